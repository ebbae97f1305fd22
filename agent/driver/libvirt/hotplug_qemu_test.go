package libvirt

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// TestDataDisksPlugIntoARealGuest attaches and detaches data disks of a
// running guest under QEMU (guesthost, libvirt 9.0 and QEMU 7.2 on Debian
// 12). QEMU attaches a disk by itself; a detach it only asks of the guest,
// and this guest has no operating system (SeaBIOS finds nothing to boot),
// so it never releases one: the disk stays attached, and the guest says
// so, until its next start drops it.
func TestDataDisksPlugIntoARealGuest(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h, err := guesthost.Start(ctx, "vfplug", os.Stderr)
	require.NoError(t, err)
	h.StopWith(t)
	d, err := Open(ctx, Config{Node: "real", Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType, ShutdownGrace: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	d.detachWait = time.Second
	calls := new([]string)
	d.intercept = func(a API) API { return shapeCalls{API: a, calls: calls} }
	l := dialHost(t, h)
	m := driver.Machine{
		UID:         "3a7d1c5e-2b4f-4e6a-9c8d-0f1e2d3c4b5a",
		Namespace:   "team-a",
		Name:        "plug",
		Generation:  1,
		VCPU:        1,
		MemoryBytes: 128 << 20,
		// Its maximum: a guest without an OS never fills a balloon.
		MaxMemoryBytes: 128 << 20,
		Running:        true,
		Disks:          []driver.Disk{{Name: "plug-root", SizeBytes: 64 << 20}},
	}
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	seed := seedVolume(m.UID) + " vdb"
	data := func(name string) driver.Disk { return driver.Disk{Name: name, SizeBytes: 16 << 20} }

	walkPlugSteps(ctx, t, d, l, calls, &m, []plugStep{
		{name: "a disk added is attached to the running guest and its next start, after every target taken",
			change: func(m *driver.Machine) { m.Disks = append(m.Disks, data("plug-data1")) },
			calls:  []string{"attach plug-data1 vdc live config"},
			live:   []string{"plug-root vda", seed, "plug-data1 vdc"}},
		{name: "a second one after it",
			change: func(m *driver.Machine) { m.Disks = append(m.Disks, data("plug-data2")) },
			calls:  []string{"attach plug-data2 vdd live config"},
			live:   []string{"plug-root vda", seed, "plug-data1 vdc", "plug-data2 vdd"}},
		{name: "a disk removed leaves the next start at once; the guest, which does not release it, keeps it, and says so",
			change:  func(m *driver.Machine) { m.Disks = append(m.Disks[:1], m.Disks[2:]...) },
			calls:   []string{"detach plug-data1 vdc live config"},
			live:    []string{"plug-root vda", seed, "plug-data1 vdc", "plug-data2 vdd"},
			next:    []string{"plug-root vda", seed, "plug-data2 vdd"},
			restart: true, message: "disk plug-data1 is still attached to the running guest, which has not released it since it was detached; it is gone at the next start"},
		{name: "a resync asks the guest again, and still says so",
			change:  func(*driver.Machine) {},
			calls:   []string{"detach plug-data1 vdc live"},
			live:    []string{"plug-root vda", seed, "plug-data1 vdc", "plug-data2 vdd"},
			next:    []string{"plug-root vda", seed, "plug-data2 vdd"},
			restart: true, message: "disk plug-data1 is still attached to the running guest, which has not released it since it was detached; it is gone at the next start"},
		{name: "a restart starts the guest without it, and the others keep their targets",
			change: func(m *driver.Machine) { m.RestartNonce = "r1" },
			live:   []string{"plug-root vda", seed, "plug-data2 vdd"}},
	})
}
