package quota

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// counterOf is a Counter over a client holding objs and no fleet.
func counterOf(t *testing.T, objs ...client.Object) *Counter {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	kube := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	return NewCounter(kube, func() []*fleet.Fleet { return nil })
}

func vmOf(i int) *v1alpha1.VirtualMachine {
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "t1", Name: fmt.Sprintf("vm-%d", i), UID: types.UID(fmt.Sprintf("vm-%d", i))}}
	vm.Spec.ForProvider.Vcpu, vm.Spec.ForProvider.Memory = 1, resource.MustParse("1Gi")
	return vm
}

func volumeOf(name, size string) v1alpha1.Volume {
	return v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t1", Name: name, UID: types.UID("vol-" + name)},
		Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse(size)}},
	}
}

// TestAdmissionsAtOnceNeverPassTheLastUnit plays a tenant whose objects
// are admitted all at once, by the hub's concurrent workers, none of them
// shown by the cache yet.
//
// Attacker's steps: create ten VMs, each with a Volume of its own or an
// address to be given, or ten snapshots, in one `kubectl apply`, so that
// the hub's workers ask the Counter about all of them at the same moment.
// Exactly as many are admitted as the limit takes, whatever the
// interleaving; and what two VMs share (one Volume) is counted once.
func TestAdmissionsAtOnceNeverPassTheLastUnit(t *testing.T) {
	vm := vmOf(0)
	vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
	cases := map[string]struct {
		hard apisv1alpha1.QuotaAmounts
		// objs are what the namespace holds first.
		objs []client.Object
		// admit admits the i-th object.
		admit func(ctx context.Context, c *Counter, i int) error
		fit   int
	}{
		"VolumesOfVMsPlacedAtOnce": {
			hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("7Gi"))},
			admit: func(ctx context.Context, c *Counter, i int) error {
				return c.Admit(ctx, vmOf(i), Placement{Volumes: []v1alpha1.Volume{volumeOf(fmt.Sprint(i), "2Gi")}})
			},
			fit: 3,
		},
		"AddressesOfVMsPlacedAtOnce": {
			hard: apisv1alpha1.QuotaAmounts{Addresses: ptr.To[int64](5)},
			admit: func(ctx context.Context, c *Counter, i int) error {
				return c.Admit(ctx, vmOf(i), Placement{Addresses: 2})
			},
			fit: 2,
		},
		"AddressesGivenToPlacedVMsAtOnce": {
			hard: apisv1alpha1.QuotaAmounts{Addresses: ptr.To[int64](4)},
			admit: func(ctx context.Context, c *Counter, i int) error {
				return c.AdmitAddresses(ctx, vmOf(i), 1)
			},
			fit: 4,
		},
		"ASharedVolumeCountsOnce": {
			hard: apisv1alpha1.QuotaAmounts{Volumes: ptr.To[int64](1)},
			admit: func(ctx context.Context, c *Counter, i int) error {
				return c.Admit(ctx, vmOf(i), Placement{Volumes: []v1alpha1.Volume{volumeOf("shared", "1Gi")}})
			},
			fit: 10,
		},
		"SnapshotsAtOnce": {
			hard: apisv1alpha1.QuotaAmounts{Snapshots: ptr.To[int64](3), Storage: ptr.To(resource.MustParse("100Gi"))},
			objs: []client.Object{func() *v1alpha1.Volume { v := volumeOf("root", "10Gi"); return &v }()},
			admit: func(ctx context.Context, c *Counter, i int) error {
				s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "t1", Name: fmt.Sprint(i), UID: types.UID(fmt.Sprintf("snap-%d", i))}}
				return c.AdmitSnapshot(ctx, s, vm)
			},
			fit: 3,
		},
		"SnapshotsStorageAtOnce": {
			hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("35Gi"))},
			objs: []client.Object{func() *v1alpha1.Volume { v := volumeOf("root", "10Gi"); return &v }()},
			admit: func(ctx context.Context, c *Counter, i int) error {
				s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "t1", Name: fmt.Sprint(i), UID: types.UID(fmt.Sprintf("snap-%d", i))}}
				return c.AdmitSnapshot(ctx, s, vm)
			},
			// An unbound root counts nothing itself; each snapshot may
			// grow to its 10Gi.
			fit: 3,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: "t1", Hard: tc.hard}}
			c := counterOf(t, append(tc.objs, q)...)
			ctx := context.Background()
			const attempts = 10
			errs := make([]error, attempts)
			var wg sync.WaitGroup
			for i := range attempts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = tc.admit(ctx, c, i)
				}()
			}
			wg.Wait()
			admitted := 0
			for _, err := range errs {
				var exceeded *ExceededError
				if err == nil {
					admitted++
					continue
				}
				assert.ErrorAs(t, err, &exceeded)
			}
			assert.Equal(t, tc.fit, admitted)
		})
	}
}

