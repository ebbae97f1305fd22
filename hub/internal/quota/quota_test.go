package quota

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
)

func tq(name string, hard apisv1alpha1.QuotaAmounts) apisv1alpha1.TenantQuota {
	return apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: "t1", Hard: hard}}
}

func TestCheck(t *testing.T) {
	oneVM := Amounts{VMs: 1, VCPU: 2, MemoryBytes: 1 << 30, StorageBytes: 4 << 30, Volumes: 2, Addresses: 2}
	cases := map[string]struct {
		quotas []apisv1alpha1.TenantQuota
		used   Amounts
		// refused is the error's message, "" when the VM fits.
		refused string
	}{
		"NoQuotaLimitsNothing": {used: Amounts{VMs: 1000, VCPU: 1000, MemoryBytes: 1 << 50}},
		"AnUnsetLimitIsUnlimited": {
			quotas: []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](5)})},
			used:   Amounts{VMs: 1, VCPU: 1000, MemoryBytes: 1 << 50, StorageBytes: 1 << 50, Volumes: 1000, Snapshots: 1000, Addresses: 1000},
		},
		"ReachingALimitExactlyFits": {
			quotas: []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](2), VCPU: ptr.To[int64](4), Memory: ptr.To(resource.MustParse("2Gi"))})},
			used:   oneVM,
		},
		"PassingVMsIsRefused": {
			quotas:  []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](1)})},
			used:    oneVM,
			refused: "quota of namespace t1 exceeded: vms would be 2 of 1 (TenantQuota q; 1 in use, this VM 1)",
		},
		"PassingVCPUIsRefused": {
			quotas:  []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{VCPU: ptr.To[int64](3)})},
			used:    oneVM,
			refused: "quota of namespace t1 exceeded: vcpu would be 4 of 3 (TenantQuota q; 2 in use, this VM 2)",
		},
		"PassingMemoryIsRefused": {
			quotas:  []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{Memory: ptr.To(resource.MustParse("1536Mi"))})},
			used:    oneVM,
			refused: "quota of namespace t1 exceeded: memory would be 2Gi of 1536Mi (TenantQuota q; 1Gi in use, this VM 1Gi)",
		},
		"EveryQuotaOfTheNamespaceApplies": {
			quotas: []apisv1alpha1.TenantQuota{
				tq("roomy", apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](10)}),
				tq("tight", apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](1)}),
			},
			used:    oneVM,
			refused: "quota of namespace t1 exceeded: vms would be 2 of 1 (TenantQuota tight; 1 in use, this VM 1)",
		},
		"PassingStorageIsRefused": {
			quotas:  []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("10Gi"))})},
			used:    Amounts{StorageBytes: 8 << 30},
			refused: "quota of namespace t1 exceeded: storage would be 12Gi of 10Gi (TenantQuota q; 8Gi in use, this VM 4Gi)",
		},
		"PassingVolumesIsRefused": {
			quotas:  []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{Volumes: ptr.To[int64](1)})},
			used:    Amounts{Volumes: 1},
			refused: "quota of namespace t1 exceeded: volumes would be 3 of 1 (TenantQuota q; 1 in use, this VM 2)",
		},
		"PassingAddressesIsRefused": {
			quotas:  []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{Addresses: ptr.To[int64](2)})},
			used:    Amounts{Addresses: 1},
			refused: "quota of namespace t1 exceeded: addresses would be 3 of 2 (TenantQuota q; 1 in use, this VM 2)",
		},
		"ASnapshotLimitDoesNotRefuseAVM": {
			quotas: []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{Snapshots: ptr.To[int64](0)})},
			used:   Amounts{Snapshots: 3},
		},
		"AZeroLimitRefusesTheFirst": {
			quotas:  []apisv1alpha1.TenantQuota{tq("q", apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](0)})},
			refused: "quota of namespace t1 exceeded: vms would be 1 of 0 (TenantQuota q; 0 in use, this VM 1)",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := Check(tc.quotas, tc.used, oneVM, "this VM")
			if tc.refused == "" {
				assert.NoError(t, err)
				return
			}
			var exceeded *ExceededError
			assert.ErrorAs(t, err, &exceeded)
			assert.EqualError(t, err, tc.refused)
		})
	}
}

func TestSummary(t *testing.T) {
	used := Amounts{VMs: 2, VCPU: 6, MemoryBytes: 4 << 30}
	stored := Amounts{VMs: 2, VCPU: 6, MemoryBytes: 4 << 30, StorageBytes: 20 << 30, Volumes: 3, Snapshots: 1, Addresses: 2}
	cases := map[string]struct {
		hard apisv1alpha1.QuotaAmounts
		used *Amounts
		want string
	}{
		"EveryLimitSet": {
			hard: apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](4), VCPU: ptr.To[int64](8), Memory: ptr.To(resource.MustParse("8Gi"))},
			want: "vms: 2/4, vcpu: 6/8, memory: 4Gi/8Gi",
		},
		"AnUnlimitedResourceShowsItsUseAlone": {
			hard: apisv1alpha1.QuotaAmounts{VCPU: ptr.To[int64](8)},
			want: "vms: 2, vcpu: 6/8, memory: 4Gi",
		},
		"StorageVolumesSnapshotsAndAddressesShowWhenLimited": {
			hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("50Gi")), Addresses: ptr.To[int64](10)},
			want: "vms: 2, vcpu: 6, memory: 4Gi, storage: 0/50Gi, addresses: 0/10",
		},
		"StorageVolumesSnapshotsAndAddressesShowWhenHeld": {
			hard: apisv1alpha1.QuotaAmounts{Snapshots: ptr.To[int64](5)},
			used: &stored,
			want: "vms: 2, vcpu: 6, memory: 4Gi, storage: 20Gi, volumes: 3, snapshots: 1/5, addresses: 2",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			q := tq("q", tc.hard)
			u := used
			if tc.used != nil {
				u = *tc.used
			}
			assert.Equal(t, tc.want, Summary(&q, u))
		})
	}
}
