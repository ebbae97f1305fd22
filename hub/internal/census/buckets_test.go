package census

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// The buckets' gauges say what a real nats-server's streams hold against
// their limits, once per server however many fleets share it.
func TestBucketGauges(t *testing.T) {
	hub, _, users := natstest.Identities(t, "node1")
	srv := natstest.New(t, users...)
	const limit = 1 << 20
	fleets := make([]*fleet.Fleet, 2)
	var b *bus.NATS
	for i := range fleets {
		nc, _ := natstest.Connect(t, srv, hub)
		var err error
		b, err = bus.New(context.Background(), nc, bus.Config{Buckets: natswire.BucketConfig{MaxBytes: limit, NodesMaxBytes: limit / 2}})
		require.NoError(t, err)
		fleets[i] = fleet.New(b, logging.NewNopLogger())
	}
	value := []byte(strings.Repeat("x", 1000))
	for _, key := range []string{"node1.a", "node1.b", "node1.c"} {
		_, err := b.Put(context.Background(), wire.BucketIntents, key, value)
		require.NoError(t, err)
	}

	elected := make(chan struct{})
	close(elected)
	kube := fake.NewClientBuilder().WithScheme(runtime.NewScheme()).Build()
	c := New(kube, func() []*fleet.Fleet { return fleets }, elected, logging.NewNopLogger())
	assert.Equal(t, 3, testutil.CollectAndCount(c, "virtfleet_hub_nats_bucket_bytes"), "one series per bucket, not per fleet")

	usage, err := b.BucketUsage(context.Background())
	require.NoError(t, err)
	got := map[string]bus.BucketUsage{}
	for _, u := range usage {
		got[u.Bucket] = u
		assert.NotEmpty(t, u.NATS, "the servers are named")
	}
	require.Contains(t, got, wire.BucketIntents)
	assert.Equal(t, uint64(3), got[wire.BucketIntents].Values)
	assert.Greater(t, got[wire.BucketIntents].Bytes, int64(3*len(value)))
	assert.Equal(t, int64(limit), got[wire.BucketIntents].MaxBytes)
	assert.Equal(t, int64(limit/2), got[wire.BucketNodes].MaxBytes)
	assert.Zero(t, got[wire.BucketReports].Values)

	intents := got[wire.BucketIntents]
	want := "# HELP virtfleet_hub_nats_bucket_max_bytes A bucket's limit in bytes: past it JetStream refuses new values (intents and reports cannot be written).\n" +
		"# TYPE virtfleet_hub_nats_bucket_max_bytes gauge\n" +
		`virtfleet_hub_nats_bucket_max_bytes{bucket="intents",nats="` + intents.NATS + `"} 1.048576e+06` + "\n" +
		`virtfleet_hub_nats_bucket_max_bytes{bucket="nodes",nats="` + intents.NATS + `"} 524288` + "\n" +
		`virtfleet_hub_nats_bucket_max_bytes{bucket="reports",nats="` + intents.NATS + `"} -1` + "\n"
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "virtfleet_hub_nats_bucket_max_bytes"))
}

// TestNodeReportGauges: each node's reports are shown against their bound,
// once per server, so a node at its bound is seen.
func TestNodeReportGauges(t *testing.T) {
	hub, agents, users := natstest.Identities(t, "node1", "node-2.rack-a")
	srv := natstest.New(t, users...)
	ctx := context.Background()
	cfg := natswire.BucketConfig{NodeReportKeys: 2, NodeReportBytes: 1 << 20}
	fleets := make([]*fleet.Fleet, 2)
	for i := range fleets {
		nc, _ := natstest.Connect(t, srv, hub)
		b, err := bus.New(ctx, nc, bus.Config{Buckets: cfg})
		require.NoError(t, err)
		fleets[i] = fleet.New(b, logging.NewNopLogger())
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		for node := range agents {
			require.NoError(t, natswire.EnsureNodeReports(ctx, js, cfg, node))
		}
	}
	nc, _ := natstest.Connect(t, srv, agents["node1"])
	node1, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, key := range []string{"a", "b", "c"} {
		_, err = node1.Publish(ctx, "$KV.reports.node1."+key, []byte("{}"))
	}
	require.Error(t, err, "node1 is at its bound")

	elected := make(chan struct{})
	close(elected)
	kube := fake.NewClientBuilder().WithScheme(runtime.NewScheme()).Build()
	c := New(kube, func() []*fleet.Fleet { return fleets }, elected, logging.NewNopLogger())
	usage, err := fleets[0].Bus.(*bus.NATS).NodeReportUsage(ctx)
	require.NoError(t, err)
	require.Len(t, usage, 2)
	server := usage[0].NATS
	want := "# HELP virtfleet_hub_node_reports_values Report keys a node's own reports stream holds: its reports and the markers of deleted ones.\n" +
		"# TYPE virtfleet_hub_node_reports_values gauge\n" +
		`virtfleet_hub_node_reports_values{nats="` + server + `",node="node-2.rack-a"} 0` + "\n" +
		`virtfleet_hub_node_reports_values{nats="` + server + `",node="node1"} 2` + "\n" +
		"# HELP virtfleet_hub_node_reports_max_values The keys a node's reports may hold: past it the node's new reports are refused, and no other node's.\n" +
		"# TYPE virtfleet_hub_node_reports_max_values gauge\n" +
		`virtfleet_hub_node_reports_max_values{nats="` + server + `",node="node-2.rack-a"} 2` + "\n" +
		`virtfleet_hub_node_reports_max_values{nats="` + server + `",node="node1"} 2` + "\n"
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "virtfleet_hub_node_reports_values", "virtfleet_hub_node_reports_max_values"))
}
