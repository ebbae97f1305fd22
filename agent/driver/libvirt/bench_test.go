package libvirt

import (
	"context"
	"fmt"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// BenchmarkEnsureRunning measures the driver taking a new VM to Running:
// network and volume checks, seed ISO, define, start, observe.
func BenchmarkEnsureRunning(b *testing.B) {
	ctx := context.Background()
	d := open(b, libvirttest.Start(b, "bench-drv"))
	base := machine("bench")
	b.ResetTimer()
	for i := range b.N {
		m := base
		m.UID = fmt.Sprintf("0b5e3f1a-7c2d-4e8f-9a1b-%012d", 1_000_000+i)
		m.Name = fmt.Sprintf("bench-%d", i)
		m.Disks = []driver.Disk{{Name: m.Name + "-root", SizeBytes: 1 << 20}}
		m.SwapBytes = 1 << 20 // the test pool holds 100 GiB
		o, err := d.Ensure(ctx, m)
		require.NoError(b, err)
		require.Equal(b, driver.PhaseRunning, o.Phase)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "VMs/s")
}

// BenchmarkRawDefineStart is the floor: a bare go-libvirt define and start of
// a minimal domain on the same kind of daemon.
func BenchmarkRawDefineStart(b *testing.B) {
	l := raw(b, libvirttest.Start(b, "bench-raw"))
	b.ResetTimer()
	for i := range b.N {
		x, err := (&libvirtxml.Domain{
			Type:   "test",
			Name:   fmt.Sprintf("raw-%d", i),
			Memory: &libvirtxml.DomainMemory{Value: 512, Unit: "MiB"},
			VCPU:   &libvirtxml.DomainVCPU{Value: 2},
			OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
		}).Marshal()
		require.NoError(b, err)
		dom, err := l.DomainDefineXMLFlags(x, golibvirt.DomainDefineFlags(0))
		require.NoError(b, err)
		require.NoError(b, l.DomainCreate(dom))
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "VMs/s")
}

// BenchmarkCapacity measures one heartbeat's read of the node's allocation
// with 100 guests defined, half of them running: what every agent pays every
// 2 s, in its own CPU and its libvirtd's (the calls are synchronous, so the
// time per heartbeat includes the daemon's work).
func BenchmarkCapacity(b *testing.B) {
	ctx := context.Background()
	d := open(b, libvirttest.Start(b, "bench-cap"))
	const guests = 100
	for i := range guests {
		m := machine(fmt.Sprintf("cap-%d", i))
		m.Running = i%2 == 0
		m.Disks = []driver.Disk{{Name: m.Name + "-root", SizeBytes: 1 << 20}}
		m.SwapBytes = 0
		_, err := d.Ensure(ctx, m)
		require.NoError(b, err)
	}
	var c driver.Capacity
	for b.Loop() {
		var err error
		c, err = d.Capacity(ctx)
		require.NoError(b, err)
	}
	require.Equal(b, int64(guests*2), c.AllocatedVCPU, "every guest counted, none twice")
}
