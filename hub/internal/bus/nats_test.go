package bus_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

const testNodeTTL = 3 * time.Second

func newHub(t *testing.T) (*bus.NATS, jetstream.JetStream, *natstest.Server, map[string]natswire.Identity) {
	t.Helper()
	return newHubWith(t, bus.Config{})
}

// newHubWith is newHub with cfg, its buckets' TTL and retry as newHub's.
func newHubWith(t *testing.T, cfg bus.Config) (*bus.NATS, jetstream.JetStream, *natstest.Server, map[string]natswire.Identity) {
	t.Helper()
	hub, agents, users := natstest.Identities(t, "node1", "node2")
	srv := natstest.New(t, users...)
	nc, _ := natstest.Connect(t, srv, hub)
	cfg.Buckets.NodeTTL, cfg.RetryInterval = testNodeTTL, 100*time.Millisecond
	b, err := bus.New(context.Background(), nc, cfg)
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	// As the hub does at node1's first heartbeat, which these tests'
	// node1 may never send.
	require.NoError(t, natswire.EnsureNodeReports(context.Background(), js, natswire.BucketConfig{}, "node1"))
	return b, js, srv, agents
}

// asAgent is the JetStream of node's agent, with its credentials, and the
// bytes of a heartbeat of node, for a test to publish what the agent would.
func asAgent(t *testing.T, srv *natstest.Server, agents map[string]natswire.Identity, node string) (jetstream.JetStream, []byte) {
	t.Helper()
	nc, _ := natstest.Connect(t, srv, agents[node])
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	hb, err := wire.EncodeNodeHeartbeat(wire.NodeHeartbeat{Node: node, Backend: "libvirt"})
	require.NoError(t, err)
	return js, hb
}

// reportingAgent connects as node's agent and returns what puts its
// heartbeat and what puts its report of uid (the server's answer).
func reportingAgent(t *testing.T, srv *natstest.Server, agents map[string]natswire.Identity, node string) (heartbeat func(), report func(uid string) error) {
	t.Helper()
	js, hb := asAgent(t, srv, agents, node)
	heartbeat = func() {
		_, err := js.Publish(context.Background(), "$KV.nodes."+node, hb)
		require.NoError(t, err)
	}
	report = func(uid string) error {
		r, err := wire.EncodeReport(wire.Report{UID: uid, Node: node})
		require.NoError(t, err)
		_, err = js.Publish(context.Background(), "$KV.reports."+node+"."+uid, r)
		return err
	}
	return heartbeat, report
}

func collect[E any](t *testing.T, watch func(context.Context, func(E)) error) <-chan E {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan E, 1024)
	done := make(chan struct{})
	go func() { defer close(done); _ = watch(ctx, func(e E) { ch <- e }) }()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

func next[E any](t *testing.T, ch <-chan E, d time.Duration, ok func(E) bool) E {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case e := <-ch:
			if ok(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no matching event within %s", d)
		}
	}
}

// watch collects the entries of b's watch of bucket until the test ends;
// refuse, if set, says which to refuse and why.
func watch(t *testing.T, b bus.Bus, bucket string, refuse func(bus.Entry) error) <-chan bus.Entry {
	t.Helper()
	return collect(t, func(ctx context.Context, fn func(bus.Entry)) error {
		return b.Watch(ctx, bucket, func(e bus.Entry) error {
			if refuse != nil {
				if err := refuse(e); err != nil {
					return err
				}
			}
			fn(e)
			return nil
		})
	})
}

