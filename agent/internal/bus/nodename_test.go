package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// TestADottedNodeNameIsItsOwnNode pins that a node named with dots works
// end to end on a real nats-server and stays apart from the nodes whose
// names look alike: "node-1" (a prefix of its name) and "node-1_rack-a"
// (what its token would be if '_' were not escaped).
func TestADottedNodeNameIsItsOwnNode(t *testing.T) {
	const dotted, prefix, lookalike = "node-1.rack-a", "node-1", "node-1_rack-a"
	srv, js, agents := natstest.NewFleet(t, natswire.BucketConfig{NodeTTL: 3 * time.Second}, dotted, prefix, lookalike)
	ctx := context.Background()
	intents, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)
	for _, n := range []string{dotted, prefix, lookalike} {
		key, err := wire.GuestIntents.Key(n, "vm-of-"+wire.NodeToken(n))
		require.NoError(t, err)
		b, err := wire.EncodeIntent(wire.Intent{UID: "vm-of-" + wire.NodeToken(n), Name: "vm", Generation: 1, Running: true})
		require.NoError(t, err)
		_, err = intents.Put(ctx, key, b)
		require.NoError(t, err)
	}

	nc, async := natstest.Connect(t, srv, agents[dotted])
	b, err := bus.New(nc, bus.Config{Node: dotted, Timeout: 500 * time.Millisecond, RetryInterval: 100 * time.Millisecond})
	require.NoError(t, err)

	got := watch(t, b).until(t, 5*time.Second, synced)
	var uids []string
	for _, ev := range got {
		if g, ok := guest(ev); ok {
			uids = append(uids, g.UID)
		}
	}
	assert.Equal(t, []string{"vm-of-node-1_rack-a"}, uids, "the node sees its own intents only")

	require.NoError(t, b.PutHeartbeat(ctx, wire.NodeHeartbeat{Backend: "libvirt"}))
	_, err = putReport(b, wire.Report{UID: "vm-of-node-1_rack-a", Node: dotted, Phase: wire.PhaseRunning})
	require.NoError(t, err)
	e, err := nodeReports{js: js}.Get(ctx, "node-1_rack-a.vm-of-node-1_rack-a")
	require.NoError(t, err, "the report is under the node's token")
	r, err := wire.DecodeReport(e.Value())
	require.NoError(t, err)
	assert.Equal(t, dotted, r.Node, "the report names the node as it is")
	assert.False(t, async.WaitForViolation(100*time.Millisecond))

	for _, other := range []string{prefix, lookalike} {
		key, err := wire.GuestReports.Key(other, "x")
		require.NoError(t, err)
		require.Error(t, publishAcked(nc, wire.Subject(wire.BucketReports, key)), "%s cannot write %s's report", dotted, other)
		assert.True(t, async.WaitForViolation(time.Second))
	}
}
