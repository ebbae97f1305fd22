package libvirt

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/drivertest"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestConformance runs the driver conformance suite against libvirt's test
// driver, each case on a node (a libvirtd) of its own.
func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		Start: func(t *testing.T) drivertest.Backend {
			node := libvirttest.Start(t, "conf")
			names := 0
			return drivertest.Backend{
				Driver: open(t, node),
				// Disks and networks the driver makes itself, each guest
				// its own disk.
				Machine: func() driver.Machine {
					names++
					return machine(fmt.Sprintf("conf%d", names))
				},
				// A domain no virtfleet agent defined, as an operator's
				// virsh define leaves it (the test driver's own "test"
				// domain is another).
				AddForeign: func(t *testing.T) {
					x, err := (&libvirtxml.Domain{
						Type: "test", Name: "hand-made",
						Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
						VCPU:   &libvirtxml.DomainVCPU{Value: 1},
						OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
					}).Marshal()
					require.NoError(t, err)
					_, err = raw(t, node).DomainDefineXMLFlags(x, 0)
					require.NoError(t, err)
				},
			}
		},
		// The test driver changes a domain's state within the call; a
		// shutdown is forced after the 50 ms grace open gives.
		Wait: 10 * time.Second, Tick: 10 * time.Millisecond,
	})
}