func TestPut(t *testing.T) {
	b, _, _, _ := newHub(t)
	ctx := context.Background()
	in := wire.Intent{UID: "vm-a", Name: "a", Generation: 1, Running: true}

	rev1, err := bus.Put(ctx, b, wire.GuestIntents, "node1", in.UID, in)
	require.NoError(t, err)
	rev2, err := bus.Put(ctx, b, wire.GuestIntents, "node1", in.UID, in)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same intent must not write")

	in.Generation = 2
	rev3, err := bus.Put(ctx, b, wire.GuestIntents, "node1", in.UID, in)
	require.NoError(t, err)
	assert.Greater(t, rev3, rev2)

	require.NoError(t, bus.Delete(ctx, b, wire.GuestIntents, "node1", "vm-a"))
	require.NoError(t, bus.Delete(ctx, b, wire.GuestIntents, "node1", "vm-a"), "deleting an absent intent succeeds")
	_, err = bus.Put(ctx, b, wire.GuestIntents, "node1", in.UID, in)
	require.NoError(t, err, "an intent can be recreated after a delete")

	var ke *wire.KeyError
	_, err = bus.Put(ctx, b, wire.GuestIntents, "", in.UID, in)
	assert.ErrorAs(t, err, &ke, "a node that is no key token")
	assert.ErrorAs(t, bus.Delete(ctx, b, wire.GuestIntents, "node1", "a.b"), &ke, "a uid that is no key token")
	var me *wire.MismatchError
	_, err = bus.Put(ctx, b, wire.GuestIntents, "node1", "vm-b", in)
	assert.ErrorAs(t, err, &me, "an intent under another guest's key")
}

// TestPutKeysEachKind pins where each kind's values go: under
// <node>.<token>.<uid>, apart from the node's other keys.
func TestPutKeysEachKind(t *testing.T) {
	b, js, _, _ := newHub(t)
	ctx := context.Background()
	intents, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)
	v := wire.VolumeIntent{UID: "vol-a", Namespace: "ns", Name: "a", Disk: "ns_a", Absent: true}

	_, err = bus.Put(ctx, b, wire.VolumeIntents, "node1", v.UID, v)
	require.NoError(t, err)
	e, err := intents.Get(ctx, "node1.volume.vol-a")
	require.NoError(t, err, "the volume intent lives under <node>.volume.<uid>")
	got, err := wire.DecodeVolumeIntent(e.Value())
	require.NoError(t, err)
	assert.Equal(t, "ns_a", got.Disk)
	_, err = intents.Get(ctx, "node1.vol-a")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a volume intent is not a guest intent")

	_, err = bus.Put(ctx, b, wire.Fabrics, "node1", wire.FabricUID, wire.Fabric{Peers: []string{"192.0.2.1"}})
	require.NoError(t, err)
	_, err = intents.Get(ctx, "node1.fabric.peers")
	require.NoError(t, err, "the fabric lives under <node>.fabric.peers")

	require.NoError(t, bus.Delete(ctx, b, wire.VolumeIntents, "node1", "vol-a"))
	_, err = intents.Get(ctx, "node1.volume.vol-a")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound)

	v.Absent = false
	_, err = bus.Put(ctx, b, wire.VolumeIntents, "node1", v.UID, v)
	var de *wire.DecodeError
	assert.ErrorAs(t, err, &de, "a value its kind refuses is not sent")
}

// TestALostNodeIsSeenATTLAfterItsLastHeartbeat pins the expiry the hub's
// node-loss handling relies on: a node that stores no heartbeat for the
// bucket's TTL is passed on as lost about one TTL after its last one.
func TestALostNodeIsSeenATTLAfterItsLastHeartbeat(t *testing.T) {
	b, _, srv, agents := newHub(t)
	events := collect(t, b.WatchNodes)
	js, hb := asAgent(t, srv, agents, "node1")

	_, err := js.Publish(context.Background(), "$KV.nodes.node1", hb)
	require.NoError(t, err)
	lastPut := time.Now()
	next(t, events, 5*time.Second, func(e bus.NodeEvent) bool { return !e.Lost && e.Node == "node1" })

	next(t, events, 3*testNodeTTL, func(e bus.NodeEvent) bool { return e.Lost && e.Node == "node1" })
	assert.InDelta(t, testNodeTTL.Seconds(), time.Since(lastPut).Seconds(), 1.5, "the loss should follow the last put by about one TTL")
}

