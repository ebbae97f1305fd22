// Package wake turns what the nodes report into reconciles: a Notifier
// queues the reconcile of the object a report is about the moment the
// report changes, so status never waits for a poll.
package wake

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// Notifier turns "the report of guest uid changed" (fleet.Fleet.Guests)
// into a reconcile of its VirtualMachine, so status follows the node at once
// instead of at the next poll. It learns which VM a uid belongs to when the VM is reconciled; a
// report for a VM not reconciled since the hub started is picked up by the
// reconcile every VM gets at start. NewNotifierFor makes one for another
// kind whose objects nodes report on (Volumes).
type Notifier struct {
	newObject func() client.Object
	// keys name the object of each uid; their owner forgets an object's
	// once it is gone.
	keys    *perobject.Map[types.NamespacedName]
	pending sync.Map // uid -> struct{}: a NotifyAfter timer is running
	events  chan ctrlevent.GenericEvent
	// onSync are the uids NotifyOnSync holds, by fleet, and subscribed the
	// fleets it listens to.
	onSync     sync.Map // syncWait -> struct{}
	subscribed sync.Map // *fleet.Fleet -> struct{}
}

// syncWait is one uid waiting for its fleet's watch to catch up.
type syncWait struct {
	fleet *fleet.Fleet
	uid   string
}

// NewNotifier returns a Notifier of VirtualMachines with room for a burst of
// changes, whose memory memory owns.
func NewNotifier(memory *perobject.Owner) *Notifier {
	return NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachine{} })
}

// NewNotifierFor returns a Notifier of the kind newObject makes.
func NewNotifierFor(memory *perobject.Owner, newObject func() client.Object) *Notifier {
	return &Notifier{newObject: newObject, keys: perobject.NewMap[types.NamespacedName](memory), events: make(chan ctrlevent.GenericEvent, 8192)}
}

// Remember records which object uid names; call it whenever o is reconciled.
func (n *Notifier) Remember(o client.Object) {
	n.keys.Store(o.GetUID(), types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()})
}

// RememberAs records that reports about uid concern o, an object other than
// the one of that uid (a migration of the VM uid). It is forgotten with the
// object of uid.
func (n *Notifier) RememberAs(uid string, o client.Object) {
	n.keys.Store(types.UID(uid), types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()})
}

// Source is the controller source the notifications arrive on, queued at
// Priority.
func (n *Notifier) Source() source.Source {
	return source.Channel(n.events, handler.Funcs{GenericFunc: enqueueFirst})
}

// Priority is the priority of the reconciles a Notifier queues in a
// controller's priority queue, above the default of the API server's
// events. A node's report finishes work: it turns into the status of a VM
// that now runs. In a burst the placement loop binds VMs to nodes faster
// than the API server takes their writes, and the controller's queue fills
// with VMs just placed, whose intents are published next; served in the
// order they came, a report waited behind all of them, and the burst
// advanced in waves: seconds in which no VM reached Running while hundreds
// waited, then hundreds at once. Served first, the VMs the nodes run are
// told as they run, and new work waits instead.
const Priority = 10

// enqueueFirst queues the reconcile of e's object at Priority, or plainly
// in a queue without priorities.
func enqueueFirst(_ context.Context, e ctrlevent.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: e.Object.GetNamespace(), Name: e.Object.GetName()}}
	if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
		pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(Priority)}, req)
		return
	}
	q.Add(req)
}

// Notify queues a reconcile of the object of uid. It never blocks the watch that
// calls it: when the queue is full the change waits for the next poll.
func (n *Notifier) Notify(uid string) {
	key, ok := n.keys.Load(types.UID(uid))
	if !ok {
		return
	}
	obj := n.newObject()
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	select {
	case n.events <- ctrlevent.GenericEvent{Object: obj}:
	default:
	}
}

// NotifyAfter notifies uid once d has passed; while one such notification is
// pending, further calls for uid add none.
func (n *Notifier) NotifyAfter(uid string, d time.Duration) {
	n.NotifyAfterIf(uid, d, func() bool { return true })
}

// NotifyAfterIf is NotifyAfter for a reconcile that may turn out not to be
// needed: once d has passed, it notifies uid only if still() says so.
func (n *Notifier) NotifyAfterIf(uid string, d time.Duration, still func() bool) {
	if _, pending := n.pending.LoadOrStore(uid, struct{}{}); pending {
		return
	}
	time.AfterFunc(d, func() {
		n.pending.Delete(uid)
		if still() {
			n.Notify(uid)
		}
	})
}

// NotifyOnSync notifies uid once f's report watch has caught up with the
// NATS server again (fleet.Fleet.SubscribeSynced): a reconcile that failed
// writing to the bus while the server was away is retried as soon as it is
// back, not when its backoff (up to apiwrites.MaxDelay) happens to expire.
func (n *Notifier) NotifyOnSync(f *fleet.Fleet, uid string) {
	n.onSync.Store(syncWait{fleet: f, uid: uid}, struct{}{})
	if _, subscribed := n.subscribed.LoadOrStore(f, struct{}{}); !subscribed {
		f.SubscribeSynced(func() { n.synced(f) })
	}
}

// synced notifies, once, every uid waiting for f.
func (n *Notifier) synced(f *fleet.Fleet) {
	n.onSync.Range(func(k, _ any) bool {
		if w := k.(syncWait); w.fleet == f { //nolint:forcetypeassert // only NotifyOnSync stores here
			n.onSync.Delete(w)
			n.Notify(w.uid)
		}
		return true
	})
}
