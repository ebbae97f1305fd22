package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/virtfleet/virtfleet/chaos/internal/chaos"
)

// TestShortChaos is `make chaos` small enough for `make test`: a few dozen
// VMs, one kill of each kind. It fails if a VM is lost, a guest duplicated
// or orphaned, the fleet does not converge within 30 s of a restart, or a
// node's loss does not show within 15 s.
func TestShortChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	ctrl.SetLogger(logr.Discard())
	o := chaos.Defaults()
	o.VMs, o.OpsPerSecond = 24, 6
	o.Down, o.ChurnBetween = 2*time.Second, 3*time.Second
	// The loss of a node must still show within 15 s; a shorter TTL only
	// makes the agent's kill cost less of the test's time.
	o.NodeTTL = 5 * time.Second
	o.Progress = testWriter{t}
	o.Debug = os.Getenv("VIRTFLEET_DEBUG") != ""
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
