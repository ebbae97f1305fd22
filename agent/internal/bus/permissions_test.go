package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// A request the server refuses for lack of permission is never answered, so
// every denied request waits this long.
const refusedAfter = 300 * time.Millisecond

func request(nc *nats.Conn, subj string, body any) (*nats.Msg, error) {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	return nc.Request(subj, b, refusedAfter)
}

// apiOK fails unless m is a JetStream API reply without an error.
func apiOK(m *nats.Msg, err error) error {
	if err != nil {
		return err
	}
	var r struct {
		Error *jetstream.APIError `json:"error"`
	}
	if json.Unmarshal(m.Data, &r) == nil && r.Error != nil {
		return r.Error
	}
	if s := m.Header.Get("Status"); s != "" {
		return &jetstream.APIError{Code: 0, Description: s + " " + m.Header.Get("Description")}
	}
	return nil
}

func publishAcked(nc *nats.Conn, subj string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), refusedAfter)
	defer cancel()
	_, err = js.Publish(ctx, subj, []byte(`{}`))
	return err
}

// delivered subscribes sub to subj, publishes on it from pub and fails
// unless the message arrives: a refused subscription or publication is
// never delivered.
func delivered(pub, sub *nats.Conn, subj string) error {
	s, err := sub.SubscribeSync(subj)
	if err != nil {
		return err
	}
	defer func() { _ = s.Unsubscribe() }()
	if err := sub.Flush(); err != nil {
		return err
	}
	if err := pub.Publish(subj, []byte("x")); err != nil {
		return err
	}
	_, err = s.NextMsg(refusedAfter)
	return err
}

func subscribe(nc *nats.Conn, subj string) error {
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		return err
	}
	_, err = sub.NextMsg(refusedAfter)
	return err
}

