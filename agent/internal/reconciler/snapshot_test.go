package reconciler

import (
	"context"
	"sync"
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

// noSnapshotter hides the fake's Snapshotter methods, as a backend without
// them.
type noSnapshotter struct{ driver.Driver }

func snapshotIntent(uid, vm string, mods ...func(*wire.SnapshotIntent)) wire.SnapshotIntent {
	s := wire.SnapshotIntent{ProtocolVersion: wire.ProtocolVersion, UID: uid, Namespace: "default", Name: "snap-" + uid, VM: vm, Memory: true}
	for _, m := range mods {
		m(&s)
	}
	return s
}

func absent(s *wire.SnapshotIntent) { s.Absent = true }

func (h *harness) putSnapshot(s wire.SnapshotIntent) {
	h.rec.snapshotIntent(bus.Event[wire.SnapshotIntent]{UID: s.UID, Value: s})
}

func (h *harness) delSnapshot(uid string) {
	h.rec.snapshotIntent(bus.Event[wire.SnapshotIntent]{UID: uid, Deleted: true})
}

// snapshot waits for the snapshot's report to satisfy ok.
func (h *harness) snapshot(uid string, ok func(wire.SnapshotReport) bool, what string) wire.SnapshotReport {
	h.t.Helper()
	return reported(h, wire.SnapshotReports, uid, ok, what)
}

func snapshotPhase(p wire.SnapshotPhase) func(wire.SnapshotReport) bool {
	return func(r wire.SnapshotReport) bool { return r.Phase == p }
}

// running starts guest uid and waits for it to run.
func (h *harness) running(uid string, mods ...func(*wire.Intent)) {
	h.t.Helper()
	h.put(intent(uid, mods...))
	h.eventually(uid, phase(wire.PhaseRunning), "the guest runs")
}

// lookedAgain has the reconciler look at everything again and waits until
// it listed guest vm's snapshots once more.
func (h *harness) lookedAgain(vm string) {
	h.t.Helper()
	n := h.calls("Snapshots", vm)
	h.rec.resync(context.Background())
	require.Eventually(h.t, func() bool { return h.calls("Snapshots", vm) > n }, 5*time.Second, 5*time.Millisecond, "the snapshot is looked at again")
}

func TestSnapshotIntents(t *testing.T) {
	cases := map[string]struct {
		start func(*testing.T) *harness
		run   func(t *testing.T, h *harness)
	}{
		"TakesOnceEvenWhenTheIntentIsDeliveredTwice": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.putSnapshot(snapshotIntent("s1", "a"))
				h.putSnapshot(snapshotIntent("s1", "a"))
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "the snapshot is taken")
				h.lookedAgain("a")
				assert.Equal(t, 1, h.calls("TakeSnapshot", "a"), "taken once")
				require.NotNil(t, r.CreatedAt)
				assert.Equal(t, wire.SnapshotReport{
					ProtocolVersion: wire.ProtocolVersion, UID: "s1", Node: node, VM: "a", Phase: wire.SnapshotPhaseReady,
					CreatedAt: r.CreatedAt, DurationMilliseconds: 3, SizeBytes: 10<<30 + 1<<30, Online: true, Memory: true, ObservedAt: r.ObservedAt,
				}, r, "the driver's figures")
			},
		},
		"ASnapshotFoundAfterARestartIsReadyWithoutATake": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				// An earlier agent took it, and stopped before it said so.
				_, err := h.fake.TakeSnapshot(t.Context(), "a", driver.SnapshotRequest{ID: "s1"})
				require.NoError(t, err)
				_, err = bus.PutReport(t.Context(), h.reports.Fake, wire.SnapshotReports, "s1", wire.SnapshotReport{UID: "s1", Node: node, VM: "a", Phase: wire.SnapshotPhaseTaking})
				require.NoError(t, err)
				h.synced()
				h.putSnapshot(snapshotIntent("s1", "a", func(s *wire.SnapshotIntent) { s.Memory = false }))
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "the snapshot found is reported")
				assert.Equal(t, 1, h.calls("TakeSnapshot", "a"), "only the earlier agent's take")
				assert.True(t, r.Frozen)
			},
		},
		"ATerminalErrorIsReportedOnceAndNotRetriedUntilTheIntentChanges": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.fake.NextTakeSnapshotErr = driver.Terminalf("disk vdb of guest a cannot be snapshotted")
				h.putSnapshot(snapshotIntent("s1", "a"))
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseFailed), "the snapshot failed")
				assert.Equal(t, "disk vdb of guest a cannot be snapshotted", r.Message)
				key, err := wire.SnapshotReports.Key(node, "s1")
				require.NoError(t, err)
				writes := h.reports.Writes(key)
				h.rec.resync(t.Context())
				assert.Never(t, func() bool { return h.calls("TakeSnapshot", "a") > 1 || h.reports.Writes(key) > writes }, 200*time.Millisecond, 10*time.Millisecond,
					"no retry, and no second report, of what no retry mends")

				h.putSnapshot(snapshotIntent("s1", "a", func(s *wire.SnapshotIntent) { s.Memory = false }))
				h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "a changed intent is tried again")
			},
		},
		"ATransientErrorIsRetriedAndShownWhileTaking": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.fake.Fail("TakeSnapshot", "a", errors.New("libvirtd is busy"))
				h.putSnapshot(snapshotIntent("s1", "a"))
				h.snapshot("s1", func(r wire.SnapshotReport) bool {
					return r.Phase == wire.SnapshotPhaseTaking && r.Message == "libvirtd is busy"
				}, "the report says why it is not taken yet")
				require.Eventually(t, func() bool { return h.calls("TakeSnapshot", "a") > 1 }, 5*time.Second, 5*time.Millisecond, "retried")
				h.fake.Fail("TakeSnapshot", "a", nil)
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "taken once the driver can")
				assert.Empty(t, r.Message)
			},
		},
		"AbsentDeletesTheSnapshotAndReportsGoneThenTheReportGoesWithTheIntent": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.putSnapshot(snapshotIntent("s1", "a"))
				h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "the snapshot is taken")
				h.putSnapshot(snapshotIntent("s1", "a", absent))
				h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseGone), "the snapshot is deleted")
				assert.Equal(t, 1, h.calls("DeleteSnapshot", "a"))
				list, err := h.fake.Snapshots(t.Context(), "a")
				require.NoError(t, err)
				assert.Empty(t, list)
				h.eventually("a", phase(wire.PhaseRunning), "the guest is untouched")

				h.delSnapshot("s1")
				require.Eventually(t, func() bool { _, ok := bus.Written(h.reports.Fake, wire.SnapshotReports, "s1"); return !ok }, 5*time.Second, 5*time.Millisecond,
					"the report goes with the intent")
			},
		},
		"AFailedDeleteSaysWhyAndIsRetried": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.putSnapshot(snapshotIntent("s1", "a"))
				h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "the snapshot is taken")
				h.fake.Fail("DeleteSnapshot", "a", errors.New("snapshot is in use by a block job"))
				h.putSnapshot(snapshotIntent("s1", "a", absent))
				r := h.snapshot("s1", func(r wire.SnapshotReport) bool { return r.Message != "" }, "the report says why it is not deleted")
				assert.Equal(t, wire.SnapshotPhaseReady, r.Phase, "still there")
				assert.Equal(t, "snapshot is in use by a block job", r.Message)
				h.fake.Fail("DeleteSnapshot", "a", nil)
				r = h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseGone), "deleted on a retry")
				assert.Empty(t, r.Message)
			},
		},
		"ASnapshotLostAfterItWasReadyIsGoneAndNeverTakenAgain": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.putSnapshot(snapshotIntent("s1", "a"))
				h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "the snapshot is taken")
				require.NoError(t, h.fake.DeleteSnapshot(t.Context(), "a", "s1"))
				h.rec.resync(t.Context())
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseGone), "a lost snapshot is gone")
				assert.Equal(t, "the snapshot is no longer on node node1", r.Message)
				assert.Equal(t, 1, h.calls("TakeSnapshot", "a"), "another moment under the same name would be a lie")
			},
		},
		"AGuestWithoutAnIntentHereFails": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.putSnapshot(snapshotIntent("s1", "elsewhere"))
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseFailed), "the snapshot fails")
				assert.Equal(t, "guest elsewhere is not on node node1", r.Message)
				assert.Zero(t, h.calls("TakeSnapshot", "elsewhere"))
			},
		},
		"AGuestTheDriverDoesNotHaveFails": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.fake.NextTakeSnapshotErr = driver.NotFoundf("domain a not found")
				h.putSnapshot(snapshotIntent("s1", "a"))
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseFailed), "the snapshot fails")
				assert.Equal(t, "guest a is not on node node1", r.Message)
			},
		},
		"ABackendWithoutSnapshotsSaysWhich": {
			start: func(t *testing.T) *harness {
				return startWith(t, func(f *fake.Driver) driver.Driver { return noSnapshotter{f} }, func(o *Options) { o.Backend = driver.BackendNova })
			},
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.putSnapshot(snapshotIntent("s1", "a"))
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseFailed), "the snapshot fails")
				assert.Equal(t, "the nova backend of node node1 keeps no snapshots", r.Message)
				h.putSnapshot(snapshotIntent("s1", "a", absent))
				h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseGone), "a node that keeps none has none to delete")
			},
		},
		"NoSnapshotWhileTheGuestMigrates": {
			run: func(t *testing.T, h *harness) {
				h.running("a")
				h.synced()
				h.put(intent("a", migrating("m1"), func(in *wire.Intent) { in.Generation = 2 }))
				h.eventually("a", func(r wire.Report) bool { return r.Migration != nil }, "the migration is under way")
				h.putSnapshot(snapshotIntent("s1", "a"))
				r := h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseTaking), "the snapshot waits")
				assert.Equal(t, "waits for the migration", r.Message)
				h.rec.resync(t.Context())
				assert.Never(t, func() bool { return h.calls("TakeSnapshot", "a") > 0 }, 200*time.Millisecond, 10*time.Millisecond, "nothing taken as the guest moves")

				h.put(intent("a", func(in *wire.Intent) { in.Generation = 3 }))
				h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "taken once the migration is over")
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

