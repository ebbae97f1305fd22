package openstack_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/volumeattach"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestAVolumeHotPlugsThroughTheNovaDriver adds a disk to a running
// server's Machine and then removes it: the nova driver attaches and
// detaches the Cinder volume through Nova while the server runs, never
// asking for or making a restart, and reports the disks attached.
func TestAVolumeHotPlugsThroughTheNovaDriver(t *testing.T) {
	ctx := context.Background()
	_, cl, d := cloudTest(t)
	m := driver.Machine{
		UID: uuid.NewString(), Namespace: "ns", Name: "plugger", Generation: 1,
		VCPU: 1, MemoryBytes: 256 << 20, Running: true,
		Disks:    []driver.Disk{{Name: "ns_plugger-root", SizeBytes: 1 << 30}},
		Networks: []driver.Network{{Name: "ns_plugger-net", CIDR: "10.79.0.0/24"}},
	}
	data := driver.Disk{Name: "ns_plugger-data", SizeBytes: 1 << 30}
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return d.Delete(ctx, m.UID) == nil }, migrateTimeout, poll, "the server is never deleted")
		for _, disk := range []driver.Disk{m.Disks[0], data} {
			require.Eventually(t, func() bool { return d.DeleteVolume(ctx, disk) == nil }, migrateTimeout, poll, "volume %s is never deleted", disk.Name)
		}
	})
	require.Eventually(t, func() bool {
		o, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		return o.Phase == driver.PhaseRunning
	}, bootTimeout, poll, "the server never ran")
	serverID := func() string {
		o, err := d.Observe(ctx, m.UID)
		require.NoError(t, err)
		return o.ID
	}()
	attachments := func() []volumeattach.VolumeAttachment {
		page, err := volumeattach.List(cl.Compute, serverID).AllPages(ctx)
		require.NoError(t, err)
		as, err := volumeattach.ExtractVolumeAttachments(page)
		require.NoError(t, err)
		return as
	}
	volume := func(name string) volumes.Volume {
		page, err := volumes.List(cl.Volume, volumes.ListOpts{Name: name}).AllPages(ctx)
		require.NoError(t, err)
		vs, err := volumes.ExtractVolumes(page)
		require.NoError(t, err)
		require.Len(t, vs, 1, "volume %s", name)
		return vs[0]
	}
	// converge ensures m, running, until done says so of the server and
	// the driver reports the disks m asks for; the server must run
	// throughout, with no restart asked for or made.
	converge := func(what string, done func() bool) {
		t.Helper()
		var o driver.Observation
		var err error
		ok := assert.Eventually(t, func() bool {
			o, err = d.Ensure(ctx, m)
			if err != nil {
				// A volume Cinder is still creating is waited for.
				require.False(t, driver.IsTerminal(err), "%v", err)
				return false
			}
			require.Equal(t, driver.PhaseRunning, o.Phase, "%s: the server runs on", what)
			require.False(t, o.RestartRequired, "%s: a disk change needs no restart", what)
			require.Zero(t, o.RestartCount, "%s: the server is not restarted", what)
			return done() && slices.Equal(o.Disks, names(m.Disks))
		}, migrateTimeout, poll, "%s never happened", what)
		if !ok {
			t.Fatalf("%s: the driver last observed %+v, with error %v; volume %s is %+v; the server's attachments are %+v",
				what, o, err, data.Name, volumes.Get(ctx, cl.Volume, volume(data.Name).ID).Body, attachments())
		}
	}
	require.Len(t, attachments(), 1, "booted with its root disk only")

	m.Disks = append(m.Disks, data)
	converge("the attach", func() bool { return volume(data.Name).Status == "in-use" })
	as := attachments()
	require.Len(t, as, 2)
	dataID := volume(data.Name).ID
	assert.True(t, slices.ContainsFunc(as, func(a volumeattach.VolumeAttachment) bool { return a.VolumeID == dataID }), "the data volume is attached: %+v", as)

	m.Disks = m.Disks[:1]
	converge("the detach", func() bool { return volume(data.Name).Status == "available" })
	as = attachments()
	require.Len(t, as, 1)
	assert.Equal(t, volume(m.Disks[0].Name).ID, as[0].VolumeID, "the boot volume stays")

	// A user who takes a disk back at once: the detach is asked while
	// Cinder may still attach the volume, which it refuses to detach
	// (this cloud is often done first; the nova driver's
	// TestADiskTakenBackAtOnceIsDetachedOnceAttached, on openstacktest,
	// always meets it).
	m.Disks = append(m.Disks, data)
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err, "the attach is asked")
	t.Logf("the data volume is %s when it is taken back", volume(data.Name).Status)
	m.Disks = m.Disks[:1]
	converge("the detach during the attach", func() bool { return volume(data.Name).Status == "available" })
	require.Len(t, attachments(), 1)
}

func names(disks []driver.Disk) []string {
	out := make([]string, 0, len(disks))
	for _, d := range disks {
		out = append(out, d.Name)
	}
	return out
}