// TestAgentPermissions is the negative matrix: node1's agent against a real
// nats-server configured exactly as a stock one would be. Each row is one
// attempt; a refused row must fail and, where the refusal is a permission
// check, the server must report the violation.
func TestAgentPermissions(t *testing.T) {
	f := newFleet(t)
	f.putIntent(t, "node1", "vm-a", 1)
	f.putIntent(t, "node2", "vm-b", 1)

	own := wire.Subject(wire.BucketIntents, "node1.>")
	theirs := wire.Subject(wire.BucketIntents, "node2.>")
	hub := f.js.Conn()
	// Console subjects (wire.ConsoleOpenSubject and the session subjects).
	const (
		ownOpen, theirOpen = "virtfleet.console.node1.open", "virtfleet.console.node2.open"
		ownIn, theirIn     = "virtfleet.console.node1.s1.in", "virtfleet.console.node2.s1.in"
		ownOut, theirOut   = "virtfleet.console.node1.s1.out", "virtfleet.console.node2.s1.out"
	)
	consumerOf := func(stream, filter string) map[string]any {
		return map[string]any{"stream_name": stream, "config": map[string]any{
			"filter_subject": filter, "deliver_policy": "last_per_subject", "ack_policy": "none", "deliver_subject": "_INBOX_node1.x",
		}}
	}
	consumer := func(filter string) map[string]any { return consumerOf("KV_intents", filter) }
	ownReports, theirReports := wire.Subject(wire.BucketReports, "node1.>"), wire.Subject(wire.BucketReports, "node2.>")

	cases := map[string]struct {
		op            func(nc *nats.Conn) error
		allowed       bool
		wantViolation bool // the refusal is a permission check, not an API error
	}{
		// What the agent needs.
		"WatchesOwnIntents": {allowed: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.KV_intents.c1."+own, consumer(own)))
		}},
		"GetsOwnIntent": {allowed: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.KV_intents.$KV.intents.node1.vm-a", nil))
		}},
		"ListsOwnReports": {allowed: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.REPORTS_node1.r1."+ownReports, consumerOf("REPORTS_node1", ownReports)))
		}},
		"CannotListOtherNodesReports": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.REPORTS_node2.r2."+theirReports, consumerOf("REPORTS_node2", theirReports)))
		}},
		// The bucket the hub watches sources every node's reports: an agent
		// reads only its own stream.
		"CannotListReportsFromTheBucket": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.KV_reports.r4."+ownReports, consumerOf("KV_reports", ownReports)))
		}},
		"CannotGetReportsFromTheBucket": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.KV_reports.$KV.reports.node1.vm-a", nil))
		}},
		"CannotSmuggleOtherReportsFilterInConsumerBody": {op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.REPORTS_node1.r3."+ownReports, consumerOf("REPORTS_node1", theirReports)))
		}},
		"WritesOwnReport":    {allowed: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.reports.node1.vm-a") }},
		"WritesOwnHeartbeat": {allowed: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.nodes.node1") }},
		// Volume keys sit under the node's prefix: the same grants cover them.
		"WritesOwnVolumeReport": {allowed: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.reports.node1.volume.vol-a") }},
		"CannotWriteOtherNodesVolumeReport": {wantViolation: true, op: func(nc *nats.Conn) error {
			return publishAcked(nc, "$KV.reports.node2.volume.vol-b")
		}},
		// So do image keys.
		"WritesOwnImageReport": {allowed: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.reports.node1.image.img-a") }},
		"GetsOwnImageReport": {allowed: true, op: func(nc *nats.Conn) error {
			if err := publishAcked(nc, "$KV.reports.node1.image.img-b"); err != nil {
				return err
			}
			return apiOK(request(nc, "$JS.API.DIRECT.GET.REPORTS_node1.$KV.reports.node1.image.img-b", nil))
		}},
		"CannotWriteOtherNodesImageReport": {wantViolation: true, op: func(nc *nats.Conn) error {
			return publishAcked(nc, "$KV.reports.node2.image.img-a")
		}},
		"CannotGetOtherNodesImageReport": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.REPORTS_node2.$KV.reports.node2.image.img-a", nil))
		}},
		// And snapshot keys: an agent reports its own snapshots, reads back
		// what it reported before a restart, and touches no other node's.
		"WritesOwnSnapshotReport": {allowed: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.reports.node1.snapshot.snap-a") }},
		"GetsOwnSnapshotReport": {allowed: true, op: func(nc *nats.Conn) error {
			if err := publishAcked(nc, "$KV.reports.node1.snapshot.snap-b"); err != nil {
				return err
			}
			return apiOK(request(nc, "$JS.API.DIRECT.GET.REPORTS_node1.$KV.reports.node1.snapshot.snap-b", nil))
		}},
		"CannotWriteOtherNodesSnapshotReport": {wantViolation: true, op: func(nc *nats.Conn) error {
			return publishAcked(nc, "$KV.reports.node2.snapshot.snap-a")
		}},
		"CannotGetOtherNodesSnapshotReport": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.REPORTS_node2.$KV.reports.node2.snapshot.snap-a", nil))
		}},
		"CannotWriteOwnSnapshotIntent": {wantViolation: true, op: func(nc *nats.Conn) error {
			return publishAcked(nc, "$KV.intents.node1.snapshot.snap-a")
		}},
		"CannotGetOtherNodesSnapshotIntent": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.KV_intents.$KV.intents.node2.snapshot.snap-b", nil))
		}},
		"CannotWriteAnImageIntent": {wantViolation: true, op: func(nc *nats.Conn) error {
			return publishAcked(nc, "$KV.intents.node1.image.img-a")
		}},
		"CannotWriteOwnVolumeIntent": {wantViolation: true, op: func(nc *nats.Conn) error {
			return publishAcked(nc, "$KV.intents.node1.volume.vol-a")
		}},
		"CannotGetOtherNodesVolumeIntent": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.KV_intents.$KV.intents.node2.volume.vol-b", nil))
		}},

		// Reading another node's intents.
		"CannotGetOtherNodesIntent": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.KV_intents.$KV.intents.node2.vm-b", nil))
		}},
		"CannotWatchOtherNodesIntents": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.KV_intents.c2."+theirs, consumer(theirs)))
		}},
		"CannotSmuggleOtherFilterInConsumerBody": {op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.KV_intents.c3."+own, consumer(theirs)))
		}},
		"CannotSmuggleOtherFiltersInConsumerBody": {op: func(nc *nats.Conn) error {
			c := consumer("")
			cfg := c["config"].(map[string]any)
			delete(cfg, "filter_subject")
			cfg["filter_subjects"] = []string{own, theirs}
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.KV_intents.c4."+own, c))
		}},
		"CannotBatchGetOtherNodesKeysThroughOwnSubject": {op: func(nc *nats.Conn) error {
			m, err := request(nc, "$JS.API.DIRECT.GET.KV_intents.$KV.intents.node1.vm-a", map[string]any{"multi_last": []string{theirs}})
			if err != nil {
				return err
			}
			if strings.Contains(m.Header.Get("Nats-Subject"), "node2") {
				return nil // leaked: the row fails because nothing was refused
			}
			return errors.New("answered without another node's key")
		}},
		"CannotCreateUnfilteredConsumer": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.CREATE.KV_intents", consumer(theirs)))
		}},
		"CannotCreateDurableConsumer": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.DURABLE.CREATE.KV_intents.d", consumer(theirs)))
		}},
		"CannotDirectGetBySequence": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.DIRECT.GET.KV_intents", map[string]any{"seq": 2}))
		}},
		"CannotGetMessageBySequence": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.MSG.GET.KV_intents", map[string]any{"seq": 2}))
		}},
		"CannotListKeysThroughStreamInfo": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.INFO.KV_intents", map[string]any{"subjects_filter": ">"}))
		}},
		"CannotListConsumers": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.CONSUMER.NAMES.KV_intents", nil))
		}},
		"CannotSniffIntentPublishes": {wantViolation: true, op: func(nc *nats.Conn) error { return subscribe(nc, theirs) }},
		"CannotListenOnOtherAgentsInbox": {wantViolation: true, op: func(nc *nats.Conn) error {
			return subscribe(nc, natswire.InboxPrefix("node2")+".>")
		}},
		"CannotListenOnSharedInbox": {wantViolation: true, op: func(nc *nats.Conn) error { return subscribe(nc, "_INBOX.>") }},

		// Writing what is not its own.
		"CannotWriteOtherNodesReport":    {wantViolation: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.reports.node2.vm-b") }},
		"CannotWriteOtherNodesHeartbeat": {wantViolation: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.nodes.node2") }},
		"CannotWriteOwnIntent":           {wantViolation: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.intents.node1.vm-a") }},
		"CannotWriteOtherNodesIntent":    {wantViolation: true, op: func(nc *nats.Conn) error { return publishAcked(nc, "$KV.intents.node2.vm-b") }},

		// Consoles: the agent serves its own node's sessions, which only the
		// hub opens, and sees nothing of another node's.
		"ReceivesOwnConsoleOpens":     {allowed: true, op: func(nc *nats.Conn) error { return delivered(hub, nc, ownOpen) }},
		"ReadsOwnConsoleInput":        {allowed: true, op: func(nc *nats.Conn) error { return delivered(hub, nc, ownIn) }},
		"WritesOwnConsoleOutput":      {allowed: true, op: func(nc *nats.Conn) error { return delivered(nc, hub, ownOut) }},
		"CannotOpenOwnConsole":        {wantViolation: true, op: func(nc *nats.Conn) error { return delivered(nc, hub, ownOpen) }},
		"CannotOpenOtherNodesConsole": {wantViolation: true, op: func(nc *nats.Conn) error { return delivered(nc, hub, theirOpen) }},
		"CannotReceiveOtherNodesConsoleOpens": {wantViolation: true, op: func(nc *nats.Conn) error {
			return delivered(hub, nc, theirOpen)
		}},
		"CannotReadOtherNodesConsoleInput":   {wantViolation: true, op: func(nc *nats.Conn) error { return delivered(hub, nc, theirIn) }},
		"CannotReadOtherNodesConsoleOutput":  {wantViolation: true, op: func(nc *nats.Conn) error { return delivered(hub, nc, theirOut) }},
		"CannotForgeOtherNodesConsoleOutput": {wantViolation: true, op: func(nc *nats.Conn) error { return delivered(nc, hub, theirOut) }},
		"CannotWriteOtherNodesConsoleInput":  {wantViolation: true, op: func(nc *nats.Conn) error { return delivered(nc, hub, theirIn) }},
		"CannotWriteConsoleInput":            {wantViolation: true, op: func(nc *nats.Conn) error { return delivered(nc, hub, ownIn) }},
		"CannotListenToEveryConsole": {wantViolation: true, op: func(nc *nats.Conn) error {
			return delivered(hub, nc, "virtfleet.console.>")
		}},
		"CannotListenToEveryNodesConsoleOpens": {wantViolation: true, op: func(nc *nats.Conn) error {
			return delivered(hub, nc, "virtfleet.console.*.open")
		}},
		"CannotPublishOnTheHubsInbox": {wantViolation: true, op: func(nc *nats.Conn) error {
			return delivered(nc, hub, natswire.InboxPrefix(natswire.HubName)+".x")
		}},

		// Administering JetStream.
		"CannotDeleteBucket": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.DELETE.KV_intents", nil))
		}},
		"CannotPurgeBucket": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.PURGE.KV_nodes", nil))
		}},
		"CannotPurgeOwnKeys": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.PURGE.REPORTS_node1", map[string]any{"filter": "$KV.reports.node1.>"}))
		}},
		"CannotCreateStream": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.CREATE.KV_evil", map[string]any{"name": "KV_evil", "subjects": []string{"$KV.intents.>"}}))
		}},
		"CannotUpdateStream": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.UPDATE.KV_intents", map[string]any{"name": "KV_intents"}))
		}},
		"CannotDeleteStreamMessage": {wantViolation: true, op: func(nc *nats.Conn) error {
			return apiOK(request(nc, "$JS.API.STREAM.MSG.DELETE.KV_intents", map[string]any{"seq": 2}))
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			nc, async := natstest.Connect(t, f.srv, f.agents["node1"])
			err := tc.op(nc)
			if tc.allowed {
				require.NoError(t, err)
				assert.False(t, async.WaitForViolation(50*time.Millisecond), "an allowed operation must not cause a violation")
				return
			}
			require.Error(t, err, "the operation must be refused")
			t.Logf("refused: %v", err)
			if tc.wantViolation {
				assert.True(t, async.WaitForViolation(time.Second), "the server must report a permissions violation")
			}
		})
	}
}

