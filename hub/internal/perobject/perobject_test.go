package perobject

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// TestForgetReachesEveryMapAndHoldsOffLateWrites pins the two halves of the
// lifecycle: an object's entries go from every Map and every other memory at
// once, and a write that returns after its object went (a reconcile in
// flight when it was deleted) is not recorded, for nothing would forget it
// again; after GoneFor the uid may be recorded again.
func TestForgetReachesEveryMapAndHoldsOffLateWrites(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		// after is how long after the Forget the late write returns.
		after time.Duration
		want  bool
	}{
		{name: "a write returning just after its object went is not recorded", after: time.Second, want: false},
		{name: "a uid recorded after GoneFor is", after: GoneFor + time.Second, want: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOwner(nil)
			o.now = func() time.Time { return now }
			a, b := NewMap[string](o), NewMap[int](o)
			var other []types.UID
			o.OnForget(func(uid types.UID) { other = append(other, uid) })
			a.Store("u1", "one")
			b.Store("u1", 1)
			b.Store("u2", 2)

			o.Forget("u1")
			_, inA := a.Load("u1")
			_, inB := b.Load("u1")
			assert.False(t, inA || inB, "u1 is still remembered")
			_, u2 := b.Load("u2")
			assert.True(t, u2, "another object was forgotten too")
			assert.Equal(t, []types.UID{"u1"}, other)

			o.now = func() time.Time { return now.Add(tc.after) }
			o.Forget("u3") // sweeps what went longer than GoneFor ago
			a.Store("u1", "late")
			_, got := a.Load("u1")
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestAnObjectsMemoryGoesWithIt runs an Owner on a real API server's
// informers: what is remembered of an object stays while it exists, also
// while it waits on a finalizer, and goes once it is gone: deleted outright,
// or when its last finalizer is stripped by hand (no write of the hub's
// ends it).
func TestAnObjectsMemoryGoesWithIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	c, err := cache.New(cp.Config, cache.Options{Scheme: cp.Scheme})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	o := NewOwner(c, &v1alpha1.VirtualNetwork{}, &v1alpha1.Volume{})
	m := NewMap[string](o)
	go func() { _ = c.Start(ctx) }()
	started := make(chan error, 1)
	go func() { started <- o.Start(ctx) }()
	select {
	case <-o.Watching():
	case err := <-started:
		require.NoError(t, err, "the owner stopped before it watched")
	}
	require.True(t, c.WaitForCacheSync(ctx))

	cases := []struct {
		name       string
		obj        client.Object
		finalizer  bool
		strippedBy string
	}{
		{name: "DeletedOutright", obj: &v1alpha1.VirtualNetwork{Spec: v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.10.120.0/24"}}}},
		{name: "ItsFinalizerStrippedByHand", obj: &v1alpha1.Volume{Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}}}, finalizer: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.obj.SetGenerateName("obj-")
			tc.obj.SetNamespace("default")
			if tc.finalizer {
				tc.obj.SetFinalizers([]string{"test.virtfleet.io/hold"})
			}
			require.NoError(t, cp.Client.Create(ctx, tc.obj))
			uid := tc.obj.GetUID()
			m.Store(uid, "remembered")
			require.NoError(t, cp.Client.Delete(ctx, tc.obj))
			if tc.finalizer {
				require.Eventually(t, func() bool {
					got := tc.obj.DeepCopyObject().(client.Object) //nolint:forcetypeassert // a copy of a client.Object
					return c.Get(ctx, client.ObjectKeyFromObject(tc.obj), got) == nil && got.GetDeletionTimestamp() != nil
				}, 10*time.Second, 10*time.Millisecond, "the cache never saw the deletion begin")
				_, ok := m.Load(uid)
				require.True(t, ok, "forgotten while it waits on its finalizer")
				require.NoError(t, cp.Client.Patch(ctx, tc.obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))))
			}
			// Long enough for a watch event on a machine busy with other
			// packages' API servers and guests.
			if !assert.Eventually(t, func() bool { _, ok := m.Load(uid); return !ok }, 30*time.Second, 10*time.Millisecond,
				"the object is gone and is still remembered") {
				key, got := client.ObjectKeyFromObject(tc.obj), tc.obj.DeepCopyObject().(client.Object) //nolint:forcetypeassert // a copy of a client.Object
				t.Logf("the API server's Get: %v; the cache's: %v", cp.Client.Get(ctx, key, got), c.Get(ctx, key, got))
			}
		})
	}
	cancel()
	assert.NoError(t, <-started)
}
