package apiwrites

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// counting counts the status updates that reach the API server.
type counting struct {
	client.Client
	n *atomic.Int32
}

func (c counting) Status() client.SubResourceWriter {
	return countingStatus{SubResourceWriter: c.Client.Status(), n: c.n}
}

type countingStatus struct {
	client.SubResourceWriter
	n *atomic.Int32
}

func (c countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	c.n.Add(1)
	return c.SubResourceWriter.Update(ctx, obj, opts...)
}

// scheduled is a Hold's comparison: only phase Scheduled may be dropped.
func scheduled(o client.Object) bool {
	n, ok := o.(*v1alpha1.VirtualNetwork)
	return ok && n.Status.AtProvider.Phase == v1alpha1.PhaseScheduled
}

// TestSkipUnchangedStatus runs against a real API server and informer cache.
func TestSkipUnchangedStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	informers, ctx := cp.InformersForTest(t)

	var sent atomic.Int32
	c := NewClient(counting{Client: cp.Client, n: &sent}, informers, perobject.NewOwner(nil))

	n := &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "net"},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.0.0.0/24"}},
	}
	require.NoError(t, cp.Client.Create(ctx, n))
	// read returns the object as the cache has it, once the cache has rv.
	read := func(rv string) *v1alpha1.VirtualNetwork {
		t.Helper()
		got := &v1alpha1.VirtualNetwork{}
		require.Eventually(t, func() bool {
			return informers.Get(ctx, client.ObjectKeyFromObject(n), got) == nil && got.ResourceVersion == rv
		}, 10*time.Second, 10*time.Millisecond)
		return got
	}
	withPhase := func(o *v1alpha1.VirtualNetwork, p v1alpha1.Phase) *v1alpha1.VirtualNetwork {
		o.Status.AtProvider.Phase = p
		return o
	}

	v1 := read(n.ResourceVersion)
	steps := []struct {
		name    string
		obj     func() *v1alpha1.VirtualNetwork
		sent    int32
		wantErr func(error) bool
		// holdFor holds the status write before the step, dropping it if
		// its phase is Scheduled.
		holdFor time.Duration
	}{
		{name: "AChangedStatusIsWritten", obj: func() *v1alpha1.VirtualNetwork { return withPhase(v1.DeepCopy(), v1alpha1.PhaseRunning) }, sent: 1},
		{name: "TheSameStatusAgainIsNot", obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseRunning)
		}, sent: 0},
		{name: "ARevertFromTheCopyItWroteOverConflictsWithoutARequest", obj: func() *v1alpha1.VirtualNetwork { return v1.DeepCopy() }, sent: 0, wantErr: kerrors.IsConflict},
		{name: "AnotherChangeIsWritten", obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseFailed)
		}, sent: 1},
		// Only the copy of the last write is known to be superseded; an
		// older one is sent, and the API server refuses it.
		{name: "ACopyTwoWritesOldIsSentAndConflicts", obj: func() *v1alpha1.VirtualNetwork { return v1.DeepCopy() }, sent: 1, wantErr: kerrors.IsConflict},
		{name: "AHeldChangeIsDroppedIfItIsTheExpectedOne", holdFor: time.Minute, obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseScheduled)
		}, sent: 0},
		{name: "AndAgainWithinTheHold", obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseScheduled)
		}, sent: 0},
		{name: "AHeldChangeWithOtherContentIsWritten", holdFor: time.Minute, obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseRunning)
		}, sent: 1},
		{name: "AWrittenChangeEndsTheHold", obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseScheduled)
		}, sent: 1},
		{name: "AndSoIsTheNextChange", obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseRunning)
		}, sent: 1},
		{name: "NorAfterTheHoldExpired", holdFor: time.Nanosecond, obj: func() *v1alpha1.VirtualNetwork {
			return withPhase(read(c.lastWritten(n.UID)), v1alpha1.PhaseScheduled)
		}, sent: 1},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.holdFor > 0 {
				c.Hold(n, s.holdFor, scheduled)
			}
			before := sent.Load()
			obj := s.obj()
			err := c.Status().Update(ctx, obj)
			if s.wantErr != nil {
				assert.True(t, s.wantErr(err), "got %v", err)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, s.sent, sent.Load()-before, "status updates sent to the API server")
			if err == nil && s.sent > 0 {
				// Read your writes: the next reconcile must not start from
				// the version before this write.
				cached := &v1alpha1.VirtualNetwork{}
				require.NoError(t, informers.Get(ctx, client.ObjectKeyFromObject(n), cached))
				assert.Equal(t, obj.ResourceVersion, cached.ResourceVersion, "the cache holds the written version once the write returns")
			}
		})
	}

	t.Run("AStatusFromBeforeADirectPatchConflictsWithoutARequest", func(t *testing.T) {
		cur := read(c.lastWritten(n.UID))
		patched := cur.DeepCopy()
		patched.Labels = map[string]string{"patched": "true"}
		require.NoError(t, Direct(c).Patch(ctx, patched, client.MergeFrom(cur)))
		before := sent.Load()
		err := c.Status().Update(ctx, withPhase(cur, v1alpha1.PhaseFailed))
		assert.True(t, kerrors.IsConflict(err), "got %v", err)
		assert.Equal(t, int32(0), sent.Load()-before, "status updates sent to the API server")
	})

	t.Run("TheStoredStatusIsTheLastOneWritten", func(t *testing.T) {
		got := &v1alpha1.VirtualNetwork{}
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(n), got))
		assert.Equal(t, v1alpha1.PhaseScheduled, got.Status.AtProvider.Phase)
	})

	// A write that changes nothing (an Update of the same object, a patch
	// of nothing) leaves the resourceVersion as it was: the copy it was
	// made from is still the object's, and a write from it must be sent.
	t.Run("AfterAWriteThatChangedNothingTheCopyIsStillCurrent", func(t *testing.T) {
		for _, write := range []struct {
			name string
			do   func(cur *v1alpha1.VirtualNetwork) error
		}{
			{name: "Update", do: func(cur *v1alpha1.VirtualNetwork) error { return c.Update(ctx, cur.DeepCopy()) }},
			{name: "Patch", do: func(cur *v1alpha1.VirtualNetwork) error {
				return c.Patch(ctx, cur.DeepCopy(), client.MergeFrom(cur))
			}},
			{name: "DirectUpdate", do: func(cur *v1alpha1.VirtualNetwork) error { return Direct(c).Update(ctx, cur.DeepCopy()) }},
		} {
			t.Run(write.name, func(t *testing.T) {
				cur := &v1alpha1.VirtualNetwork{}
				require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(n), cur))
				cur = read(cur.ResourceVersion)
				require.NoError(t, write.do(cur))
				now := &v1alpha1.VirtualNetwork{}
				require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(n), now))
				require.Equal(t, cur.ResourceVersion, now.ResourceVersion, "a write that changes nothing keeps the resourceVersion")
				before := sent.Load()
				next := v1alpha1.PhaseRunning
				if cur.Status.AtProvider.Phase == next {
					next = v1alpha1.PhaseFailed
				}
				require.NoError(t, c.Status().Update(ctx, withPhase(cur, next)))
				assert.Equal(t, int32(1), sent.Load()-before, "status updates sent to the API server")
			})
		}
	})
}

