package libvirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/libvirt/qcow2"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// TestBackupsOfARealGuest backs up a guest under QEMU (guesthost: libvirt
// 9.0 and QEMU 7.2 under TCG), full and incremental, commits, fails and
// cancels backups, snapshots the guest once it has a backup's checkpoint,
// and checks that each backup, read back, is the guest's disks as QEMU
// wrote them into its volumes, read through libvirt. The guest has no
// operating system (SeaBIOS finds nothing to boot), so nothing writes to
// its disks but the test, through QEMU's own qemu-io (the monitor's, a
// test's tool only); and it has no guest agent, so nothing is frozen. It
// also records what libvirt 9.0 refuses of checkpoints beside snapshots,
// of stopped guests, and of qcow2 version 2.
func TestBackupsOfARealGuest(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	h, err := guesthost.Start(ctx, "vfbackup", os.Stderr)
	require.NoError(t, err)
	h.StopWith(t)
	d, err := Open(ctx, Config{Node: "real", Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType, ShutdownGrace: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	l := dialHost(t, h)
	pool, err := l.StoragePoolLookupByName(guesthost.Pool)
	require.NoError(t, err)

	m := driver.Machine{
		UID:         "3b9d2f4e-6a1c-4e8b-9d0f-2a4c6e8b0d1f",
		Namespace:   "team-a",
		Name:        "kept",
		Generation:  1,
		VCPU:        1,
		MemoryBytes: 128 << 20,
		SwapBytes:   8 << 20,
		Running:     true,
		Disks:       []driver.Disk{{Name: "team-a_kept-root", SizeBytes: 64 << 20}, {Name: "team-a_kept-data", SizeBytes: 16 << 20}},
	}
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	dom := domainOf(t, l, m.UID)

	// want is what the guest's disks hold, as the test wrote them; a new
	// disk reads as zeros.
	want := map[string][]byte{"root": make([]byte, 64<<20), "team-a_kept-data": make([]byte, 16<<20)}
	devices := map[string]string{"root": "virtio-disk0", "team-a_kept-data": "virtio-disk1"}
	volumes := map[string]string{"root": "team-a_kept-root", "team-a_kept-data": "team-a_kept-data"}
	write := func(t *testing.T, disk string, off, n int64, pattern int) {
		t.Helper()
		cmd := fmt.Sprintf("write -P %#x %d %d", pattern, off, n)
		if pattern == 0 {
			cmd = fmt.Sprintf("write -z %d %d", off, n)
		}
		qemuIO(t, l, dom, devices[disk], cmd)
		copy(want[disk][off:off+n], bytes.Repeat([]byte{byte(pattern)}, int(n)))
	}
	checkpoints := func(t *testing.T) []string {
		t.Helper()
		all, _, err := l.DomainListAllCheckpoints(domainOf(t, l, m.UID), 1, 0)
		require.NoError(t, err)
		var names []string
		for _, c := range all {
			names = append(names, c.Name)
		}
		slices.Sort(names)
		return names
	}
	// onDisk is what the guest's volumes hold, read back through libvirt
	// over the driver's own download connection (download.go): the disks
	// as QEMU wrote them, where want is what the test asked it to write.
	// QEMU flushes first: until then the volumes lack the qcow2 tables it
	// caches, and read as they were before.
	onDisk := func(t *testing.T) map[string][]byte {
		t.Helper()
		out := map[string][]byte{}
		for name, vol := range volumes {
			qemuIO(t, l, dom, devices[name], "flush")
			v, err := l.StorageVolLookupByName(pool, vol)
			require.NoError(t, err)
			out[name] = readVolume(t, h, v)
		}
		return out
	}
	noScratch := func(t *testing.T) {
		t.Helper()
		vols, _, err := l.StoragePoolListAllVolumes(pool, 1, 0)
		require.NoError(t, err)
		for _, v := range vols {
			assert.False(t, strings.HasSuffix(v.Name, backupSuffix), "scratch volume %s is left", v.Name)
		}
	}

	// backedUp is what the backups read, applied one after the other: the
	// disks as a store gives them back.
	backedUp := map[string][]byte{}
	t.Run("AFullBackupHandsWhatTheDisksHold", func(t *testing.T) {
		write(t, "root", 4<<20, 1<<20, 0x5a)
		write(t, "root", 63<<20, 1<<20, 0x5b)
		write(t, "team-a_kept-data", 1<<20, 64<<10, 0x11)
		rec := &backupRecorder{}
		began := time.Now()
		res, err := d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b1"}, rec)
		require.NoError(t, err)
		t.Logf("full backup of 80 MiB of disks in %s, %d bytes read", time.Since(began), res.BytesRead)
		assert.True(t, res.Full)
		assert.False(t, res.Frozen, "no guest agent answers")
		assert.Equal(t, int64(2<<20+64<<10), res.BytesRead, "the data written, nothing of what reads as zeros")
		assert.Equal(t, []driver.BackupDisk{{Name: "root", Size: 64 << 20}, {Name: "team-a_kept-data", Size: 16 << 20}}, rec.names(), "the root disk and the volume; no swap, no seed")
		assert.Equal(t, []handed{{4 << 20, 1 << 20, qcow2.Data}, {63 << 20, 1 << 20, qcow2.Data}}, rec.disk("root").ranges())
		assert.Equal(t, []handed{{1 << 20, 64 << 10, qcow2.Data}}, rec.disk("team-a_kept-data").ranges())
		rec.apply(t, backedUp)
		assertSame(t, want, backedUp)
		assertSame(t, onDisk(t), backedUp)
		assert.Equal(t, []string{"b1"}, checkpoints(t))
		noScratch(t)
	})

	t.Run("AnIncrementalHandsOnlyWhatChanged", func(t *testing.T) {
		write(t, "root", 20<<20, 2<<20, 0x6b)
		write(t, "root", 4<<20, 512<<10, 0)
		write(t, "root", 40<<20+100, 10, 0x6c) // a few bytes: their cluster
		rec := &backupRecorder{}
		began := time.Now()
		res, err := d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b2", Since: "b1"}, rec)
		require.NoError(t, err)
		t.Logf("incremental backup in %s, %d bytes read", time.Since(began), res.BytesRead)
		assert.False(t, res.Full)
		assert.Equal(t, []handed{{4 << 20, 512 << 10, qcow2.Zero}, {20 << 20, 2 << 20, qcow2.Data}, {40 << 20, 64 << 10, qcow2.Data}}, rec.disk("root").ranges(),
			"what was written since b1, in clusters of 64 KiB; a zeroed range as zeros")
		assert.Empty(t, rec.disk("team-a_kept-data").ranges(), "nothing written")
		rec.apply(t, backedUp)
		assertSame(t, want, backedUp)
		assertSame(t, onDisk(t), backedUp)
		assert.Equal(t, []string{"b1", "b2"}, checkpoints(t))
		noScratch(t)
	})

	t.Run("ABackupSinceACheckpointTheGuestNoLongerHasIsFull", func(t *testing.T) {
		require.NoError(t, d.CommitBackup(ctx, m.UID, "b2"))
		assert.Equal(t, []string{"b2"}, checkpoints(t), "committed: the others are forgotten")
		rec := &backupRecorder{}
		res, err := d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b2x", Since: "b1"}, rec)
		require.NoError(t, err)
		assert.True(t, res.Full)
		full := map[string][]byte{}
		rec.apply(t, full)
		assertSame(t, want, full)
		assertSame(t, onDisk(t), full)
		require.NoError(t, d.CommitBackup(ctx, m.UID, "b2"))
		assert.Equal(t, []string{"b2"}, checkpoints(t), "the newer checkpoint is forgotten too")
	})

	t.Run("AFailedBackupLeavesNoCheckpoint", func(t *testing.T) {
		write(t, "root", 30<<20, 64<<10, 0x7c)
		failing := errors.New("the store is full")
		_, err := d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b3", Since: "b2"}, &backupRecorder{failData: failing})
		require.ErrorIs(t, err, failing)
		assert.Equal(t, []string{"b2"}, checkpoints(t))
		noScratch(t)
	})

	t.Run("ACancelledBackupLeavesNoCheckpoint", func(t *testing.T) {
		write(t, "root", 8<<20, 48<<20, 0x7d)
		write(t, "team-a_kept-data", 2<<20, 12<<20, 0x7e)
		cut, cancelCut := context.WithCancel(ctx)
		defer cancelCut()
		d.intercept = func(a API) API { return cancelAtBegin{API: a, cancel: cancelCut} }
		_, err := d.BackUp(cut, m.UID, driver.BackupRequest{ID: "b3", Since: "b2"}, &backupRecorder{})
		d.intercept = nil
		require.ErrorIs(t, err, context.Canceled)
		assert.ErrorContains(t, err, "backup aborted")
		assert.Equal(t, []string{"b2"}, checkpoints(t))
		noScratch(t)
	})

	t.Run("TheNextIncrementalHandsAllSinceTheCommittedOne", func(t *testing.T) {
		rec := &backupRecorder{}
		res, err := d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b4", Since: "b2"}, rec)
		require.NoError(t, err)
		assert.False(t, res.Full)
		assert.Equal(t, []handed{{8 << 20, 48 << 20, qcow2.Data}}, rec.disk("root").ranges(), "what the failed (at 30 MiB) and the cancelled backups did not keep")
		assert.Equal(t, []handed{{2 << 20, 12 << 20, qcow2.Data}}, rec.disk("team-a_kept-data").ranges())
		rec.apply(t, backedUp)
		assertSame(t, want, backedUp)
		assertSame(t, onDisk(t), backedUp)
		require.NoError(t, d.CommitBackup(ctx, m.UID, "b4"))
		assert.Equal(t, []string{"b4"}, checkpoints(t))
	})

	t.Run("ASnapshotDeletesTheCheckpointsAndTheNextBackupIsFull", func(t *testing.T) {
		s, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "s1", Memory: true})
		require.NoError(t, err, "a running guest with a committed backup's checkpoint is snapshotted")
		assert.True(t, s.Online)
		assert.True(t, hasSnapshot(t, l, m.UID, "s1"))
		assert.Empty(t, checkpoints(t), "its checkpoints were deleted first")

		// What they were deleted for: the snapshot reverts, which QEMU
		// refuses beside checkpoints (see below).
		require.NoError(t, d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: "s1", Running: true}))
		state, _, err := l.DomainGetState(dom, 0)
		require.NoError(t, err)
		assert.Equal(t, golibvirt.DomainRunning, golibvirt.DomainState(state), "resumed at the snapshot's moment")

		_, err = d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b5", Since: "b4"}, &backupRecorder{})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "cannot be backed up while it has snapshots (1): delete its snapshots first")
		assert.Empty(t, checkpoints(t), "no checkpoint made")

		require.NoError(t, d.DeleteSnapshot(ctx, m.UID, "s1"))
		rec := &backupRecorder{}
		res, err := d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b5", Since: "b4"}, rec)
		require.NoError(t, err)
		assert.True(t, res.Full, "b4 went before the snapshot")
		full := map[string][]byte{}
		rec.apply(t, full)
		assertSame(t, want, full)
		assertSame(t, onDisk(t), full)
		require.NoError(t, d.CommitBackup(ctx, m.UID, "b5"))
		assert.Equal(t, []string{"b5"}, checkpoints(t))
	})

	t.Run("DownloadsReadWhatTheVolumeHoldsWhenItsDataComesBeforeTheReply", func(t *testing.T) {
		// Why the driver downloads over a connection of its own (see
		// download.go): how often libvirtd's data comes first.
		v, err := l.StorageVolLookupByName(pool, "team-a_kept-data")
		require.NoError(t, err)
		dl, err := dialDownloads(h.Socket, h.URI)
		require.NoError(t, err)
		defer dl.Close() //nolint:errcheck // read-only
		whole := make([]byte, 4<<20)
		began := time.Now()
		_, err = (&volumeReader{ctx: ctx, dl: dl, vol: v}).ReadAt(whole, 0)
		require.NoError(t, err)
		t.Logf("4 MiB downloaded in %s", time.Since(began))
		const reads = 200
		for i := range reads {
			off := int64(i*37%64) << 16
			p := make([]byte, 64<<10)
			_, err := (&volumeReader{ctx: ctx, dl: dl, vol: v}).ReadAt(p, off)
			require.NoError(t, err)
			require.Equal(t, whole[off:off+64<<10], p, "read %d at %d", i, off)
		}
		t.Logf("%d of %d downloads had data before their reply", dl.dataBeforeReply, reads+1)
	})

	t.Run("LibvirtSnapshotsAGuestWithCheckpointsButCannotRevertIt", func(t *testing.T) {
		// Why TakeSnapshot deletes a guest's checkpoints first, and
		// BackUp refuses a guest with snapshots.
		x, err := (&libvirtxml.DomainSnapshot{
			Name:   "beside-checkpoints",
			Memory: &libvirtxml.DomainSnapshotMemory{Snapshot: "internal"},
			Disks: &libvirtxml.DomainSnapshotDisks{Disks: []libvirtxml.DomainSnapshotDisk{
				{Name: "vda", Snapshot: "internal"}, {Name: "vdb", Snapshot: "internal"}, {Name: "vdc", Snapshot: "internal"}, {Name: "vdd", Snapshot: "no"},
			}},
		}).Marshal()
		require.NoError(t, err)
		snap, err := l.DomainSnapshotCreateXML(dom, x, 0)
		require.NoError(t, err, "libvirt 9.0 takes an internal snapshot of a guest with checkpoints")

		_, err = d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b6", Since: "b5"}, &backupRecorder{})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "cannot be backed up while it has snapshots (1)")
		assert.Equal(t, []string{"b5"}, checkpoints(t), "no checkpoint made")

		cx, err := (&libvirtxml.DomainCheckpoint{Name: "beside-a-snapshot"}).Marshal()
		require.NoError(t, err)
		_, err = l.DomainCheckpointCreateXML(dom, cx, 0)
		require.NoError(t, err, "libvirt 9.0 makes a checkpoint of a guest with an internal snapshot")

		err = l.DomainRevertToSnapshot(snap, 0)
		require.Error(t, err)
		// libvirt starts QEMU again to load the snapshot and quotes why it
		// exited from QEMU's log, when it reads the log in time; the log
		// itself keeps QEMU's refusal either way.
		const refusal = "Device has active dirty bitmaps"
		if !strings.Contains(err.Error(), refusal) {
			var log string
			_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				log, _ = h.QEMULog(dom.Name)
				return strings.Contains(log, refusal), nil
			})
			require.Contains(t, log, refusal, "QEMU refuses to revert a disk with bitmaps; libvirt said %v", err)
		}
		s, _, err := l.DomainGetState(dom, 0)
		require.NoError(t, err)
		assert.Equal(t, golibvirt.DomainShutoff, golibvirt.DomainState(s), "and the failed revert stopped the guest")
	})

	t.Run("AStoppedGuestIsNotBackedUp", func(t *testing.T) {
		_, err := d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b6"}, &backupRecorder{})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "libvirt 9.0 backs up only running guests")
		bx, err := (&libvirtxml.DomainBackup{Push: &libvirtxml.DomainBackupPush{}}).Marshal()
		require.NoError(t, err)
		err = l.DomainBackupBegin(dom, bx, golibvirt.OptString{}, 0)
		assert.ErrorContains(t, err, "cannot perform disk backup for inactive domain", "libvirt's own refusal")

		err = d.CommitBackup(ctx, m.UID, "b6")
		assert.ErrorContains(t, err, "libvirt 9.0 deletes checkpoints of running guests only", "a commit waits until it runs")
		assert.Equal(t, []string{"b5", "beside-a-snapshot"}, checkpoints(t))
		_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "s2"})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "is stopped and has backup checkpoints (2)")
		assert.ErrorContains(t, err, "start the guest to snapshot it")
		assert.False(t, hasSnapshot(t, l, m.UID, "s2"), "nor does a snapshot")
		c, err := l.DomainCheckpointLookupByName(dom, "beside-a-snapshot", 0)
		require.NoError(t, err)
		assert.ErrorContains(t, l.DomainCheckpointDelete(c, 0), "cannot delete checkpoint for inactive domain")
		// Its metadata alone can go, but its bitmap stays in the disks,
		// and the next checkpoint of that name fails: why the driver
		// keeps a checkpoint it cannot delete, rather than forget it.
		require.NoError(t, l.DomainCheckpointDelete(c, golibvirt.DomainCheckpointDeleteMetadataOnly))
		require.NoError(t, l.DomainCreate(dom))
		cx, err := (&libvirtxml.DomainCheckpoint{Name: "beside-a-snapshot"}).Marshal()
		require.NoError(t, err)
		_, err = l.DomainCheckpointCreateXML(dom, cx, 0)
		assert.ErrorContains(t, err, "Bitmap already exists: beside-a-snapshot")
	})

	t.Run("ADiskInQcow2Version2IsNotBackedUp", func(t *testing.T) {
		// A disk made before the driver made qcow2 version 3, attached
		// at the guest's restart.
		x, err := (&libvirtxml.StorageVolume{
			Name:     "team-a_kept-old",
			Capacity: &libvirtxml.StorageVolumeSize{Value: 8 << 20},
			Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}, Compat: "0.10"},
		}).Marshal()
		require.NoError(t, err)
		_, err = l.StorageVolCreateXML(pool, x, 0)
		require.NoError(t, err)
		snap, err := l.DomainSnapshotLookupByName(dom, "beside-checkpoints", 0)
		require.NoError(t, err)
		require.NoError(t, l.DomainSnapshotDelete(snap, 0), "which BackUp would refuse first")
		old := m
		old.Disks = append(slices.Clone(m.Disks), driver.Disk{Name: "team-a_kept-old", SizeBytes: 8 << 20})
		old.RestartNonce = "old-disk"
		began := time.Now()
		o, err := d.Ensure(ctx, old)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
		t.Logf("restarted with the old disk in %s", time.Since(began))

		// The disk's target is the one the running guest gave it.
		x, err = l.DomainGetXMLDesc(dom, 0)
		require.NoError(t, err)
		var live libvirtxml.Domain
		require.NoError(t, live.Unmarshal(x))
		var target string
		var disks []libvirtxml.DomainCheckpointDisk
		for _, disk := range live.Devices.Disks {
			c := libvirtxml.DomainCheckpointDisk{Name: disk.Target.Dev, Checkpoint: "no"}
			if disk.Source != nil && disk.Source.Volume != nil && disk.Source.Volume.Volume == "team-a_kept-old" {
				target, c.Checkpoint = disk.Target.Dev, "bitmap"
			}
			disks = append(disks, c)
		}
		require.NotEmpty(t, target, "the old disk is attached: %s", x)

		_, err = d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b7"}, &backupRecorder{})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "volume team-a_kept-old ("+target+") is qcow2 version 2")
		// libvirt's own refusal, had the driver asked.
		cx, err := (&libvirtxml.DomainCheckpoint{Name: "v2", Disks: &libvirtxml.DomainCheckpointDisks{Disks: disks}}).Marshal()
		require.NoError(t, err)
		_, err = l.DomainCheckpointCreateXML(dom, cx, 0)
		assert.ErrorContains(t, err, "Cannot store dirty bitmaps in qcow2 v2 files")
	})

	t.Run("ADeletedGuestTakesWhatBackupsLeft", func(t *testing.T) {
		// As an agent that stopped half-way would leave it.
		x, err := (&libvirtxml.StorageVolume{Name: backupScratch(m.UID, "vda"), Capacity: &libvirtxml.StorageVolumeSize{Value: 1 << 20}}).Marshal()
		require.NoError(t, err)
		_, err = l.StorageVolCreateXML(pool, x, 0)
		require.NoError(t, err)
		require.NoError(t, d.Delete(ctx, m.UID))
		vols, _, err := l.StoragePoolListAllVolumes(pool, 1, 0)
		require.NoError(t, err)
		for _, v := range vols {
			assert.False(t, strings.HasPrefix(v.Name, m.UID), "%s is left", v.Name)
		}
	})

}