// TestATakeWaitsForTheGuestsEnsure: a guest and its snapshot are two
// queue items, and still the driver is never asked about the snapshot while
// the guest's Ensure runs.
func TestATakeWaitsForTheGuestsEnsure(t *testing.T) {
	gate := &gatedEnsure{entered: make(chan struct{}, 1), release: make(chan struct{})}
	var once sync.Once
	open := func() { once.Do(func() { close(gate.release) }) }
	h := startWith(t, func(f *fake.Driver) driver.Driver { gate.Driver = f; return gate })
	t.Cleanup(open) // runs before the reconciler is stopped, so no worker stays held
	h.synced()
	h.put(intent("a"))
	select {
	case <-gate.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the guest is never ensured")
	}
	h.putSnapshot(snapshotIntent("s1", "a"))
	assert.Never(t, func() bool { return h.calls("Snapshots", "a")+h.calls("TakeSnapshot", "a") > 0 }, 200*time.Millisecond, 10*time.Millisecond,
		"the snapshot is not touched while the guest is being ensured")
	open()
	h.snapshot("s1", snapshotPhase(wire.SnapshotPhaseReady), "taken once the Ensure returned")
}

// gatedEnsure holds every Ensure until release is closed, saying on
// entered that it holds one.
type gatedEnsure struct {
	*fake.Driver
	entered chan struct{}
	release chan struct{}
}

func (g *gatedEnsure) Ensure(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.release
	return g.Driver.Ensure(ctx, m)
}
