package openstack_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// TestNovaDriverSnapshotsThroughCinder runs the nova driver's snapshots
// against the real services: a running server's two volumes, with data
// written into their files where a guest would have, are snapshotted
// through Nova's createImage into Cinder snapshots and nothing else stays
// (no Glance image); memory is refused with the reason; a revert to the
// latest snapshot brings both volumes' bytes back through Cinder's revert,
// once per restore, and the guest runs again from them; a revert to an
// older snapshot is refused before the guest is touched; deleting the
// snapshots leaves none in Cinder.
func TestNovaDriverSnapshotsThroughCinder(t *testing.T) {
	ctx := context.Background()
	c, cl, d := cloudTest(t, func(cfg *nova.Config) { cfg.Node = "node-snapshots" })
	g := &guests{d: d, cl: cl, network: "ns_snapshots-net", subnet: [3]byte{10, 77, 0}}

	const size = 1 << 30
	vm := g.machine("snapped", driver.Disk{Name: "ns_snapped-root", SizeBytes: size}, driver.Disk{Name: "ns_snapped-data", SizeBytes: size})
	g.run(t, vm)
	// Cinder deletes no volume that has snapshots: they go first (cleanups
	// run last first).
	t.Cleanup(func() {
		for _, s := range snapshotsOf(t, d, vm.UID) {
			assert.NoError(t, d.DeleteSnapshot(ctx, vm.UID, s.ID))
		}
		assertNoSnapshotsLeft(t, cl, vm.UID)
	})
	paths := map[string]string{}
	for _, disk := range vm.Disks {
		paths[disk.Name] = c.VolumePath(cinderVolume(t, cl, disk.Name).ID)
	}
	// write has the guest write n bytes at off of each disk, and returns
	// what the disks hold then.
	write := func(off, n int64) map[string][32]byte {
		sums := map[string][32]byte{}
		for name, path := range paths {
			writeRandom(t, path, off, n)
			sums[name] = fileSum(t, path)
		}
		return sums
	}
	sums := func() map[string][32]byte {
		out := map[string][32]byte{}
		for name, path := range paths {
			out[name] = fileSum(t, path)
		}
		return out
	}
	marker := write(5<<20, 1<<20)

	t.Run("ASnapshotIsACinderSnapshotOfEachVolumeAndNoImage", func(t *testing.T) {
		start := time.Now()
		s, err := d.TakeSnapshot(ctx, vm.UID, driver.SnapshotRequest{ID: "s-1"})
		require.NoError(t, err)
		t.Logf("snapshot of %d volumes taken in %s", len(vm.Disks), time.Since(start).Round(time.Millisecond))
		assert.Equal(t, "s-1", s.ID)
		assert.True(t, s.Online, "the guest ran")
		assert.False(t, s.Memory)
		assert.False(t, s.Frozen, "the guest's image asks for no quiesce: Nova skips a quiesce it cannot make, so no freeze is certain")
		assert.False(t, s.CreatedAt.IsZero())
		assert.Positive(t, s.Duration)
		assert.Equal(t, int64(2*size), s.SizeBytes, "what Cinder counts of the two snapshots")
		assert.Len(t, cinderSnapshots(t, cl, "snapshot for vf-snapshot-s-1"), 2, "one Cinder snapshot per volume")
		assert.Empty(t, glanceImages(t, cl, "vf-snapshot-s-1"), "the image createImage made is gone")

		again, err := d.TakeSnapshot(ctx, vm.UID, driver.SnapshotRequest{ID: "s-1"})
		require.NoError(t, err)
		assert.Equal(t, s.CreatedAt, again.CreatedAt, "a snapshot the guest has is returned, not taken again")
		assert.Len(t, cinderSnapshots(t, cl, "snapshot for vf-snapshot-s-1"), 2)
		listed := snapshotsOf(t, d, vm.UID)
		require.Len(t, listed, 1)
		assert.Equal(t, "s-1", listed[0].ID)
	})

	t.Run("BadInputIsRefusedWithTheReasonAndLeavesNothing", func(t *testing.T) {
		cases := map[string]struct {
			take    func() error
			check   func(error) bool
			message string
		}{
			"Memory": {
				take: func() error {
					_, err := d.TakeSnapshot(ctx, vm.UID, driver.SnapshotRequest{ID: "s-memory", Memory: true})
					return err
				},
				check: driver.IsTerminal, message: "Nova keeps no guest memory",
			},
			"NoID": {
				take: func() error {
					_, err := d.TakeSnapshot(ctx, vm.UID, driver.SnapshotRequest{})
					return err
				},
				check: driver.IsTerminal, message: "needs an ID",
			},
			"UnknownGuest": {
				take: func() error {
					_, err := d.TakeSnapshot(ctx, uuid.NewString(), driver.SnapshotRequest{ID: "s-nobody"})
					return err
				},
				check: driver.IsNotFound, message: "no server with",
			},
			"AnotherGuestsSnapshot": {
				take: func() error {
					return d.RevertSnapshot(ctx, uuid.NewString(), driver.RevertRequest{Snapshot: "s-1"})
				},
				check: driver.IsTerminal, message: "has no snapshot s-1",
			},
			"RevertToNoSnapshot": {
				take: func() error {
					return d.RevertSnapshot(ctx, vm.UID, driver.RevertRequest{Snapshot: "s-none"})
				},
				check: driver.IsTerminal, message: "has no snapshot s-none",
			},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				err := tc.take()
				require.Error(t, err)
				assert.True(t, tc.check(err), "%v", err)
				assert.ErrorContains(t, err, tc.message)
			})
		}
		assert.Empty(t, cinderSnapshots(t, cl, "snapshot for vf-snapshot-s-memory"))
		assert.Empty(t, glanceImages(t, cl, "vf-snapshot-s-memory"))
		assert.Len(t, snapshotsOf(t, d, vm.UID), 1, "only s-1")
	})

	t.Run("ARevertBringsTheVolumesBackOnceAndTheGuestRunsAgain", func(t *testing.T) {
		before := guestObservation(t, d, vm.UID)
		// Other bytes over the marker: writeRandom's bytes follow from
		// where and how much it writes.
		overwritten := write(5<<20, 1<<20+1)
		require.NotEqual(t, marker, overwritten)
		start := time.Now()
		require.NoError(t, d.RevertSnapshot(ctx, vm.UID, driver.RevertRequest{Snapshot: "s-1", Restore: "r-1"}))
		t.Logf("reverted in %s", time.Since(start).Round(time.Millisecond))
		assert.Equal(t, marker, sums(), "both volumes hold what they held at the snapshot")
		_, err := d.Observe(ctx, vm.UID)
		assert.True(t, driver.IsNotFound(err), "the guest is absent until the next Ensure: %v", err)
		g.ensureRunning(t, vm)
		after := guestObservation(t, d, vm.UID)
		assert.NotEqual(t, before.ID, after.ID, "a new Nova server")
		assert.Equal(t, before.RestartCount, after.RestartCount, "the restarts counted are kept")
		assert.Equal(t, marker, sums(), "the new server boots from the reverted volumes")

		since := write(9<<20, 1<<20)
		require.NoError(t, d.RevertSnapshot(ctx, vm.UID, driver.RevertRequest{Snapshot: "s-1", Restore: "r-1"}))
		assert.Equal(t, since, sums(), "a restore named again is not made again")
		assert.Equal(t, after.ID, guestObservation(t, d, vm.UID).ID, "nor is the guest touched")
	})

	t.Run("ARevertToASnapshotNotTheLatestIsRefusedAndTheGuestUntouched", func(t *testing.T) {
		_, err := d.TakeSnapshot(ctx, vm.UID, driver.SnapshotRequest{ID: "s-2"})
		require.NoError(t, err)
		before := guestObservation(t, d, vm.UID)
		err = d.RevertSnapshot(ctx, vm.UID, driver.RevertRequest{Snapshot: "s-1", Restore: "r-2"})
		require.Error(t, err)
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "only to its latest snapshot")
		assert.ErrorContains(t, err, "s-2")
		assert.Equal(t, before.ID, guestObservation(t, d, vm.UID).ID)
		listed := snapshotsOf(t, d, vm.UID)
		require.Len(t, listed, 2)
		assert.Equal(t, []string{"s-1", "s-2"}, []string{listed[0].ID, listed[1].ID}, "oldest first")
	})

	t.Run("DeletingSnapshotsLeavesNoneInCinder", func(t *testing.T) {
		for _, id := range []string{"s-2", "s-1", "s-absent"} {
			require.NoError(t, d.DeleteSnapshot(ctx, vm.UID, id))
		}
		assert.Empty(t, snapshotsOf(t, d, vm.UID))
		assertNoSnapshotsLeft(t, cl, vm.UID)
	})
}

