package openstack_test

import (
	"context"
	"os"
	"testing"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestAnAttachedVolumeGrowsThroughTheNovaDriver raises the size of a
// running server's boot volume: the nova driver extends it in Cinder
// (attached, so at microversion 3.42), the volume's file grows, and the
// server runs on without needing a restart.
func TestAnAttachedVolumeGrowsThroughTheNovaDriver(t *testing.T) {
	ctx := context.Background()
	c, cl, d := cloudTest(t)
	var err error
	m := driver.Machine{
		UID: uuid.NewString(), Namespace: "ns", Name: "grower", Generation: 1,
		VCPU: 1, MemoryBytes: 256 << 20, Running: true,
		Disks:    []driver.Disk{{Name: "ns_grower-root", SizeBytes: 1 << 30}},
		Networks: []driver.Network{{Name: "ns_grower-net", CIDR: "10.78.0.0/24"}},
	}
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return d.Delete(ctx, m.UID) == nil }, migrateTimeout, poll, "the server is never deleted")
		require.Eventually(t, func() bool { return d.DeleteVolume(ctx, m.Disks[0]) == nil }, migrateTimeout, poll, "the volume is never deleted")
	})
	var o driver.Observation
	require.Eventually(t, func() bool {
		o, err = d.Ensure(ctx, m)
		require.NoError(t, err)
		return o.Phase == driver.PhaseRunning
	}, bootTimeout, poll, "the server never ran: %+v", o)

	m.Disks[0].SizeBytes = 2 << 30
	require.Eventually(t, func() bool {
		o, err = d.Ensure(ctx, m)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseRunning, o.Phase, "the server runs on while its volume grows")
		require.False(t, o.RestartRequired, "a volume's size needs no restart")
		return o.Message == ""
	}, migrateTimeout, poll, "the volume never grew: %+v", o)

	page, err := volumes.List(cl.Volume, volumes.ListOpts{Name: m.Disks[0].Name}).AllPages(ctx)
	require.NoError(t, err)
	vs, err := volumes.ExtractVolumes(page)
	require.NoError(t, err)
	require.Len(t, vs, 1)
	assert.Equal(t, 2, vs[0].Size, "Cinder's size, in GiB")
	assert.Equal(t, "in-use", vs[0].Status, "extended while attached")
	fi, err := os.Stat(c.VolumePath(vs[0].ID))
	require.NoError(t, err)
	assert.Equal(t, int64(2<<30), fi.Size(), "the volume driver grew its file")
}
