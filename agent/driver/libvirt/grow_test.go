package libvirt

import (
	"context"
	"fmt"
	"path"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// resizes records the volume reads and resizes the driver asks of
// libvirt. libvirt's test driver implements neither virStorageVolResize
// nor virDomainBlockResize; with pretend set, resizes answer as a
// libvirtd with QEMU does when it grows a volume, without growing it.
type resizes struct {
	API
	pretend bool
	calls   *[]string
}

func (r *resizes) StorageVolGetInfo(v golibvirt.StorageVol) (int8, uint64, uint64, error) {
	*r.calls = append(*r.calls, "read "+v.Name)
	return r.API.StorageVolGetInfo(v)
}

func (r *resizes) StorageVolResize(v golibvirt.StorageVol, size uint64, flags golibvirt.StorageVolResizeFlags) error {
	*r.calls = append(*r.calls, fmt.Sprintf("resize volume %s to %d", v.Name, size))
	if r.pretend {
		return nil
	}
	return r.API.StorageVolResize(v, size, flags)
}

func (r *resizes) DomainBlockResize(dom golibvirt.Domain, disk string, size uint64, flags golibvirt.DomainBlockResizeFlags) error {
	*r.calls = append(*r.calls, fmt.Sprintf("resize live %s to %d in bytes=%t", path.Base(disk), size, flags == golibvirt.DomainBlockResizeBytes))
	if r.pretend {
		return nil
	}
	return r.API.DomainBlockResize(dom, disk, size, flags)
}

// TestDisksGrowNeverShrinkAndNeedNoRestart walks one guest through size
// changes of its root disk: each step pins the reads and resizes the
// driver asks of libvirt, and what the guest reports.
func TestDisksGrowNeverShrinkAndNeedNoRestart(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "grow")
	d := open(t, node)
	r := &resizes{pretend: true, calls: new([]string)}
	d.intercept = func(a API) API { r.API = a; return r }
	m := machine("grown")
	root := m.Disks[0].Name
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	steps := []struct {
		name    string
		change  func(m *driver.Machine)
		refuse  bool
		calls   []string
		phase   driver.Phase
		message string
	}{
		{name: "a resync of a guest whose disks are as big as asked reads no volume", change: func(*driver.Machine) {}, phase: driver.PhaseRunning},
		{name: "a larger size grows the running guest's disk live, in bytes", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 2 << 30 },
			calls: []string{"read " + root, fmt.Sprintf("resize live %s to %d in bytes=true", root, 2<<30)}, phase: driver.PhaseRunning},
		{name: "a grown disk is not read again", change: func(*driver.Machine) {}, phase: driver.PhaseRunning},
		{name: "a smaller size than the volume's leaves it as it is", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 512 << 20 },
			calls: []string{"read " + root}, phase: driver.PhaseRunning},
		{name: "a stopped guest's volume is resized itself", change: func(m *driver.Machine) { m.Running, m.Disks[0].SizeBytes = false, 3<<30 },
			calls: []string{"read " + root, fmt.Sprintf("resize volume %s to %d", root, 3<<30)}, phase: driver.PhaseStopped},
		{name: "a size the pool cannot hold is not asked of libvirt, and the message names the pool", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 1 << 40 },
			calls: []string{"read " + root}, phase: driver.PhaseStopped, message: "cannot grow disk " + root + " to 1099511627776 bytes: storage pool default-pool has"},
		{name: "a grow libvirt refuses leaves the guest running, says why, and is tried again", change: func(m *driver.Machine) { m.Running, m.Disks[0].SizeBytes = true, 4<<30 }, refuse: true,
			calls: []string{"read " + root, fmt.Sprintf("resize live %s to %d in bytes=true", root, 4<<30)}, phase: driver.PhaseRunning, message: "virDomainBlockResize"},
		{name: "a refused grow is tried at the next Ensure", change: func(*driver.Machine) {}, refuse: true,
			calls: []string{"read " + root, fmt.Sprintf("resize live %s to %d in bytes=true", root, 4<<30)}, phase: driver.PhaseRunning, message: "virDomainBlockResize"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&m)
			r.pretend = !s.refuse
			*r.calls = nil
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err, "a disk that cannot grow fails no Ensure")
			assert.Equal(t, s.calls, *r.calls)
			assert.Equal(t, s.phase, o.Phase)
			assert.False(t, o.RestartRequired, "a disk's size needs no restart")
			if s.message == "" {
				assert.Empty(t, o.Message)
			} else {
				assert.Contains(t, o.Message, s.message)
			}
		})
	}
}

// defines counts the domain definitions the driver writes.
type defines struct {
	API
	n *int
}

func (c defines) DomainDefineXMLFlags(x string, flags golibvirt.DomainDefineFlags) (golibvirt.Domain, error) {
	*c.n++
	return c.API.DomainDefineXMLFlags(x, flags)
}

// A guest defined before disks grew live carries a spec hash of its disks'
// sizes too: the driver takes it as up to date, and neither redefines it
// nor reports it RestartRequired.
func TestAGuestHashedWithItsDiskSizesIsNotRedefined(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "sized-hash")
	d := open(t, node)
	m := machine("sized")
	m.Running = false
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	defineAsBefore(t, d, raw(t, node), m, hashSized)

	var n int
	d.intercept = func(a API) API { return defines{API: a, n: &n} }
	m.Running = true
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Zero(t, n, "no definition written")
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.False(t, o.RestartRequired)
}
