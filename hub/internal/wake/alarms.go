package wake

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// Alarms wake objects at times of their own on a clock a test can step
// (a backup schedule at its next due time, a location at its next garbage
// collection), where a RequeueAfter would wait on the wall clock. Each
// object has at most one alarm; setting another replaces it.
type Alarms struct {
	clock  clock.WithDelayedExecution
	timers *perobject.Map[clock.Timer]
	events chan ctrlevent.GenericEvent
}

// NewAlarms returns Alarms on c whose memory memory owns: an object's
// alarm is stopped once it is gone.
func NewAlarms(memory *perobject.Owner, c clock.WithDelayedExecution) *Alarms {
	a := &Alarms{clock: c, events: make(chan ctrlevent.GenericEvent, 1024)}
	// Registered before the Map, so that it runs before the Map forgets.
	memory.OnForget(func(uid types.UID) {
		if t, ok := a.timers.Load(uid); ok {
			t.Stop()
		}
	})
	a.timers = perobject.NewMap[clock.Timer](memory)
	return a
}

// Source is the controller source the alarms arrive on.
func (a *Alarms) Source() source.Source {
	return source.Channel(a.events, &handler.EnqueueRequestForObject{})
}

// Set wakes o at the time at, or at once if that has passed, instead of
// when any earlier alarm of o said.
func (a *Alarms) Set(o client.Object, at time.Time) {
	key := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: o.GetNamespace(), Name: o.GetName()}}
	ring := func() {
		select {
		case a.events <- ctrlevent.GenericEvent{Object: key}:
		default:
			// The queue is full: the object's next reconcile, from its
			// watch or resync, sets the alarm again.
		}
	}
	if old, ok := a.timers.LoadAndDelete(o.GetUID()); ok {
		old.Stop()
	}
	d := at.Sub(a.clock.Now())
	if d <= 0 {
		// A fake clock fires a timer only when it is moved.
		ring()
		return
	}
	a.timers.Store(o.GetUID(), a.clock.AfterFunc(d, ring))
}
