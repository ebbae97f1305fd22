package fleet_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// archiveReport is a kind of report the wire does not have: a node's view
// of an archive.
type archiveReport struct {
	UID       string `json:"uid"`
	Node      string `json:"node"`
	SizeBytes int64  `json:"sizeBytes"`
}

// archives declares it, and nothing else is needed for the hub to read it.
var archives = wire.Kind[archiveReport]{
	Name: "archive report", Bucket: wire.BucketReports, Token: "archive",
	Encode: func(r archiveReport) ([]byte, error) { return json.Marshal(r) },
	Decode: func(b []byte) (archiveReport, error) {
		var r archiveReport
		err := json.Unmarshal(b, &r)
		return r, err
	},
	Identity: func(r archiveReport) (string, string) { return r.Node, r.UID },
}

// natsFleet is a Fleet over a real nats-server, not yet running, with what
// its test needs to play node1's agent and to write any report.
type natsFleet struct {
	*fleet.Fleet
	bus *bus.NATS
	// agent is node1's agent's connection, with its permissions.
	agent jetstream.JetStream
	// reports is the reports bucket, bound with the hub's permissions.
	reports jetstream.KeyValue
}

func newNATSFleet(t *testing.T) *natsFleet {
	t.Helper()
	hub, agents, users := natstest.Identities(t, "node1")
	srv := natstest.New(t, users...)
	ctx := context.Background()
	nc, _ := natstest.Connect(t, srv, hub)
	b, err := bus.New(ctx, nc, bus.Config{})
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, "node1"))
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	anc, _ := natstest.Connect(t, srv, agents["node1"])
	agent, err := jetstream.New(anc)
	require.NoError(t, err)
	return &natsFleet{Fleet: fleet.New(b, logging.NewNopLogger()), bus: b, agent: agent, reports: reports}
}

// run runs f until the test ends and returns once its report watch has
// caught up.
func (f *natsFleet) run(t *testing.T) {
	t.Helper()
	synced := make(chan struct{}, 1)
	f.SubscribeSynced(func() {
		select {
		case synced <- struct{}{}:
		default:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-synced:
	case <-time.After(5 * time.Second):
		t.Fatal("the report watch did not catch up")
	}
}

// publish plays node1's agent writing v under key.
func (f *natsFleet) publish(t *testing.T, key string, v archiveReport) {
	t.Helper()
	b, err := archives.Encode(v)
	require.NoError(t, err)
	_, err = f.agent.Publish(context.Background(), wire.Subject(wire.BucketReports, key), b)
	require.NoError(t, err)
}

// uids delivers the uids r's subscribers are told of.
func uids[R any](r *fleet.Reports[R]) <-chan string {
	ch := make(chan string, 64)
	r.Subscribe(func(uid string) { ch <- uid })
	return ch
}

// await waits for uid on ch.
func await(t *testing.T, ch <-chan string, uid string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case got := <-ch:
			if got == uid {
				return
			}
		case <-timeout:
			t.Fatalf("no change of %s", uid)
		}
	}
}

// TestAKindOfItsOwnNeedsNoChange: a kind declared outside bus and fleet is
// read from a node, kept per node and uid and told to its subscribers, and
// a value of it under another's key is refused as any other kind's is.
func TestAKindOfItsOwnNeedsNoChange(t *testing.T) {
	f := newNATSFleet(t)
	snaps := fleet.Watch(f.Fleet, archives, "Backup")
	changed := uids(snaps)
	f.run(t)

	f.publish(t, "node1.archive.snap-a", archiveReport{UID: "snap-a", Node: "node1", SizeBytes: 42})
	await(t, changed, "snap-a")
	r, ok := snaps.Report("node1", "snap-a")
	require.True(t, ok)
	assert.Equal(t, archiveReport{UID: "snap-a", Node: "node1", SizeBytes: 42}, r.Report)
	assert.Equal(t, "node1", r.Node)
	assert.NotZero(t, r.Revision)
	assert.Equal(t, []string{"node1"}, snaps.Reporters("snap-a"))
	_, isGuest := f.Guests.Report("node1", "snap-a")
	assert.False(t, isGuest, "a backup report is no guest report")

	before := f.bus.Rejections().Count(natswire.ReasonMismatch)
	f.publish(t, "node1.archive.snap-b", archiveReport{UID: "snap-c", Node: "node1"})
	f.publish(t, "node1.archive.snap-d", archiveReport{UID: "snap-d", Node: "node1"})
	await(t, changed, "snap-d")
	assert.Equal(t, before+1, f.bus.Rejections().Count(natswire.ReasonMismatch), "a backup under another's key")
	_, ok = snaps.Report("node1", "snap-b")
	assert.False(t, ok)
	_, ok = snaps.Report("node1", "snap-c")
	assert.False(t, ok)

	require.NoError(t, f.reports.Delete(context.Background(), "node1.archive.snap-a"))
	await(t, changed, "snap-a")
	_, ok = snaps.Report("node1", "snap-a")
	assert.False(t, ok, "a deleted report is forgotten")
}

