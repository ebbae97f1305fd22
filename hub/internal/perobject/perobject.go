// Package perobject owns what the hub remembers of each Kubernetes object
// between reconciles: the intent last published, the last write made and a
// status write held back, which object a node's report wakes. Every such
// memory is a Map made by the hub's one Owner, and the Owner forgets an
// object's entries in every Map once the object leaves the informer cache.
// A component cannot keep state of an object that outlives the object, so
// there is no forget hook to wire into a controller, and none to miss.
//
// Keys are object uids, which are unique across kinds: a Map may hold
// entries of objects of any kind the Owner watches (a migration's
// notifications are kept under its VM's uid). The hub's Owner watches
// every kind the hub reconciles.
package perobject

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// GoneFor is how long after an object went a Map refuses to record it
// again: a reconcile or a write that was in flight when the object went
// would otherwise record it after it was forgotten, and nothing would
// forget it again. It is far longer than a reconcile takes.
const GoneFor = time.Minute

// Owner forgets what every Map holds of an object once it is gone.
type Owner struct {
	cache cache.Cache
	kinds []client.Object

	mu sync.Mutex
	// forgets drop an object's entries from each memory.
	forgets []func(uid types.UID)
	// gone are the uids forgotten within GoneFor, and when.
	gone      map[types.UID]time.Time
	lastSweep time.Time
	now       func() time.Time
	// watching is closed once Start watches every kind.
	watching chan struct{}
}

// NewOwner returns an Owner of the memory of objects of kinds, which it
// forgets once c's informer sees them deleted, from Start on. With a nil
// cache it forgets only what Forget is told (unit tests).
func NewOwner(c cache.Cache, kinds ...client.Object) *Owner {
	return &Owner{cache: c, kinds: kinds, gone: map[types.UID]time.Time{}, now: time.Now, watching: make(chan struct{})}
}

// Map is one component's memory of objects, by uid. Its zero value is not
// usable: make it with NewMap.
type Map[V any] struct {
	owner *Owner
	m     sync.Map
}

// NewMap returns an empty Map whose entries o forgets once their object is
// gone.
func NewMap[V any](o *Owner) *Map[V] {
	m := &Map[V]{owner: o}
	o.OnForget(m.Delete)
	return m
}

// OnForget makes o call forget with the uid of every object gone, for a
// memory that is no Map (one indexed by name, say). Its maker calls it, once,
// when it makes that memory.
func (o *Owner) OnForget(forget func(uid types.UID)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.forgets = append(o.forgets, forget)
}

// Load returns the entry of uid.
func (m *Map[V]) Load(uid types.UID) (V, bool) {
	return entry[V](m.m.Load(uid))
}

// entry is a stored value as V, or V's zero value when there is none.
func entry[V any](v any, ok bool) (V, bool) {
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true //nolint:forcetypeassert // only Store and LoadOrStore store in a Map
}

// Store makes v the entry of uid, unless the object of uid went within
// GoneFor.
func (m *Map[V]) Store(uid types.UID, v V) {
	m.owner.mu.Lock()
	defer m.owner.mu.Unlock()
	if _, gone := m.owner.gone[uid]; gone {
		return
	}
	m.m.Store(uid, v)
}

// CompareAndDelete deletes the entry of uid if it is old.
func (m *Map[V]) CompareAndDelete(uid types.UID, old V) bool {
	return m.m.CompareAndDelete(uid, old)
}

// LoadAndDelete drops the entry of uid and returns it.
func (m *Map[V]) LoadAndDelete(uid types.UID) (V, bool) {
	return entry[V](m.m.LoadAndDelete(uid))
}

// Delete drops the entry of uid; the object may be recorded again.
func (m *Map[V]) Delete(uid types.UID) { m.m.Delete(uid) }

// Range calls f with every entry, as sync.Map.Range does, until f returns
// false: to find the objects of one namespace among few, say.
func (m *Map[V]) Range(f func(uid types.UID, v V) bool) {
	m.m.Range(func(k, v any) bool {
		return f(k.(types.UID), v.(V)) //nolint:forcetypeassert // only Store stores in a Map
	})
}

// Forget drops what every Map holds of uid, and refuses to record it again
// within GoneFor. The Owner calls it when an object leaves the cache; a
// writer that knows its write ends an object (removing its last finalizer)
// may call it at once.
func (o *Owner) Forget(uid types.UID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, forget := range o.forgets {
		forget(uid)
	}
	now := o.now()
	o.gone[uid] = now
	if now.Sub(o.lastSweep) < GoneFor/4 {
		return
	}
	o.lastSweep = now
	for u, at := range o.gone {
		if now.Sub(at) > GoneFor {
			delete(o.gone, u)
		}
	}
}

// Start forgets every object of the Owner's kinds once its informer sees
// it deleted (its last finalizer removed, or a relist that no longer finds
// it), until ctx is done. It is a manager.Runnable, and runs on every
// replica: a replica that is not the leader remembers nothing, and one that
// was must forget. It watches each kind without waiting for its informer to
// sync, so no deletion can fall between an informer's start and the watch.
func (o *Owner) Start(ctx context.Context) error {
	if o.cache == nil {
		close(o.watching)
		<-ctx.Done()
		return nil
	}
	for _, k := range o.kinds {
		inf, err := o.cache.GetInformer(ctx, k, cache.BlockUntilSynced(false))
		if err != nil {
			return errors.Wrapf(err, "cannot watch %T to forget what the hub remembers of them", k)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: o.deleted}); err != nil {
			return errors.Wrapf(err, "cannot watch %T to forget what the hub remembers of them", k)
		}
	}
	close(o.watching)
	<-ctx.Done()
	return nil
}

// Watching is closed once Start watches every kind: from then on, no
// deletion of an object of them goes unseen.
func (o *Owner) Watching() <-chan struct{} { return o.watching }

// NeedLeaderElection implements manager.LeaderElectionRunnable: see Start.
func (o *Owner) NeedLeaderElection() bool { return false }

// deleted forgets a deleted object, also one the informer only learnt was
// deleted from a relist (a tombstone).
func (o *Owner) deleted(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if m, ok := obj.(interface{ GetUID() types.UID }); ok {
		o.Forget(m.GetUID())
	}
}
