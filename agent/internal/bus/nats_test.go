package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/testing/natstest"
)

func TestWatchIntentsDeliversStateThenChanges(t *testing.T) {
	f := newFleet(t)
	f.putIntent(t, "node1", "vm-a", 1)
	f.putIntent(t, "node2", "vm-b", 1)
	b, _, async := f.agent(t, "node1")

	e := watch(t, b)
	initial := e.until(t, 5*time.Second, synced)
	require.Len(t, initial, 2, "one intent of node1, then the synced marker; none of node2")
	assert.Equal(t, "vm-a", initial[0].UID)

	f.putIntent(t, "node1", "vm-a", 2)
	e.until(t, 5*time.Second, generation("vm-a", 2))

	require.NoError(t, f.intents.Delete(context.Background(), "node1.vm-a"))
	got := e.until(t, 5*time.Second, func(ev bus.IntentEvent) bool { return ev.Deleted })
	assert.Equal(t, "vm-a", got[len(got)-1].UID)
	assert.False(t, async.WaitForViolation(0), "watching must need no permission the agent lacks")
}

func TestPutReportIsCompareAndSetAndIdempotent(t *testing.T) {
	f := newFleet(t)
	b, _, async := f.agent(t, "node1")
	ctx := context.Background()
	r := wire.Report{UID: "vm-a", Phase: wire.PhaseRunning, ObservedAt: time.Unix(1, 0).UTC()}

	rev1, err := b.PutReport(ctx, r)
	require.NoError(t, err)
	rev2, err := b.PutReport(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same report must not write")

	// An agent restarted with no memory re-reads the revision it wrote.
	restarted, _, _ := f.agent(t, "node1")
	rev3, err := restarted.PutReport(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev3)

	// The first agent's idea of the revision is now stale.
	r.Phase = wire.PhaseStopped
	_, err = restarted.PutReport(ctx, r)
	require.NoError(t, err)
	r.Phase = wire.PhaseFailed
	_, err = b.PutReport(ctx, r)
	var conflict *bus.ConflictError
	require.ErrorAs(t, err, &conflict)
	_, err = b.PutReport(ctx, r)
	require.NoError(t, err, "the write after a conflict re-reads and succeeds")

	require.NoError(t, b.DeleteReport(ctx, "vm-a"))
	require.NoError(t, b.DeleteReport(ctx, "vm-a"), "deleting twice is harmless")
	_, err = f.reports.Get(ctx, "node1.vm-a")
	assert.Error(t, err)

	_, err = b.PutReport(ctx, wire.Report{UID: "vm.a"})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
	assert.False(t, async.WaitForViolation(0))
}

func TestWatchIntentsRejectsBadInputAndCarriesOn(t *testing.T) {
	f := newFleet(t)
	b, _, _ := f.agent(t, "node1")
	e := watch(t, b)
	e.until(t, 5*time.Second, synced)
	ctx := context.Background()

	cases := map[string]struct {
		key, value string
		reason     string
	}{
		"CorruptValue":       {key: "node1.vm-x", value: `{"protocolVersion":1,`, reason: natswire.ReasonDecode},
		"NewerVersion":       {key: "node1.vm-y", value: `{"protocolVersion":99,"uid":"vm-y"}`, reason: natswire.ReasonVersion},
		"UIDOfAnotherKey":    {key: "node1.vm-z", value: `{"protocolVersion":1,"uid":"vm-other"}`, reason: natswire.ReasonMismatch},
		"UnsafeUIDInContent": {key: "node1.vm-w", value: `{"protocolVersion":1,"uid":"a b"}`, reason: natswire.ReasonKey},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := b.Rejections().Count(tc.reason)
			_, err := f.intents.Put(ctx, tc.key, []byte(tc.value))
			require.NoError(t, err)
			// A good intent after the bad one proves the watch carried on.
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
	e.until(t, 20*time.Second, func(ev bus.IntentEvent) bool {
		resynced = resynced || ev.Synced
		seen[ev.UID] = ev.Intent.Generation
		return seen["vm-0"] == 2 && seen["vm-new"] == 1 && resynced
	})

	ctx := context.Background()
	for i := range n {
		_, err := f.intents.Get(ctx, fmt.Sprintf("node1.vm-%d", i))
		require.NoError(t, err, "intent written before the restart must survive it")
	}
	_, err := b.PutReport(ctx, wire.Report{UID: "vm-0", Phase: wire.PhaseRunning})
	require.NoError(t, err, "the agent can write again after the restart")
}

// TestWatchIntentsRecoversALostConsumerWithinSeconds: when the server that
// holds the watch's consumer goes, the agent's own connection may stay (in
// a cluster, another server's stream leader is killed), and only missing
// heartbeats tell the watch. It makes its consumer again within seconds;
// with nats.go's default heartbeat (5 s, checked every 10 s) it took 10 to
// 20 s, and make chaos saw a VM wait 25 s for a stop after the kill of the
// JetStream meta leader.
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

func TestWatchIntentsRoutesVolumeIntents(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	put := func(node, uid string) {
		key, err := wire.VolumeIntentKey(node, uid)
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
	var volumes []bus.VolumeIntentEvent
	for _, ev := range initial {
		if ev.Volume != nil {
			assert.Empty(t, ev.UID, "a volume intent is not a guest intent")
			volumes = append(volumes, *ev.Volume)
		}
	}
	require.Len(t, volumes, 1)
	assert.Equal(t, "vol-a", volumes[0].UID)
	assert.Equal(t, "ns_vol-a", volumes[0].Intent.Disk)

	require.NoError(t, f.intents.Delete(ctx, "node1.volume.vol-a"))
	got := e.until(t, 5*time.Second, func(ev bus.IntentEvent) bool { return ev.Volume != nil && ev.Volume.Deleted })
	assert.Equal(t, "vol-a", got[len(got)-1].Volume.UID)

	cases := map[string]struct {
		key, value string
		reason     string
	}{
		"CorruptVolumeIntent":       {key: "node1.volume.vol-x", value: `{"protocolVersion":1,`, reason: natswire.ReasonDecode},
		"NewerVolumeIntent":         {key: "node1.volume.vol-y", value: `{"protocolVersion":2,"uid":"vol-y"}`, reason: natswire.ReasonVersion},
		"VolumeIntentOfAnotherUID":  {key: "node1.volume.vol-z", value: `{"protocolVersion":1,"uid":"vol-o","disk":"d","absent":true}`, reason: natswire.ReasonMismatch},
		"PresentVolumeIsNotDefined": {key: "node1.volume.vol-p", value: `{"protocolVersion":1,"uid":"vol-p","disk":"d"}`, reason: natswire.ReasonDecode},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := b.Rejections().Count(tc.reason)
			_, err := f.intents.Put(ctx, tc.key, []byte(tc.value))
			require.NoError(t, err)
			f.putIntent(t, "node1", "vm-good", int64(len(name)))
			e.until(t, 5*time.Second, generation("vm-good", int64(len(name))))
			assert.Equal(t, before+1, b.Rejections().Count(tc.reason))
		})
	}
	assert.False(t, async.WaitForViolation(0), "watching volume intents needs no permission the agent lacks")
}

func TestPutVolumeReport(t *testing.T) {
	f := newFleet(t)
	b, _, async := f.agent(t, "node1")
	ctx := context.Background()
	r := wire.VolumeReport{UID: "vol-a", Message: "attached", ObservedAt: time.Unix(1, 0).UTC()}

	rev1, err := b.PutVolumeReport(ctx, r)
	require.NoError(t, err)
	rev2, err := b.PutVolumeReport(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same report must not write")

	r.Gone, r.Message = true, ""
	_, err = b.PutVolumeReport(ctx, r)
	require.NoError(t, err)
	e, err := f.reports.Get(ctx, "node1.volume.vol-a")
	require.NoError(t, err, "the report lives under <node>.volume.<uid>")
	got, err := wire.DecodeVolumeReport(e.Value())
	require.NoError(t, err)
	assert.True(t, got.Gone)

	// A guest report of the same uid is another key.
	_, err = b.PutReport(ctx, wire.Report{UID: "vol-a", Phase: wire.PhaseRunning})
	require.NoError(t, err)
	require.NoError(t, b.DeleteVolumeReport(ctx, "vol-a"))
	require.NoError(t, b.DeleteVolumeReport(ctx, "vol-a"), "deleting twice is harmless")
	_, err = f.reports.Get(ctx, "node1.volume.vol-a")
	assert.Error(t, err)
	_, err = f.reports.Get(ctx, "node1.vol-a")
	assert.NoError(t, err, "deleting the volume report leaves the guest report")

	_, err = b.PutVolumeReport(ctx, wire.VolumeReport{UID: "vol.a"})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
	assert.False(t, async.WaitForViolation(0))
}

func TestPutImageReport(t *testing.T) {
	f := newFleet(t)
	b, _, async := f.agent(t, "node1")
	ctx := context.Background()
	r := wire.ImageReport{UID: "img-a", Name: "ubuntu", Phase: wire.ImagePhaseImporting, Message: "importing image ubuntu: 1 of 2 bytes", ObservedAt: time.Unix(1, 0).UTC()}

	rev1, err := b.PutImageReport(ctx, r)
	require.NoError(t, err)
	rev2, err := b.PutImageReport(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same report must not write")

	r.Phase, r.SizeBytes, r.Message = wire.ImagePhaseReady, 2, ""
	_, err = b.PutImageReport(ctx, r)
	require.NoError(t, err)
	e, err := f.reports.Get(ctx, "node1.image.img-a")
	require.NoError(t, err, "the report lives under <node>.image.<uid>")
	got, err := wire.DecodeImageReport(e.Value())
	require.NoError(t, err)
	assert.Equal(t, wire.ImagePhaseReady, got.Phase)
	assert.Equal(t, int64(2), got.SizeBytes)
	assert.Equal(t, "node1", got.Node, "the bus stamps its own node")

	require.NoError(t, b.DeleteImageReport(ctx, "img-a"))
	require.NoError(t, b.DeleteImageReport(ctx, "img-a"), "deleting twice is harmless")
	_, err = f.reports.Get(ctx, "node1.image.img-a")
	assert.Error(t, err)

	_, err = b.PutImageReport(ctx, wire.ImageReport{UID: "img.a", Phase: wire.ImagePhaseReady})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
	assert.False(t, async.WaitForViolation(0), "writing image reports needs no permission the agent lacks")
}
