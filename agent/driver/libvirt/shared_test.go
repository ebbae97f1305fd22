package libvirt

import (
	"context"
	"sync"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// sharedPool is the name of the pool on shared storage in these tests.
const sharedPool = "nfs-a"

// staleSharedPool plays what a host's libvirtd knows of a pool on shared
// storage: a volume another host made there is unknown to it until it
// re-reads the pool (StoragePoolRefresh). The test driver keeps volumes in
// memory, one daemon's alone, so the other host is a raw connection to the
// same daemon, and hide hides what it made from the driver until a refresh.
type staleSharedPool struct {
	mu        sync.Mutex
	hidden    map[string]bool
	refreshes int
}

func (s *staleSharedPool) hide(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hidden[name] = true
}

func (s *staleSharedPool) wrap(a API) API { return staleAPI{API: a, s: s} }

type staleAPI struct {
	API
	s *staleSharedPool
}

func (a staleAPI) StorageVolLookupByName(p golibvirt.StoragePool, name string) (golibvirt.StorageVol, error) {
	a.s.mu.Lock()
	hidden := p.Name == sharedPool && a.s.hidden[name]
	a.s.mu.Unlock()
	if hidden {
		return golibvirt.StorageVol{}, golibvirt.Error{Code: uint32(golibvirt.ErrNoStorageVol), Message: "Storage volume not found: no storage vol with matching name '" + name + "'"}
	}
	return a.API.StorageVolLookupByName(p, name)
}

func (a staleAPI) StoragePoolRefresh(p golibvirt.StoragePool, flags uint32) error {
	if p.Name == sharedPool {
		a.s.mu.Lock()
		a.s.refreshes++
		clear(a.s.hidden)
		a.s.mu.Unlock()
	}
	return a.API.StoragePoolRefresh(p, flags)
}

// TestDisksInASharedPool: a disk in a shared pool that another host made is
// found and opened as it is, never made again; one that is not there yet is
// made by its first use; one to be made from an image is refused.
func TestDisksInASharedPool(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "shared-pool")
	d, l := open(t, node), raw(t, node)
	// The administrator's pool, as defined on every host that mounts it.
	require.NoError(t, node.DefinePool(sharedPool, "/srv/nfs-a"))
	stale := &staleSharedPool{hidden: map[string]bool{}}
	d.intercept = stale.wrap

	// Another host made the guest's root disk: larger than the guest asks
	// for, which it keeps, as the user data on it.
	x, err := (&libvirtxml.StorageVolume{
		Name: "team-a_db-root", Capacity: &libvirtxml.StorageVolumeSize{Value: 3 << 30, Unit: "B"},
		Target: &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}},
	}).Marshal()
	require.NoError(t, err)
	p, err := l.StoragePoolLookupByName(sharedPool)
	require.NoError(t, err)
	theirs, err := l.StorageVolCreateXML(p, x, 0)
	require.NoError(t, err)
	stale.hide(theirs.Name)

	m := machine("db")
	m.Disks = []driver.Disk{
		{Name: "team-a_db-root", SizeBytes: 1 << 30, Pool: sharedPool},
		{Name: "team-a_db-data", SizeBytes: 2 << 30, Pool: sharedPool},
	}
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.Positive(t, stale.refreshes, "the shared pool is re-read before its volumes are looked up")

	root, err := l.StorageVolLookupByName(p, "team-a_db-root")
	require.NoError(t, err)
	assert.Equal(t, theirs.Key, root.Key, "the other host's volume, not a new one")
	_, capacity, _, err := l.StorageVolGetInfo(root)
	require.NoError(t, err)
	assert.Equal(t, uint64(3<<30), capacity, "opened as it is: never made again, nor resized")

	data, err := l.StorageVolLookupByName(p, "team-a_db-data")
	require.NoError(t, err, "a disk not there yet is made by its first use, in the shared pool")
	_, capacity, _, err = l.StorageVolGetInfo(data)
	require.NoError(t, err)
	assert.Equal(t, uint64(2<<30), capacity)
	assert.False(t, volumeExists(t, l, "team-a_db-data"), "nothing of it in the node's own pool")

	var sources []string
	for _, disk := range definition(t, l, m).Devices.Disks {
		if disk.Source != nil && disk.Source.Volume != nil && disk.Source.Volume.Pool == sharedPool {
			sources = append(sources, disk.Source.Volume.Volume)
		}
	}
	assert.Equal(t, []string{"team-a_db-root", "team-a_db-data"}, sources, "the guest's disks are the shared pool's volumes")

	t.Run("ObservingAVolumeAnotherHostMade", func(t *testing.T) {
		x, err := (&libvirtxml.StorageVolume{Name: "team-a_logs", Capacity: &libvirtxml.StorageVolumeSize{Value: 5 << 30, Unit: "B"}}).Marshal()
		require.NoError(t, err)
		made, err := l.StorageVolCreateXML(p, x, 0)
		require.NoError(t, err)
		stale.hide(made.Name)
		got, err := d.ObserveVolume(ctx, driver.Disk{Name: "team-a_logs", Pool: sharedPool})
		require.NoError(t, err)
		assert.Equal(t, driver.VolumeObservation{ID: made.Key, SizeBytes: 5 << 30}, got)
	})

	t.Run("ADiskFromAnImageIsRefused", func(t *testing.T) {
		img := &driver.Image{UID: "5f0c", Name: "ubuntu", URL: "http://127.0.0.1:1/disk.qcow2", Format: "qcow2", AllowedSources: loopback}
		m := imageMachine("web", img)
		m.Disks[0].Pool = sharedPool
		_, err := d.Ensure(ctx, m)
		require.Error(t, err)
		assert.True(t, driver.IsTerminal(err), "not retried: %v", err)
		assert.ErrorContains(t, err, "volume web-root in shared pool nfs-a cannot be made from an image yet")
		_, err = l.StorageVolLookupByName(p, "web-root")
		assert.True(t, isCode(err, golibvirt.ErrNoStorageVol), "nothing made: %v", err)
	})
}
