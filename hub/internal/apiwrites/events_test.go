package apiwrites

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// TestBudgetRecordsWarningsAlwaysAndNormalEventsWithinTheBudget pins what a
// burst does to events: Normal events pass until the budget's burst is
// spent, then are dropped and counted by reason until the budget refills;
// Warnings and the budget's Always reasons pass whatever is left of it.
func TestBudgetRecordsWarningsAlwaysAndNormalEventsWithinTheBudget(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	// One Normal event a second, bursts of two.
	budget := &EventBudget{Limiter: flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(1, 2, clock), Always: []string{"RestartedElsewhere"}}
	sink := record.NewFakeRecorder(100)
	r := Budget(sink, budget)
	vm := &v1alpha1.VirtualMachine{}
	dropped := func(reason string) float64 { return testutil.ToFloat64(metrics.EventsDropped.WithLabelValues(reason)) }
	before := dropped("Started")

	steps := []struct {
		name     string
		record   func()
		want     string
		recorded bool
	}{
		{name: "FirstNormalPasses", record: func() { r.Event(vm, corev1.EventTypeNormal, "Started", "one") }, want: "Normal Started one", recorded: true},
		{name: "SecondNormalPassesWithinTheBurst", record: func() { r.Eventf(vm, corev1.EventTypeNormal, "Started", "%s", "two") }, want: "Normal Started two", recorded: true},
		{name: "ThirdNormalIsDropped", record: func() { r.Event(vm, corev1.EventTypeNormal, "Started", "three") }},
		{name: "AWarningPassesAnyway", record: func() { r.Event(vm, corev1.EventTypeWarning, "NodeLost", "lost") }, want: "Warning NodeLost lost", recorded: true},
		{name: "ANormalOfAnAlwaysReasonPassesAnyway", record: func() { r.Event(vm, corev1.EventTypeNormal, "RestartedElsewhere", "moved") }, want: "Normal RestartedElsewhere moved", recorded: true},
		{name: "AnAnnotatedNormalIsDropped", record: func() { r.AnnotatedEventf(vm, nil, corev1.EventTypeNormal, "Started", "%s", "four") }},
		{name: "ASecondLaterOneMorePasses", record: func() { clock.Step(time.Second); r.Event(vm, corev1.EventTypeNormal, "Started", "five") }, want: "Normal Started five", recorded: true},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.record()
			select {
			case got := <-sink.Events:
				assert.True(t, s.recorded, "recorded %q", got)
				assert.Equal(t, s.want, got)
			default:
				assert.False(t, s.recorded, "nothing was recorded")
			}
		})
	}
	assert.Equal(t, 2.0, dropped("Started")-before, "the dropped events are counted by reason")
}

// TestNoBudgetRecordsEverything pins that a nil budget (the hub's
// --normal-events-per-second below 0) leaves the recorder as it is.
func TestNoBudgetRecordsEverything(t *testing.T) {
	sink := record.NewFakeRecorder(1)
	assert.Same(t, record.EventRecorder(sink), Budget(sink, nil))
}