// TestWhatWasAdmittedCountsUntilTheCacheShowsIt pins when an admission
// stops counting on its own: once the cache counts the object, never
// twice, and never before.
func TestWhatWasAdmittedCountsUntilTheCacheShowsIt(t *testing.T) {
	ctx := context.Background()
	q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: "t1", Hard: apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](10)}}}
	c := counterOf(t, q)
	vm := vmOf(1)
	v := volumeOf("data", "3Gi")
	require.NoError(t, c.Admit(ctx, vm, Placement{Volumes: []v1alpha1.Volume{v}, Addresses: 2}))
	used, err := c.Used(ctx, "t1")
	require.NoError(t, err)
	assert.Equal(t, Amounts{VMs: 1, VCPU: 1, MemoryBytes: 1 << 30, StorageBytes: 3 << 30, Volumes: 1, Addresses: 2}, used, "admitted, not shown yet")

	// The cache shows the VM bound, its Volume bound and one address.
	kube := c.kube.(client.Client)
	vm.Annotations = map[string]string{v1alpha1.AnnotationNode: "n1"}
	require.NoError(t, kube.Create(ctx, vm))
	v.Annotations = map[string]string{v1alpha1.AnnotationNode: "n1"}
	require.NoError(t, kube.Create(ctx, &v))
	require.NoError(t, kube.Create(ctx, &v1alpha1.NetworkAddress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t1", Name: "net.10.0.0.2"},
		Spec:       v1alpha1.NetworkAddressSpec{VirtualMachineUID: string(vm.UID)},
	}))
	used, err = c.Used(ctx, "t1")
	require.NoError(t, err)
	assert.Equal(t, Amounts{VMs: 1, VCPU: 1, MemoryBytes: 1 << 30, StorageBytes: 3 << 30, Volumes: 1, Addresses: 2}, used,
		"the second address still counts as admitted until it is recorded, the first as a record")

	c.Forget(vm.UID)
	used, err = c.Used(ctx, "t1")
	require.NoError(t, err)
	assert.Equal(t, int64(1), used.Addresses, "a forgotten VM's admission counts no more")
}

// TestSnapshotsCountWhileANodeHoldsThem pins what each snapshot phase
// counts: one taken counts the size its node reported, one being taken
// what it may grow to, one that failed or was never asked of a node
// nothing.
func TestSnapshotsCountWhileANodeHoldsThem(t *testing.T) {
	root := volumeOf("root", "10Gi")
	root.Annotations = map[string]string{v1alpha1.AnnotationNode: "n1"}
	vm := vmOf(1)
	vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
	snap := func(name string, st v1alpha1.VirtualMachineSnapshotStatus, memory bool) *v1alpha1.VirtualMachineSnapshot {
		s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "t1", Name: name}, Status: st}
		s.Spec.IncludeMemory = memory
		s.Status.SourceUID, s.Status.VM = string(vm.UID), vm.Spec.ForProvider.DeepCopy()
		return s
	}
	taken := metav1.Now()
	cases := map[string]struct {
		snapshot *v1alpha1.VirtualMachineSnapshot
		want     Amounts
	}{
		"TakenCountsItsReportedSize": {
			snapshot: snap("taken", v1alpha1.VirtualMachineSnapshotStatus{Phase: v1alpha1.SnapshotSucceeded, Node: "n1", CreationTime: &taken, Size: ptr.To(resource.MustParse("3Gi"))}, false),
			want:     Amounts{Snapshots: 1, StorageBytes: 3 << 30},
		},
		"LostStillCountsItsSize": {
			snapshot: snap("lost", v1alpha1.VirtualMachineSnapshotStatus{Phase: v1alpha1.SnapshotLost, Node: "n1", CreationTime: &taken, Size: ptr.To(resource.MustParse("3Gi"))}, false),
			want:     Amounts{Snapshots: 1, StorageBytes: 3 << 30},
		},
		"BeingTakenCountsItsDisks": {
			snapshot: snap("taking", v1alpha1.VirtualMachineSnapshotStatus{Phase: v1alpha1.SnapshotInProgress, Node: "n1"}, false),
			want:     Amounts{Snapshots: 1, StorageBytes: 10 << 30},
		},
		"BeingTakenWithMemoryCountsItsDisksAndMemory": {
			snapshot: snap("taking-memory", v1alpha1.VirtualMachineSnapshotStatus{Phase: v1alpha1.SnapshotInProgress, Node: "n1"}, true),
			want:     Amounts{Snapshots: 1, StorageBytes: 11 << 30},
		},
		"FailedCountsNothing": {
			snapshot: snap("failed", v1alpha1.VirtualMachineSnapshotStatus{Phase: v1alpha1.SnapshotFailed, Node: "n1"}, false),
		},
		"PendingCountsNothing": {
			snapshot: snap("pending", v1alpha1.VirtualMachineSnapshotStatus{Phase: v1alpha1.SnapshotPending}, false),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := counterOf(t, root.DeepCopy(), vm.DeepCopy(), tc.snapshot)
			used, err := c.Used(context.Background(), "t1")
			require.NoError(t, err)
			want := Amounts{Volumes: 1, StorageBytes: 10 << 30}.add(tc.want)
			assert.Equal(t, want, used)
		})
	}
}
