package natswire_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// hubJetStream starts a real nats-server and connects to it as the hub.
func hubJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	hub, _, users := natstest.Identities(t)
	srv := natstest.New(t, users...)
	nc, _ := natstest.Connect(t, srv, hub)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// streamConfig is the configuration the server holds for bucket's stream.
func streamConfig(t *testing.T, js jetstream.JetStream, bucket string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(context.Background(), "KV_"+bucket)
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.Config
}

// TestEnsureBucketsLimitsEveryBucket pins the byte limits on the server's
// streams, with the defaults and with a configuration that sets them.
func TestEnsureBucketsLimitsEveryBucket(t *testing.T) {
	cases := map[string]struct {
		cfg                                     natswire.BucketConfig
		wantMaxBytes, wantNodesMaxBytes         int64
		wantMaxValueSize                        int32
		wantNodeReportKeys, wantNodeReportBytes int64
	}{
		"Defaults": {
			wantMaxBytes: natswire.DefaultMaxBytes, wantNodesMaxBytes: natswire.DefaultNodesMaxBytes, wantMaxValueSize: natswire.DefaultMaxValueSize,
			wantNodeReportKeys: natswire.DefaultNodeReportKeys, wantNodeReportBytes: natswire.DefaultNodeReportBytes,
		},
		"Configured": {
			cfg:          natswire.BucketConfig{MaxBytes: 8 << 20, NodesMaxBytes: 2 << 20, MaxValueSize: 64 << 10, NodeReportKeys: 100, NodeReportBytes: 1 << 20},
			wantMaxBytes: 8 << 20, wantNodesMaxBytes: 2 << 20, wantMaxValueSize: 64 << 10,
			wantNodeReportKeys: 100, wantNodeReportBytes: 1 << 20,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			js := hubJetStream(t)
			require.NoError(t, natswire.EnsureBuckets(context.Background(), js, tc.cfg))
			require.NoError(t, natswire.EnsureNodeReports(context.Background(), js, tc.cfg, "node1"))
			// The reports bucket has no limit of its own: its sources,
			// the nodes' streams, bound it.
			for bucket, want := range map[string]int64{wire.BucketIntents: tc.wantMaxBytes, wire.BucketReports: -1, wire.BucketNodes: tc.wantNodesMaxBytes} {
				c := streamConfig(t, js, bucket)
				assert.Equal(t, want, c.MaxBytes, "MaxBytes of %s", bucket)
				assert.Equal(t, tc.wantMaxValueSize, c.MaxMsgSize, "MaxValueSize of %s", bucket)
				assert.Equal(t, jetstream.DiscardNew, c.Discard, "a full %s bucket must refuse new values, not drop old ones", bucket)
				assert.False(t, c.AllowRollup, "roll-ups in %s", bucket)
				assert.Zero(t, c.SubjectDeleteMarkerTTL, "markers in %s: they need roll-ups", bucket)
			}
			reports := streamConfig(t, js, wire.BucketReports)
			assert.Empty(t, reports.Subjects, "the reports bucket takes no write: only what it sources")
			own := nodeReportsConfig(t, js, "node1")
			assert.Equal(t, []string{"$KV.reports.node1.>"}, own.Subjects)
			assert.Equal(t, tc.wantNodeReportKeys, own.MaxMsgs, "keys of a node's reports")
			assert.Equal(t, tc.wantNodeReportBytes, own.MaxBytes, "bytes of a node's reports")
			assert.Equal(t, tc.wantMaxValueSize, own.MaxMsgSize)
			assert.Equal(t, jetstream.DiscardNew, own.Discard, "a node at its bound must be refused, not drop its own old reports")
			assert.False(t, own.AllowRollup, "a node must not roll up its own stream")
			assert.Contains(t, sourceNames(reports), natswire.NodeReportsStream("node1"))
		})
	}
}

