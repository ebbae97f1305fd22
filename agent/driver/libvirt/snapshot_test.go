package libvirt

import (
	"cmp"
	"context"
	"fmt"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// snapshotCalls records the driver's freezes, thaws, snapshots taken,
// records written and reverts beside powerCalls' power calls, and fails freezes or
// records as a test asks.
type snapshotCalls struct {
	API
	calls *[]string
	// freezeErr is what a freeze returns instead of freezing;
	// recordErr what the write of a snapshot's complete record does.
	freezeErr, recordErr error
}

func (s snapshotCalls) DomainFsfreeze(dom golibvirt.Domain, mounts []string, flags uint32) (int32, error) {
	*s.calls = append(*s.calls, "freeze")
	if s.freezeErr != nil {
		return 0, s.freezeErr
	}
	return s.API.DomainFsfreeze(dom, mounts, flags)
}

func (s snapshotCalls) DomainFsthaw(dom golibvirt.Domain, mounts []string, flags uint32) (int32, error) {
	*s.calls = append(*s.calls, "thaw")
	return s.API.DomainFsthaw(dom, mounts, flags)
}

func (s snapshotCalls) DomainRevertToSnapshot(snap golibvirt.DomainSnapshot, flags uint32) error {
	call := map[golibvirt.DomainSnapshotRevertFlags]string{
		0: "revert", golibvirt.DomainSnapshotRevertRunning: "revert running", golibvirt.DomainSnapshotRevertPaused: "revert paused",
	}[golibvirt.DomainSnapshotRevertFlags(flags)]
	*s.calls = append(*s.calls, call)
	return s.API.DomainRevertToSnapshot(snap, flags)
}

func (s snapshotCalls) DomainSnapshotCreateXML(dom golibvirt.Domain, x string, flags uint32) (golibvirt.DomainSnapshot, error) {
	if flags&uint32(golibvirt.DomainSnapshotCreateRedefine) == 0 {
		*s.calls = append(*s.calls, "take")
		return s.API.DomainSnapshotCreateXML(dom, x, flags)
	}
	*s.calls = append(*s.calls, "record")
	if s.recordErr != nil {
		return golibvirt.DomainSnapshot{}, s.recordErr
	}
	return s.API.DomainSnapshotCreateXML(dom, x, flags)
}

// snapshotMachine is a guest whose disks all keep snapshots: its root
// disk is qcow2, and so is the swap the driver makes it.
func snapshotMachine(name string) driver.Machine {
	return machine(name)
}

// TestANewGuestsSwapKeepsSnapshots: QEMU takes an internal snapshot only
// when every writable disk can keep one, so the swap a guest is given is
// qcow2, and a snapshot with memory includes it.
func TestANewGuestsSwapKeepsSnapshots(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "snapshot-swap")
	d := open(t, node)
	l := raw(t, node)
	m := snapshotMachine("swapping")
	m.SwapBytes = 256 << 20
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	f, err := volumeFormat(l, testPool, swapVolume(m.UID))
	require.NoError(t, err)
	assert.Equal(t, "qcow2", f)
	s, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "with-swap", Memory: true})
	require.NoError(t, err)
	assert.True(t, s.Memory)
}

// watched opens a driver on node whose libvirt calls of interest land in
// calls, with the faults set through the returned snapshotCalls.
func watched(t *testing.T, node *libvirttest.Node) (*Driver, *[]string, *snapshotCalls) {
	t.Helper()
	d := open(t, node)
	calls := &[]string{}
	faults := &snapshotCalls{calls: calls}
	d.intercept = func(a API) API {
		f := *faults
		f.API = powerCalls{API: a, calls: calls}
		return f
	}
	return d, calls, faults
}

// stateOfGuest is the state of guest uid's domain, read behind the
// driver's back.
func stateOfGuest(t *testing.T, l *golibvirt.Libvirt, uid string) golibvirt.DomainState {
	t.Helper()
	s, _, err := l.DomainGetState(domainOf(t, l, uid), 0)
	require.NoError(t, err)
	return golibvirt.DomainState(s)
}

