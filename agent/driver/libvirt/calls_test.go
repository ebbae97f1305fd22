package libvirt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestRoundTrips holds the driver's common operations to a budget of libvirt
// calls. Each call is a round trip to the daemon: in a burst, the agent's CPU
// goes mostly to the syscalls and wakeups of these (BenchmarkEnsureRunning's
// profile), and the daemon's to answering them.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	n := libvirttest.Start(t, "calls")
	calls := n.CountCalls(t)
	d, err := Open(ctx, Config{Node: n.Name, Socket: calls.Socket, URI: n.URI, Pool: testPool, ShutdownGrace: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	// The first guest makes the network; the budgets are for the ones after.
	_, err = d.Ensure(ctx, machine("first"))
	require.NoError(t, err)
	m := machine("counted")

	for _, tc := range []struct {
		name   string
		do     func() (driver.Observation, error)
		budget int
	}{
		{"a new guest: network and volumes checked, address reserved, root, swap and seed made, defined, started, observed", func() (driver.Observation, error) { return d.Ensure(ctx, m) }, 25},
		{"a guest already as it should be (the resync)", func() (driver.Observation, error) { return d.Ensure(ctx, m) }, 10},
		{"a running guest observed", func() (driver.Observation, error) { return d.Observe(ctx, m.UID) }, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls.Reset()
			o, err := tc.do()
			require.NoError(t, err)
			require.Equal(t, driver.PhaseRunning, o.Phase)
			require.NotEmpty(t, o.Interfaces[0].IPs, "the test driver's guest has its address at once")
			require.LessOrEqual(t, calls.Total(), tc.budget, "libvirt calls: %s", calls)
		})
	}
}