// guestObservation is what d observes of guest uid, which must be there.
func guestObservation(t *testing.T, d *nova.Driver, uid string) driver.Observation {
	t.Helper()
	o, err := d.Observe(context.Background(), uid)
	require.NoError(t, err)
	return o
}

func snapshotsOf(t *testing.T, d *nova.Driver, uid string) []driver.Snapshot {
	t.Helper()
	list, err := d.Snapshots(context.Background(), uid)
	require.NoError(t, err)
	return list
}

// cinderSnapshots are the Cinder snapshots named name.
func cinderSnapshots(t *testing.T, cl *openstack.Clients, name string) []snapshots.Snapshot {
	t.Helper()
	page, err := snapshots.ListDetail(cl.Volume, snapshots.ListOpts{AllTenants: true, Name: name}).AllPages(context.Background())
	require.NoError(t, err)
	all, err := snapshots.ExtractSnapshots(page)
	require.NoError(t, err)
	return all
}

// assertNoSnapshotsLeft checks that Cinder, once it finished deleting,
// holds no snapshot of the driver's of guest uid, and Glance no image of
// a createImage.
func assertNoSnapshotsLeft(t *testing.T, cl *openstack.Clients, uid string) {
	t.Helper()
	left := func() []string {
		var names []string
		for _, s := range cinderSnapshots(t, cl, "") {
			if s.Metadata[nova.MetaUID] == uid || strings.HasPrefix(s.Name, "snapshot for vf-snapshot-") {
				names = append(names, "snapshot "+s.Name+" ("+s.Status+")")
			}
		}
		page, err := images.List(cl.Image, images.ListOpts{}).AllPages(context.Background())
		require.NoError(t, err)
		ims, err := images.ExtractImages(page)
		require.NoError(t, err)
		for _, im := range ims {
			if strings.HasPrefix(im.Name, "vf-snapshot-") {
				names = append(names, "image "+im.Name)
			}
		}
		return names
	}
	var last []string
	assert.Eventually(t, func() bool { last = left(); return len(last) == 0 }, migrateTimeout, poll, "left: %v", &last)
}