// qemuIO runs a qemu-io command on the disk of dom with the device id dev,
// through QEMU's monitor: a test's way of writing as a guest would, and of
// reading what the guest sees ("read -P" checks a pattern).
func qemuIO(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain, dev, cmd string) {
	t.Helper()
	out, err := l.QEMUDomainMonitorCommand(dom, fmt.Sprintf("qemu-io -d /machine/peripheral/%s/virtio-backend %q", dev, cmd), 1) // HMP
	require.NoError(t, err)
	require.NotContains(t, out, "rror", "qemu-io %s: %s", cmd, out)
	require.NotContains(t, out, "failed", "qemu-io %s: %s", cmd, out)
}

// handed is a range a backup handed.
type handed struct {
	off, n int64
	kind   qcow2.Kind
}

// recordedDisk is one disk a backup handed.
type recordedDisk struct {
	disk  driver.BackupDisk
	data  map[int64][]byte
	order []handed
}

// ranges are the ranges handed, merged where they touch.
func (r *recordedDisk) ranges() []handed {
	var out []handed
	for _, h := range r.order {
		if n := len(out); n > 0 && out[n-1].kind == h.kind && out[n-1].off+out[n-1].n == h.off {
			out[n-1].n += h.n
			continue
		}
		out = append(out, h)
	}
	return out
}