func ids(snaps []driver.Snapshot) []string {
	out := make([]string, 0, len(snaps))
	for _, s := range snaps {
		out = append(out, s.ID)
	}
	return out
}

// hasSnapshot says whether guest uid's domain has a snapshot named id,
// virtfleet's or not.
func hasSnapshot(t *testing.T, l *golibvirt.Libvirt, uid, id string) bool {
	t.Helper()
	_, err := l.DomainSnapshotLookupByName(domainOf(t, l, uid), id, 0)
	if isCode(err, golibvirt.ErrNoDomainSnapshot) {
		return false
	}
	require.NoError(t, err)
	return true
}

// TestSnapshotsOfAGuest walks one guest of libvirt's test driver through
// snapshots of each kind, their listing, reverts and deletion, each step
// checking what the driver asked of libvirt and the domain's state behind
// its back. The test driver keeps memory with a snapshot of a running
// guest whatever it is asked, as QEMU must, and its guest agent freezes
// filesystems.
func TestSnapshotsOfAGuest(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "snapshots")
	d, calls, _ := watched(t, node)
	l := raw(t, node)
	m := snapshotMachine("snapped")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	taken := map[string]driver.Snapshot{}

	for _, s := range []struct {
		name    string
		running bool
		req     driver.SnapshotRequest
		calls   []string
		want    driver.Snapshot // ID, Online, Memory and Frozen
	}{
		{name: "ARunningGuestWithItsMemoryIsNotFrozen", running: true, req: driver.SnapshotRequest{ID: "s-memory", Memory: true},
			calls: []string{"take", "record"}, want: driver.Snapshot{ID: "s-memory", Online: true, Memory: true}},
		{name: "ARunningGuestsDisksAloneAreTakenFrozen", running: true, req: driver.SnapshotRequest{ID: "s-disks"},
			calls: []string{"freeze", "take", "thaw", "record"}, want: driver.Snapshot{ID: "s-disks", Online: true, Frozen: true}},
		{name: "AStoppedGuestsSnapshotIsOfItsDisksWhateverIsAsked", running: false, req: driver.SnapshotRequest{ID: "s-stopped", Memory: true},
			calls: []string{"take", "record"}, want: driver.Snapshot{ID: "s-stopped"}},
	} {
		t.Run(s.name, func(t *testing.T) {
			m.Running = s.running
			_, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			*calls = nil
			got, err := d.TakeSnapshot(ctx, m.UID, s.req)
			require.NoError(t, err)
			assert.Equal(t, s.calls, *calls, "libvirt calls")
			assert.Equal(t, s.want, driver.Snapshot{ID: got.ID, Online: got.Online, Memory: got.Memory, Frozen: got.Frozen})
			assert.False(t, got.CreatedAt.IsZero(), "created at")
			assert.Positive(t, got.Duration, "taken in this process")
			assert.True(t, hasSnapshot(t, l, m.UID, s.req.ID), "libvirt has it under its ID")
			taken[got.ID] = got
		})
	}

	t.Run("TakingOneAgainReturnsItAsItWas", func(t *testing.T) {
		*calls = nil
		got, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "s-disks"})
		require.NoError(t, err)
		assert.Empty(t, *calls, "nothing frozen, nothing taken")
		want := taken["s-disks"]
		want.Duration = 0
		assert.Equal(t, want, got)
	})

	t.Run("TheyAreListedOldestFirst", func(t *testing.T) {
		got, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, []string{"s-memory", "s-disks", "s-stopped"}, ids(got))
	})

	t.Run("ANewDriverListsThemAsTheyWereTaken", func(t *testing.T) {
		got, err := open(t, node).Snapshots(ctx, m.UID)
		require.NoError(t, err)
		require.Len(t, got, len(taken))
		for _, s := range got {
			want := taken[s.ID]
			want.Duration = 0
			assert.Equal(t, want, s, "frozen, memory and the moment come back from the description")
		}
	})

	t.Run("ASnapshotVirtfleetDidNotTakeIsNoneOfTheGuests", func(t *testing.T) {
		x, err := (&libvirtxml.DomainSnapshot{Name: "by-hand"}).Marshal()
		require.NoError(t, err)
		_, err = l.DomainSnapshotCreateXML(domainOf(t, l, m.UID), x, 0)
		require.NoError(t, err)
		got, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.NotContains(t, ids(got), "by-hand", "not listed")
		err = d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: "by-hand", Running: true})
		assert.True(t, driver.IsTerminal(err), "not reverted: %v", err)
		require.NoError(t, d.DeleteSnapshot(ctx, m.UID, "by-hand"))
		assert.True(t, hasSnapshot(t, l, m.UID, "by-hand"), "not deleted")
	})

	for _, s := range []struct {
		name    string
		id      string
		running bool
		calls   []string
		state   golibvirt.DomainState
	}{
		{name: "ASnapshotWithMemoryRevertedRunningResumesTheGuest", id: "s-memory", running: true, calls: []string{"revert running"}, state: golibvirt.DomainRunning},
		{name: "ASnapshotWithMemoryRevertedStoppedLeavesItOff", id: "s-memory", running: false, calls: []string{"revert paused", "destroy"}, state: golibvirt.DomainShutoff},
		{name: "ADiskOnlySnapshotOfARunningGuestNeverRunsItsMemory", id: "s-disks", running: true, calls: []string{"revert paused", "destroy"}, state: golibvirt.DomainShutoff},
		{name: "AStoppedGuestsSnapshotLeavesItOff", id: "s-stopped", running: true, calls: []string{"revert", "destroy"}, state: golibvirt.DomainShutoff},
	} {
		t.Run(s.name, func(t *testing.T) {
			// From a running guest each time, the hardest case.
			m.Running = true
			_, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			*calls = nil
			require.NoError(t, d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: s.id, Running: s.running}))
			assert.Equal(t, s.calls, *calls, "revert and power calls")
			assert.Equal(t, s.state, stateOfGuest(t, l, m.UID), "the domain's state behind the driver's back")
			o, err := d.Observe(ctx, m.UID)
			require.NoError(t, err)
			assert.Equal(t, map[bool]driver.Phase{true: driver.PhaseRunning, false: driver.PhaseStopped}[s.state == golibvirt.DomainRunning], o.Phase)
			if s.state == golibvirt.DomainRunning {
				require.True(t, receive(t, d, driver.Event{UID: m.UID, Kind: driver.EventStarted}), "libvirt says the guest started from the snapshot")
				d.stateMu.Lock()
				_, known := d.startedAt[m.UID]
				d.stateMu.Unlock()
				assert.False(t, known, "no new boot began: no lease of the guest's is too old for it")
			}
		})
	}

	t.Run("TheNextEnsureStartsAGuestARevertLeftOff", func(t *testing.T) {
		*calls = nil
		o, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		assert.Equal(t, []string{"start"}, *calls)
		assert.Equal(t, driver.PhaseRunning, o.Phase)
	})

	t.Run("ANamedRevertIsMadeOnce", func(t *testing.T) {
		r := driver.RevertRequest{Snapshot: "s-memory", Restore: "restore-1", Running: true}
		*calls = nil
		require.NoError(t, d.RevertSnapshot(ctx, m.UID, r))
		assert.Equal(t, []string{"revert running"}, *calls)
		*calls = nil
		require.NoError(t, d.RevertSnapshot(ctx, m.UID, r), "an agent that restarted before it reported the revert asks again")
		assert.Empty(t, *calls, "the revert made is not made again")
		r.Restore = "restore-2"
		require.NoError(t, d.RevertSnapshot(ctx, m.UID, r))
		assert.Equal(t, []string{"revert running"}, *calls, "another restore reverts again")
	})

	t.Run("AnUnknownSnapshotIsTerminal", func(t *testing.T) {
		err := d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: "never-taken", Running: true})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.Equal(t, golibvirt.DomainRunning, stateOfGuest(t, l, m.UID), "the guest runs on")
	})

	t.Run("DeletedItIsGone", func(t *testing.T) {
		require.NoError(t, d.DeleteSnapshot(ctx, m.UID, "s-disks"))
		assert.False(t, hasSnapshot(t, l, m.UID, "s-disks"))
		got, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, []string{"s-memory", "s-stopped"}, ids(got))
		assert.Equal(t, golibvirt.DomainRunning, stateOfGuest(t, l, m.UID), "the guest is not touched")
	})

	t.Run("DeletingItAgainSucceeds", func(t *testing.T) {
		require.NoError(t, d.DeleteSnapshot(ctx, m.UID, "s-disks"))
	})

	t.Run("AGuestWithSnapshotsIsDeletedWithThem", func(t *testing.T) {
		require.NoError(t, d.Delete(ctx, m.UID))
		_, err := l.DomainLookupByUUID(mustUUID(t, m.UID))
		assert.True(t, isCode(err, golibvirt.ErrNoDomain), "undefined: %v", err)
		got, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.Empty(t, got)
	})
}