// TestBucketRefusesWritesOverItsLimits shows the server enforcing the
// limits: a value over MaxValueSize and a value that would take the bucket
// over MaxBytes are refused, and what the bucket held stays.
func TestBucketRefusesWritesOverItsLimits(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	const maxBytes, maxValue = 64 << 10, 4 << 10
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{MaxBytes: maxBytes, MaxValueSize: maxValue}))
	kv, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)

	_, err = kv.Put(ctx, "node1.too-big", bytes.Repeat([]byte("x"), maxValue+1))
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr, "a value over MaxValueSize must be refused")
	assert.Equal(t, jetstream.JSErrCodeStreamMessageExceedsMaximum, apiErr.ErrorCode, apiErr.Description)

	// Fill the bucket with values under MaxValueSize until it refuses one;
	// it must do so before holding more than MaxBytes.
	value := bytes.Repeat([]byte("y"), maxValue/2)
	var stored []string
	for i := 0; ; i++ {
		key := fmt.Sprintf("node1.k%d", i)
		if _, err := kv.Put(ctx, key, value); err != nil {
			// nats-server's JSStreamStoreFailedF wraps ErrMaxBytes; nats.go
			// names no constant for it.
			require.ErrorContains(t, err, "maximum bytes exceeded")
			break
		}
		stored = append(stored, key)
		require.LessOrEqual(t, len(stored)*len(value), maxBytes, "the bucket took more than MaxBytes of values")
	}
	require.NotEmpty(t, stored)
	for _, key := range stored {
		e, err := kv.Get(ctx, key)
		require.NoError(t, err, "a full bucket must keep what it holds: %s", key)
		assert.Equal(t, value, e.Value())
	}
}

// TestEnsureBucketsLimitsExistingBuckets brings buckets made without limits
// and with roll-ups allowed (as before the limits existed), and a nodes
// bucket with expiry markers (as before the hub judged a node's loss
// itself), to the configured ones at the next start, keeping their values,
// the way it brings them to the configured replicas.
func TestEnsureBucketsLimitsExistingBuckets(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	old := append(natswire.KeyValueConfigs(natswire.BucketConfig{}), jetstream.KeyValueConfig{Bucket: wire.BucketReports})
	for _, c := range old {
		c.MaxBytes, c.MaxValueSize = 0, 0
		if c.Bucket == wire.BucketNodes {
			c.LimitMarkerTTL = c.TTL
		}
		_, err := js.CreateKeyValue(ctx, c)
		require.NoError(t, err)
		require.Equal(t, int64(-1), streamConfig(t, js, c.Bucket).MaxBytes, "the old bucket %s is unlimited", c.Bucket)
	}
	kv, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "node1.vm", []byte("intent"))
	require.NoError(t, err)
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	_, err = reports.Put(ctx, "node1.vm", []byte("report"))
	require.NoError(t, err)
	nodes, err := js.KeyValue(ctx, wire.BucketNodes)
	require.NoError(t, err)
	_, err = nodes.Put(ctx, "node1", []byte("heartbeat"))
	require.NoError(t, err)

	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	for _, bucket := range []string{wire.BucketIntents, wire.BucketNodes} {
		c := streamConfig(t, js, bucket)
		assert.Positive(t, c.MaxBytes, "MaxBytes of %s", bucket)
		assert.Equal(t, natswire.DefaultMaxValueSize, c.MaxMsgSize, "MaxValueSize of %s", bucket)
		assert.False(t, c.AllowRollup, "roll-ups in %s", bucket)
		assert.Zero(t, c.SubjectDeleteMarkerTTL, "markers in %s", bucket)
	}
	assert.Equal(t, natswire.DefaultNodeTTL, streamConfig(t, js, wire.BucketNodes).MaxAge)
	e, err := nodes.Get(ctx, "node1")
	require.NoError(t, err)
	assert.Equal(t, []byte("heartbeat"), e.Value())
	assert.False(t, streamConfig(t, js, wire.BucketReports).AllowRollup, "roll-ups in %s", wire.BucketReports)
	e, err = kv.Get(ctx, "node1.vm")
	require.NoError(t, err)
	assert.Equal(t, []byte("intent"), e.Value())

	// The old reports bucket gave up its subjects, so the node's own
	// stream can take them, and what it held stays readable.
	require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, "node1"))
	e, err = reports.Get(ctx, "node1.vm")
	require.NoError(t, err)
	assert.Equal(t, []byte("report"), e.Value())
}

// nodeReportsConfig is the configuration the server holds for node's own
// reports stream.
func nodeReportsConfig(t *testing.T, js jetstream.JetStream, node string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(context.Background(), natswire.NodeReportsStream(wire.NodeToken(node)))
	require.NoError(t, err)
	return s.CachedInfo().Config
}

func sourceNames(c jetstream.StreamConfig) []string {
	var out []string
	for _, s := range c.Sources {
		out = append(out, s.Name)
	}
	return out
}

// TestEnsureNodeReportsIsIdempotent: the hub makes a node's stream at each
// start for every node it heard from, and the bucket sources each once.
func TestEnsureNodeReportsIsIdempotent(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	for range 2 {
		for _, node := range []string{"node1", "node-2.rack-a"} {
			require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, node))
		}
	}
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{NodeReportKeys: 10}))
	assert.ElementsMatch(t, []string{"REPORTS_node1", "REPORTS_node-2_rack-a"}, sourceNames(streamConfig(t, js, wire.BucketReports)))
	assert.Equal(t, int64(10), nodeReportsConfig(t, js, "node1").MaxMsgs, "a changed bound reaches the nodes' streams at the hub's next start")
}

