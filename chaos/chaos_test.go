package main

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/virtfleet/virtfleet/chaos/internal/chaos"
)

// TestShortChaos is `make chaos` small enough for `make test`: a few dozen
// VMs, a third of them HA, one fault of each kind (with one NATS server, so
// the partition too). It fails if a VM is lost, a guest duplicated or
// orphaned, a VM runs on two nodes at once, the fleet does not converge
// within 30 s of a restart, a node's loss does not show within 15 s, or a
// lost node's HA VMs do not run elsewhere within 60 s at p95.
func TestShortChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	ctrl.SetLogger(logr.Discard())
	o := chaos.Defaults()
	o.VMs, o.OpsPerSecond = 24, 6
	// With half of them stopped by the churn at any time, enough HA VMs
	// that a node has some running to measure.
	o.HAVMs = 8
	o.Down, o.ChurnBetween = 2*time.Second, 3*time.Second
	// The loss of a node must still show within 15 s; a shorter TTL only
	// makes the agent's kill cost less of the test's time.
	o.NodeTTL = 5 * time.Second
	o.Progress = testWriter{t}
	// The logs are kept only when the run fails, and a failure that comes
	// once in many runs must carry its own trace.
	o.Debug = true
	r, err := chaos.Run(context.Background(), o)
	if r != nil {
		t.Log("\n" + chaos.Summary(r))
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Failures {
		t.Error(f)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