// TestAgentCannotActAsAnotherAgent covers "reading another agent's
// credentials": credentials never travel over NATS (the server knows only
// public keys), so the remaining attack is claiming another agent's public
// key without its seed.
func TestAgentCannotActAsAnotherAgent(t *testing.T) {
	f := newFleet(t)
	own, err := nkeys.FromSeed(f.agents["node1"].Seed)
	require.NoError(t, err)
	nc, err := nats.Connect(f.srv.URL(), nats.Nkey(f.agents["node2"].PublicKey, own.Sign))
	if nc != nil {
		nc.Close()
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Authorization Violation")
}

// TestHubConsolePermissions: the hub opens any node's console sessions,
// sends their input and reads their output.
func TestHubConsolePermissions(t *testing.T) {
	f := newFleet(t)
	hub := f.js.Conn()
	cases := map[string]struct {
		node    string
		subject string
		// fromHub: the hub publishes and the node's agent receives;
		// otherwise the agent publishes and the hub receives.
		fromHub bool
	}{
		"OpensNode1sConsole":       {node: "node1", subject: "virtfleet.console.node1.open", fromHub: true},
		"OpensNode2sConsole":       {node: "node2", subject: "virtfleet.console.node2.open", fromHub: true},
		"SendsInputToNode2":        {node: "node2", subject: "virtfleet.console.node2.s1.in", fromHub: true},
		"ReadsOutputOfNode2":       {node: "node2", subject: "virtfleet.console.node2.s1.out"},
		"ReadsEveryNodesOutputToo": {node: "node1", subject: "virtfleet.console.*.*.out"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			agent, agentAsync := natstest.Connect(t, f.srv, f.agents[tc.node])
			if tc.fromHub {
				require.NoError(t, delivered(hub, agent, tc.subject))
			} else {
				// The agent publishes on its own subject; the hub may
				// listen with wildcards.
				s, err := hub.SubscribeSync(tc.subject)
				require.NoError(t, err)
				defer func() { _ = s.Unsubscribe() }()
				require.NoError(t, hub.Flush())
				require.NoError(t, agent.Publish("virtfleet.console."+tc.node+".s1.out", []byte("x")))
				_, err = s.NextMsg(time.Second)
				require.NoError(t, err)
			}
			assert.False(t, agentAsync.WaitForViolation(50*time.Millisecond), "neither side may cause a violation")
		})
	}
}

