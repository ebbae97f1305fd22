package libvirt

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// TestSnapshotsOfARealGuest takes, reverts and deletes snapshots of a
// guest under QEMU (guesthost, libvirt 9.0 and QEMU 7.2 on Debian 12). The
// guest has no operating system, and so no guest agent: SeaBIOS runs and
// finds nothing to boot on its empty disk.
func TestSnapshotsOfARealGuest(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h, err := guesthost.Start(ctx, "vfsnap", os.Stderr)
	require.NoError(t, err)
	h.StopWith(t)
	d, err := Open(ctx, Config{Node: "real", Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType, ShutdownGrace: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	l := dialHost(t, h)
	m := driver.Machine{
		UID:         "5e2a7c1d-9b3f-4d6e-8a0c-2b4d6f8a0c1e",
		Namespace:   "team-a",
		Name:        "kept",
		Generation:  1,
		VCPU:        1,
		MemoryBytes: 128 << 20,
		Running:     true,
		Disks:       []driver.Disk{{Name: "kept-root", SizeBytes: 64 << 20}},
	}
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	restarts := o.RestartCount
	state := func(t *testing.T) (golibvirt.DomainState, int32) {
		t.Helper()
		s, reason, err := l.DomainGetState(domainOf(t, l, m.UID), 0)
		require.NoError(t, err)
		return golibvirt.DomainState(s), reason
	}

	t.Run("LibvirtRefusesADiskOnlyInternalSnapshotOfARunningGuest", func(t *testing.T) {
		// Why QEMU takes a disk-only snapshot of a running guest itself
		// (snapshotlive.go): should a later libvirt take this, the
		// driver can leave it to libvirt.
		x, err := (&libvirtxml.DomainSnapshot{
			Name:   "disks-alone",
			Memory: &libvirtxml.DomainSnapshotMemory{Snapshot: "no"},
			Disks:  &libvirtxml.DomainSnapshotDisks{Disks: []libvirtxml.DomainSnapshotDisk{{Name: "vda", Snapshot: "internal"}, {Name: "vdb", Snapshot: "no"}}},
		}).Marshal()
		require.NoError(t, err)
		_, err = l.DomainSnapshotCreateXML(domainOf(t, l, m.UID), x, 0)
		require.ErrorContains(t, err, "internal snapshot of a running VM must include the memory state")
		assert.True(t, isCode(err, golibvirt.ErrOperationUnsupported), "%v", err)
	})

	var withMemory driver.Snapshot
	t.Run("ARunningGuestIsTakenWithItsMemory", func(t *testing.T) {
		withMemory, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "with-memory", Memory: true})
		require.NoError(t, err)
		assert.True(t, withMemory.Online)
		assert.True(t, withMemory.Memory)
		assert.False(t, withMemory.Frozen)
		assert.Positive(t, withMemory.SizeBytes, "the memory image went into the root disk")
		t.Logf("taken in %s, %d bytes", withMemory.Duration, withMemory.SizeBytes)
		listed, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		require.Len(t, listed, 1)
		withMemory.Duration = 0
		assert.Equal(t, withMemory, listed[0])
		s, _ := state(t)
		assert.Equal(t, golibvirt.DomainRunning, s, "it runs on")
	})

	t.Run("RevertedRunningItGoesOnFromTheSnapshotWithoutARestart", func(t *testing.T) {
		require.NoError(t, d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: "with-memory", Running: true}))
		s, reason := state(t)
		assert.Equal(t, golibvirt.DomainRunning, s)
		assert.Equal(t, golibvirt.DomainRunningFromSnapshot, golibvirt.DomainRunningReason(reason), "resumed, not booted")
		o, err := d.Observe(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseRunning, o.Phase)
		assert.Equal(t, restarts, o.RestartCount, "no reboot counted")
	})

	root := filepath.Join(h.LibDir("images"), "kept-root")
	t.Run("ItsDisksAloneAreTakenUnfrozenWithoutAGuestAgentWhileItRuns", func(t *testing.T) {
		writeLive(t, l, m.UID, 0xaa)
		_, before := state(t)
		got, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "disks"})
		require.NoError(t, err)
		writeLive(t, l, m.UID, 0xbb)
		assert.True(t, got.Online)
		assert.False(t, got.Memory)
		assert.False(t, got.Frozen, "no agent answered: crash-consistent")
		t.Logf("taken in %s, %d bytes", got.Duration, got.SizeBytes)
		s, after := state(t)
		assert.Equal(t, golibvirt.DomainRunning, s, "it runs on")
		// A guest libvirt paused for a snapshot runs again "unpaused".
		assert.Equal(t, golibvirt.DomainRunningReason(before), golibvirt.DomainRunningReason(after), "never paused")
		sizes := vmStateSizes(t, root)
		assert.Zero(t, sizes["disks"], "no memory was written for it")
		assert.Positive(t, sizes["with-memory"], "as it was for the snapshot with the memory")
		listed, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		got.Duration = 0
		assert.Contains(t, listed, got, "listed as taken")
	})

	t.Run("APausedGuestsDisksAreTakenAndItStaysPaused", func(t *testing.T) {
		require.NoError(t, l.DomainSuspend(domainOf(t, l, m.UID)))
		got, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "paused"})
		require.NoError(t, err)
		assert.True(t, got.Online)
		assert.False(t, got.Frozen, "a paused guest's agent cannot answer")
		assert.Zero(t, vmStateSizes(t, root)["paused"], "no memory was written for it")
		s, _ := state(t)
		assert.Equal(t, golibvirt.DomainPaused, s, "left as it was")
		require.NoError(t, l.DomainResume(domainOf(t, l, m.UID)))
		require.NoError(t, d.DeleteSnapshot(ctx, m.UID, "paused"))
		assert.NotContains(t, vmStateSizes(t, root), "paused")
	})

	t.Run("ALiveSnapshotCutShortIsTakenAgainWhole", func(t *testing.T) {
		// As an agent stopped after QEMU took it, before its record
		// was complete, leaves it.
		dom := domainOf(t, l, m.UID)
		req := driver.SnapshotRequest{ID: "cut"}
		plan, err := d.planSnapshot(l, dom, m.UID, req)
		require.NoError(t, err)
		require.True(t, plan.live)
		_, err = d.defineLiveSnapshot(l, dom, m.UID, plan, snapshotRecord{VM: m.UID, Online: true, TakenAt: time.Now().UTC()})
		require.NoError(t, err)
		require.NoError(t, takeInternalSnapshots(l, dom, req.ID, plan))
		listed, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.NotContains(t, ids(listed), req.ID, "not taken until its record is complete")

		_, err = d.TakeSnapshot(ctx, m.UID, req)
		require.NoError(t, err, "QEMU refuses a second snapshot of one name: the first was deleted")
		var cut int
		for _, s := range qcow2Snapshots(t, root) {
			if s.Name == req.ID {
				cut++
			}
		}
		assert.Equal(t, 1, cut, "one snapshot of that name in the disk")
		require.NoError(t, d.DeleteSnapshot(ctx, m.UID, req.ID))
		assert.NotContains(t, vmStateSizes(t, root), req.ID, "deleted from the disk of the running guest")
	})

	t.Run("ADiskOnlySnapshotRevertedLeavesTheGuestOff", func(t *testing.T) {
		require.NoError(t, d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: "disks", Running: true}))
		s, _ := state(t)
		assert.Equal(t, golibvirt.DomainShutoff, s)
		// qemu-io fails a read whose data is not the pattern.
		qemuTool(t, "qemu-io", "-r", "-U", "-f", "qcow2", "-c", "read -P 0xaa "+markedAt, root)
	})

	t.Run("TheNextEnsureStartsIt", func(t *testing.T) {
		o, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
		assert.Equal(t, restarts, o.RestartCount, "a start is no restart")
		s, reason := state(t)
		assert.Equal(t, golibvirt.DomainRunning, s)
		assert.Equal(t, golibvirt.DomainRunningBooted, golibvirt.DomainRunningReason(reason), "booted cold")
	})

	t.Run("AStoppedGuestsDisksAreTaken", func(t *testing.T) {
		m.Running = false
		require.Eventually(t, func() bool {
			o, err := d.Ensure(ctx, m)
			return err == nil && o.Phase == driver.PhaseStopped
		}, time.Minute, 500*time.Millisecond, "forced off once the grace is over: SeaBIOS ignores ACPI")
		got, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "stopped", Memory: true})
		require.NoError(t, err)
		assert.False(t, got.Online)
		assert.False(t, got.Memory)
		require.NoError(t, d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: "stopped", Running: true}))
		s, _ := state(t)
		assert.Equal(t, golibvirt.DomainShutoff, s)
	})

	t.Run("DeletedASnapshotIsListedNoMore", func(t *testing.T) {
		require.NoError(t, d.DeleteSnapshot(ctx, m.UID, "with-memory"))
		listed, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, []string{"disks", "stopped"}, ids(listed))
	})

	t.Run("AGuestWithARawDiskIsRefused", func(t *testing.T) {
		raw := m
		raw.UID, raw.Name = "6f3b8d2e-0c4a-4e7f-9b1d-3c5e7a9b1d2f", "raw"
		raw.Disks = []driver.Disk{{Name: "raw-root", SizeBytes: 64 << 20}, {Name: "raw-data", SizeBytes: 16 << 20, Format: "raw"}}
		_, err := d.Ensure(ctx, raw)
		require.NoError(t, err)
		_, err = d.TakeSnapshot(ctx, raw.UID, driver.SnapshotRequest{ID: "refused"})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "disk volume raw-data (vdb) is raw")
		assert.False(t, hasSnapshot(t, l, raw.UID, "refused"), "nothing taken")
	})

	t.Run("AGuestWithSnapshotsIsDeleted", func(t *testing.T) {
		require.NoError(t, d.Delete(ctx, m.UID))
		_, err := l.DomainLookupByUUID(mustUUID(t, m.UID))
		assert.True(t, isCode(err, golibvirt.ErrNoDomain), "undefined: %v", err)
	})
}

