package fake

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestSnapshotter pins the fake's driver.Snapshotter to the contract the
// reconciler's tests rely on, each case from a guest that runs.
func TestSnapshotter(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	guest := driver.Machine{UID: uid, Namespace: "team-a", Name: "web-1", Disks: []driver.Disk{{Name: "root", SizeBytes: 1 << 30}}, VCPU: 2, MemoryBytes: 512 << 20, Running: true, RestartNonce: "n1"}
	stopped := guest
	stopped.Running = false

	cases := map[string]func(t *testing.T, d *Driver){
		"TakingAgainReturnsTheSnapshotAsTakenAndKeepsOne": func(t *testing.T, d *Driver) {
			first, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1", Memory: true})
			require.NoError(t, err)
			again, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err)
			assert.Equal(t, first, again, "never taken again, whatever the request says")
			list, err := d.Snapshots(ctx, uid)
			require.NoError(t, err)
			assert.Equal(t, []driver.Snapshot{first}, list)
		},
		"ARunningGuestWithMemoryIsOnlineAndHoldsItsMemory": func(t *testing.T, d *Driver) {
			s, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1", Memory: true})
			require.NoError(t, err)
			assert.Equal(t, driver.Snapshot{ID: "s1", CreatedAt: s.CreatedAt, Duration: snapshotDuration, SizeBytes: 1<<30 + 512<<20, Online: true, Memory: true}, s)
			assert.False(t, s.CreatedAt.IsZero())
		},
		"ARunningGuestWithoutMemoryIsFrozen": func(t *testing.T, d *Driver) {
			s, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err)
			assert.True(t, s.Online)
			assert.True(t, s.Frozen)
			assert.False(t, s.Memory)
			assert.Equal(t, int64(1<<30), s.SizeBytes)
		},
		"AStoppedGuestsSnapshotIsOfItsDisksAlone": func(t *testing.T, d *Driver) {
			_, err := d.Ensure(ctx, stopped)
			require.NoError(t, err)
			s, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1", Memory: true})
			require.NoError(t, err)
			assert.False(t, s.Online || s.Memory || s.Frozen)
		},
		"AGuestNotOnTheNodeIsNotFoundAndHasNoSnapshots": func(t *testing.T, d *Driver) {
			_, err := d.TakeSnapshot(ctx, "other", driver.SnapshotRequest{ID: "s1"})
			assert.True(t, driver.IsNotFound(err), "take: %v", err)
			assert.True(t, driver.IsNotFound(d.RevertSnapshot(ctx, "other", driver.RevertRequest{Snapshot: "s1", Running: true})), "revert")
			list, err := d.Snapshots(ctx, "other")
			require.NoError(t, err)
			assert.Empty(t, list)
			assert.NoError(t, d.DeleteSnapshot(ctx, "other", "s1"))
		},
		"AnIDAnotherGuestHasIsRefused": func(t *testing.T, d *Driver) {
			other := guest
			other.UID = "other"
			_, err := d.Ensure(ctx, other)
			require.NoError(t, err)
			_, err = d.TakeSnapshot(ctx, "other", driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err)
			_, err = d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			assert.True(t, driver.IsTerminal(err), "got %v", err)
		},
		"DeletingIsIdempotentAndLeavesTheGuest": func(t *testing.T, d *Driver) {
			_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err)
			require.NoError(t, d.DeleteSnapshot(ctx, uid, "s1"))
			require.NoError(t, d.DeleteSnapshot(ctx, uid, "s1"))
			list, err := d.Snapshots(ctx, uid)
			require.NoError(t, err)
			assert.Empty(t, list)
			o, err := d.Observe(ctx, uid)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase)
		},
		"TheGuestsSnapshotsGoWithIt": func(t *testing.T, d *Driver) {
			_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err)
			require.NoError(t, d.Delete(ctx, uid))
			_, err = d.Ensure(ctx, guest)
			require.NoError(t, err)
			list, err := d.Snapshots(ctx, uid)
			require.NoError(t, err)
			assert.Empty(t, list)
		},
		"RevertingWithMemoryAndRunningKeepsTheSameBootRunning": func(t *testing.T, d *Driver) {
			_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1", Memory: true})
			require.NoError(t, err)
			_, err = d.Ensure(ctx, stopped)
			require.NoError(t, err)
			require.NoError(t, d.RevertSnapshot(ctx, uid, driver.RevertRequest{Snapshot: "s1", Running: true}))
			o, err := d.Observe(ctx, uid)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.Zero(t, o.RestartCount, "not restarted")
			o, err = d.Ensure(ctx, guest)
			require.NoError(t, err)
			assert.Zero(t, o.RestartCount, "the restart nonce handled before the revert is not replayed")
		},
		"RevertingWithMemoryButNotRunningLeavesItStopped": func(t *testing.T, d *Driver) {
			_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1", Memory: true})
			require.NoError(t, err)
			require.NoError(t, d.RevertSnapshot(ctx, uid, driver.RevertRequest{Snapshot: "s1", Running: false}))
			o, err := d.Observe(ctx, uid)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseStopped, o.Phase)
		},
		"RevertingToDisksAloneLeavesItStoppedForEnsureToStart": func(t *testing.T, d *Driver) {
			_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err)
			require.NoError(t, d.RevertSnapshot(ctx, uid, driver.RevertRequest{Snapshot: "s1", Running: true}))
			o, err := d.Observe(ctx, uid)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseStopped, o.Phase)
			o, err = d.Ensure(ctx, guest)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.Zero(t, o.RestartCount)
		},
		"ANamedRevertIsMadeOnce": func(t *testing.T, d *Driver) {
			_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err)
			r := driver.RevertRequest{Snapshot: "s1", Restore: "r1", Running: true}
			require.NoError(t, d.RevertSnapshot(ctx, uid, r))
			o, err := d.Ensure(ctx, guest)
			require.NoError(t, err)
			require.Equal(t, driver.PhaseRunning, o.Phase)
			require.NoError(t, d.RevertSnapshot(ctx, uid, r), "asked again after a restart")
			o, err = d.Observe(ctx, uid)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase, "not reverted again: the guest runs on")
		},
		"RevertingToASnapshotTheGuestHasNotIsTerminal": func(t *testing.T, d *Driver) {
			err := d.RevertSnapshot(ctx, uid, driver.RevertRequest{Snapshot: "s9", Running: true})
			assert.True(t, driver.IsTerminal(err), "got %v", err)
		},
		"NextHooksFailOneCallEachAndAreRecorded": func(t *testing.T, d *Driver) {
			d.NextTakeSnapshotErr, d.NextSnapshotsErr, d.NextDeleteSnapshotErr, d.NextRevertSnapshotErr = boom, boom, boom, boom
			_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.ErrorIs(t, err, boom)
			_, err = d.Snapshots(ctx, uid)
			require.ErrorIs(t, err, boom)
			require.ErrorIs(t, d.DeleteSnapshot(ctx, uid, "s1"), boom)
			require.ErrorIs(t, d.RevertSnapshot(ctx, uid, driver.RevertRequest{Snapshot: "s1", Running: true}), boom)
			_, err = d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
			require.NoError(t, err, "cleared")
			require.NoError(t, d.RevertSnapshot(ctx, uid, driver.RevertRequest{Snapshot: "s1", Running: false}))
			calls := d.Calls()
			assert.Equal(t, []string{"Ensure", "TakeSnapshot", "Snapshots", "DeleteSnapshot", "RevertSnapshot", "TakeSnapshot", "RevertSnapshot"}, ops(calls))
			last := calls[len(calls)-1]
			assert.Equal(t, "s1", last.Snapshot.ID)
			assert.False(t, last.Running)
		},
		"FailFailsEveryTakeOfTheGuest": func(t *testing.T, d *Driver) {
			d.Fail("TakeSnapshot", uid, boom)
			for range 2 {
				_, err := d.TakeSnapshot(ctx, uid, driver.SnapshotRequest{ID: "s1"})
				require.ErrorIs(t, err, boom)
			}
			assert.Equal(t, 2, d.Attempts("TakeSnapshot", uid))
			list, err := d.Snapshots(ctx, uid)
			require.NoError(t, err)
			assert.Empty(t, list, "a failed take leaves nothing behind")
		},
	}
	for name, run := range cases {
		t.Run(name, func(t *testing.T) {
			d := New("node-a")
			_, err := d.Ensure(ctx, guest)
			require.NoError(t, err)
			run(t, d)
		})
	}
}
