package bus_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

func TestWatchIntentsDeliversStateThenChanges(t *testing.T) {
	f := newFleet(t)
	f.putIntent(t, "node1", "vm-a", 1)
	f.putIntent(t, "node2", "vm-b", 1)
	b, _, async := f.agent(t, "node1")

	e := watch(t, b)
	initial := e.until(t, 5*time.Second, synced)
	require.Len(t, initial, 2, "one intent of node1, then the synced marker; none of node2")
	first, ok := guest(initial[0])
	require.True(t, ok, "the first event is a guest's intent: %+v", initial[0])
	assert.Equal(t, "vm-a", first.UID)

	f.putIntent(t, "node1", "vm-a", 2)
	e.until(t, 5*time.Second, generation("vm-a", 2))

	require.NoError(t, f.intents.Delete(context.Background(), "node1.vm-a"))
	got := e.until(t, 5*time.Second, func(ev any) bool { g, ok := guest(ev); return ok && g.Deleted })
	deleted, _ := guest(got[len(got)-1])
	assert.Equal(t, "vm-a", deleted.UID)
	assert.False(t, async.WaitForViolation(0), "watching must need no permission the agent lacks")
}

func TestPutReportIsCompareAndSetAndIdempotent(t *testing.T) {
	f := newFleet(t)
	b, _, async := f.agent(t, "node1")
	ctx := context.Background()
	r := wire.Report{UID: "vm-a", Node: "node1", Phase: wire.PhaseRunning, ObservedAt: time.Unix(1, 0).UTC()}

	rev1, err := putReport(b, r)
	require.NoError(t, err)
	rev2, err := putReport(b, r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same report must not write")

	// An agent restarted with no memory re-reads the revision it wrote.
	restarted, _, _ := f.agent(t, "node1")
	rev3, err := putReport(restarted, r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev3)

	// The first agent's idea of the revision is now stale.
	r.Phase = wire.PhaseStopped
	_, err = putReport(restarted, r)
	require.NoError(t, err)
	r.Phase = wire.PhaseFailed
	_, err = putReport(b, r)
	var conflict *bus.ConflictError
	require.ErrorAs(t, err, &conflict)
	_, err = putReport(b, r)
	require.NoError(t, err, "the write after a conflict re-reads and succeeds")

	require.NoError(t, bus.DeleteReport(ctx, b, wire.GuestReports, "vm-a"))
	require.NoError(t, bus.DeleteReport(ctx, b, wire.GuestReports, "vm-a"), "deleting twice is harmless")
	_, err = f.reports.Get(ctx, "node1.vm-a")
	assert.Error(t, err)

	_, err = putReport(b, wire.Report{UID: "vm.a", Node: "node1"})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
	assert.False(t, async.WaitForViolation(0))
}

// TestKeysListsTheNodesOwnReports: an agent starting afresh finds what its
// node reported before, of every kind, without what was deleted and
// without another node's, under its own permissions.
func TestKeysListsTheNodesOwnReports(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	before, _, _ := f.agent(t, "node1")
	other, _, _ := f.agent(t, "node2")
	empty, err := before.Keys(ctx)
	require.NoError(t, err)
	assert.Empty(t, empty, "a node that reported nothing")
	for _, uid := range []string{"vm-a", "vm-b", "vm-gone"} {
		_, err := putReport(before, wire.Report{UID: uid, Node: "node1", Phase: wire.PhaseRunning})
		require.NoError(t, err)
	}
	_, err = bus.PutReport(ctx, before, wire.VolumeReports, "vol-a", wire.VolumeReport{UID: "vol-a"})
	require.NoError(t, err)
	require.NoError(t, bus.DeleteReport(ctx, before, wire.GuestReports, "vm-gone"))
	_, err = putReport(other, wire.Report{UID: "vm-c", Node: "node2", Phase: wire.PhaseRunning})
	require.NoError(t, err)

	afresh, _, async := f.agent(t, "node1")
	keys, err := afresh.Keys(ctx)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"node1.vm-a", "node1.vm-b", "node1.volume.vol-a"}, keys)
	assert.False(t, async.WaitForViolation(0), "listing its own reports is within the agent's permissions")
}

