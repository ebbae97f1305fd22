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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
)

// TestVolumesAttachedAtOnceNeverPassTheQuota plays a tenant who gives
// placed VMs new Volumes at once, so that the hub's workers admit them
// before the cache shows any of them bound.
//
// Attacker's steps, a namespace with a TenantQuota of 7Gi of storage (or
// 4 volumes) and ten placed VMs: `kubectl -n team apply` ten 2Gi Volumes
// and, in one go, patch each VM (or one VM) to attach one of them
// (spec.forProvider.diskAttachments). Before, each Volume was checked
// alone against what the cache held, each fit, and all ten were bound and
// made: 20Gi under a 7Gi quota.
func TestVolumesAttachedAtOnceNeverPassTheQuota(t *testing.T) {
	const attempts = 10
	bound := volumeOf("root", "3Gi")
	bound.Annotations = map[string]string{v1alpha1.AnnotationNode: "n1"}
	cases := map[string]struct {
		hard apisv1alpha1.QuotaAmounts
		// objs are what the namespace holds first.
		objs []client.Object
		// vm and volume are the VM given the i-th Volume, and that Volume.
		vm     func(i int) *v1alpha1.VirtualMachine
		volume func(i int) v1alpha1.Volume
		fit    int
		// limit is the resource the others are refused for.
		limit string
	}{
		"StorageOfTenVMs": {
			hard:   apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("7Gi"))},
			vm:     vmOf,
			volume: func(i int) v1alpha1.Volume { return volumeOf(fmt.Sprint(i), "2Gi") },
			fit:    3,
			limit:  "storage",
		},
		"StorageOfOneVM": {
			hard:   apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("7Gi"))},
			vm:     func(int) *v1alpha1.VirtualMachine { return vmOf(0) },
			volume: func(i int) v1alpha1.Volume { return volumeOf(fmt.Sprint(i), "2Gi") },
			fit:    3,
			limit:  "storage",
		},
		"StorageBesideABoundVolume": {
			hard:   apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("7Gi"))},
			objs:   []client.Object{&bound},
			vm:     vmOf,
			volume: func(i int) v1alpha1.Volume { return volumeOf(fmt.Sprint(i), "2Gi") },
			fit:    2,
			limit:  "storage",
		},
		"VolumesOfTenVMs": {
			hard:   apisv1alpha1.QuotaAmounts{Volumes: ptr.To[int64](4)},
			vm:     vmOf,
			volume: func(i int) v1alpha1.Volume { return volumeOf(fmt.Sprint(i), "1Gi") },
			fit:    4,
			limit:  "volumes",
		},
		"OneVolumeGivenToTenVMsCountsOnce": {
			hard:   apisv1alpha1.QuotaAmounts{Volumes: ptr.To[int64](1)},
			vm:     vmOf,
			volume: func(int) v1alpha1.Volume { return volumeOf("shared", "1Gi") },
			fit:    attempts,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: "t1", Hard: tc.hard}}
			c := counterOf(t, append(tc.objs, q)...)
			ctx := context.Background()
			errs := make([]error, attempts)
			var wg sync.WaitGroup
			for i := range attempts {
				wg.Go(func() {
					v := tc.volume(i)
					errs[i] = c.AdmitVolume(ctx, tc.vm(i), &v)
				})
			}
			wg.Wait()
			admitted := 0
			for _, err := range errs {
				if err == nil {
					admitted++
					continue
				}
				var exceeded *ExceededError
				if assert.ErrorAs(t, err, &exceeded) {
					assert.Equal(t, tc.limit, exceeded.Resource, "the limit named")
					assert.Equal(t, "this Volume", exceeded.What)
				}
			}
			assert.Equal(t, tc.fit, admitted)
		})
	}
}

// TestAnAttachedVolumeCountsUntilTheCacheShowsItBound pins how long a
// Volume given to a placed VM counts once admitted: until the cache shows
// it bound (then the cache counts it, never both), or until its binding
// failed, its Volume went or its VM went; and what a second Volume that
// together with it passes the quota is told meanwhile, by FitsVolume,
// which admits nothing and never counts a Volume against itself.
func TestAnAttachedVolumeCountsUntilTheCacheShowsItBound(t *testing.T) {
	const refused = "quota of namespace t1 exceeded: storage would be 8Gi of 6Gi (TenantQuota q; 4Gi in use, this Volume 4Gi)"
	cases := map[string]struct {
		// then is what happens to the first Volume, given to vm, after
		// both were asked about.
		then func(t *testing.T, c *Counter, vm *v1alpha1.VirtualMachine, first *v1alpha1.Volume)
		// used is the storage the namespace holds after then.
		used int64
		// second is the error the second Volume is answered after then,
		// "" when it is admitted.
		second string
	}{
		"BoundAndTheSecondStaysOut": {
			then: func(t *testing.T, c *Counter, _ *v1alpha1.VirtualMachine, first *v1alpha1.Volume) {
				first.Annotations = map[string]string{v1alpha1.AnnotationNode: "n1"}
				require.NoError(t, c.kube.(client.Client).Update(context.Background(), first))
			},
			used:   4 << 30,
			second: refused,
		},
		"BindingFailedAndItIsForgotten": {
			then: func(_ *testing.T, c *Counter, vm *v1alpha1.VirtualMachine, first *v1alpha1.Volume) {
				c.ForgetVolume(first.UID, vm.UID)
			},
		},
		"AnotherVMForgetsNothingOfIt": {
			then: func(_ *testing.T, c *Counter, _ *v1alpha1.VirtualMachine, first *v1alpha1.Volume) {
				c.ForgetVolume(first.UID, vmOf(9).UID)
			},
			used:   4 << 30,
			second: refused,
		},
		"VolumeGone": {
			then: func(t *testing.T, c *Counter, _ *v1alpha1.VirtualMachine, first *v1alpha1.Volume) {
				require.NoError(t, c.kube.(client.Client).Delete(context.Background(), first))
				c.Forget(first.UID)
			},
		},
		"VMGone": {
			then: func(_ *testing.T, c *Counter, vm *v1alpha1.VirtualMachine, _ *v1alpha1.Volume) {
				c.Forget(vm.UID)
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			first, second := volumeOf("a", "4Gi"), volumeOf("b", "4Gi")
			q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: "t1", Hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("6Gi"))}}}
			c := counterOf(t, q, &first, &second)
			vm := vmOf(0)

			require.NoError(t, c.AdmitVolume(ctx, vm, &first))
			require.NoError(t, c.AdmitVolume(ctx, vm, &first), "the same Volume admitted again counts once")
			require.NoError(t, c.FitsVolume(ctx, &first), "an admitted Volume does not keep itself out")
			require.EqualError(t, c.FitsVolume(ctx, &second), refused, "what the second Volume says")
			require.EqualError(t, c.AdmitVolume(ctx, vmOf(1), &second), refused)
			used, err := c.Used(ctx, "t1")
			require.NoError(t, err)
			assert.Equal(t, int64(4<<30), used.StorageBytes, "the admitted Volume, once")

			tc.then(t, c, vm, &first)
			used, err = c.Used(ctx, "t1")
			require.NoError(t, err)
			assert.Equal(t, tc.used, used.StorageBytes)
			err = c.AdmitVolume(ctx, vmOf(1), &second)
			if tc.second == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.second)
		})
	}
}
