package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

const targetURI = "fake://node2"

// migrationPair runs node1 with guest uid running on it and node2, which
// node1's hypervisor reaches at targetURI.
func migrationPair(t *testing.T, uid string) (source, target *harness) {
	t.Helper()
	same := func(f *fake.Driver) driver.Driver { return f }
	source = start(t)
	target = startOn(t, "node2", logging.NewNopLogger(), same)
	source.fake.Reach(targetURI, target.fake)
	source.put(intent(uid))
	source.eventually(uid, phase(wire.PhaseRunning), "the guest runs on node1")
	return source, target
}

func incoming(id string) func(*wire.Intent) {
	return func(in *wire.Intent) { in.Incoming = &wire.Incoming{ID: id, SourceNode: node} }
}

func migrating(id string) func(*wire.Intent) {
	return func(in *wire.Intent) {
		in.Migration = &wire.Migration{ID: id, TargetNode: "node2", TargetURI: targetURI}
	}
}

// The target gets ready and says so without creating the guest; the
// source migrates once told to, reports its progress and never starts the
// guest again; the guest then runs on the target, reported there.
func TestMigrationMovesTheGuestBetweenNodes(t *testing.T) {
	source, target := migrationPair(t, "g1")

	target.put(intent("g1", incoming("m1")))
	rep := target.eventually("g1", func(r wire.Report) bool { return r.Incoming == "m1" }, "the target says it is ready")
	assert.Equal(t, wire.PhasePending, rep.Phase)
	assert.True(t, target.fake.Prepared("g1"))
	assert.Zero(t, target.calls("Ensure", "g1"), "a target never creates the guest itself")

	ensures := source.calls("Ensure", "g1")
	source.put(intent("g1", migrating("m1")))
	rep = source.eventually("g1", func(r wire.Report) bool {
		return r.Migration != nil && r.Migration.Phase == wire.MigrationSucceeded
	}, "the source reports the migration done")
	assert.Equal(t, "m1", rep.Migration.ID)
	assert.Equal(t, int64(1<<30), rep.Migration.ProcessedBytes)
	assert.NotNil(t, rep.Migration.FinishedAt)
	assert.Contains(t, rep.Message, "migrated to node node2")
	assert.Equal(t, wire.PhaseRunning, rep.Phase, "the guest runs on, elsewhere")

	target.eventually("g1", func(r wire.Report) bool { return r.Phase == wire.PhaseRunning && r.Incoming == "m1" }, "the target reports the guest it received")
	_, err := source.fake.Observe(t.Context(), "g1")
	assert.True(t, driver.IsNotFound(err), "the guest left node1")

	migrates := source.calls("Migrate", "g1")
	source.rec.resync(t.Context())
	require.Eventually(t, func() bool { return source.calls("Migrate", "g1") > migrates }, 5*time.Second, 5*time.Millisecond, "a resync looks at the guest again")
	assert.Equal(t, ensures, source.calls("Ensure", "g1"), "a source told to migrate never ensures the guest")

	// The hub makes the target's intent the guest's own and deletes the
	// source's: the target drives the guest, the source forgets it.
	target.put(intent("g1"))
	target.eventually("g1", func(r wire.Report) bool { return r.Phase == wire.PhaseRunning && r.Incoming == "" }, "the target drives the guest")
	source.synced()
	source.del("g1")
	require.Eventually(t, func() bool { _, ok := source.reports.get("g1"); return !ok }, 5*time.Second, 5*time.Millisecond)
	_, err = target.fake.Observe(t.Context(), "g1")
	assert.NoError(t, err, "deleting the source's intent leaves the guest on the target")
}

// A migration that fails is reported so, and the guest runs on where it
// was.
func TestMigrationThatFailsKeepsTheGuestOnTheSource(t *testing.T) {
	cases := map[string]struct {
		prepare func(source, target *harness)
		message string
	}{
		"TheHypervisorFails": {
			prepare: func(source, target *harness) {
				target.put(intent("g1", incoming("m1")))
				source.fake.Fail("Migrate", "g1", errors.New("unable to connect to server"))
			},
			message: "unable to connect to server",
		},
		"TheTargetIsNotReady": {
			prepare: func(*harness, *harness) {},
			message: "not ready for the guest",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			source, target := migrationPair(t, "g1")
			tc.prepare(source, target)
			source.put(intent("g1", migrating("m1")))
			rep := source.eventually("g1", func(r wire.Report) bool {
				return r.Migration != nil && r.Migration.Phase == wire.MigrationFailed
			}, "the source reports the migration failed")
			assert.Contains(t, rep.Migration.Message, tc.message)
			assert.Equal(t, wire.PhaseRunning, rep.Phase)
			obs, err := source.fake.Observe(t.Context(), "g1")
			require.NoError(t, err, "the guest is still on node1")
			assert.Equal(t, driver.PhaseRunning, obs.Phase)
		})
	}
}

// A source told to migrate a guest it does not have says so, and creates
// nothing: the guest may be running elsewhere.
func TestMigrationOfAGuestNotHereCreatesNothing(t *testing.T) {
	source := start(t)
	source.put(intent("g2", migrating("m2")))
	rep := source.eventually("g2", func(r wire.Report) bool { return r.Migration != nil }, "the source reports on the migration")
	assert.Equal(t, wire.MigrationFailed, rep.Migration.Phase)
	assert.Contains(t, rep.Migration.Message, "not on node node1")
	assert.Zero(t, source.calls("Ensure", "g2"))
}

// A move between the node's own hosts (a Nova cloud's, a KubeVirt
// cluster's) takes the node alone: the guest stays, on its new host.
func TestMigrationWithinTheNodeMovesTheGuestToAnotherHost(t *testing.T) {
	h := start(t)
	h.put(intent("g3"))
	h.eventually("g3", phase(wire.PhaseRunning), "the guest runs")
	ensures := h.calls("Ensure", "g3")
	h.put(intent("g3", func(in *wire.Intent) {
		in.Migration = &wire.Migration{ID: "m3", TargetNode: node, TargetHost: "compute-2"}
	}))
	rep := h.eventually("g3", func(r wire.Report) bool {
		return r.Migration != nil && r.Migration.Phase == wire.MigrationSucceeded
	}, "the node reports the move done")
	assert.Equal(t, "compute-2", rep.Host, "the report shows the new host")
	assert.Equal(t, wire.PhaseRunning, rep.Phase)
	assert.Equal(t, ensures, h.calls("Ensure", "g3"))
}

// A cancelled migration ends Failed and the guest runs on where it was.
func TestMigrationCancelledKeepsTheGuestOnTheSource(t *testing.T) {
	source, target := migrationPair(t, "g1")
	target.put(intent("g1", incoming("m1")))
	target.eventually("g1", func(r wire.Report) bool { return r.Incoming == "m1" }, "the target is ready")
	source.put(intent("g1", func(in *wire.Intent) {
		migrating("m1")(in)
		in.Migration.Cancel = true
	}))
	rep := source.eventually("g1", func(r wire.Report) bool {
		return r.Migration != nil && r.Migration.Phase == wire.MigrationFailed
	}, "the source reports the migration cancelled")
	assert.Contains(t, rep.Migration.Message, "cancelled")
	_, err := source.fake.Observe(t.Context(), "g1")
	require.NoError(t, err, "the guest is still on node1")
}
