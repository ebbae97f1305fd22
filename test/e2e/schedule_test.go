package e2e

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// Every test of the package calls t.Parallel and runs on a stack of its
// own; how many run at once is decided here. A stack mostly waits (on the
// API server, on NATS, on its agents), so a few side by side fill two
// cores that one at a time left idle; too many would starve the timings
// the tests assert (a lost node within 15 s).

// stackSlots is how many stacks run at once besides the one on the shared
// OpenStack.
const stackSlots = 3

var slots = make(chan struct{}, stackSlots)

// takeSlot waits for a stack slot and gives it back once t and its
// cleanups (the stack's stop among them) are done.
func takeSlot(t *testing.T) {
	t.Helper()
	start := time.Now()
	slots <- struct{}{}
	t.Cleanup(func() { <-slots })
	// Said apart, so the test's own time can be told from its queueing.
	t.Logf("a stack slot after %s", time.Since(start).Round(time.Millisecond))
}

// cloud is held by the one test at a time whose stack has a node on the
// test binary's shared OpenStack: those tests turn its compute hosts on
// and off, and count its flavors and keypairs, so two would see each
// other's. They hold no stack slot: the cloud is their bound, and the
// longest of them (a real guest's boot, backup and restore) starts at
// once instead of after the others.
var cloud sync.Mutex

// holdCloud takes the shared OpenStack for t, until t's cleanups are done.
func holdCloud(t *testing.T) {
	t.Helper()
	start := time.Now()
	cloud.Lock()
	t.Cleanup(cloud.Unlock)
	t.Logf("the shared OpenStack after %s", time.Since(start).Round(time.Millisecond))
}

// usesCloud says whether a stack of o has a node on the shared OpenStack.
func usesCloud(o stack.Options) bool {
	for _, b := range o.Backends {
		if b == driver.BackendNova {
			return true
		}
	}
	return false
}

// The hub, agent, plugin and simnodes binaries, built once for every stack
// of the test binary rather than linked again for each.
var binaries struct {
	once sync.Once
	dir  string
	err  error
}

// sharedBinaries builds the stacks' binaries on the first call.
func sharedBinaries(t *testing.T) string {
	t.Helper()
	binaries.once.Do(func() {
		if binaries.dir, binaries.err = os.MkdirTemp("", "vf-e2e-bin-"); binaries.err == nil {
			binaries.err = stack.Build(context.Background(), binaries.dir)
		}
	})
	require.NoError(t, binaries.err)
	return binaries.dir
}

// removeBinaries removes what sharedBinaries built, after the last test.
func removeBinaries() {
	if binaries.dir != "" {
		_ = os.RemoveAll(binaries.dir)
	}
}