// streamWrites is a JetStream that records the names of the streams it is
// asked to create or update.
type streamWrites struct {
	jetstream.JetStream
	names []string
}

func (w *streamWrites) CreateOrUpdateStream(ctx context.Context, c jetstream.StreamConfig) (jetstream.Stream, error) {
	w.names = append(w.names, c.Name)
	return w.JetStream.CreateOrUpdateStream(ctx, c)
}

func (w *streamWrites) UpdateStream(ctx context.Context, c jetstream.StreamConfig) (jetstream.Stream, error) {
	w.names = append(w.names, c.Name)
	return w.JetStream.UpdateStream(ctx, c)
}

// nodeStreams are the nodes' reports streams of names.
func (w *streamWrites) nodeStreams() []string {
	return slices.DeleteFunc(slices.Clone(w.names), func(n string) bool { return !strings.HasPrefix(n, "REPORTS_") })
}

// TestEnsureBucketsWritesOnlyTheNodesStreamsWhoseBoundChanged: a hub
// starting over many nodes reads their streams and writes only those a
// changed bound must change, so its start does not cost a write per node.
func TestEnsureBucketsWritesOnlyTheNodesStreamsWhoseBoundChanged(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	nodes := []string{"node1", "node2", "node3"}
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	for _, node := range nodes {
		require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, node))
	}
	steps := []struct {
		name        string
		cfg         natswire.BucketConfig
		wantWritten []string
		wantKeys    int64
	}{
		{name: "Unchanged", wantKeys: natswire.DefaultNodeReportKeys},
		{name: "BoundChanged", cfg: natswire.BucketConfig{NodeReportKeys: 10}, wantWritten: []string{"REPORTS_node1", "REPORTS_node2", "REPORTS_node3"}, wantKeys: 10},
		{name: "ChangedBoundUnchanged", cfg: natswire.BucketConfig{NodeReportKeys: 10}, wantKeys: 10},
		{name: "BytesChanged", cfg: natswire.BucketConfig{NodeReportKeys: 10, NodeReportBytes: 1 << 20}, wantWritten: []string{"REPORTS_node1", "REPORTS_node2", "REPORTS_node3"}, wantKeys: 10},
	}
	for _, step := range steps {
		w := &streamWrites{JetStream: js}
		require.NoError(t, natswire.EnsureBuckets(ctx, w, step.cfg), step.name)
		assert.ElementsMatch(t, step.wantWritten, w.nodeStreams(), "%s: the nodes' streams written", step.name)
		for _, node := range nodes {
			assert.Equal(t, step.wantKeys, nodeReportsConfig(t, js, node).MaxMsgs, "%s: keys of %s's reports", step.name, node)
		}
	}
	assert.Equal(t, int64(1<<20), nodeReportsConfig(t, js, "node2").MaxBytes)
	assert.ElementsMatch(t, []string{"REPORTS_node1", "REPORTS_node2", "REPORTS_node3"}, sourceNames(streamConfig(t, js, wire.BucketReports)))
}

// TestCheckNodeReportsDropsTheSourcesOfLostStreams: a node's stream lost
// behind the hub's back is not taken, and the bucket stops sourcing it
// (JetStream would not source a stream made anew under its name) while it
// goes on sourcing the other nodes; EnsureNodeReports then adds it afresh.
func TestCheckNodeReportsDropsTheSourcesOfLostStreams(t *testing.T) {
	cases := map[string]struct {
		nodes, lost []string
	}{
		"OneOfTwoLost":   {nodes: []string{"node1", "node2"}, lost: []string{"node2"}},
		"TheOnlyOneLost": {nodes: []string{"node1"}, lost: []string{"node1"}},
		"NoneLost":       {nodes: []string{"node1", "node2"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			js := hubJetStream(t)
			require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
			for _, node := range tc.nodes {
				require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, node))
			}
			for _, node := range tc.lost {
				require.NoError(t, js.DeleteStream(ctx, natswire.NodeReportsStream(wire.NodeToken(node))))
			}

			taken, err := natswire.CheckNodeReports(ctx, js)
			require.NoError(t, err)
			var stay []string
			for _, node := range tc.nodes {
				stream := natswire.NodeReportsStream(wire.NodeToken(node))
				lost := slices.Contains(tc.lost, node)
				assert.Equal(t, !lost, taken[stream], "whether %s is taken", stream)
				if !lost {
					stay = append(stay, stream)
				}
			}
			assert.ElementsMatch(t, stay, sourceNames(streamConfig(t, js, wire.BucketReports)))

			for _, node := range tc.lost {
				require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, node))
			}
			taken, err = natswire.CheckNodeReports(ctx, js)
			require.NoError(t, err)
			assert.Len(t, taken, len(tc.nodes), "every node's stream is taken once made again")
		})
	}
}

