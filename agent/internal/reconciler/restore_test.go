package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// restoring asks for restore id of the guest to snapshot, in generation
// gen of its intent.
func restoring(id, snapshot string, gen int64) func(*wire.Intent) {
	return func(in *wire.Intent) {
		in.Restore, in.Generation = &wire.Restore{ID: id, Snapshot: snapshot}, gen
	}
}

func restorePhase(p wire.RestorePhase) func(wire.Report) bool {
	return func(r wire.Report) bool { return r.Restore != nil && r.Restore.Phase == p }
}

// snapshotted runs guest uid and takes its snapshot id, with memory.
func (h *harness) snapshotted(uid, id string) {
	h.t.Helper()
	h.running(uid)
	_, err := h.fake.TakeSnapshot(h.t.Context(), uid, driver.SnapshotRequest{ID: id, Memory: true})
	require.NoError(h.t, err)
}

// reverts are the RevertSnapshot calls of guest uid that succeeded.
func (h *harness) reverts(uid string) []fake.Call {
	var out []fake.Call
	for _, c := range h.fake.Calls() {
		if c.Op == "RevertSnapshot" && c.UID == uid {
			out = append(out, c)
		}
	}
	return out
}

func TestRestore(t *testing.T) {
	cases := map[string]struct {
		start func(*testing.T) *harness
		run   func(t *testing.T, h *harness)
	}{
		"RestoresOncePerIDAndTheReportCarriesItsPhases": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.snapshotted("a", "s1")
				h.fake.Fail("RevertSnapshot", "a", errors.New("libvirtd is busy"))
				h.put(intent("a", restoring("r1", "s1", 2)))
				// Each attempt is reported as it begins, before the driver
				// fails it: the failure shows on a later report.
				r := h.eventually("a", func(r wire.Report) bool {
					return restorePhase(wire.RestoreRunning)(r) && r.Restore.Message == "libvirtd is busy"
				}, "a failure a retry may mend shows on the running restore")
				require.NotNil(t, r.Restore.StartedAt)
				assert.Nil(t, r.Restore.FinishedAt)
				started := *r.Restore.StartedAt

				h.fake.Fail("RevertSnapshot", "a", nil)
				r = h.eventually("a", restorePhase(wire.RestoreSucceeded), "the restore succeeds")
				assert.Equal(t, "r1", r.Restore.ID)
				assert.Empty(t, r.Restore.Message)
				assert.Equal(t, started, *r.Restore.StartedAt, "started once, however often retried")
				require.NotNil(t, r.Restore.FinishedAt)
				assert.Equal(t, wire.PhaseRunning, r.Phase)
				assert.Zero(t, r.RestartCount, "a memory snapshot resumes the same boot")
				attempts := len(h.reverts("a"))
				assert.True(t, h.reverts("a")[attempts-1].Running)

				h.reconcileAgain("a")
				h.put(intent("a", restoring("r1", "s1", 3)))
				h.eventually("a", func(r wire.Report) bool { return r.ObservedGeneration == 3 }, "the next generation is seen")
				assert.Len(t, h.reverts("a"), attempts, "never restored twice")
				r = h.eventually("a", restorePhase(wire.RestoreSucceeded), "the report keeps the restore while the intent asks for it")

				h.put(intent("a", func(in *wire.Intent) { in.Generation = 4 }))
				r = h.eventually("a", func(r wire.Report) bool { return r.ObservedGeneration == 4 }, "the hub dropped the restore")
				assert.Nil(t, r.Restore)
			},
		},
		"RunningFalseLeavesTheGuestStopped": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.snapshotted("a", "s1")
				h.put(intent("a", restoring("r1", "s1", 2), func(in *wire.Intent) { in.Running = false }))
				r := h.eventually("a", restorePhase(wire.RestoreSucceeded), "the restore succeeds")
				assert.Equal(t, wire.PhaseStopped, r.Phase)
				require.Len(t, h.reverts("a"), 1)
				assert.False(t, h.reverts("a")[0].Running, "reverted not to run")
			},
		},
		"ARestoreToDisksAloneStartsTheGuestAgain": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.running("a")
				_, err := h.fake.TakeSnapshot(t.Context(), "a", driver.SnapshotRequest{ID: "s1"})
				require.NoError(t, err)
				h.put(intent("a", restoring("r1", "s1", 2)))
				r := h.eventually("a", restorePhase(wire.RestoreSucceeded), "the restore succeeds")
				assert.Equal(t, wire.PhaseRunning, r.Phase, "the Ensure after the revert started it")
			},
		},
		"ARestoreAnEarlierAgentFinishedIsNotDoneAgain": {
			run: func(t *testing.T, h *harness) {
				// The hypervisor kept the guest and its snapshot while the
				// agent restarted; the agent has written nothing yet.
				_, err := h.fake.Ensure(t.Context(), driver.Machine{UID: "a", Namespace: "default", Name: "vm-a", VCPU: 2, MemoryBytes: 1 << 30, Running: true, Disks: []driver.Disk{{Name: "default_root"}}})
				require.NoError(t, err)
				_, err = h.fake.TakeSnapshot(t.Context(), "a", driver.SnapshotRequest{ID: "s1", Memory: true})
				require.NoError(t, err)
				began := time.Unix(1700000000, 0).UTC()
				ended := began.Add(time.Second)
				earlier := wire.RestoreReport{ID: "r1", Phase: wire.RestoreSucceeded, StartedAt: &began, FinishedAt: &ended}
				_, err = bus.PutReport(t.Context(), h.reports.Fake, wire.GuestReports, "a", wire.Report{UID: "a", Node: node, Phase: wire.PhaseRunning, Restore: &earlier})
				require.NoError(t, err)
				// The restarted agent is told the intent afresh.
				h.put(intent("a", restoring("r1", "s1", 2)))
				r := h.eventually("a", func(r wire.Report) bool { return r.ObservedGeneration == 2 }, "the guest is reported")
				assert.Equal(t, &earlier, r.Restore, "the earlier agent's restore is reported as it finished")
				assert.Empty(t, h.reverts("a"))
			},
		},
		"ASnapshotTheGuestHasNotFailsTheRestoreOnceAndTheGuestRunsOn": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.running("a")
				h.put(intent("a", restoring("r1", "s9", 2)))
				r := h.eventually("a", restorePhase(wire.RestoreFailed), "the restore fails")
				assert.Equal(t, "guest a has no snapshot s9", r.Restore.Message)
				assert.NotNil(t, r.Restore.FinishedAt)
				assert.Equal(t, wire.PhaseRunning, r.Phase)
				h.reconcileAgain("a")
				assert.Len(t, h.reverts("a"), 1, "what cannot succeed is not tried again")
			},
		},
		"NoRestoreWhileTheGuestMigrates": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.snapshotted("a", "s1")
				h.put(intent("a", restoring("r1", "s1", 2), migrating("m1")))
				r := h.eventually("a", func(r wire.Report) bool { return r.Migration != nil && r.Migration.Phase == wire.MigrationFailed }, "the migration ends")
				assert.Nil(t, r.Restore)
				assert.Empty(t, h.reverts("a"), "never restored as it moves")
				h.put(intent("a", restoring("r1", "s1", 3)))
				h.eventually("a", restorePhase(wire.RestoreSucceeded), "restored once the migration is over")
			},
		},
		"ABackendWithoutSnapshotsFailsTheRestore": {
			start: func(t *testing.T) *harness {
				return startWith(t, func(f *fake.Driver) driver.Driver { return noSnapshotter{f} })
			},
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.put(intent("a", restoring("r1", "s1", 2)))
				r := h.eventually("a", restorePhase(wire.RestoreFailed), "the restore fails")
				assert.Equal(t, "the backend of node node1 keeps no snapshots", r.Restore.Message)
				assert.Equal(t, wire.PhaseRunning, r.Phase, "the guest is made as ever")
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if tc.start == nil {
				tc.start = start
			}
			tc.run(t, tc.start(t))
		})
	}
}