// TestANodeCannotRemoveAnotherNodesKeys plays a stolen node credential
// against the shared buckets a node writes, the reports and the
// heartbeats, through the headers of its own permitted writes, which no
// subject permission sees. The attacker holds node1's seed and publishes to
// node1's own key with "Nats-Rollup: all" (which would purge every message
// of the stream: every node's reports, or every node's heartbeat, so that
// the hub would stop hearing from the others), and with "Nats-Rollup: sub"
// alone and with KV's purge marker (each of which would purge that one
// key). Each is refused, and node2's key and node1's own earlier one
// survive.
func TestANodeCannotRemoveAnotherNodesKeys(t *testing.T) {
	ctx := context.Background()
	headers := map[string]nats.Header{
		"RollupOfTheWholeBucket": {jetstream.MsgRollup: []string{jetstream.MsgRollupAll}},
		"RollupOfItsOwnKey":      {jetstream.MsgRollup: []string{jetstream.MsgRollupSubject}},
		"PurgeMarkerOfItsOwnKey": {"KV-Operation": []string{"PURGE"}, jetstream.MsgRollup: []string{jetstream.MsgRollupSubject}},
	}
	buckets := map[string]struct {
		bucket string
		// theirs is node2's key, ours node1's earlier one, and target the
		// key node1 writes with the headers.
		theirs, ours, target string
		keys                 func(t *testing.T, f *fleet) keys
	}{
		"Reports": {bucket: wire.BucketReports, theirs: "node2.vm-b", ours: "node1.vm-old", target: "node1.vm-a",
			keys: func(_ *testing.T, f *fleet) keys { return reportKeys{f.reports} }},
		"Heartbeats": {bucket: wire.BucketNodes, theirs: "node2", ours: "node1", target: "node1",
			keys: func(t *testing.T, f *fleet) keys {
				kv, err := f.js.KeyValue(ctx, wire.BucketNodes)
				require.NoError(t, err)
				return kvKeys{kv}
			}},
	}
	for bucketName, b := range buckets {
		for name, hdr := range headers {
			t.Run(bucketName+"/"+name, func(t *testing.T) {
				f := newFleet(t)
				keys := b.keys(t, f)
				theirs, err := keys.Put(ctx, b.theirs, []byte(`{"uid":"theirs"}`))
				require.NoError(t, err)
				ours, err := keys.Put(ctx, b.ours, []byte(`{"uid":"ours"}`))
				require.NoError(t, err)

				nc, _ := natstest.Connect(t, f.srv, f.agents["node1"])
				js, err := jetstream.New(nc)
				require.NoError(t, err)
				_, err = js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(b.bucket, b.target), Data: []byte(`{}`), Header: hdr})
				require.Error(t, err, "the bucket must refuse a roll-up")
				t.Logf("refused: %v", err)

				rev, err := keys.Revision(ctx, b.theirs)
				require.NoError(t, err, "another node's key is gone")
				assert.Equal(t, theirs, rev)
				rev, err = keys.Revision(ctx, b.ours)
				require.NoError(t, err, "the node's own earlier key is gone")
				assert.Equal(t, ours, rev)
			})
		}
	}
}

