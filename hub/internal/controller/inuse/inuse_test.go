package inuse

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// usesVolumes is a VirtualMachine's use of Volumes, as the index package
// describes it (which imports this one, so cannot serve here): those it
// attaches, then those its guest still holds.
var usesVolumes = User{
	Kind:    v1alpha1.VirtualMachineKind,
	New:     func() client.Object { return &v1alpha1.VirtualMachine{} },
	NewList: func() client.ObjectList { return &v1alpha1.VirtualMachineList{} },
	Index:   "spec.forProvider.diskAttachments.name+status.atProvider.disks",
	Uses: func(o client.Object) []string {
		vm := o.(*v1alpha1.VirtualMachine) //nolint:forcetypeassert // indexed type
		var out []string
		for _, a := range vm.Spec.ForProvider.DiskAttachments {
			out = append(out, string(a.Name))
		}
		for _, d := range vm.Status.AtProvider.Disks {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
		return out
	},
}

// release is a Kind.Release that answers released and err, counting calls.
type release struct {
	released bool
	err      error
	calls    int
}

func (r *release) Release(context.Context, *v1alpha1.Volume) (bool, error) {
	r.calls++
	return r.released, r.err
}

// testExternal is the inuse client of Volumes used by the VMs named in
// users, each attaching the Volume "data"; rel, if set, is its Release.
func testExternal(t *testing.T, rel *release, users ...string) (*external[*v1alpha1.Volume], *fleettest.Recorder) {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	objs := []client.Object{}
	for _, u := range users {
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: u}}
		vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "data"}}
		objs = append(objs, vm)
	}
	// A VM of another namespace attaching a Volume of the same name is no user.
	other := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Name: "z"}}
	other.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "data"}}
	kube := fake.NewClientBuilder().WithScheme(s).WithIndex(&v1alpha1.VirtualMachine{}, usesVolumes.Index, usesVolumes.Uses).
		WithObjects(append(objs, other)...).Build()
	k := Kind[*v1alpha1.Volume]{
		GroupKind:        v1alpha1.VolumeGroupKind,
		GroupVersionKind: v1alpha1.VolumeGroupVersionKind,
		New:              func() *v1alpha1.Volume { return &v1alpha1.Volume{} },
		User:             usesVolumes,
		Observe: func(_ context.Context, _ client.Reader, v *v1alpha1.Volume, users Users) (xpv2.Condition, error) {
			v.Status.AtProvider.AttachedTo = users.Names()
			return xpv2.Available(), nil
		},
	}
	if rel != nil {
		k.Release = rel.Release
	}
	rec := &fleettest.Recorder{}
	return &external[*v1alpha1.Volume]{kube: kube, kind: k, recorder: rec, released: perobject.NewMap[struct{}](perobject.NewOwner(nil)), settles: &settles{},
		finalize: make(chan ctrlevent.GenericEvent, 1)}, rec
}

// many is n user names, in the order Users sorts them.
func many(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("vm-%03d", i)
	}
	return names
}

func volume(deleted bool) *v1alpha1.Volume {
	v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "data", UID: "vol-uid"}}
	if deleted {
		now := metav1.Now()
		v.DeletionTimestamp = &now
	}
	return v
}

