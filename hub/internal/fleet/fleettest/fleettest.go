// Package fleettest serves the hub's controller tests: a fleet.Fleet over an
// in-memory bus.Fake, and an event recorder. Test code only.
package fleettest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// Start runs a Fleet over b until the test ends, and returns it once its
// watches deliver.
func Start(t *testing.T, b *bus.Fake) *fleet.Fleet {
	t.Helper()
	f := fleet.New(b, logging.NewNopLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// A lost node and a volume report of nobody's mark that the node and
	// report watches are in place; the hub's records answer once the
	// intents bucket was read.
	b.SetNode(bus.NodeEvent{Node: "sentinel", Lost: true})
	bus.SetValue(b, wire.VolumeReports, "sentinel", "sentinel", wire.VolumeReport{UID: "sentinel"})
	require.Eventually(t, func() bool {
		_, ok := f.Volumes.Report("sentinel", "sentinel")
		_, err := f.Held("sentinel")
		return ok && f.Node("sentinel").Lost && err == nil
	}, 5*time.Second, time.Millisecond)
	return f
}

// Recorder is an event.Recorder that keeps what it records.
type Recorder struct {
	mu     sync.Mutex
	events []event.Event
}

var _ event.Recorder = (*Recorder)(nil)

// Event implements event.Recorder.
func (r *Recorder) Event(_ runtime.Object, e event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// WithAnnotations implements event.Recorder.
func (r *Recorder) WithAnnotations(...string) event.Recorder { return r }

// Events are the events recorded so far, oldest first.
func (r *Recorder) Events() []event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event.Event(nil), r.events...)
}

// AssertWarning asserts that r recorded only Warning events, and one with
// reason want, or none when want is empty; it returns them for further
// checks.
func (r *Recorder) AssertWarning(t *testing.T, want event.Reason) []event.Event {
	t.Helper()
	got := r.Events()
	var reasons []event.Reason
	for _, e := range got {
		assert.Equal(t, event.TypeWarning, e.Type, "event %s", e.Reason)
		reasons = append(reasons, e.Reason)
	}
	if want == "" {
		assert.Empty(t, reasons)
	} else {
		assert.Equal(t, []event.Reason{want}, reasons)
	}
	return got
}

// AssertWakeUp asserts that wakeUps (see WakeUps) delivers a reconcile of
// key within a second if want, and none otherwise.
func AssertWakeUp(t *testing.T, wakeUps <-chan reconcile.Request, want bool, key types.NamespacedName) {
	t.Helper()
	select {
	case req := <-wakeUps:
		assert.True(t, want, "unexpected wake-up %v", req)
		assert.Equal(t, key, req.NamespacedName)
	case <-time.After(time.Second):
		assert.False(t, want, "no wake-up of %s", key)
	}
}

// WakeUps delivers the reconciles n asks for to the returned channel until
// the test ends, as a controller watching n.Source would receive them.
func WakeUps(t *testing.T, n *wake.Notifier) <-chan reconcile.Request {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	require.NoError(t, n.Source().Start(ctx, q))
	out := make(chan reconcile.Request, 8)
	go func() {
		for {
			req, shutdown := q.Get()
			if shutdown {
				return
			}
			out <- req
			q.Done(req)
		}
	}()
	t.Cleanup(func() { cancel(); q.ShutDown() })
	return out
}