// TestALaggingWatchTakesNoLiveNodeForLost: the hub's watch of the
// heartbeats stops delivering for longer than a TTL (its consumer is lost
// again and again, as when the servers holding it are killed one after
// another) while the node goes on storing heartbeats. The node is never
// passed on as lost, for the bucket holds newer heartbeats than the watch
// delivered; once it stops, it is.
func TestALaggingWatchTakesNoLiveNodeForLost(t *testing.T) {
	b, js, srv, agents := newHub(t)
	events := collect(t, b.WatchNodes)
	heartbeat, _ := reportingAgent(t, srv, agents, "node2")
	heartbeat()
	next(t, events, 5*time.Second, func(e bus.NodeEvent) bool { return !e.Lost && e.Node == "node2" })

	ctx := context.Background()
	stream, err := js.Stream(ctx, wire.Stream(wire.BucketNodes))
	require.NoError(t, err)
	beat := time.NewTicker(300 * time.Millisecond)
	defer beat.Stop()
	cut := time.NewTicker(50 * time.Millisecond)
	defer cut.Stop()
	for end := time.After(3 * testNodeTTL); ; {
		select {
		case <-beat.C:
			heartbeat()
			continue
		case <-cut.C:
			for c := range stream.ListConsumers(ctx).Info() {
				_ = stream.DeleteConsumer(ctx, c.Name) // the watch may be making it anew
			}
			continue
		case e := <-events:
			require.False(t, e.Lost, "node %s passed on as lost while it stores heartbeats", e.Node)
			continue
		case <-end:
		}
		break
	}

	lastPut := time.Now()
	next(t, events, 3*testNodeTTL, func(e bus.NodeEvent) bool { return e.Lost && e.Node == "node2" })
	t.Logf("lost %s after its last heartbeat", time.Since(lastPut).Round(100*time.Millisecond))
}

// TestANodesFirstHeartbeatMakesRoomForItsReports: a node the hub never
// heard from has nowhere to report to; its first heartbeat gives it its own
// reports stream before the hub's fleet hears of the node, and what it
// reports then reaches the bucket the hub watches.
func TestANodesFirstHeartbeatMakesRoomForItsReports(t *testing.T) {
	b, _, srv, agents := newHub(t)
	events := collect(t, b.WatchNodes)
	entries := watch(t, b, wire.BucketReports, nil)
	js, hb := asAgent(t, srv, agents, "node2")
	ctx := context.Background()
	report, err := wire.EncodeReport(wire.Report{UID: "vm-a", Node: "node2"})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "$KV.reports.node2.vm-a", report)
	require.Error(t, err, "no stream takes the reports of a node never heard from")

	_, err = js.Publish(ctx, "$KV.nodes.node2", hb)
	require.NoError(t, err)
	next(t, events, 5*time.Second, func(e bus.NodeEvent) bool { return !e.Lost && e.Node == "node2" })
	_, err = js.Publish(ctx, "$KV.reports.node2.vm-a", report)
	require.NoError(t, err, "the node's reports are taken once the hub heard from it")
	got := next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node2.vm-a" })
	assert.Equal(t, report, got.Value)
}

// TestADroppedNodeIsTakenAfresh: a node removed for good (its keys deleted,
// then DropNode) leaves no reports stream, so its reports are refused; if
// it is heard from again, its next heartbeat makes the stream afresh and
// its reports reach the bucket, without waiting for the hub's periodic
// check of the streams.
func TestADroppedNodeIsTakenAfresh(t *testing.T) {
	b, hubJS, srv, agents := newHubWith(t, bus.Config{})
	events := collect(t, b.WatchNodes)
	entries := watch(t, b, wire.BucketReports, nil)
	heartbeat, report := reportingAgent(t, srv, agents, "node2")
	ctx := context.Background()

	heartbeat()
	next(t, events, 5*time.Second, func(e bus.NodeEvent) bool { return !e.Lost && e.Node == "node2" })
	require.NoError(t, report("vm-a"))
	next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node2.vm-a" && !e.Deleted })
	require.NoError(t, b.Delete(ctx, wire.BucketReports, "node2.vm-a"))
	next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node2.vm-a" && e.Deleted })

	require.NoError(t, b.DropNode(ctx, "node2"))
	_, err := hubJS.Stream(ctx, natswire.NodeReportsStream(wire.NodeToken("node2")))
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	require.Error(t, report("vm-b"), "no stream takes a dropped node's reports")

	heartbeat()
	require.Eventually(t, func() bool { return report("vm-c") == nil }, 10*time.Second, 100*time.Millisecond, "the node heard from again reports again")
	next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node2.vm-c" && !e.Deleted })
}