func TestObserve(t *testing.T) {
	cases := map[string]struct {
		users   []string
		deleted bool
		// rel is the Kind's Release; released is whether a Delete
		// released the Volume before this Observe.
		rel      *release
		released bool

		wantExists   bool
		wantInUse    xpv2.Condition
		wantAttached []string
	}{
		"AnUnusedResourceExistsUnusedAndReady": {
			wantExists:   true,
			wantAttached: []string{},
			wantInUse:    xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionFalse, Reason: "Unused"},
		},
		"AUsedResourceNamesItsUsersSorted": {
			users:        []string{"b", "a"},
			wantExists:   true,
			wantInUse:    xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionTrue, Reason: "UsedByVirtualMachines", Message: "used by VirtualMachine a, b"},
			wantAttached: []string{"a", "b"},
		},
		"AResourceOfManyUsersNamesTheFirstAndCountsTheRest": {
			users:        many(25),
			wantExists:   true,
			wantInUse:    xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionTrue, Reason: "UsedByVirtualMachines", Message: "used by VirtualMachine " + strings.Join(many(20), ", ") + " and 5 more"},
			wantAttached: many(25), // the Kind's Observe decides what its status lists
		},
		"ADeletedResourceStillUsedExists": {
			users: []string{"a"}, deleted: true,
			wantExists: true,
			wantInUse:  xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionTrue, Reason: "UsedByVirtualMachines", Message: "used by VirtualMachine a"},
		},
		"ADeletedResourceNoLongerUsedIsGoneWithNothingToRelease": {
			deleted:    true,
			wantExists: false,
			wantInUse:  xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionFalse, Reason: "Unused"},
		},
		"ADeletedUnusedResourceExistsUntilReleased": {
			deleted: true, rel: &release{},
			wantExists: true,
			wantInUse:  xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionFalse, Reason: "Unused"},
		},
		"ADeletedUnusedResourceIsGoneOnceReleased": {
			deleted: true, rel: &release{released: true}, released: true,
			wantExists: false,
			wantInUse:  xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionFalse, Reason: "Unused"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e, _ := testExternal(t, tc.rel, tc.users...)
			v := volume(tc.deleted)
			if tc.released {
				_, err := e.Delete(context.Background(), v)
				require.NoError(t, err)
			}

			obs, err := e.Observe(context.Background(), v)

			require.NoError(t, err)
			assert.Equal(t, tc.wantExists, obs.ResourceExists, "exists")
			inUse := v.GetCondition(TypeInUse)
			inUse.LastTransitionTime = metav1.Time{}
			assert.Equal(t, tc.wantInUse, inUse)
			if !tc.deleted {
				assert.True(t, obs.ResourceUpToDate)
				assert.Equal(t, corev1.ConditionTrue, v.GetCondition(xpv2.TypeReady).Status, "the Kind's Observe gives Ready")
				assert.Equal(t, tc.wantAttached, v.Status.AtProvider.AttachedTo)
			}
		})
	}
}

func TestDelete(t *testing.T) {
	boom := errors.New("boom")
	cases := map[string]struct {
		users []string
		rel   *release

		wantErr          string
		wantEvent        event.Reason
		wantReleaseCalls int
		// wantReleased is also whether the resource is reconciled again at
		// once, to be finalized.
		wantReleased bool
	}{
		"AUsedResourceIsRefusedWithAWarningNamingItsUsers": {
			users: []string{"a"}, rel: &release{released: true},
			wantErr:   "Volume data is used by VirtualMachine a: it is deleted once they no longer use it",
			wantEvent: ReasonDeletionBlocked,
		},
		"AResourceOfManyUsersIsRefusedNamingTheFirstAndCountingTheRest": {
			users:     many(MaxNamed + 1),
			wantErr:   "Volume data is used by VirtualMachine " + strings.Join(many(MaxNamed), ", ") + " and 1 more: it is deleted once they no longer use it",
			wantEvent: ReasonDeletionBlocked,
		},
		"AnUnusedResourceWithNothingToReleaseGoes": {},
		"AnUnusedResourceIsReleased": {
			rel:              &release{released: true},
			wantReleaseCalls: 1, wantReleased: true,
		},
		"AReleaseThatWaitsIsNotReleasedYet": {
			rel:              &release{},
			wantReleaseCalls: 1,
		},
		"AReleaseErrorIsReturned": {
			rel:              &release{err: boom},
			wantErr:          "boom",
			wantReleaseCalls: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e, rec := testExternal(t, tc.rel, tc.users...)
			v := volume(true)

			_, err := e.Delete(context.Background(), v)

			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
				assert.Equal(t, xpv2.Deleting().Reason, v.GetCondition(xpv2.TypeReady).Reason)
			}
			rec.AssertWarning(t, tc.wantEvent)
			if tc.rel != nil {
				assert.Equal(t, tc.wantReleaseCalls, tc.rel.calls, "Release calls")
			}
			_, released := e.released.Load(v.GetUID())
			assert.Equal(t, tc.wantReleased, released, "remembered as released")
			if !tc.wantReleased {
				assert.Empty(t, e.finalize, "no reconcile to finalize what is not released")
				return
			}
			require.Len(t, e.finalize, 1, "a released resource is reconciled again at once, not after its backoff")
			again := <-e.finalize
			assert.Equal(t, client.ObjectKeyFromObject(v), client.ObjectKeyFromObject(again.Object))
		})
	}
}