// laggingCache holds an object at resourceVersion "1" until lag has passed
// since it was made, then at "2", counting the reads.
type laggingCache struct {
	client.Reader
	since time.Time
	lag   time.Duration
	reads atomic.Int32
}

func (c *laggingCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	c.reads.Add(1)
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	obj.SetResourceVersion("1")
	if time.Since(c.since) >= c.lag {
		obj.SetResourceVersion("2")
	}
	return nil
}

// TestAwaitCacheReturnsOnceTheCacheHasTheWrite pins the read-your-writes
// wait: it ends as soon as the cache shows the write, or after cacheWait
// when it never does, and a long wait reads the cache ever less often
// (2 ms, then twice as long each time up to 32 ms), not every 2 ms.
func TestAwaitCacheReturnsOnceTheCacheHasTheWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		lag  time.Duration
	}{
		{"the cache has it at once", 0},
		{"the cache is 150 ms behind", 150 * time.Millisecond},
		{"the cache never has it", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := &laggingCache{since: time.Now(), lag: tc.lag}
			c := NewClient(nil, cache, perobject.NewOwner(nil))
			written := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", ResourceVersion: "2"}}

			start := time.Now()
			c.awaitCache(context.Background(), written, "1")
			took := time.Since(start)

			assert.GreaterOrEqual(t, took, min(tc.lag, cacheWait), "it waited for the cache")
			if tc.lag < cacheWait {
				assert.Less(t, took, cacheWait, "it did not wait out cacheWait once the cache had the write")
			}
			// Sleeps of 2, 4, 8 and 16 ms, then 32 ms each: at most 6 reads
			// plus one per 32 ms of the time it took, however slow the
			// machine (a sleep is never shorter than asked).
			assert.LessOrEqual(t, int(cache.reads.Load()), 6+int(took/(32*time.Millisecond)), "reads in %s", took)
		})
	}
}