// TestARevertKeepsWhatTheDriverRecorded: the restart and reset nonces
// handled and the restarts counted after a snapshot was taken are not
// undone by its revert, so the next Ensure acts on none of them again.
func TestARevertKeepsWhatTheDriverRecorded(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "snapshot-record")
	d, calls, _ := watched(t, node)
	l := raw(t, node)
	m := snapshotMachine("recorded")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "before", Memory: true})
	require.NoError(t, err)
	_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "before-disks"})
	require.NoError(t, err)
	m.RestartNonce = "n1"
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	m.ResetNonce = "r1"
	*calls = nil
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, []string{"reset"}, *calls)
	require.Equal(t, int32(2), o.RestartCount, "a restart and a reset since the snapshot")
	recorded := definition(t, l, m).Metadata

	for _, s := range []struct {
		name  string
		id    string
		calls []string
	}{
		{name: "ResumedFromTheSnapshot", id: "before", calls: []string{"revert running"}},
		{name: "BootedColdFromTheSnapshotsDisks", id: "before-disks", calls: []string{"revert paused", "destroy", "start"}},
	} {
		t.Run(s.name, func(t *testing.T) {
			*calls = nil
			require.NoError(t, d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: s.id, Running: true}))
			o, err := d.Observe(ctx, m.UID)
			require.NoError(t, err)
			assert.Equal(t, int32(2), o.RestartCount, "the count does not go back, nor jump")
			o, err = d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, s.calls, *calls, "no restart or reset made again")
			assert.Equal(t, int32(2), o.RestartCount)
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.Equal(t, recorded, definition(t, l, m).Metadata, "the running definition's metadata as before the revert")
		})
	}
}