// putReport writes r as the report of its guest.
func putReport(b bus.Reports, r wire.Report) (uint64, error) {
	return bus.PutReport(context.Background(), b, wire.GuestReports, r.UID, r)
}

// TestPutRefusesWhatTheHubWouldRefuse: a report is checked as the hub
// checks it, and written only under the node's own keys of the reports
// bucket, before anything is sent.
func TestPutRefusesWhatTheHubWouldRefuse(t *testing.T) {
	f := newFleet(t)
	b, _, async := f.agent(t, "node1")
	ctx := context.Background()
	var (
		mismatch *wire.MismatchError
		keyErr   *wire.KeyError
	)
	_, err := putReport(b, wire.Report{UID: "vm-a", Node: "node2"})
	assert.ErrorAs(t, err, &mismatch, "a report naming another node")
	_, err = bus.PutReport(ctx, b, wire.GuestReports, "vm-b", wire.Report{UID: "vm-a", Node: "node1"})
	assert.ErrorAs(t, err, &mismatch, "a report of another uid than its key's")
	_, err = bus.PutReport(ctx, b, wire.VolumeIntents, "vol-a", wire.VolumeIntent{UID: "vol-a", Disk: "d", Absent: true})
	assert.Error(t, err, "an intent is no report")
	_, err = b.Put(ctx, "node2.vm-a", []byte("{}"))
	assert.ErrorAs(t, err, &keyErr, "another node's key")
	assert.ErrorAs(t, b.Delete(ctx, "node2.vm-a"), &keyErr, "another node's key")

	for _, node := range []string{"node1", "node2"} {
		n, err := f.reports.Count(ctx, node)
		require.NoError(t, err)
		assert.Zero(t, n, "nothing may be written in %s's reports", node)
	}
	assert.False(t, async.WaitForViolation(0), "nothing refused may reach the server")
}

// TestWatchIntentsRejectsBadInputAndCarriesOn: an intent that cannot be
// decoded, is of a newer version, names another key or is of a kind no
// handler takes is counted and skipped.
func TestWatchIntentsRejectsBadInputAndCarriesOn(t *testing.T) {
	f := newFleet(t)
	b, _, _ := f.agent(t, "node1")
	e := watch(t, b)
	e.until(t, 5*time.Second, synced)

	rejects(t, f, b, e, map[string]rejection{
		"CorruptValue":       {key: "node1.vm-x", value: `{"protocolVersion":1,`, reason: natswire.ReasonDecode},
		"NewerVersion":       {key: "node1.vm-y", value: `{"protocolVersion":99,"uid":"vm-y"}`, reason: natswire.ReasonVersion},
		"UIDOfAnotherKey":    {key: "node1.vm-z", value: `{"protocolVersion":1,"uid":"vm-other"}`, reason: natswire.ReasonMismatch},
		"UnsafeUIDInContent": {key: "node1.vm-w", value: `{"protocolVersion":1,"uid":"a b"}`, reason: natswire.ReasonKey},
		"NoHandledKind":      {key: "node1.snapshot.snap-a", value: `{"uid":"snap-a"}`, reason: natswire.ReasonKey},
	})
}

// rejection is a value the hub writes under key that the watch must refuse,
// counting it under reason.
type rejection struct{ key, value, reason string }

// rejects writes each bad value as the hub does, then a good intent, which
// proves the watch carried on, and checks the refusal was counted.
func rejects(t *testing.T, f *fleet, b *bus.NATS, e *events, cases map[string]rejection) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := b.Rejections().Count(tc.reason)
			_, err := f.intents.Put(context.Background(), tc.key, []byte(tc.value))
			require.NoError(t, err)
			f.putIntent(t, "node1", "vm-good", int64(len(name)))
			e.until(t, 5*time.Second, generation("vm-good", int64(len(name))))
			assert.Equal(t, before+1, b.Rejections().Count(tc.reason))
		})
	}
}

