package virtualmachine

import (
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// Notifier turns "the report of guest uid changed" into a reconcile of its
// VirtualMachine, so status follows the node at once instead of at the next
// poll. It learns which VM a uid belongs to when the VM is reconciled; a
// report for a VM not reconciled since the hub started is picked up by the
// reconcile every VM gets at start.
type Notifier struct {
	keys    sync.Map // uid -> types.NamespacedName
	pending sync.Map // uid -> struct{}: a NotifyAfter timer is running
	// unplaced are the VMs waiting for a node with room.
	unplaced sync.Map // uid -> struct{}
	events   chan ctrlevent.GenericEvent
}

// NewNotifier returns a Notifier with room for a burst of changes.
func NewNotifier() *Notifier {
	return &Notifier{events: make(chan ctrlevent.GenericEvent, 8192)}
}

func (n *Notifier) remember(vm *v1alpha1.VirtualMachine) {
	n.keys.Store(string(vm.UID), types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name})
}

// Notify queues a reconcile of the VM of uid. It never blocks the watch that
// calls it: when the queue is full the change waits for the next poll.
func (n *Notifier) Notify(uid string) {
	v, ok := n.keys.Load(uid)
	if !ok {
		return
	}
	key := v.(types.NamespacedName) //nolint:forcetypeassert // only remember stores here
	obj := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case n.events <- ctrlevent.GenericEvent{Object: client.Object(obj)}:
	default:
	}
}

// NotifyUnplaced notifies every VM still waiting for a node, when one joins.
func (n *Notifier) NotifyUnplaced(string) {
	n.unplaced.Range(func(uid, _ any) bool {
		n.Notify(uid.(string)) //nolint:forcetypeassert // only strings are stored
		return true
	})
}

func (n *Notifier) placed(uid string, placed bool) {
	if placed {
		n.unplaced.Delete(uid)
		return
	}
	n.unplaced.Store(uid, struct{}{})
}

// NotifyAfter notifies uid once d has passed; while one such notification is
// pending, further calls for uid add none.
func (n *Notifier) NotifyAfter(uid string, d time.Duration) {
	if _, pending := n.pending.LoadOrStore(uid, struct{}{}); pending {
		return
	}
	time.AfterFunc(d, func() {
		n.pending.Delete(uid)
		n.Notify(uid)
	})
}

func now() metav1.Time { return metav1.Now() }