// TestARevertBringsBackTheSnapshotsShape: the definitions a revert brings
// back are the snapshot's, and so is their spec hash, so that the next
// Ensure gives the guest the shape its Machine says, not the one it had
// when the snapshot was taken.
func TestARevertBringsBackTheSnapshotsShape(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "snapshot-shape")
	d := open(t, node)
	l := raw(t, node)
	m := snapshotMachine("reshaped")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "two-vcpus"})
	require.NoError(t, err)
	// A new maximum waits for the next start; the vCPUs within the one
	// the guest runs with do not.
	m.VCPU, m.MaxVCPU = 4, 4
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.True(t, o.RestartRequired, "the new shape waits for the next start")

	require.NoError(t, d.RevertSnapshot(ctx, m.UID, driver.RevertRequest{Snapshot: "two-vcpus", Running: true}))
	vcpus := func() (current, maximum uint) {
		v := definition(t, l, m).VCPU
		return cmp.Or(v.Current, v.Value), v.Value
	}
	current, _ := vcpus()
	assert.Equal(t, uint(2), current, "the snapshot's definition is back")
	o, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.False(t, o.RestartRequired)
	current, maximum := vcpus()
	assert.Equal(t, [2]uint{4, 4}, [2]uint{current, maximum}, "started with the Machine's shape and maximum")
}