// TestSurvivesServerRestart shuts the server down under a watching agent and
// starts it again on the same store: nothing written before is lost, the
// watch resumes, and it says Synced again once caught up, so the agent
// looks at every guest at once.
func TestSurvivesServerRestart(t *testing.T) {
	f := newFleet(t)
	const n = 20
	for i := range n {
		f.putIntent(t, "node1", fmt.Sprintf("vm-%d", i), 1)
	}
	b, _, _ := f.agent(t, "node1")
	e := watch(t, b)
	require.Len(t, e.until(t, 5*time.Second, synced), n+1)

	f.srv.Shutdown()
	require.NoError(t, f.srv.Restart())

	// Written while the agent may still be reconnecting. The writer itself
	// may need a few seconds to reconnect and for JetStream to recover its
	// streams on a loaded machine, so it retries as the hub does.
	f.putIntentEventually(t, "node1", "vm-0", 2)
	f.putIntentEventually(t, "node1", "vm-new", 1)
	seen := map[string]int64{}
	resynced := false
	e.until(t, 20*time.Second, func(ev any) bool {
		resynced = resynced || synced(ev)
		if g, ok := guest(ev); ok {
			seen[g.UID] = g.Value.Generation
		}
		return seen["vm-0"] == 2 && seen["vm-new"] == 1 && resynced
	})

	ctx := context.Background()
	for i := range n {
		_, err := f.intents.Get(ctx, fmt.Sprintf("node1.vm-%d", i))
		require.NoError(t, err, "intent written before the restart must survive it")
	}
	_, err := putReport(b, wire.Report{UID: "vm-0", Node: "node1", Phase: wire.PhaseRunning})
	require.NoError(t, err, "the agent can write again after the restart")
}

// TestResumeIntentsSaysSyncedAgain: the agent asks its watch to resume
// (a lost lease renewed) and hears Synced again once the watch has caught
// up with what was written before it asked, delivering nothing twice.
func TestResumeIntentsSaysSyncedAgain(t *testing.T) {
	f := newFleet(t)
	f.putIntent(t, "node1", "vm-a", 1)
	b, _, async := f.agent(t, "node1")
	e := watch(t, b)
	e.until(t, 5*time.Second, synced)

	b.ResumeIntents()
	assert.Len(t, e.until(t, 5*time.Second, synced), 1, "nothing was missed: Synced alone")

	f.putIntent(t, "node1", "vm-a", 2)
	b.ResumeIntents()
	got := e.until(t, 5*time.Second, synced)
	assert.True(t, slices.ContainsFunc(got, generation("vm-a", 2)), "Synced follows what was written before the resume: %+v", got)
	assert.False(t, async.WaitForViolation(0), "resuming must need no permission the agent lacks")
}

// TestWatchIntentsRecoversALostConsumerWithinSeconds: when the server that
// holds the watch's consumer goes, the agent's own connection may stay (in
// a cluster, another server's stream leader is killed), and only missing
// heartbeats tell the watch. It makes its consumer again within seconds,
// not after the several heartbeat intervals nats.go's default would wait.
func TestWatchIntentsRecoversALostConsumerWithinSeconds(t *testing.T) {
	f := newFleet(t)
	b, _, _ := f.agent(t, "node1")
	e := watch(t, b)
	e.until(t, 5*time.Second, synced)

	natstest.DeleteConsumers(t, f.js, wire.Stream(wire.BucketIntents))

	start := time.Now()
	f.putIntent(t, "node1", "vm-a", 1)
	e.until(t, 6*time.Second, generation("vm-a", 1))
	t.Logf("delivered %s after the consumer was lost", time.Since(start).Round(100*time.Millisecond))
}

