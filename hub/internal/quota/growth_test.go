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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
)

// grownVolumes is n Volumes of namespace t1 on node n1, each recorded by
// the hub at 8Gi and asking for 12Gi, with a TenantQuota q of storage
// hard, and a Counter over them and a fleet holding the records.
func grownVolumes(t *testing.T, n int, hard string) (*Counter, *fleet.Fleet, []*v1alpha1.Volume) {
	t.Helper()
	ctx := context.Background()
	f := fleettest.Start(t, bus.NewFake())
	q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: "t1", Hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse(hard))}}}
	objs := []client.Object{q}
	var volumes []*v1alpha1.Volume
	for i := range n {
		v := volumeOf(fmt.Sprint(i), "12Gi")
		v.Annotations = map[string]string{v1alpha1.AnnotationNode: "n1"}
		require.NoError(t, f.RecordSize(ctx, string(v.UID), 8<<30))
		volumes = append(volumes, &v)
		objs = append(objs, &v)
	}
	s := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	kube := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	return NewCounter(kube, func() []*fleet.Fleet { return []*fleet.Fleet{f} }), f, volumes
}

// TestGrowthsAtOnceNeverPassTheQuota plays a tenant who grows several
// Volumes at once, so that the hub's workers admit their growths before
// any of their size records lands.
//
// Attacker's steps, a namespace with a TenantQuota of 20Gi of storage and
// two (or ten) 8Gi Volumes on a node, each attached to a running VM:
// `kubectl -n team patch volume <each> --type merge -p
// '{"spec":{"forProvider":{"size":"12Gi"}}}'` for all of them in one go.
// Before, each growth of 4Gi was checked against the 16Gi the records
// held, each fit alone, and every one was sent: 24Gi (or 56Gi) under a
// 20Gi quota.
func TestGrowthsAtOnceNeverPassTheQuota(t *testing.T) {
	cases := map[string]struct {
		volumes int
		hard    string
		fit     int
	}{
		"TwoWhereOneFits":  {volumes: 2, hard: "20Gi", fit: 1},
		"TenWhereThreeFit": {volumes: 10, hard: "92Gi", fit: 3},
		"TenWhereAllFit":   {volumes: 10, hard: "120Gi", fit: 10},
		"TenWhereNoneFits": {volumes: 10, hard: "83Gi", fit: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c, _, volumes := grownVolumes(t, tc.volumes, tc.hard)
			ctx := context.Background()
			errs := make([]error, len(volumes))
			var wg sync.WaitGroup
			for i, v := range volumes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = c.AdmitGrowth(ctx, v, 8<<30)
				}()
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
					assert.Equal(t, "storage", exceeded.Resource, "the limit named")
				}
			}
			assert.Equal(t, tc.fit, admitted)
			used, err := c.Used(ctx, "t1")
			require.NoError(t, err)
			assert.Equal(t, int64(tc.volumes)*8<<30+int64(tc.fit)*4<<30, used.StorageBytes, "what the records hold and the growths admitted")
		})
	}
}

// TestAnAdmittedGrowthCountsUntilItsRecordLands pins how long an admitted
// growth counts: until the hub's size record shows it (then the record
// counts, never both), or until its record's write failed and it was
// forgotten; and what the second of two growths that together pass the
// quota is told meanwhile.
func TestAnAdmittedGrowthCountsUntilItsRecordLands(t *testing.T) {
	const held = "quota of namespace t1 exceeded: storage would be 24Gi of 20Gi (TenantQuota q; 20Gi in use, this Volume's growth 4Gi)"
	cases := map[string]struct {
		// then is what happens to the first growth after both were
		// asked about.
		then func(t *testing.T, c *Counter, f *fleet.Fleet, first *v1alpha1.Volume)
		// used is the storage the namespace holds after then.
		used int64
		// second is the error the second growth is answered after then,
		// "" when it is admitted.
		second string
	}{
		"RecordLandsAndTheSecondStaysHeld": {
			then: func(t *testing.T, _ *Counter, f *fleet.Fleet, first *v1alpha1.Volume) {
				require.NoError(t, f.RecordSize(context.Background(), string(first.UID), 12<<30))
			},
			used:   20 << 30,
			second: held,
		},
		"RecordLandsAndTheQuotaIsRaised": {
			then: func(t *testing.T, c *Counter, f *fleet.Fleet, first *v1alpha1.Volume) {
				require.NoError(t, f.RecordSize(context.Background(), string(first.UID), 12<<30))
				kube := c.kube.(client.Client)
				q := &apisv1alpha1.TenantQuota{}
				require.NoError(t, kube.Get(context.Background(), client.ObjectKey{Name: "q"}, q))
				q.Spec.Hard.Storage = ptr.To(resource.MustParse("24Gi"))
				require.NoError(t, kube.Update(context.Background(), q))
			},
			used: 20 << 30,
		},
		"RecordFailsAndTheGrowthIsForgotten": {
			then: func(_ *testing.T, c *Counter, _ *fleet.Fleet, first *v1alpha1.Volume) {
				c.ForgetGrowth(first.UID)
			},
			used: 16 << 30,
		},
		"FirstVolumeDeleted": {
			then: func(t *testing.T, c *Counter, _ *fleet.Fleet, first *v1alpha1.Volume) {
				require.NoError(t, c.kube.(client.Client).Delete(context.Background(), first))
				c.Forget(first.UID)
			},
			used: 8 << 30,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c, f, volumes := grownVolumes(t, 2, "20Gi")
			first, second := volumes[0], volumes[1]

			require.NoError(t, c.AdmitGrowth(ctx, first, 8<<30))
			require.NoError(t, c.AdmitGrowth(ctx, first, 8<<30), "the same growth admitted again counts once")
			require.EqualError(t, c.AdmitGrowth(ctx, second, 8<<30), held)
			size, err := c.HeldGrowth(ctx, second)
			assert.Equal(t, int64(8<<30), size)
			require.EqualError(t, err, held, "what the second Volume says")
			_, err = c.HeldGrowth(ctx, first)
			require.NoError(t, err, "an admitted growth does not hold itself")
			used, err := c.Used(ctx, "t1")
			require.NoError(t, err)
			assert.Equal(t, int64(20<<30), used.StorageBytes, "the records and the admitted growth")

			tc.then(t, c, f, first)
			used, err = c.Used(ctx, "t1")
			require.NoError(t, err)
			assert.Equal(t, tc.used, used.StorageBytes)
			err = c.AdmitGrowth(ctx, second, 8<<30)
			if tc.second == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.second)
		})
	}
}