// TestAStartFromASnapshotIsNoBoot: libvirt announces a guest resumed from
// a snapshot as started, and the driver may hear it after the revert
// returned; it must not take it for a new boot, whose leases from before
// would be too old.
func TestAStartFromASnapshotIsNoBoot(t *testing.T) {
	d := open(t, libvirttest.Start(t, "snapshot-start"))
	m := snapshotMachine("started")
	for _, tc := range []struct {
		name   string
		detail golibvirt.DomainEventStartedDetailType
		boot   bool
	}{
		{name: "ABoot", detail: golibvirt.DomainEventStartedBooted, boot: true},
		{name: "AStartFromASnapshot", detail: golibvirt.DomainEventStartedFromSnapshot},
		{name: "AnArrivalByMigration", detail: golibvirt.DomainEventStartedMigrated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.stateMu.Lock()
			delete(d.startedAt, m.UID)
			d.stateMu.Unlock()
			d.handle(golibvirt.DomainEventLifecycleMsg{
				Dom:   golibvirt.Domain{Name: domainName(m), UUID: mustUUID(t, m.UID)},
				Event: int32(golibvirt.DomainEventStarted), Detail: int32(tc.detail),
			})
			d.stateMu.Lock()
			_, known := d.startedAt[m.UID]
			d.stateMu.Unlock()
			assert.Equal(t, tc.boot, known, "a boot began")
		})
	}
}

// TestSnapshotsRefused: what no snapshot can be taken of, or reverted to,
// is said at once and leaves nothing behind.
func TestSnapshotsRefused(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "snapshot-refused")
	d := open(t, node)
	l := raw(t, node)

	for _, tc := range []struct {
		name    string
		machine string
		change  func(m *driver.Machine)
		// before runs before the guest is made.
		before func(t *testing.T, m driver.Machine)
		says   func(m driver.Machine) string
	}{
		{name: "AGuestWithSwapMadeRawBefore", machine: "swapped", change: func(m *driver.Machine) { m.SwapBytes = 256 << 20 }, before: func(t *testing.T, m driver.Machine) {
			p, err := l.StoragePoolLookupByName(testPool)
			require.NoError(t, err)
			_, err = createVolume(l, p, swapVolume(m.UID), m.SwapBytes, "raw")
			require.NoError(t, err, "a swap volume as the driver made them before they were qcow2")
		}, says: func(m driver.Machine) string { return "swap disk volume " + swapVolume(m.UID) + " (vdb) is raw" }},
		{name: "AGuestWithARawDataDisk", machine: "raw", change: func(m *driver.Machine) {
			m.Disks = append(m.Disks, driver.Disk{Name: "raw-data", SizeBytes: 1 << 30, Format: "raw"})
		}, says: func(driver.Machine) string { return "disk volume raw-data (vdb) is raw" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := snapshotMachine(tc.machine)
			tc.change(&m)
			if tc.before != nil {
				tc.before(t, m)
			}
			_, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "refused", Memory: true})
			assert.True(t, driver.IsTerminal(err), "%v", err)
			assert.ErrorContains(t, err, tc.says(m))
			assert.ErrorContains(t, err, "qcow2")
			assert.False(t, hasSnapshot(t, l, m.UID, "refused"), "nothing taken")
		})
	}

	t.Run("APoolWithoutRoomForTheGuestsMemory", func(t *testing.T) {
		m := snapshotMachine("roomless")
		_, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		fillPool(t, node, 1<<20)
		_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "refused", Memory: true})
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, fmt.Sprintf("snapshot refused of guest %s, which keeps its memory, needs %d bytes but storage pool %q has 1048576 of", m.UID, m.MemoryBytes, testPool))
		assert.False(t, hasSnapshot(t, l, m.UID, "refused"), "nothing taken")
		assert.Equal(t, golibvirt.DomainRunning, stateOfGuest(t, l, m.UID), "it runs on")
	})

	absent := snapshotMachine("absent")
	t.Run("TakingOneOfAnAbsentGuestIsNotFound", func(t *testing.T) {
		_, err := d.TakeSnapshot(ctx, absent.UID, driver.SnapshotRequest{ID: "s"})
		assert.True(t, driver.IsNotFound(err), "%v", err)
	})
	t.Run("RevertingOneOfAnAbsentGuestIsNotFound", func(t *testing.T) {
		err := d.RevertSnapshot(ctx, absent.UID, driver.RevertRequest{Snapshot: "s", Running: true})
		assert.True(t, driver.IsNotFound(err), "%v", err)
	})
	t.Run("AnAbsentGuestHasNone", func(t *testing.T) {
		got, err := d.Snapshots(ctx, absent.UID)
		require.NoError(t, err)
		assert.Nil(t, got)
	})
	t.Run("DeletingOneOfAnAbsentGuestSucceeds", func(t *testing.T) {
		require.NoError(t, d.DeleteSnapshot(ctx, absent.UID, "s"))
	})
	t.Run("ASnapshotNeedsAnID", func(t *testing.T) {
		m := snapshotMachine("unnamed")
		_, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{})
		assert.True(t, driver.IsTerminal(err), "%v", err)
	})
}

