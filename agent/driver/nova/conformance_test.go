package nova_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/drivertest"
)

// TestConformance runs the driver conformance suite against the test
// cloud, each case on a cloud of its own whose servers finish their
// transitions by themselves (newCloud's short transition delay).
func TestConformance(t *testing.T) {
	t.Parallel()
	drivertest.Run(t, drivertest.Harness{
		Start: func(t *testing.T) drivertest.Backend {
			c := newCloud(t, password)
			names := 0
			return drivertest.Backend{
				Driver: c.open(t),
				// Volumes and networks the driver makes itself, each guest
				// its own boot volume.
				Machine: func() driver.Machine {
					names++
					return machine(fmt.Sprintf("conf%d", names))
				},
				// A server of the same project that another node's agent
				// made.
				AddForeign: func(t *testing.T) {
					other, err := nova.Open(context.Background(), c.config("node2", time.Hour))
					require.NoError(t, err)
					t.Cleanup(func() { _ = other.Close() })
					ensure(t, other, machine("foreign"), driver.PhaseRunning)
				},
			}
		},
		Wait: waitFor, Tick: tick,
		Unsupported: map[drivertest.Capability]string{
			drivertest.Claim: "the test cloud serves no PUT /servers/{id}, with which Claim renames the server (HTTP 405)",
		},
	})
}