// TestNovaDriverMakesAVolumeOfASnapshot runs a clone from a snapshot on
// the nova driver against the real services. Steps: a server runs on a
// root volume; a marker is written into the volume's file where a guest
// would have; the driver snapshots the server (Cinder snapshots); the
// marker is overwritten; a new server is ensured whose root disk is an
// image copying the first root volume as the snapshot holds it. Its new
// volume is made from the Cinder snapshot, holds the marker, not the
// overwrite, and Glance gains no image. An image naming a snapshot that
// holds no snapshot of its volume is refused, Terminal, naming why.
func TestNovaDriverMakesAVolumeOfASnapshot(t *testing.T) {
	ctx := context.Background()
	c, cl, d := cloudTest(t, func(cfg *nova.Config) { cfg.Node = "node-snapclone" })
	g := &guests{d: d, cl: cl, network: "ns_snapclone-net", subnet: [3]byte{10, 78, 0}}

	const size = 1 << 30
	src := g.machine("origin", driver.Disk{Name: "ns_origin-root", SizeBytes: size})
	g.run(t, src)
	t.Cleanup(func() {
		for _, s := range snapshotsOf(t, d, src.UID) {
			assert.NoError(t, d.DeleteSnapshot(ctx, src.UID, s.ID))
		}
	})
	var err error
	path := c.VolumePath(cinderVolume(t, cl, "ns_origin-root").ID)
	writeRandom(t, path, 5<<20, 1<<20)
	marker := fileSum(t, path)
	_, err = d.TakeSnapshot(ctx, src.UID, driver.SnapshotRequest{ID: "s-origin"})
	require.NoError(t, err)
	writeRandom(t, path, 5<<20, 1<<20+1)
	require.NotEqual(t, marker, fileSum(t, path))

	t.Run("TheNewVolumeIsTheSnapshotsCopy", func(t *testing.T) {
		image := &driver.Image{Name: "copy", UID: uuid.NewString(), SourceVolume: "ns_origin-root", SourceSnapshot: "s-origin"}
		clone := g.machine("copy", driver.Disk{Name: "ns_copy-root", SizeBytes: size, Image: image})
		g.run(t, clone)
		v := cinderVolume(t, cl, "ns_copy-root")
		set := cinderSnapshots(t, cl, "snapshot for vf-snapshot-s-origin")
		require.Len(t, set, 1)
		assert.Equal(t, set[0].ID, v.SnapshotID, "made of the Cinder snapshot the snapshot took")
		assert.Equal(t, marker, fileSum(t, c.VolumePath(v.ID)), "the volume as the snapshot holds it")
		assert.Empty(t, glanceImages(t, cl, nova.ImageName(image.UID)), "no image in between")
	})

	t.Run("ASnapshotWithoutTheVolumeIsRefused", func(t *testing.T) {
		cases := map[string]driver.Image{
			"AnotherSnapshot": {Name: "none", SourceVolume: "ns_origin-root", SourceSnapshot: "s-none"},
			"AnotherVolume":   {Name: "gone", SourceVolume: "ns_nobody-root", SourceSnapshot: "s-origin"},
		}
		for name, image := range cases {
			t.Run(name, func(t *testing.T) {
				image.UID = uuid.NewString()
				m := g.machine("refused", driver.Disk{Name: "ns_refused-" + image.Name, SizeBytes: size, Image: &image})
				_, err := d.Ensure(ctx, m)
				require.Error(t, err)
				assert.True(t, driver.IsTerminal(err), "%v", err)
				assert.ErrorContains(t, err, "volume "+image.SourceVolume)
				assert.Empty(t, cinderVolumes(t, cl, m.Disks[0].Name), "no volume made")
				assert.NoError(t, d.Delete(ctx, m.UID))
			})
		}
	})
}