// lastWritten is the resourceVersion uid's last write made, or "".
func (s *Client) lastWritten(uid types.UID) string {
	w, _ := s.written.Load(uid)
	return w.made
}

// TestEqualStatusComparesTheStoredStatusOnly: two objects whose statuses the
// API server would store alike are equal, whatever else differs.
func TestEqualStatusComparesTheStoredStatusOnly(t *testing.T) {
	at := time.Date(2026, 11, 26, 21, 0, 0, 0, time.UTC)
	base := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Name: "net", ResourceVersion: "1"}}
	base.Status.AtProvider.Phase = v1alpha1.PhaseRunning
	base.Status.SetConditions(xpv2.Available().WithMessage("ready"))
	base.Status.Conditions[0].LastTransitionTime = metav1.NewTime(at)
	for _, tc := range []struct {
		name  string
		other func(*v1alpha1.VirtualNetwork)
		equal bool
	}{
		{"the same", func(*v1alpha1.VirtualNetwork) {}, true},
		{"another spec and metadata", func(n *v1alpha1.VirtualNetwork) {
			n.Spec.ForProvider.CIDR, n.ResourceVersion, n.Labels = "10.9.0.0/24", "9", map[string]string{"a": "b"}
		}, true},
		{"a transition time within the same second, as stored", func(n *v1alpha1.VirtualNetwork) {
			n.Status.Conditions[0].LastTransitionTime = metav1.NewTime(at.Add(400 * time.Millisecond))
		}, true},
		{"another phase", func(n *v1alpha1.VirtualNetwork) { n.Status.AtProvider.Phase = v1alpha1.PhaseFailed }, false},
		{"another condition message", func(n *v1alpha1.VirtualNetwork) { n.Status.Conditions[0].Message = "not ready" }, false},
		{"a transition time a second later", func(n *v1alpha1.VirtualNetwork) {
			n.Status.Conditions[0].LastTransitionTime = metav1.NewTime(at.Add(time.Second))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := base.DeepCopy()
			tc.other(other)
			assert.Equal(t, tc.equal, equalStatus(base, other))
		})
	}
	assert.False(t, equalStatus(base, &metav1.Status{}), "an object without a status struct is never equal")
}

// TestRemovingTheLastFinalizerForgetsTheObjectOnceItIsGone runs against a
// real API server. A finalizer removal that conflicts leaves the object,
// and what the hub remembers of it, as they were: forgotten, the memory
// would refuse to record it again for perobject.GoneFor, and a VM whose
// deletion the hub remembers would wait that long for its finalizer.
func TestRemovingTheLastFinalizerForgetsTheObjectOnceItIsGone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	informers, ctx := cp.InformersForTest(t)
	owner := perobject.NewOwner(nil)
	memory := perobject.NewMap[string](owner)
	c := NewClient(cp.Client, informers, owner)

	n := &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "going", Finalizers: []string{"test.virtfleet.io/hold"}},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.0.0.0/24"}},
	}
	require.NoError(t, cp.Client.Create(ctx, n))
	stale := n.DeepCopy()
	require.NoError(t, cp.Client.Delete(ctx, n))
	current := &v1alpha1.VirtualNetwork{}
	require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(n), current))
	require.NotNil(t, current.DeletionTimestamp)
	memory.Store(n.UID, "deleting")

	steps := []struct {
		name string
		obj  *v1alpha1.VirtualNetwork
		// wantErr is nil for an update that lands.
		wantErr func(error) bool
		// remembered is what the memory holds after the update, and
		// recordable whether it may record the object again.
		remembered, recordable bool
	}{
		{name: "AConflictingRemovalLeavesTheMemory", obj: stale, wantErr: kerrors.IsConflict, remembered: true, recordable: true},
		{name: "ARemovalThatLandsForgetsTheObject", obj: current, remembered: false, recordable: false},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			o := s.obj.DeepCopy()
			o.DeletionTimestamp = current.DeletionTimestamp
			o.Finalizers = nil
			err := c.Update(ctx, o)
			if s.wantErr != nil {
				require.Error(t, err)
				assert.True(t, s.wantErr(err), "unexpected error: %v", err)
			} else {
				require.NoError(t, err)
			}
			_, ok := memory.Load(n.UID)
			assert.Equal(t, s.remembered, ok, "whether the memory still holds the object")
			memory.Store(n.UID, "again")
			_, ok = memory.Load(n.UID)
			assert.Equal(t, s.recordable, ok, "whether the object may be recorded again")
		})
	}
}