// TestALostReportsStreamIsMadeAgain: a node's reports stream lost behind
// the hub's back after the hub made it (deleted, or no longer sourced by
// the bucket) is made again at one of the node's heartbeats once the
// hub's check of it is due, and the node's reports reach the bucket again
// without a hub restart.
func TestALostReportsStreamIsMadeAgain(t *testing.T) {
	stream := natswire.NodeReportsStream(wire.NodeToken("node2"))
	cases := map[string]func(t *testing.T, js jetstream.JetStream){
		"StreamDeleted": func(t *testing.T, js jetstream.JetStream) {
			require.NoError(t, js.DeleteStream(context.Background(), stream))
		},
		"NoLongerSourced": func(t *testing.T, js jetstream.JetStream) {
			s, err := js.Stream(context.Background(), wire.Stream(wire.BucketReports))
			require.NoError(t, err)
			c := s.CachedInfo().Config
			c.Sources = slices.DeleteFunc(c.Sources, func(src *jetstream.StreamSource) bool { return src.Name == stream })
			_, err = js.UpdateStream(context.Background(), c)
			require.NoError(t, err)
		},
	}
	for name, lose := range cases {
		t.Run(name, func(t *testing.T) {
			b, hubJS, srv, agents := newHubWith(t, bus.Config{ReportingRecheck: 200 * time.Millisecond})
			events := collect(t, b.WatchNodes)
			entries := watch(t, b, wire.BucketReports, nil)
			heartbeat, report := reportingAgent(t, srv, agents, "node2")

			heartbeat()
			next(t, events, 5*time.Second, func(e bus.NodeEvent) bool { return !e.Lost && e.Node == "node2" })
			// Several reports, so that the lost stream had got further
			// than the one made again will have when the node reports.
			for _, uid := range []string{"vm-a", "vm-b", "vm-c"} {
				require.NoError(t, report(uid))
			}
			next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node2.vm-c" })

			lose(t, hubJS)

			// The node heartbeats on and reports anew until one of its
			// new reports reaches the hub.
			var sent []string
			reached := func() bool {
				for {
					select {
					case e := <-entries:
						if slices.Contains(sent, e.Key) {
							return true
						}
					default:
						return false
					}
				}
			}
			require.Eventually(t, func() bool {
				if reached() {
					return true
				}
				heartbeat()
				uid := fmt.Sprintf("vm-new-%d", len(sent))
				if report(uid) == nil {
					sent = append(sent, "node2."+uid)
				}
				return false
			}, 10*time.Second, 100*time.Millisecond, "the node's reports reach the bucket again")
		})
	}
}

// TestWatchCountsRefusedEntriesAndCarriesOn: an entry the watch's handler
// refuses is counted by the reason of the handler's error, and the entries
// after it are delivered.
func TestWatchCountsRefusedEntriesAndCarriesOn(t *testing.T) {
	b, js, _, _ := newHub(t)
	refusals := map[string]error{
		"node1.decode":   &wire.DecodeError{Kind: "report", Err: assert.AnError},
		"node1.version":  &wire.VersionError{Got: 2},
		"node1.mismatch": &wire.MismatchError{Key: "node1.mismatch"},
		"node1.key":      &wire.KeyError{What: "key", Value: "node1.key"},
	}
	entries := watch(t, b, wire.BucketReports, func(e bus.Entry) error { return refusals[e.Key] })
	ctx := context.Background()
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)

	for key, refusal := range refusals {
		t.Run(key, func(t *testing.T) {
			reason := natswire.Reason(refusal)
			before := b.Rejections().Count(reason)
			_, err := reports.Put(ctx, key, []byte("refused"))
			require.NoError(t, err)
			_, err = reports.Put(ctx, "node1.good", []byte(key))
			require.NoError(t, err)
			e := next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node1.good" && string(e.Value) == key })
			assert.False(t, e.Deleted)
			assert.Equal(t, before+1, b.Rejections().Count(reason))
		})
	}
}