// TestWatchIntentsBacksOffWhileTheServerRefusesIt: while every attempt to
// watch fails (here the intents stream is gone), the watch waits longer
// after each failure instead of retrying at a fixed pace, which from a
// thousand agents at once would keep the server too busy to recover; and
// it resumes once the stream is back.
func TestWatchIntentsBacksOffWhileTheServerRefusesIt(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	name := wire.Stream(wire.BucketIntents)
	s, err := f.js.Stream(ctx, name)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	require.NoError(t, f.js.DeleteStream(ctx, name))

	const (
		retry  = 50 * time.Millisecond
		window = 2 * time.Second
	)
	nc, _ := natstest.Connect(t, f.srv, f.agents["node1"])
	attempts := &countingLog{message: "Cannot watch intents; retrying"}
	b, err := bus.New(nc, bus.Config{Node: "node1", RetryInterval: retry, Log: attempts})
	require.NoError(t, err)
	e := watch(t, b)

	// At a fixed pace the watch would try window/retry times; doubling
	// from retry, it has waited 1.55 s after its sixth attempt.
	time.Sleep(window)
	n := attempts.count()
	assert.GreaterOrEqual(t, n, 2, "the watch retries")
	assert.LessOrEqual(t, n, 7, "the watch retries %d times in %s: no backoff", n, window)

	_, err = f.js.CreateStream(ctx, cfg)
	require.NoError(t, err)
	f.putIntent(t, "node1", "vm-a", 1)
	e.until(t, 10*time.Second, generation("vm-a", 1))
}

// countingLog counts the Info lines whose message is message.
type countingLog struct {
	message string
	mu      sync.Mutex
	n       int
}

func (l *countingLog) Info(msg string, _ ...any) {
	if msg == l.message {
		l.mu.Lock()
		l.n++
		l.mu.Unlock()
	}
}
func (l *countingLog) Debug(string, ...any)             {}
func (l *countingLog) WithValues(...any) logging.Logger { return l }
func (l *countingLog) count() int                       { l.mu.Lock(); defer l.mu.Unlock(); return l.n }

func TestWatchIntentsRoutesVolumeIntents(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	put := func(node, uid string) {
		key, err := wire.VolumeIntents.Key(node, uid)
		require.NoError(t, err)
		b, err := wire.EncodeVolumeIntent(wire.VolumeIntent{UID: uid, Namespace: "ns", Name: uid, Disk: "ns_" + uid, Absent: true})
		require.NoError(t, err)
		_, err = f.intents.Put(ctx, key, b)
		require.NoError(t, err)
	}
	put("node1", "vol-a")
	put("node2", "vol-b")
	f.putIntent(t, "node1", "vm-a", 1)
	b, _, async := f.agent(t, "node1")

	e := watch(t, b)
	initial := e.until(t, 5*time.Second, synced)
	require.Len(t, initial, 3, "node1's volume and guest intents, then one synced marker; none of node2")
	var (
		volumes []bus.Event[wire.VolumeIntent]
		guests  []string
	)
	for _, ev := range initial {
		if v, ok := ev.(bus.Event[wire.VolumeIntent]); ok {
			volumes = append(volumes, v)
		}
		if g, ok := guest(ev); ok {
			guests = append(guests, g.UID)
		}
	}
	require.Len(t, volumes, 1)
	assert.Equal(t, "vol-a", volumes[0].UID)
	assert.Equal(t, "ns_vol-a", volumes[0].Value.Disk)
	assert.Equal(t, []string{"vm-a"}, guests, "a volume intent is not a guest intent")

	require.NoError(t, f.intents.Delete(ctx, "node1.volume.vol-a"))
	got := e.until(t, 5*time.Second, func(ev any) bool { v, ok := ev.(bus.Event[wire.VolumeIntent]); return ok && v.Deleted })
	assert.Equal(t, "vol-a", got[len(got)-1].(bus.Event[wire.VolumeIntent]).UID)

	rejects(t, f, b, e, map[string]rejection{
		"CorruptVolumeIntent":       {key: "node1.volume.vol-x", value: `{"protocolVersion":1,`, reason: natswire.ReasonDecode},
		"NewerVolumeIntent":         {key: "node1.volume.vol-y", value: `{"protocolVersion":2,"uid":"vol-y"}`, reason: natswire.ReasonVersion},
		"VolumeIntentOfAnotherUID":  {key: "node1.volume.vol-z", value: `{"protocolVersion":1,"uid":"vol-o","disk":"d","absent":true}`, reason: natswire.ReasonMismatch},
		"PresentVolumeIsNotDefined": {key: "node1.volume.vol-p", value: `{"protocolVersion":1,"uid":"vol-p","disk":"d"}`, reason: natswire.ReasonDecode},
	})
	assert.False(t, async.WaitForViolation(0), "watching volume intents needs no permission the agent lacks")
}