// TestAUserChangeWakesWhatItUsedAndWhatItUses pins that a VM that swaps one
// Volume for another wakes both, after userSettle.
func TestAUserChangeWakesWhatItUsedAndWhatItUses(t *testing.T) {
	vm := func(disk string) *v1alpha1.VirtualMachine {
		m := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "a"}}
		m.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(disk)}}
		return m
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(q.ShutDown)
	h := enqueueAfter((&settles{}).of, func(_ context.Context, o client.Object) []string { return usesVolumes.Uses(o) }, func(context.Context, reconcile.Request) bool { return true })

	start := time.Now()
	h.Update(context.Background(), ctrlevent.UpdateEvent{ObjectOld: vm("old"), ObjectNew: vm("new")}, q)

	var got []string
	for range 2 {
		r, _ := q.Get()
		got = append(got, r.Name)
		assert.Equal(t, "team", r.Namespace)
		q.Done(r)
	}
	assert.ElementsMatch(t, []string{"old", "new"}, got)
	assert.GreaterOrEqual(t, time.Since(start), userSettle, "the reconciles wait for the user's own writes to settle")
}

// TestANewUserWakesWhatItWillNotBind pins Kind.AwaitsBinding: a created VM
// does not wake a Volume its placement will bind (that write wakes it), and
// wakes every other one as before.
func TestANewUserWakesWhatItWillNotBind(t *testing.T) {
	bound := func(v *v1alpha1.Volume) *v1alpha1.Volume {
		v.Annotations = map[string]string{v1alpha1.AnnotationNode: "node1"}
		return v
	}
	withFinalizer := func(v *v1alpha1.Volume) *v1alpha1.Volume {
		v.Finalizers = []string{"keep"}
		return v
	}
	cases := map[string]struct {
		volume        *v1alpha1.Volume // nil: not in the cache
		awaitsBinding bool             // whether the Kind has the hook
		woken         bool
	}{
		"UnboundAwaitsItsBinding":          {volume: volume(false), awaitsBinding: true},
		"BoundIsWoken":                     {volume: bound(volume(false)), awaitsBinding: true, woken: true},
		"DeletedIsWoken":                   {volume: withFinalizer(volume(true)), awaitsBinding: true, woken: true},
		"NotInTheCacheIsWoken":             {awaitsBinding: true, woken: true},
		"KindWithoutTheHookWakesEveryTime": {volume: volume(false), woken: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := runtime.NewScheme()
			require.NoError(t, apis.AddToScheme(s))
			b := fake.NewClientBuilder().WithScheme(s)
			if tc.volume != nil {
				b = b.WithObjects(tc.volume)
			}
			k := Kind[*v1alpha1.Volume]{New: func() *v1alpha1.Volume { return &v1alpha1.Volume{} }}
			if tc.awaitsBinding {
				k.AwaitsBinding = func(v *v1alpha1.Volume) bool { return v.GetAnnotations()[v1alpha1.AnnotationNode] == "" }
			}
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			t.Cleanup(q.ShutDown)
			h := enqueueAfter(func(reconcile.Request) time.Duration { return 0 }, func(_ context.Context, o client.Object) []string { return usesVolumes.Uses(o) }, k.bindingWakes(b.Build()))

			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "a"}}
			vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "data"}}
			// With no settle time, a wake is queued at once.
			h.Create(context.Background(), ctrlevent.CreateEvent{Object: vm}, q)
			assert.Equal(t, tc.woken, q.Len() == 1, "queued reconciles: %d", q.Len())
		})
	}
}

// TestOwnStatusWritesWakeNothing: a resource's controller is not woken by
// its own status writes, and is by every other change of the resource.
func TestOwnStatusWritesWakeNothing(t *testing.T) {
	base := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db", Generation: 1, ResourceVersion: "1",
		Finalizers: []string{"finalizer.managedresource.crossplane.io"}, Annotations: map[string]string{"a": "b"}}}
	for _, tc := range []struct {
		name   string
		change func(*v1alpha1.VirtualNetwork)
		wakes  bool
	}{
		{"its status written", func(n *v1alpha1.VirtualNetwork) { n.Status.AtProvider.AttachedCount = 7 }, false},
		{"nothing changed (an informer's resync)", func(*v1alpha1.VirtualNetwork) {}, false},
		{"its spec changed", func(n *v1alpha1.VirtualNetwork) { n.Generation = 2 }, true},
		{"an annotation set (a Volume's binding)", func(n *v1alpha1.VirtualNetwork) { n.Annotations["virtfleet.io/node"] = "node1" }, true},
		{"a label set", func(n *v1alpha1.VirtualNetwork) { n.Labels = map[string]string{"tier": "db"} }, true},
		{"its finalizer removed", func(n *v1alpha1.VirtualNetwork) { n.Finalizers = nil }, true},
		{"deleted", func(n *v1alpha1.VirtualNetwork) { now := metav1.Now(); n.DeletionTimestamp = &now }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := base.DeepCopy()
			next.ResourceVersion = "2"
			tc.change(next)
			assert.Equal(t, tc.wakes, beyondStatus.Update(ctrlevent.UpdateEvent{ObjectOld: base, ObjectNew: next}))
		})
	}
	assert.True(t, beyondStatus.Create(ctrlevent.CreateEvent{Object: base}), "a resource seen first is reconciled")
	assert.True(t, beyondStatus.Delete(ctrlevent.DeleteEvent{Object: base}))
}