func TestWatchResumesAfterServerRestart(t *testing.T) {
	b, js, srv, _ := newHub(t)
	entries := watch(t, b, wire.BucketReports, nil)
	ctx := context.Background()
	put := func(uid string) {
		v, err := wire.EncodeReport(wire.Report{UID: uid, Node: "node1"})
		require.NoError(t, err)
		kv, err := js.KeyValue(ctx, wire.BucketReports)
		require.NoError(t, err)
		_, err = kv.Put(ctx, "node1."+uid, v)
		require.NoError(t, err)
	}
	put("before")
	next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node1.before" })

	srv.Shutdown()
	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool { _, err := js.AccountInfo(ctx); return err == nil }, 10*time.Second, 50*time.Millisecond)
	put("after")
	next(t, entries, 10*time.Second, func(e bus.Entry) bool { return e.Key == "node1.after" })
}

// TestWatchResumesAfterItsConsumerIsLost: when the server holding a
// watch's consumer goes and the hub's connection stays (in a cluster,
// another server's stream leader is killed), the watch finds itself behind
// its bucket and resumes within seconds, not once nats.go misses its
// consumer's heartbeats.
func TestWatchResumesAfterItsConsumerIsLost(t *testing.T) {
	b, js, _, _ := newHub(t)
	entries := watch(t, b, wire.BucketReports, nil)
	next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Synced })
	natstest.DeleteConsumers(t, js, wire.Stream(wire.BucketReports))
	ctx := context.Background()

	v, err := wire.EncodeReport(wire.Report{UID: "after", Node: "node1"})
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	start := time.Now()
	_, err = kv.Put(ctx, "node1.after", v)
	require.NoError(t, err)
	next(t, entries, 7*time.Second, func(e bus.Entry) bool { return e.Key == "node1.after" })
	t.Logf("delivered %s after the consumer was lost", time.Since(start).Round(100*time.Millisecond))
}

// swallowingDialer dials the server for real; once swallow is set, what the
// client writes is dropped while the connection stays up: requests are sent
// and none is answered, as with a request in flight when the server dies.
// Each dropped write is signalled on swallowed.
type swallowingDialer struct {
	net.Dialer
	swallow   atomic.Bool
	swallowed chan struct{}
	last      atomic.Pointer[swallowingConn]
}

func (d *swallowingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.Dialer.Dial(network, address)
	if err != nil {
		return nil, err
	}
	sc := &swallowingConn{Conn: c, d: d}
	d.last.Store(sc)
	return sc, nil
}

type swallowingConn struct {
	net.Conn
	d *swallowingDialer
}

func (c *swallowingConn) Write(p []byte) (int, error) {
	if !c.d.swallow.Load() {
		return c.Conn.Write(p)
	}
	select {
	case c.d.swallowed <- struct{}{}:
	default:
	}
	return len(p), nil
}