// TestDropNodeReportsFreesTheNodesBound: a node removed for good leaves no
// stream behind to hold its bound of the JetStream store, and no source in
// the bucket; the other node's stays, and the dropped node heard from
// again is taken afresh.
func TestDropNodeReportsFreesTheNodesBound(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	for _, node := range []string{"node1", "node2"} {
		require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, node))
	}
	reserved := func() uint64 {
		info, err := js.AccountInfo(ctx)
		require.NoError(t, err)
		return info.ReservedStore
	}
	before := reserved()

	require.NoError(t, natswire.DropNodeReports(ctx, js, "node2"))
	_, err := js.Stream(ctx, natswire.NodeReportsStream(wire.NodeToken("node2")))
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	assert.Equal(t, []string{natswire.NodeReportsStream(wire.NodeToken("node1"))}, sourceNames(streamConfig(t, js, wire.BucketReports)))
	assert.Equal(t, before-uint64(natswire.DefaultNodeReportBytes), reserved(), "the dropped node's bound is no longer reserved")
	require.NoError(t, natswire.DropNodeReports(ctx, js, "node2"), "dropping it again finds nothing to do")

	require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, "node2"))
	taken, err := natswire.CheckNodeReports(ctx, js)
	require.NoError(t, err)
	assert.Len(t, taken, 2, "the node heard from again is taken afresh")
}

// TestAStreamLostWhileTheHubWasDownIsSourcedAfresh: the hub's start does
// not make again a node's stream lost meanwhile under the bucket's stale
// source of it (JetStream would not source the new one); the node's next
// heartbeat makes it and its source afresh, and its reports reach the
// bucket.
func TestAStreamLostWhileTheHubWasDownIsSourcedAfresh(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, "node1"))
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	reached := func(key, value string) func() bool {
		return func() bool {
			e, err := reports.Get(ctx, key)
			return err == nil && string(e.Value()) == value
		}
	}
	_, err = reports.Put(ctx, "node1.vm-a", []byte("before"))
	require.NoError(t, err)
	require.Eventually(t, reached("node1.vm-a", "before"), 5*time.Second, 50*time.Millisecond)
	require.NoError(t, js.DeleteStream(ctx, natswire.NodeReportsStream(wire.NodeToken("node1"))))

	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	assert.Empty(t, sourceNames(streamConfig(t, js, wire.BucketReports)), "the lost stream is no longer sourced")
	require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, "node1"))
	_, err = reports.Put(ctx, "node1.vm-b", []byte("after"))
	require.NoError(t, err)
	require.Eventually(t, reached("node1.vm-b", "after"), 5*time.Second, 50*time.Millisecond, "the node's reports reach the bucket again")
	assert.True(t, reached("node1.vm-a", "before")(), "what the bucket had sourced stays")
}

// TestTheIntentsBucketTakesAWatchPerNodePastTheServersDefault: every agent
// watches its own intents with an ordered consumer (an ephemeral one,
// filtered on its prefix, made here as nats.go makes it at the watch's
// first read), and nats-server allows 1,000 consumers a stream unless the
// stream says otherwise, so the watch of a fleet's node 1,001 was refused.
// The bucket bounds its consumers itself, higher, and still bounds them.
func TestTheIntentsBucketTakesAWatchPerNodePastTheServersDefault(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	assert.Equal(t, natswire.DefaultIntentConsumers, streamConfig(t, js, wire.BucketIntents).MaxConsumers)
	watch := func(node string) error {
		_, err := js.CreateConsumer(ctx, "KV_"+wire.BucketIntents, jetstream.ConsumerConfig{
			FilterSubject: fmt.Sprintf("$KV.%s.%s.>", wire.BucketIntents, node),
			AckPolicy:     jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		})
		return err
	}

	const nodes = 1001
	for i := range nodes {
		require.NoError(t, watch(fmt.Sprintf("node%d", i)), "the watch of node %d", i)
	}

	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{IntentConsumers: nodes + 1}))
	require.NoError(t, watch("extra1"), "one more, up to the bound")
	require.Error(t, watch("extra2"), "none past the bound")
}