// TestTheReportWatchRefusesBadReports: a report that cannot be decoded, has
// a newer protocol version, is under a key not its own or of no kind the
// fleet reads, is counted by its reason and skipped, and the watch carries
// on.
func TestTheReportWatchRefusesBadReports(t *testing.T) {
	f := newNATSFleet(t)
	f.run(t)
	ctx := context.Background()

	cases := map[string]struct {
		key, value string
		reason     string
	}{
		"CorruptReport":               {key: "node1.vm-x", value: `not json`, reason: natswire.ReasonDecode},
		"NewerReport":                 {key: "node1.vm-y", value: `{"protocolVersion":2,"uid":"vm-y","node":"node1"}`, reason: natswire.ReasonVersion},
		"ReportForOtherNode":          {key: "node1.vm-z", value: `{"protocolVersion":1,"uid":"vm-z","node":"node2"}`, reason: natswire.ReasonMismatch},
		"CorruptVolumeReport":         {key: "node1.volume.vol-x", value: `not json`, reason: natswire.ReasonDecode},
		"NewerVolumeReport":           {key: "node1.volume.vol-y", value: `{"protocolVersion":2,"uid":"vol-y"}`, reason: natswire.ReasonVersion},
		"VolumeReportForOtherUID":     {key: "node1.volume.vol-z", value: `{"protocolVersion":1,"uid":"vol-other"}`, reason: natswire.ReasonMismatch},
		"GuestReportUnderVolumeKey":   {key: "node1.volume.vol-w", value: `{"protocolVersion":1,"node":"node1"}`, reason: natswire.ReasonKey},
		"CorruptImageReport":          {key: "node1.image.img-x", value: `not json`, reason: natswire.ReasonDecode},
		"NewerImageReport":            {key: "node1.image.img-y", value: `{"protocolVersion":2,"uid":"img-y"}`, reason: natswire.ReasonVersion},
		"ImageReportForOtherUID":      {key: "node1.image.img-z", value: `{"protocolVersion":1,"uid":"img-other","node":"node1","phase":"Ready"}`, reason: natswire.ReasonMismatch},
		"ImageReportOfAnotherNode":    {key: "node1.image.img-n", value: `{"protocolVersion":1,"uid":"img-n","node":"node2","phase":"Ready"}`, reason: natswire.ReasonMismatch},
		"ImageReportWithUnknownPhase": {key: "node1.image.img-p", value: `{"protocolVersion":1,"uid":"img-p","node":"node1","phase":"Pruned"}`, reason: natswire.ReasonDecode},
		"KindTheFleetDoesNotRead":     {key: "node1.archive.snap-a", value: `{"uid":"snap-a","node":"node1"}`, reason: natswire.ReasonKey},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := f.bus.Rejections().Count(tc.reason)
			_, err := f.reports.Put(ctx, tc.key, []byte(tc.value))
			require.NoError(t, err)
			good, err := wire.EncodeReport(wire.Report{UID: "vm-good", Node: "node1", Message: name})
			require.NoError(t, err)
			_, err = f.reports.Put(ctx, "node1.vm-good", good)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				r, ok := f.Guests.Report("node1", "vm-good")
				return ok && r.Report.Message == name
			}, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, before+1, f.bus.Rejections().Count(tc.reason))
		})
	}
	// A key without a node token is refused by the watch too (ReasonKey),
	// but it cannot even be written: no node's reports stream takes it.
	_, err := f.reports.Put(ctx, "vm-q", []byte(`{"protocolVersion":1,"uid":"vm-q","node":"node1"}`))
	require.Error(t, err, "a report key outside every node's prefix")
}