// keys writes a bucket's keys and reads their revisions.
type keys interface {
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Revision(ctx context.Context, key string) (uint64, error)
}

type reportKeys struct{ nodeReports }

func (r reportKeys) Revision(ctx context.Context, key string) (uint64, error) {
	e, err := r.Get(ctx, key)
	return e.Revision(), err
}

type kvKeys struct{ jetstream.KeyValue }

func (k kvKeys) Revision(ctx context.Context, key string) (uint64, error) {
	e, err := k.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	return e.Revision(), nil
}

// TestANodeCannotFillTheReportsBucket plays a stolen node credential
// against the reports bucket every node shares. The attacker holds node1's
// seed and publishes new report keys under node1's own prefix, which its
// permissions allow, as fast as the server acks them: with small values
// until the node's bound in keys, with large ones until its bound in bytes.
// Its writes past the bound are refused, the keys it holds still take new
// values, and node2's agent still writes new reports, which reach the
// bucket the hub watches.
func TestANodeCannotFillTheReportsBucket(t *testing.T) {
	ctx := context.Background()
	const keys, bytes = 64, 64 << 10
	cases := map[string]struct {
		value    int
		maxTaken int // the bound the attacker meets first
	}{
		"NewKeysUntilTheKeyBound":      {value: 16, maxTaken: keys},
		"LargeValuesUntilTheByteBound": {value: 8 << 10, maxTaken: bytes / (8 << 10)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv, js, agents := natstest.NewFleet(t, natswire.BucketConfig{NodeReportKeys: keys, NodeReportBytes: bytes}, "node1", "node2")
			bucket, err := js.KeyValue(ctx, wire.BucketReports)
			require.NoError(t, err)

			nc, _ := natstest.Connect(t, srv, agents["node1"])
			attacker, err := jetstream.New(nc)
			require.NoError(t, err)
			junk := []byte(strings.Repeat("x", tc.value))
			taken := 0
			for ; taken <= 2*keys; taken++ {
				if _, err = attacker.Publish(ctx, fmt.Sprintf("$KV.reports.node1.junk-%d", taken), junk); err != nil {
					break
				}
			}
			require.Error(t, err, "the node's reports must be bounded")
			t.Logf("refused after %d keys: %v", taken, err)
			assert.LessOrEqual(t, taken, tc.maxTaken, "the node holds no more than its bound")
			_, err = attacker.Publish(ctx, "$KV.reports.node1.junk-0", []byte("{}"))
			require.NoError(t, err, "a key the node holds takes a new value at its bound")

			node2, _, _ := (&fleet{srv: srv, agents: agents}).agent(t, "node2")
			for _, uid := range []string{"vm-b", "vm-c"} {
				_, err = putReport(node2, wire.Report{UID: uid, Node: "node2", Phase: wire.PhaseRunning})
				require.NoError(t, err, "another node's reports are taken")
				require.Eventually(t, func() bool {
					_, err := bucket.Get(ctx, "node2."+uid)
					return err == nil
				}, 5*time.Second, 10*time.Millisecond, "another node's report reaches the bucket the hub watches")
			}
		})
	}
}

// TestAnAgentIsToldItsReportsAreAtTheirBound: the agent's own bus names
// the refusal, so what it logs says why.
func TestAnAgentIsToldItsReportsAreAtTheirBound(t *testing.T) {
	srv, _, agents := natstest.NewFleet(t, natswire.BucketConfig{NodeReportKeys: 2}, "node1")
	b, _, _ := (&fleet{srv: srv, agents: agents}).agent(t, "node1")
	for _, uid := range []string{"vm-a", "vm-b"} {
		_, err := putReport(b, wire.Report{UID: uid, Node: "node1"})
		require.NoError(t, err)
	}
	_, err := putReport(b, wire.Report{UID: "vm-c", Node: "node1"})
	var bound *bus.BoundError
	require.ErrorAs(t, err, &bound)
	assert.Equal(t, "node1.vm-c", bound.Key)
	_, err = putReport(b, wire.Report{UID: "vm-a", Node: "node1", Phase: wire.PhaseRunning})
	require.NoError(t, err, "a report the node holds is still updated")
}