// backupRecorder is a driver.BackupWriter that keeps what it is handed,
// and fails a Data call with failData where it is set.
type backupRecorder struct {
	disks    []*recordedDisk
	failData error
}

func (r *backupRecorder) Disk(d driver.BackupDisk) error {
	r.disks = append(r.disks, &recordedDisk{disk: d, data: map[int64][]byte{}})
	return nil
}

func (r *backupRecorder) last() (*recordedDisk, error) {
	if len(r.disks) == 0 {
		return nil, errors.New("a range before any disk")
	}
	return r.disks[len(r.disks)-1], nil
}

func (r *backupRecorder) hand(h handed) (*recordedDisk, error) {
	d, err := r.last()
	if err != nil {
		return nil, err
	}
	if n := len(d.order); n > 0 && d.order[n-1].off+d.order[n-1].n > h.off {
		return nil, fmt.Errorf("range at %d is handed after one that ends at %d", h.off, d.order[n-1].off+d.order[n-1].n)
	}
	if h.off+h.n > d.disk.Size {
		return nil, fmt.Errorf("range at %d of %d bytes is past the disk's end", h.off, h.n)
	}
	d.order = append(d.order, h)
	return d, nil
}

func (r *backupRecorder) Data(off int64, p []byte) error {
	if r.failData != nil {
		return r.failData
	}
	if len(p) > backupReadSize {
		return fmt.Errorf("%d bytes handed at once", len(p))
	}
	d, err := r.hand(handed{off, int64(len(p)), qcow2.Data})
	if err == nil {
		d.data[off] = bytes.Clone(p)
	}
	return err
}