// swallowingBus is a bus over its own connection to srv through a
// swallowingDialer, with a vm-a intent already written.
func swallowingBus(t *testing.T, srv *natstest.Server, hub natswire.Identity, timeout time.Duration) (*bus.NATS, *swallowingDialer) {
	t.Helper()
	opts, err := hub.ConnectOptions()
	require.NoError(t, err)
	dialer := &swallowingDialer{swallowed: make(chan struct{}, 1)}
	nc, err := nats.Connect(srv.URL(), append(opts, nats.SetCustomDialer(dialer), nats.MaxReconnects(-1))...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	b, err := bus.New(context.Background(), nc, bus.Config{Timeout: timeout})
	require.NoError(t, err)
	_, err = bus.Put(context.Background(), b, wire.GuestIntents, "node1", "vm-a", wire.Intent{UID: "vm-a", Name: "a", Generation: 1})
	require.NoError(t, err, "the bus works before the server stops answering")
	dialer.swallow.Store(true)
	return b, dialer
}

// TestAWriteTheServerNeverAnswersFails: a write or delete whose request is
// lost fails as soon as the connection is known to be lost, or else after
// the bus's timeout, even when the caller's deadline is a minute away (the
// managed reconciler's). JetStream bounds a request by its own 5 s only when
// the context has no deadline.
func TestAWriteTheServerNeverAnswersFails(t *testing.T) {
	hub, _, users := natstest.Identities(t, "node1")
	srv := natstest.New(t, users...)
	ops := map[string]func(context.Context, *bus.NATS) error{
		"Put": func(ctx context.Context, b *bus.NATS) error {
			_, err := b.Put(ctx, wire.BucketIntents, "node1.vm-a", []byte("changed"))
			return err
		},
		"Delete": func(ctx context.Context, b *bus.NATS) error { return b.Delete(ctx, wire.BucketIntents, "node1.vm-a") },
	}
	const guard = 10 * time.Second
	ways := map[string]struct {
		timeout time.Duration
		// whileWaiting runs once the request is on the wire.
		whileWaiting func(d *swallowingDialer)
		want         error
	}{
		"TheConnectionIsLost":      {timeout: time.Minute, whileWaiting: func(d *swallowingDialer) { _ = d.last.Load().Conn.Close() }, want: context.Canceled},
		"NoAnswerWithinTheTimeout": {timeout: 200 * time.Millisecond, whileWaiting: func(*swallowingDialer) {}, want: context.DeadlineExceeded},
	}
	for way, w := range ways {
		for name, op := range ops {
			t.Run(way+"/"+name, func(t *testing.T) {
				b, dialer := swallowingBus(t, srv, hub, w.timeout)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				done := make(chan error, 1)
				go func() { done <- op(ctx, b) }()
				select {
				case <-dialer.swallowed:
				case <-time.After(guard):
					t.Fatal("no request sent")
				}
				w.whileWaiting(dialer)
				select {
				case err := <-done:
					assert.ErrorIs(t, err, w.want)
				case <-time.After(guard):
					t.Fatalf("%s still waits for a reply %s after the request was sent", name, guard)
				}
			})
		}
	}
}

// TestListAndDeleteAt pins what the sweep of stray intents relies on, for
// the NATS bus and the Fake alike: List shows every key present with its
// revision and none deleted, and DeleteAt deletes a key only at the
// revision it was listed at.
func TestListAndDeleteAt(t *testing.T) {
	cases := []struct {
		name string
		bus  func(t *testing.T) bus.Bus
	}{
		{name: "NATS", bus: func(t *testing.T) bus.Bus { b, _, _, _ := newHub(t); return b }},
		{name: "Fake", bus: func(*testing.T) bus.Bus { return bus.NewFake() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.bus(t)
			ctx := context.Background()
			put := func(uid string, generation int64) uint64 {
				rev, err := bus.Put(ctx, b, wire.GuestIntents, "node1", uid, wire.Intent{UID: uid, Generation: generation})
				require.NoError(t, err)
				return rev
			}
			revA, revB := put("vm-a", 1), put("vm-b", 1)
			put("vm-c", 1)
			require.NoError(t, bus.Delete(ctx, b, wire.GuestIntents, "node1", "vm-c"))

			got, err := b.List(ctx, wire.BucketIntents)
			require.NoError(t, err)
			assert.ElementsMatch(t, []bus.Entry{{Key: "node1.vm-a", Revision: revA}, {Key: "node1.vm-b", Revision: revB}}, got, "the keys present, with their revisions, without values")

			put("vm-a", 2)
			var conflict *bus.ConflictError
			require.ErrorAs(t, b.DeleteAt(ctx, wire.BucketIntents, "node1.vm-a", revA), &conflict, "a key written since it was listed stays")
			require.NoError(t, b.DeleteAt(ctx, wire.BucketIntents, "node1.vm-b", revB))
			got, err = b.List(ctx, wire.BucketIntents)
			require.NoError(t, err)
			require.Len(t, got, 1)
			assert.Equal(t, "node1.vm-a", got[0].Key)
		})
	}
}
