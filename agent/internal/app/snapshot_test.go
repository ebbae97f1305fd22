package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver/fake"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// TestSnapshotOverTheWire runs an agent on a real nats-server, with its own
// credentials, over a driver that keeps snapshots: its heartbeat says so,
// and a snapshot the hub asks for in the intents bucket comes back Ready in
// the reports bucket, under the node's key.
func TestSnapshotOverTheWire(t *testing.T) {
	t.Parallel()
	const node = "snap1"
	f := newWire(t, 0, node)
	cfg := f.config(node)
	cfg.Driver = fake.New(node)
	f.start(t, cfg)

	require.Eventually(t, func() bool {
		e, err := f.nodes.Get(context.Background(), node)
		if err != nil {
			return false
		}
		hb, err := wire.DecodeNodeHeartbeat(e.Value())
		require.NoError(t, err)
		return hb.Snapshots
	}, waitFor, 10*time.Millisecond, "the heartbeat announces snapshots")

	in := vm("db")
	f.put(t, node, in)
	f.waitReport(t, node, in.UID, "Running", running(1))

	snap := wire.SnapshotIntent{UID: "5e1f0c2a-snap", Namespace: in.Namespace, Name: "db-before-upgrade", VM: in.UID, Memory: true}
	putIntent(t, f, wire.SnapshotIntents, node, snap.UID, snap)
	r := waitReportOf(t, f, wire.SnapshotReports, node, snap.UID, "Ready", func(r wire.SnapshotReport) bool { return r.Phase == wire.SnapshotPhaseReady })
	assert.Equal(t, node, r.Node)
	assert.Equal(t, in.UID, r.VM)
	assert.NotNil(t, r.CreatedAt)
	assert.True(t, r.Online, "the guest ran")
	assert.True(t, r.Memory, "with its memory, as asked")
	assert.Positive(t, r.SizeBytes)
}