// qcow2Snapshot is an internal snapshot of a qcow2 image, as qemu-img
// lists it.
type qcow2Snapshot struct {
	Name string `json:"name"`
	// VMStateSize is how much of the guest's memory and device state it
	// holds.
	VMStateSize int64 `json:"vm-state-size"`
}

// qcow2Snapshots lists the internal snapshots of the qcow2 image at path.
func qcow2Snapshots(t *testing.T, path string) []qcow2Snapshot {
	t.Helper()
	var info struct {
		Snapshots []qcow2Snapshot `json:"snapshots"`
	}
	// -U: the running guest holds the image.
	require.NoError(t, json.Unmarshal(qemuTool(t, "qemu-img", "info", "-U", "--output=json", path), &info))
	return info.Snapshots
}

// vmStateSizes is how much of the guest's state each internal snapshot of
// the qcow2 image at path holds, by name.
func vmStateSizes(t *testing.T, path string) map[string]int64 {
	t.Helper()
	sizes := map[string]int64{}
	for _, s := range qcow2Snapshots(t, path) {
		sizes[s.Name] = s.VMStateSize
	}
	return sizes
}

// markedAt is the range of the disk writeLive writes: past what SeaBIOS
// reads, and all of one qcow2 cluster.
const markedAt = "1M 64k"

// writeLive has the QEMU of the running guest uid write pattern over
// markedAt of its first disk, as the guest would (HMP's qemu-io).
func writeLive(t *testing.T, l *golibvirt.Libvirt, uid string, pattern byte) {
	t.Helper()
	// The guest's device: its block backend is the one with write access.
	cmd := fmt.Sprintf(`qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend "write -P %#x %s"`, pattern, markedAt)
	var out string
	require.NoError(t, monitor(l, domainOf(t, l, uid), "human-monitor-command", map[string]string{"command-line": cmd}, &out))
	require.NotContains(t, out, "rror", "qemu-io: %s", out)
}