func TestPutVolumeReport(t *testing.T) {
	f := newFleet(t)
	b, _, async := f.agent(t, "node1")
	ctx := context.Background()
	r := wire.VolumeReport{UID: "vol-a", Message: "attached", ObservedAt: time.Unix(1, 0).UTC()}
	put := func(r wire.VolumeReport) (uint64, error) { return bus.PutReport(ctx, b, wire.VolumeReports, r.UID, r) }

	rev1, err := put(r)
	require.NoError(t, err)
	rev2, err := put(r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same report must not write")

	r.Gone, r.Message = true, ""
	_, err = put(r)
	require.NoError(t, err)
	e, err := f.reports.Get(ctx, "node1.volume.vol-a")
	require.NoError(t, err, "the report lives under <node>.volume.<uid>")
	got, err := wire.DecodeVolumeReport(e.Value())
	require.NoError(t, err)
	assert.True(t, got.Gone)

	// A guest report of the same uid is another key.
	_, err = putReport(b, wire.Report{UID: "vol-a", Node: "node1", Phase: wire.PhaseRunning})
	require.NoError(t, err)
	require.NoError(t, bus.DeleteReport(ctx, b, wire.VolumeReports, "vol-a"))
	require.NoError(t, bus.DeleteReport(ctx, b, wire.VolumeReports, "vol-a"), "deleting twice is harmless")
	_, err = f.reports.Get(ctx, "node1.volume.vol-a")
	assert.Error(t, err)
	_, err = f.reports.Get(ctx, "node1.vol-a")
	assert.NoError(t, err, "deleting the volume report leaves the guest report")

	_, err = put(wire.VolumeReport{UID: "vol.a"})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
	assert.False(t, async.WaitForViolation(0))
}

func TestPutImageReport(t *testing.T) {
	f := newFleet(t)
	b, _, async := f.agent(t, "node1")
	ctx := context.Background()
	r := wire.ImageReport{UID: "img-a", Name: "ubuntu", Node: "node1", Phase: wire.ImagePhaseImporting, Message: "importing image ubuntu: 1 of 2 bytes", ObservedAt: time.Unix(1, 0).UTC()}
	put := func(r wire.ImageReport) (uint64, error) { return bus.PutReport(ctx, b, wire.ImageReports, r.UID, r) }

	rev1, err := put(r)
	require.NoError(t, err)
	rev2, err := put(r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same report must not write")

	r.Phase, r.SizeBytes, r.Message = wire.ImagePhaseReady, 2, ""
	_, err = put(r)
	require.NoError(t, err)
	e, err := f.reports.Get(ctx, "node1.image.img-a")
	require.NoError(t, err, "the report lives under <node>.image.<uid>")
	got, err := wire.DecodeImageReport(e.Value())
	require.NoError(t, err)
	assert.Equal(t, wire.ImagePhaseReady, got.Phase)
	assert.Equal(t, int64(2), got.SizeBytes)
	assert.Equal(t, "node1", got.Node)

	require.NoError(t, bus.DeleteReport(ctx, b, wire.ImageReports, "img-a"))
	require.NoError(t, bus.DeleteReport(ctx, b, wire.ImageReports, "img-a"), "deleting twice is harmless")
	_, err = f.reports.Get(ctx, "node1.image.img-a")
	assert.Error(t, err)

	_, err = put(wire.ImageReport{UID: "img.a", Node: "node1", Phase: wire.ImagePhaseReady})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
	assert.False(t, async.WaitForViolation(0), "writing image reports needs no permission the agent lacks")
}

// TestSnapshotIntentsAndReports: under node1's real permissions, the hub's
// snapshot intents for node1 (and none of node2's) reach the handler of
// wire.SnapshotIntents; the agent's snapshot report lands under
// <node>.snapshot.<uid>, where an agent started afresh reads it back; a
// report naming another node is refused before anything is sent.
func TestSnapshotIntentsAndReports(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	put := func(node, uid string) {
		key, err := wire.SnapshotIntents.Key(node, uid)
		require.NoError(t, err)
		b, err := wire.EncodeSnapshotIntent(wire.SnapshotIntent{UID: uid, Namespace: "ns", Name: uid, VM: "vm-a", Memory: true})
		require.NoError(t, err)
		_, err = f.intents.Put(ctx, key, b)
		require.NoError(t, err)
	}
	put("node1", "snap-a")
	put("node2", "snap-b")
	b, _, async := f.agent(t, "node1")

	e := watch(t, b, into(wire.GuestIntents), into(wire.SnapshotIntents))
	initial := e.until(t, 5*time.Second, synced)
	require.Len(t, initial, 2, "node1's snapshot intent, then Synced; none of node2")
	got, ok := initial[0].(bus.Event[wire.SnapshotIntent])
	require.True(t, ok, "delivered to the snapshot handler: %+v", initial[0])
	assert.Equal(t, wire.SnapshotIntent{ProtocolVersion: wire.ProtocolVersion, UID: "snap-a", Namespace: "ns", Name: "snap-a", VM: "vm-a", Memory: true}, got.Value)

	created := time.Unix(1700000000, 0).UTC()
	r := wire.SnapshotReport{UID: "snap-a", Node: "node1", VM: "vm-a", Phase: wire.SnapshotPhaseReady, CreatedAt: &created, SizeBytes: 1 << 20, Online: true, Memory: true, ObservedAt: created}
	_, err := bus.PutReport(ctx, b, wire.SnapshotReports, r.UID, r)
	require.NoError(t, err)
	stored, err := f.reports.Get(ctx, "node1.snapshot.snap-a")
	require.NoError(t, err, "the report lives under <node>.snapshot.<uid>")
	hub, err := wire.DecodeSnapshotReport(stored.Value())
	require.NoError(t, err)
	assert.Equal(t, wire.SnapshotPhaseReady, hub.Phase)

	afresh, _, afreshAsync := f.agent(t, "node1")
	back, found, err := bus.GetReport(ctx, afresh, wire.SnapshotReports, "snap-a")
	require.NoError(t, err)
	require.True(t, found, "an agent started afresh reads what its node reported")
	assert.True(t, wire.SnapshotReports.Equal(r, back), "read back as written: %+v", back)
	_, found, err = bus.GetReport(ctx, afresh, wire.SnapshotReports, "snap-none")
	require.NoError(t, err)
	assert.False(t, found, "no report, no error")

	r.Node = "node2"
	_, err = bus.PutReport(ctx, b, wire.SnapshotReports, r.UID, r)
	var mismatch *wire.MismatchError
	assert.ErrorAs(t, err, &mismatch, "a report of another node is refused before it is sent")
	assert.False(t, async.WaitForViolation(0), "snapshot intents and reports need no permission the agent lacks")
	assert.False(t, afreshAsync.WaitForViolation(0))
}
