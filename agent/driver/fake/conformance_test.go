package fake

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/drivertest"
)

// conformanceUIDs numbers the conformance suite's guests.
var conformanceUIDs atomic.Int64

// TestConformance runs the driver conformance suite against the fake: the
// reconciler's tests trust it to keep the contract the real drivers keep.
func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		Start: func(t *testing.T) drivertest.Backend {
			d := New("node-a")
			t.Cleanup(func() { _ = d.Close() })
			return drivertest.Backend{
				Driver: d,
				Machine: func() driver.Machine {
					n := conformanceUIDs.Add(1)
					name := fmt.Sprintf("vm-%d", n)
					return driver.Machine{
						UID: fmt.Sprintf("6f1c1f43-5c1e-4d43-9b4e-%012d", n), Namespace: "team-a", Name: name,
						VCPU: 2, MemoryBytes: 1 << 30, Running: true,
						Disks: []driver.Disk{{Name: "team-a_" + name + "-root", SizeBytes: 1 << 30}},
					}
				},
				AddForeign: func(*testing.T) { d.AddForeign("hand-made", 8, 64<<20) },
			}
		},
		// Every transition of the fake is made at once.
		Wait: time.Second, Tick: time.Millisecond,
	})
}