func (r *backupRecorder) Zero(off, length int64) error {
	_, err := r.hand(handed{off, length, qcow2.Zero})
	return err
}

func (r *backupRecorder) names() []driver.BackupDisk {
	var out []driver.BackupDisk
	for _, d := range r.disks {
		out = append(out, d.disk)
	}
	return out
}

func (r *backupRecorder) disk(name string) *recordedDisk {
	for _, d := range r.disks {
		if d.disk.Name == name {
			return d
		}
	}
	return &recordedDisk{}
}

// apply writes what the backup handed over images: a full backup's onto
// zeros.
func (r *backupRecorder) apply(t *testing.T, images map[string][]byte) {
	t.Helper()
	for _, d := range r.disks {
		img, ok := images[d.disk.Name]
		if !ok {
			img = make([]byte, d.disk.Size)
			images[d.disk.Name] = img
		}
		require.Len(t, img, int(d.disk.Size))
		for _, h := range d.order {
			if h.kind == qcow2.Zero {
				clear(img[h.off : h.off+h.n])
				continue
			}
			copy(img[h.off:], d.data[h.off])
		}
	}
}

// assertSame compares disk images without printing megabytes.
func assertSame(t *testing.T, want, got map[string][]byte) {
	t.Helper()
	for name, w := range want {
		g := got[name]
		if !assert.Len(t, g, len(w), name) {
			continue
		}
		for off := 0; off < len(w); off += 64 << 10 {
			if !bytes.Equal(w[off:off+64<<10], g[off:off+64<<10]) {
				assert.Fail(t, "the images differ", "%s first differs in the 64 KiB at %d", name, off)
				break
			}
		}
	}
}

// readVolume reads a qcow2 volume back through libvirt, as the driver
// reads a backup's.
func readVolume(t *testing.T, h *guesthost.Host, v golibvirt.StorageVol) []byte {
	t.Helper()
	dl, err := dialDownloads(h.Socket, h.URI)
	require.NoError(t, err)
	defer dl.Close() //nolint:errcheck // read-only
	im, err := qcow2.Open(&volumeReader{ctx: context.Background(), dl: dl, vol: v})
	require.NoError(t, err)
	exts, err := im.Map()
	require.NoError(t, err)
	out := make([]byte, im.Size())
	require.NoError(t, im.Read(exts, 4<<20, func(off int64, p []byte) error {
		copy(out[off:], p)
		return nil
	}, nil))
	return out
}

// cancelAtBegin cancels a backup's context as soon as its job began.
type cancelAtBegin struct {
	API
	cancel context.CancelFunc
}

func (c cancelAtBegin) DomainBackupBegin(dom golibvirt.Domain, x string, cx golibvirt.OptString, flags golibvirt.DomainBackupBeginFlags) error {
	err := c.API.DomainBackupBegin(dom, x, cx, flags)
	c.cancel()
	return err
}
