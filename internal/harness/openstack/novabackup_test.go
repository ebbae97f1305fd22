package openstack_test

import (
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

// TestNovaDriverBacksUpAndRestoresThroughCinderAndGlance runs the nova
// driver's backups against the real services and a real S3 store: a
// server's two volumes, with data written into their files where a guest
// would have, are read through a forced snapshot of each, a volume of it
// and its raw upload to Glance, into a backup that holds exactly the data;
// nothing of the temporaries is left. A second backup of the unchanged
// guest uploads no chunk. A new server's boot volume made from the
// backup's root disk holds the same bytes.
func TestNovaDriverBacksUpAndRestoresThroughCinderAndGlance(t *testing.T) {
	ctx := context.Background()
	c, cl, d := cloudTest(t, func(cfg *nova.Config) {
		cfg.Node = "node-backups"
		cfg.Images.Dir = t.TempDir()
		cfg.ImagePruneInterval = time.Hour
	})
	srv := s3test.New(t)
	require.NoError(t, srv.MakeBucket(ctx, "backups"))
	loc := wire.BackupLocation{
		Endpoint: srv.Endpoint, Insecure: true, Region: srv.Region, Bucket: "backups",
		Credentials: wire.BackupCredentials{AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey},
	}
	store, err := backupstore.Open(ctx, backupstore.LocationOf(loc))
	require.NoError(t, err)

	g := &guests{d: d, cl: cl, network: "ns_backups-net", subnet: [3]byte{10, 79, 0}}
	machine, run := g.machine, g.run

	const size = 1 << 30
	vm := machine("backed-up", driver.Disk{Name: "ns_backed-up-root", SizeBytes: size}, driver.Disk{Name: "ns_backed-up-data", SizeBytes: size})
	run(t, vm)
	// What the guest wrote: whole chunks and a piece of one, at offsets
	// that are not the start.
	written := map[string][2]int64{"ns_backed-up-root": {5 << 20, 3 << 20}, "ns_backed-up-data": {512 << 20, 1<<20 + 10}}
	sums := map[string][32]byte{}
	for name, w := range written {
		path := c.VolumePath(cinderVolume(t, cl, name).ID)
		writeRandom(t, path, w[0], w[1])
		sums[name] = fileSum(t, path)
	}

	var first backupstore.Manifest
	t.Run("ABackupHoldsTheVolumesDataAndLeavesNoTemporaries", func(t *testing.T) {
		w, err := store.NewWriter(ctx, backupstore.Manifest{ID: "b-1", Namespace: "ns", VMName: vm.Name, VMUID: vm.UID}, nil)
		require.NoError(t, err)
		start := time.Now()
		res, err := d.BackUp(ctx, vm.UID, driver.BackupRequest{ID: "b-1"}, w)
		require.NoError(t, err)
		first, err = w.Commit(ctx)
		require.NoError(t, err)
		st := w.Stats()
		t.Logf("backup of %d bytes of disks in %s: %d bytes of data handed, %d bytes in %d chunks written", res.BytesRead, time.Since(start).Round(time.Millisecond), st.BytesRead, st.BytesWritten, st.ChunksWritten)
		assert.True(t, res.Full, "Cinder tracks no changed blocks: every backup is full")
		assert.False(t, res.Frozen)
		assert.Equal(t, int64(2*size), res.BytesRead, "both volumes read whole")
		assert.Equal(t, int64(3<<20+2<<20), st.BytesRead, "only the chunk windows that hold data are handed as data")
		assert.Equal(t, int64(5), st.ChunksWritten)
		require.Len(t, first.Disks, 2)
		assert.Equal(t, "root", first.Disks[0].Name, "the boot volume is the root disk")
		assert.Equal(t, "ns_backed-up-data", first.Disks[1].Name, "another volume is named as in Cinder")
		for _, disk := range first.Disks {
			assert.Equal(t, int64(size), disk.Size)
		}
		assertNoTemporaries(t, cl, vm.UID)
	})

	t.Run("ASecondBackupOfTheUnchangedGuestUploadsNoChunk", func(t *testing.T) {
		require.NotEmpty(t, first.ID)
		w, err := store.NewWriter(ctx, backupstore.Manifest{ID: "b-2", Namespace: "ns", VMName: vm.Name, VMUID: vm.UID}, &first)
		require.NoError(t, err)
		res, err := d.BackUp(ctx, vm.UID, driver.BackupRequest{ID: "b-2", Since: "b-1"}, w)
		require.NoError(t, err)
		require.True(t, res.Full)
		w.MarkFull()
		_, err = w.Commit(ctx)
		require.NoError(t, err)
		assert.Zero(t, w.Stats().ChunksWritten)
		assert.Equal(t, int64(5), w.Stats().ChunksReused)
		require.NoError(t, d.CommitBackup(ctx, vm.UID, "b-2"))
	})

	t.Run("AVolumeMadeFromTheBackupHoldsTheRootDisk", func(t *testing.T) {
		require.NotEmpty(t, first.ID)
		img := &driver.Image{
			UID: uuid.NewString(), Name: "restored", Format: "raw",
			Backup: &wire.ImageBackup{Location: loc, Namespace: "ns", ID: "b-1", Disk: "root"},
		}
		again := machine("restored", driver.Disk{Name: "ns_restored-root", SizeBytes: size, Image: img})
		// The cloud is shared with the image tests, which count the
		// images the driver imported: the restored one goes, after the
		// guest and its volume (cleanups run last first).
		t.Cleanup(func() {
			page, err := images.List(cl.Image, images.ListOpts{Name: nova.ImageName(img.UID)}).AllPages(ctx)
			require.NoError(t, err)
			all, err := images.ExtractImages(page)
			require.NoError(t, err)
			for _, im := range all {
				assert.NoError(t, images.Delete(ctx, cl.Image, im.ID).ExtractErr())
			}
		})
		start := time.Now()
		run(t, again)
		t.Logf("restored guest running %s after its Ensure began", time.Since(start).Round(time.Millisecond))
		v := cinderVolume(t, cl, again.Disks[0].Name)
		assert.Equal(t, sums["ns_backed-up-root"], fileSum(t, c.VolumePath(v.ID)), "the restored volume holds the backed-up root disk's bytes")
	})

	t.Run("BadInput", func(t *testing.T) {
		cases := map[string]struct {
			uid, id string
			check   func(error) bool
			message string
		}{
			"NoID":         {uid: vm.UID, check: driver.IsTerminal, message: "needs an ID"},
			"UnknownGuest": {uid: uuid.NewString(), id: "b-x", check: driver.IsNotFound, message: "no server with"},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				w, err := store.NewWriter(ctx, backupstore.Manifest{ID: "bad-" + strings.ToLower(name), Namespace: "ns", VMName: vm.Name, VMUID: vm.UID}, nil)
				require.NoError(t, err)
				defer w.Abort()
				_, err = d.BackUp(ctx, tc.uid, driver.BackupRequest{ID: tc.id}, w)
				require.Error(t, err)
				assert.True(t, tc.check(err), "%v", err)
				assert.ErrorContains(t, err, tc.message)
			})
		}
	})
}

