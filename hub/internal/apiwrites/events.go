package apiwrites

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/virtfleet/virtfleet/internal/metrics"
)

// DefaultNormalEventsPerSecond is the hub's budget of Normal events: a
// steady trickle, which a user applying VMs by hand never exhausts.
const DefaultNormalEventsPerSecond = 5

// EventBudget is the hub's budget of Normal events, shared by every
// recorder of a manager that ForManager wraps with it.
type EventBudget struct {
	// Limiter accepts a Normal event, or refuses it when the budget is
	// spent.
	Limiter flowcontrol.PassiveRateLimiter
	// Always are the reasons of the Normal events recorded whatever is
	// left of the budget: what the hub did to a VM on its own, which is
	// rare, happens when much else does (a node lost takes its VMs
	// elsewhere at once), and is what an operator looks for afterwards.
	Always []string
}

// NewEventBudget returns a budget of perSecond Normal events with bursts of
// ten times as many, beyond which only the reasons always are recorded.
func NewEventBudget(perSecond float64, always ...string) *EventBudget {
	return &EventBudget{Limiter: flowcontrol.NewTokenBucketPassiveRateLimiter(float32(perSecond), max(1, int(10*perSecond))), Always: always}
}

// Budget returns r recording Normal events only within budget (see
// budgeted); a nil budget returns r as it is.
func Budget(r record.EventRecorder, budget *EventBudget) record.EventRecorder {
	if budget == nil {
		return r
	}
	return &budgeted{EventRecorder: r, budget: budget}
}

// budgeted is an event recorder that records Warning events and the
// budget's Always reasons always, and other Normal events within a budget
// shared by every controller of the hub; Normal events beyond it are
// dropped and counted (virtfleet_hub_events_dropped_total).
//
// Every Kubernetes event is a write (a POST, or a PATCH when the recorder
// folds repeats). A VM records several Normal events on its way to Running
// (crossplane-runtime's CreatedExternalResource, Scheduled, Started), each
// saying what its status already says, so in a burst of creates they
// would cost more writes than the VM itself. Within the budget a user
// still sees them for the VMs they apply by hand; a burst spends the
// budget and writes no more of them. A Warning is what a user must act
// on: it is never dropped here. (client-go's recorder has its own spam
// filter, per object and reason, which never trips in a burst: every VM
// is another object.)
type budgeted struct {
	record.EventRecorder
	budget *EventBudget
}

// spend says whether an event of type eventtype may be recorded, and counts
// it as dropped if not.
func (r *budgeted) spend(eventtype, reason string) bool {
	if eventtype == corev1.EventTypeWarning || slices.Contains(r.budget.Always, reason) || r.budget.Limiter.TryAccept() {
		return true
	}
	metrics.EventsDropped.WithLabelValues(reason).Inc()
	return false
}

func (r *budgeted) Event(obj runtime.Object, eventtype, reason, message string) {
	if r.spend(eventtype, reason) {
		r.EventRecorder.Event(obj, eventtype, reason, message)
	}
}

func (r *budgeted) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	if r.spend(eventtype, reason) {
		r.EventRecorder.Eventf(obj, eventtype, reason, format, args...)
	}
}

func (r *budgeted) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, format string, args ...any) {
	if r.spend(eventtype, reason) {
		r.EventRecorder.AnnotatedEventf(obj, annotations, eventtype, reason, format, args...)
	}
}