// TestAResourceWithManyUsersWaitsLonger: the wait after a change of a
// resource's users grows with their number once listing them costs more
// than userSettle is worth, and falls back when they go.
func TestAResourceWithManyUsersWaitsLonger(t *testing.T) {
	s := &settles{}
	key := types.NamespacedName{Namespace: "team", Name: "fleet-net"}
	other := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "data"}}
	for _, tc := range []struct {
		name  string
		users int
		want  time.Duration
	}{
		{"never reconciled", -1, userSettle},
		{"a few users", 3, userSettle},
		{"as many as userSettle covers", int(userSettle / perUserSettle), userSettle},
		{"ten thousand", 10000, 10000 * perUserSettle},
		{"down to a few again", 2, userSettle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.users >= 0 {
				s.record(key, tc.users)
			}
			assert.Equal(t, tc.want, s.of(reconcile.Request{NamespacedName: key}))
			assert.Equal(t, userSettle, s.of(other), "another resource keeps its own wait")
		})
	}
	n := 0
	s.m.Range(func(any, any) bool { n++; return true })
	assert.Zero(t, n, "nothing held once no resource has many users")
}

// TestObserveCountsTheUsersForTheWait: a reconcile notes how many users the
// resource has, which sets how long it waits after their next change.
func TestObserveCountsTheUsersForTheWait(t *testing.T) {
	users := int(userSettle/perUserSettle) + 500
	e, _ := testExternal(t, nil, many(users)...)
	_, err := e.Observe(context.Background(), volume(false))
	require.NoError(t, err)
	assert.Equal(t, time.Duration(users)*perUserSettle, e.settles.of(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "data"}}))
}

// TestAUserOnANodeWakesWhatItUses: a user's status writes wake nothing it
// uses, except, for a kind that says where its objects are, a change of
// node; a change of what it uses always does.
func TestAUserOnANodeWakesWhatItUses(t *testing.T) {
	onNode := usesVolumes
	onNode.Node = func(o client.Object) string { return o.(*v1alpha1.VirtualMachine).Status.AtProvider.Node } //nolint:forcetypeassert // VMs only
	// Its guest still holds data, which its spec no longer attaches.
	base := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "a", Generation: 1}}
	base.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
	base.Status.AtProvider.Disks = []string{"root", "data"}
	for _, tc := range []struct {
		name                string
		change              func(*v1alpha1.VirtualMachine)
		withNode, withoutIt bool
	}{
		{"placed on its first node", func(vm *v1alpha1.VirtualMachine) { vm.Status.AtProvider.Node = "node1" }, true, false},
		{"another status write", func(vm *v1alpha1.VirtualMachine) { vm.Status.AtProvider.Phase = v1alpha1.PhaseRunning }, false, false},
		{"what it uses changed", func(vm *v1alpha1.VirtualMachine) { vm.Generation = 2 }, true, true},
		{"its guest let a disk go (a status write)", func(vm *v1alpha1.VirtualMachine) { vm.Status.AtProvider.Disks = []string{"root"} }, true, true},
		{"its status lists its disks in another order", func(vm *v1alpha1.VirtualMachine) { vm.Status.AtProvider.Disks = []string{"data", "root"} }, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := base.DeepCopy()
			tc.change(next)
			e := ctrlevent.UpdateEvent{ObjectOld: base, ObjectNew: next}
			assert.Equal(t, tc.withNode, onNode.changes().Update(e), "a kind with Node")
			assert.Equal(t, tc.withoutIt, usesVolumes.changes().Update(e), "a kind without")
		})
	}
}
