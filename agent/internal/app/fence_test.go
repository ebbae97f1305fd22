package app

import (
	"context"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// TestANodeCutOffFencesItself plays a node cut off from NATS: its heartbeat
// puts fail. Once they have failed for the lease, the guests the hub would
// restart elsewhere (Fence) are destroyed and none is started again, whatever
// their intents say, until a heartbeat is stored and the intents were read
// afresh after it; the node's other guests run on throughout.
func TestANodeCutOffFencesItself(t *testing.T) {
	const fenceAfter = 300 * time.Millisecond
	cfg := Config{
		Node: "n1", FenceAfter: fenceAfter, HeartbeatInterval: 20 * time.Millisecond, SharedPools: []string{"nfs-a"},
		Workers: 2, ResyncInterval: time.Hour, Metrics: metrics.NewAgentMetrics(),
	}
	cfg.defaults()
	b, drv := bus.NewFake(cfg.Node), fake.New(cfg.Node)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runNode(ctx, cfg, b, drv, logging.NewNopLogger()) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	ha, plain := guestIntent("ha", true), guestIntent("plain", false)
	put(t, b, ha, plain)
	waitPhase(t, drv, "ha", driver.PhaseRunning)
	waitPhase(t, drv, "plain", driver.PhaseRunning)
	hb, ok := b.Heartbeat()
	require.True(t, ok)
	assert.Equal(t, fenceAfter.Milliseconds(), hb.FenceAfterMillis, "the heartbeat announces the lease")
	assert.Equal(t, []string{"nfs-a"}, hb.SharedPools)

	cutOff := time.Now()
	b.FailHeartbeats(errors.New("no responders"))
	waitGone(t, drv, "ha")
	// The last put that succeeded was issued at most one interval before
	// the cut.
	assert.GreaterOrEqual(t, time.Since(cutOff), fenceAfter-cfg.HeartbeatInterval, "fenced before the lease ran out")
	phase(t, drv, "plain", driver.PhaseRunning, "a guest without Fence is untouched")

	// While fenced, intents that say Running start no guest that fences.
	ha.Generation, ha.RestartNonce = 2, "t1"
	more := guestIntent("ha2", true)
	put(t, b, ha, more)
	fenced := len(drv.Calls())
	time.Sleep(5 * cfg.HeartbeatInterval)
	assert.Empty(t, ensures(drv.Calls()[fenced:], "ha", "ha2"), "no guest that fences is ensured while fenced")

	// A heartbeat is stored again, but the watch has not caught up yet.
	b.PauseResumes(true)
	stored := time.Now()
	b.FailHeartbeats(nil)
	require.Eventually(t, func() bool { hb, _ := b.Heartbeat(); return hb.SentAt.After(stored) && b.Resumes() > 0 }, 5*time.Second, 5*time.Millisecond,
		"a heartbeat is stored and the watch asked to resume")
	time.Sleep(5 * cfg.HeartbeatInterval)
	assert.Empty(t, ensures(drv.Calls()[fenced:], "ha", "ha2"), "still fenced until the intents are read afresh")

	// The watch catches up: the guests that fence run again.
	b.PauseResumes(false)
	waitPhase(t, drv, "ha", driver.PhaseRunning)
	waitPhase(t, drv, "ha2", driver.PhaseRunning)
	phase(t, drv, "plain", driver.PhaseRunning, "")
}

func guestIntent(uid string, fence bool) wire.Intent {
	return wire.Intent{
		ProtocolVersion: wire.ProtocolVersion, UID: uid, Namespace: "default", Name: "vm-" + uid, Generation: 1, Running: true, Fence: fence,
		Machine: wire.Machine{VCPU: 1, MemoryBytes: 1 << 30, Disks: []wire.Disk{{Name: "root-" + uid, VolumeUID: "vol-" + uid, SizeBytes: 1 << 30}}},
	}
}

func put(t *testing.T, b *bus.Fake, ins ...wire.Intent) {
	t.Helper()
	for _, in := range ins {
		require.NoError(t, bus.SetIntent(b, wire.GuestIntents, in.UID, in))
	}
}

// ensures are the Ensure calls among calls of the guests uids.
func ensures(calls []fake.Call, uids ...string) []fake.Call {
	var out []fake.Call
	for _, c := range calls {
		for _, uid := range uids {
			if c.Op == "Ensure" && c.UID == uid {
				out = append(out, c)
			}
		}
	}
	return out
}

func waitPhase(t *testing.T, drv *fake.Driver, uid string, p driver.Phase) {
	t.Helper()
	require.Eventually(t, func() bool {
		o, err := drv.Observe(context.Background(), uid)
		return err == nil && o.Phase == p
	}, 5*time.Second, 5*time.Millisecond, "guest %s %s", uid, p)
}

func waitGone(t *testing.T, drv *fake.Driver, uid string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := drv.Observe(context.Background(), uid)
		return driver.IsNotFound(err)
	}, 5*time.Second, 5*time.Millisecond, "guest %s destroyed", uid)
}

func phase(t *testing.T, drv *fake.Driver, uid string, p driver.Phase, msg string) {
	t.Helper()
	o, err := drv.Observe(context.Background(), uid)
	require.NoError(t, err, msg)
	assert.Equal(t, p, o.Phase, msg)
}