// TestASnapshotCutShort: whatever fails once the guest was frozen or its
// snapshot begun, the guest is thawed and no part of the snapshot is left;
// one an agent that stopped left incomplete is taken again. A guest whose
// agent does not answer is snapshotted as it is.
func TestASnapshotCutShort(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "snapshot-cut")
	d, calls, faults := watched(t, node)
	l := raw(t, node)
	m := snapshotMachine("cut")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	t.Run("ARecordThatCannotBeWrittenLeavesNoSnapshot", func(t *testing.T) {
		faults.recordErr = golibvirt.Error{Code: uint32(golibvirt.ErrInternalError), Message: "injected"}
		defer func() { faults.recordErr = nil }()
		*calls = nil
		_, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "cut"})
		require.ErrorContains(t, err, "injected")
		assert.Equal(t, []string{"freeze", "take", "thaw", "record"}, *calls)
		assert.False(t, hasSnapshot(t, l, m.UID, "cut"), "the partial snapshot is deleted")
	})

	t.Run("AnIncompleteSnapshotIsTakenAgain", func(t *testing.T) {
		desc, err := snapshotRecord{VM: m.UID}.description()
		require.NoError(t, err)
		x, err := (&libvirtxml.DomainSnapshot{Name: "incomplete", Description: desc}).Marshal()
		require.NoError(t, err)
		_, err = l.DomainSnapshotCreateXML(domainOf(t, l, m.UID), x, 0)
		require.NoError(t, err)
		listed, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.Empty(t, listed, "not one the guest has")

		*calls = nil
		got, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "incomplete"})
		require.NoError(t, err)
		assert.Equal(t, []string{"freeze", "take", "thaw", "record"}, *calls, "taken anew, with a freeze and a thaw")
		assert.True(t, got.Frozen)
		listed, err = d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, []string{"incomplete"}, ids(listed))
	})

	t.Run("AGuestWhoseAgentDoesNotAnswerIsNotFrozen", func(t *testing.T) {
		faults.freezeErr = golibvirt.Error{Code: uint32(golibvirt.ErrAgentUnresponsive), Message: "Guest agent is not responding: QEMU guest agent is not connected"}
		defer func() { faults.freezeErr = nil }()
		*calls = nil
		got, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "unfrozen"})
		require.NoError(t, err)
		assert.False(t, got.Frozen, "crash-consistent")
		assert.Equal(t, []string{"freeze", "take", "thaw", "record"}, *calls, "a thaw all the same: a freeze that timed out may have frozen")
	})
}
