package volume

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
)

// TestAVolumeOverQuotaSaysWhyItIsMadeNowhere plays a tenant that creates a
// Volume bigger than its namespace's quota leaves room for, or one Volume
// more than it allows.
//
// Attacker's steps: with an 8Gi Volume of namespace team on node1 and a
// TenantQuota of team, `kubectl -n team apply` one more Volume. Its VM
// stays Pending (placement admits the Volume with it); the Volume itself
// is Pending and Unavailable, naming the namespace, the limit, what is in
// use and what it would add, so `kubectl get vol` shows why no node has
// it. A Volume already on a node is never called over quota by a limit
// lowered later: it is there.
func TestAVolumeOverQuotaSaysWhyItIsMadeNowhere(t *testing.T) {
	held := &v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "old", UID: "old-uid", Annotations: map[string]string{v1alpha1.AnnotationNode: testNode}},
		Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("8Gi")}},
	}
	cases := map[string]struct {
		hard *apisv1alpha1.QuotaAmounts
		// node is the new Volume's.
		node string
		// refused is its Ready message, "" when it is Available.
		refused string
	}{
		"NoQuotaNoLimit": {},
		"ItFits": {
			hard: &apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("12Gi")), Volumes: ptr.To[int64](2)},
		},
		"PastStorage": {
			hard:    &apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("10Gi"))},
			refused: "made on no node: quota of namespace team exceeded: storage would be 12Gi of 10Gi (TenantQuota team; 8Gi in use, this Volume 4Gi)",
		},
		"PastVolumes": {
			hard:    &apisv1alpha1.QuotaAmounts{Volumes: ptr.To[int64](1)},
			refused: "made on no node: quota of namespace team exceeded: volumes would be 2 of 1 (TenantQuota team; 1 in use, this Volume 1)",
		},
		"ABoundOneIsNeverCalledOverQuota": {
			hard: &apisv1alpha1.QuotaAmounts{Volumes: ptr.To[int64](0)},
			node: testNode,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := boundVolume(tc.node)
			v.Spec.ForProvider.Size = resource.MustParse("4Gi")
			objs := []client.Object{held, v}
			if tc.hard != nil {
				objs = append(objs, &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: "team", Hard: *tc.hard}})
			}
			_, f := played(t)
			r, _, _, kube := testReleaser(t, f, objs...)
			r.quotas = quota.NewCounter(kube, func() []*fleet.Fleet { return []*fleet.Fleet{f} })

			got, err := r.Observe(context.Background(), kube, v, inuse.Users{})
			require.NoError(t, err)
			if tc.refused == "" {
				assert.Equal(t, corev1.ConditionTrue, got.Status, got.Message)
				return
			}
			assert.Equal(t, xpv2.ReasonUnavailable, got.Reason)
			assert.Equal(t, tc.refused, got.Message)
			assert.Equal(t, v1alpha1.PhasePending, v.Status.AtProvider.Phase)
		})
	}
}
