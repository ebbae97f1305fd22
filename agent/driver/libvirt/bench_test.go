package libvirt

import (
	"context"
	"fmt"
	"net/netip"
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
		// Each guest its own address, as the hub's allocator gives them.
		m.Networks = []driver.Network{{Name: "bench-net", CIDR: "10.30.0.0/16", Mode: driver.NetworkModeNAT,
			Address: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 30, byte(1 + i/250), byte(2 + i%250)}), 16)}}
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
// time per heartbeat includes the daemon's work), and its libvirt calls.
func BenchmarkCapacity(b *testing.B) {
	ctx := context.Background()
	const guests = 100
	d, calls, _ := countedNode(b, "bench-cap", guests, func(i int) bool { return i%2 == 0 })
	_, err := d.Capacity(ctx)
	require.NoError(b, err)
	calls.Reset()
	var c driver.Capacity
	for b.Loop() {
		c, err = d.Capacity(ctx)
		require.NoError(b, err)
	}
	b.ReportMetric(float64(calls.Total())/float64(b.N), "calls/op")
	require.Equal(b, int64(guests*2), c.AllocatedVCPU, "every guest counted, none twice")
}

// observedGuests is how many guests the full-observe benchmarks run: issue
// 40's node of 200 guests.
const observedGuests = 200

// countedNode opens a driver on a node of its own through a call counter,
// with n guests on one network the driver made, those running says
// running, and returns the driver, the counter and the guests' machines.
func countedNode(b *testing.B, name string, n int, running func(i int) bool) (*Driver, *libvirttest.CallCounter, []driver.Machine) {
	b.Helper()
	ctx := context.Background()
	d, calls := openCounted(b, name)
	ms := make([]driver.Machine, n)
	for i := range ms {
		m := machine(fmt.Sprintf("%s-%d", name, i))
		m.UID = fmt.Sprintf("0b5e3f1a-7c2d-4e8f-9a1b-%012d", 2_000_000+i)
		// One network of n guests, each its own address, as the hub's
		// allocator gives them.
		m.Networks[0].CIDR = "10.30.0.0/16"
		m.Networks[0].Name = "net-" + name
		m.Networks[0].Address = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 30, byte(1 + i/250), byte(2 + i%250)}), 16)
		m.Disks = []driver.Disk{{Name: m.Name + "-root", SizeBytes: 1 << 20}}
		m.SwapBytes = 0
		m.Running = running(i)
		_, err := d.Ensure(ctx, m)
		require.NoError(b, err)
		ms[i] = m
	}
	return d, calls, ms
}

func allRunning(int) bool { return true }

// BenchmarkObserveAll measures the driver's full observe of a node of 200
// running guests, List, as every resync makes it, and counts its libvirt
// calls: each is a round trip to the daemon.
func BenchmarkObserveAll(b *testing.B) {
	ctx := context.Background()
	d, calls, _ := countedNode(b, "bench-list", observedGuests, allRunning)
	// The first look reads every definition; the benchmark is of the
	// looks after it.
	got, err := d.List(ctx)
	require.NoError(b, err)
	calls.Reset()
	for b.Loop() {
		got, err = d.List(ctx)
		require.NoError(b, err)
	}
	b.ReportMetric(float64(calls.Total())/float64(b.N), "calls/op")
	require.Len(b, got, observedGuests)
	for _, o := range got {
		require.Equal(b, driver.PhaseRunning, o.Phase)
		require.NotEmpty(b, o.Interfaces[0].IPs, "every guest has its address")
	}
}

// BenchmarkResync measures what the agent's resyncs ask of the driver on a
// node of 200 running guests where nothing changed. A periodic one lists
// the orphans and the guests; the reconciler ensures none of the guests the
// list shows settled (reconciler's settled.go). The agent's first one, and
// one after a reconnect, also ensure every guest as its intent says.
func BenchmarkResync(b *testing.B) {
	ctx := context.Background()
	d, calls, ms := countedNode(b, "bench-resync", observedGuests, allRunning)
	_, err := d.List(ctx)
	require.NoError(b, err)
	for _, bc := range []struct {
		name   string
		ensure bool
	}{{"Periodic", false}, {"EnsuringEvery", true}} {
		b.Run(bc.name, func(b *testing.B) {
			calls.Reset()
			for b.Loop() {
				_, err := d.Orphans(ctx)
				require.NoError(b, err)
				_, err = d.List(ctx)
				require.NoError(b, err)
				for _, m := range ms {
					if !bc.ensure {
						break
					}
					o, err := d.Ensure(ctx, m)
					require.NoError(b, err)
					require.Equal(b, driver.PhaseRunning, o.Phase)
				}
			}
			b.ReportMetric(float64(calls.Total())/float64(b.N), "calls/op")
		})
	}
}