// guests are the Machines of one test of the nova driver d, on a network
// of the test's own: each gets the next address of its /24 subnet, as the
// hub gives them.
type guests struct {
	d       *nova.Driver
	cl      *openstack.Clients
	network string
	subnet  [3]byte
	host    byte
}

func (g *guests) machine(name string, disks ...driver.Disk) driver.Machine {
	g.host++
	return driver.Machine{
		UID: uuid.NewString(), Namespace: "ns", Name: name, Generation: 1,
		VCPU: 1, MemoryBytes: 256 << 20, Running: true, Disks: disks,
		Networks: []driver.Network{{
			Name: g.network, CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{g.subnet[0], g.subnet[1], g.subnet[2], 0}), 24).String(),
			Address: netip.PrefixFrom(netip.AddrFrom4([4]byte{g.subnet[0], g.subnet[1], g.subnet[2], 10 + g.host}), 24),
		}},
	}
}

// run ensures m until it runs with its volumes attached; the test's
// cleanup deletes it and its volumes.
func (g *guests) run(t *testing.T, m driver.Machine) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() {
		assert.Eventually(t, func() bool { return g.d.Delete(ctx, m.UID) == nil }, migrateTimeout, poll)
		for _, disk := range m.Disks {
			assert.Eventually(t, func() bool { return g.d.DeleteVolume(ctx, disk) == nil }, migrateTimeout, poll)
		}
	})
	g.ensureRunning(t, m)
}

// ensureRunning ensures m until it runs with its volumes attached.
func (g *guests) ensureRunning(t *testing.T, m driver.Machine) {
	t.Helper()
	require.Eventually(t, func() bool {
		o, err := g.d.Ensure(context.Background(), m)
		return err == nil && o.Phase == driver.PhaseRunning && attachedVolumes(t, g.cl, o.ID) == len(m.Disks)
	}, bootTimeout, poll, "guest %s runs with its %d volumes attached", m.Name, len(m.Disks))
}

// attachedVolumes counts the volumes attached to server id.
func attachedVolumes(t *testing.T, cl *openstack.Clients, id string) int {
	t.Helper()
	s, err := servers.Get(context.Background(), cl.Compute, id).Extract()
	require.NoError(t, err)
	return len(s.AttachedVolumes)
}

// writeRandom writes n random bytes at off into the file at path.
func writeRandom(t *testing.T, path string, off, n int64) {
	t.Helper()
	p := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(off), byte(n)})
	_, _ = r.Read(p)
	f, err := os.OpenFile(path, os.O_WRONLY, 0) //nolint:gosec // the cloud's own volume
	require.NoError(t, err)
	_, err = f.WriteAt(p, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// fileSum is the SHA-256 of the file at path.
func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path) //nolint:gosec // the cloud's own volume
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return [32]byte(h.Sum(nil))
}

// assertNoTemporaries checks that no snapshot, volume or image a backup of
// guest uid made is left, once Cinder finished deleting them.
func assertNoTemporaries(t *testing.T, cl *openstack.Clients, uid string) {
	t.Helper()
	prefix := "vf-backup-" + uid
	left := func() []string {
		var names []string
		page, err := snapshots.List(cl.Volume, snapshots.ListOpts{AllTenants: true}).AllPages(context.Background())
		require.NoError(t, err)
		snaps, err := snapshots.ExtractSnapshots(page)
		require.NoError(t, err)
		for _, s := range snaps {
			names = append(names, "snapshot "+s.Name)
		}
		vpage, err := volumes.List(cl.Volume, volumes.ListOpts{AllTenants: true}).AllPages(context.Background())
		require.NoError(t, err)
		vols, err := volumes.ExtractVolumes(vpage)
		require.NoError(t, err)
		for _, v := range vols {
			names = append(names, "volume "+v.Name)
		}
		ipage, err := images.List(cl.Image, images.ListOpts{}).AllPages(context.Background())
		require.NoError(t, err)
		ims, err := images.ExtractImages(ipage)
		require.NoError(t, err)
		for _, im := range ims {
			names = append(names, "image "+im.Name)
		}
		var ours []string
		for _, n := range names {
			if strings.Contains(n, " "+prefix) {
				ours = append(ours, n)
			}
		}
		return ours
	}
	var last []string
	assert.Eventually(t, func() bool { last = left(); return len(last) == 0 }, migrateTimeout, poll, "temporaries left: %v", &last)
}
