package bus_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/testing/natstest"
)

const testNodeTTL = 3 * time.Second

func newHub(t *testing.T) (*bus.NATS, jetstream.JetStream, *natstest.Server, map[string]natswire.Identity) {
	t.Helper()
	hub, agents, users := natstest.Identities(t, "node1")
	srv := natstest.New(t, users...)
	nc, _ := natstest.Connect(t, srv, hub)
	b, err := bus.New(context.Background(), nc, bus.Config{Buckets: natswire.BucketConfig{NodeTTL: testNodeTTL}, RetryInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return b, js, srv, agents
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

func TestPutIntent(t *testing.T) {
	b, _, _, _ := newHub(t)
	ctx := context.Background()
	in := wire.Intent{UID: "vm-a", Name: "a", Generation: 1, Running: true}

	rev1, err := b.PutIntent(ctx, "node1", in)
	require.NoError(t, err)
	rev2, err := b.PutIntent(ctx, "node1", in)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same intent must not write")

	in.Generation = 2
	rev3, err := b.PutIntent(ctx, "node1", in)
	require.NoError(t, err)
	assert.Greater(t, rev3, rev2)

	require.NoError(t, b.DeleteIntent(ctx, "node1", "vm-a"))
	require.NoError(t, b.DeleteIntent(ctx, "node1", "vm-a"), "deleting an absent intent succeeds")
	_, err = b.PutIntent(ctx, "node1", in)
	require.NoError(t, err, "an intent can be recreated after a delete")

	_, err = b.PutIntent(ctx, "", in)
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
}

// TestLostNodeIsPurged pins the expiry the hub's node-loss handling relies
// on: a heartbeat that is not refreshed turns into a purge within about one
// TTL of the last put.
func TestLostNodeIsPurged(t *testing.T) {
	b, _, srv, agents := newHub(t)
	events := collect(t, b.WatchNodes)
	nc, _ := natstest.Connect(t, srv, agents["node1"])
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	hb, err := wire.EncodeNodeHeartbeat(wire.NodeHeartbeat{Node: "node1", Backend: "libvirt"})
	require.NoError(t, err)

	_, err = js.Publish(context.Background(), "$KV.nodes.node1", hb)
	require.NoError(t, err)
	lastPut := time.Now()
	next(t, events, 5*time.Second, func(e bus.NodeEvent) bool { return !e.Lost && e.Node == "node1" })

	next(t, events, 3*testNodeTTL, func(e bus.NodeEvent) bool { return e.Lost && e.Node == "node1" })
	assert.InDelta(t, testNodeTTL.Seconds(), time.Since(lastPut).Seconds(), 1.5, "purge should follow the last put by about one TTL")
}

func TestWatchReportsRejectsBadInputAndCarriesOn(t *testing.T) {
	b, js, _, _ := newHub(t)
	events := collect(t, b.WatchReports)
	ctx := context.Background()
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)

	cases := map[string]struct {
		key, value string
		reason     string
	}{
		"CorruptValue":        {key: "node1.vm-x", value: `not json`, reason: natswire.ReasonDecode},
		"NewerVersion":        {key: "node1.vm-y", value: `{"protocolVersion":2,"uid":"vm-y","node":"node1"}`, reason: natswire.ReasonVersion},
		"ReportForOtherNode":  {key: "node1.vm-z", value: `{"protocolVersion":1,"uid":"vm-z","node":"node2"}`, reason: natswire.ReasonMismatch},
		"KeyWithoutNodeToken": {key: "vm-q", value: `{"protocolVersion":1,"uid":"vm-q","node":"node1"}`, reason: natswire.ReasonKey},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := b.Rejections().Count(tc.reason)
			_, err := reports.Put(ctx, tc.key, []byte(tc.value))
			require.NoError(t, err)
			good, err := wire.EncodeReport(wire.Report{UID: "vm-good", Node: "node1", Message: name})
			require.NoError(t, err)
			_, err = reports.Put(ctx, "node1.vm-good", good)
			require.NoError(t, err)
			next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Report.Message == name })
			assert.Equal(t, before+1, b.Rejections().Count(tc.reason))
		})
	}
}

func TestWatchReportsResumesAfterServerRestart(t *testing.T) {
	b, js, srv, _ := newHub(t)
	events := collect(t, b.WatchReports)
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
	next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.UID == "before" })

	srv.Shutdown()
	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool { _, err := js.AccountInfo(ctx); return err == nil }, 10*time.Second, 50*time.Millisecond)
	put("after")
	next(t, events, 10*time.Second, func(e bus.ReportEvent) bool { return e.UID == "after" })
}

// TestWatchReportsResumesAfterItsConsumerIsLost: when the server holding a
// watch's consumer goes and the hub's connection stays (in a cluster,
// another server's stream leader is killed), the watch finds itself behind
// its bucket and resumes within seconds, not after nats.go's 10-20 s.
func TestWatchReportsResumesAfterItsConsumerIsLost(t *testing.T) {
	b, js, _, _ := newHub(t)
	events := collect(t, b.WatchReports)
	next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Synced })
	natstest.DeleteConsumers(t, js, wire.Stream(wire.BucketReports))
	ctx := context.Background()

	v, err := wire.EncodeReport(wire.Report{UID: "after", Node: "node1"})
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	start := time.Now()
	_, err = kv.Put(ctx, "node1.after", v)
	require.NoError(t, err)
	next(t, events, 7*time.Second, func(e bus.ReportEvent) bool { return e.UID == "after" })
	t.Logf("delivered %s after the consumer was lost", time.Since(start).Round(100*time.Millisecond))
}

func TestPutVolumeIntent(t *testing.T) {
	b, js, _, _ := newHub(t)
	ctx := context.Background()
	intents, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)
	v := wire.VolumeIntent{UID: "vol-a", Namespace: "ns", Name: "a", Disk: "ns_a", Absent: true}

	rev1, err := b.PutVolumeIntent(ctx, "node1", v)
	require.NoError(t, err)
	rev2, err := b.PutVolumeIntent(ctx, "node1", v)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replaying the same volume intent must not write")

	e, err := intents.Get(ctx, "node1.volume.vol-a")
	require.NoError(t, err, "the volume intent lives under <node>.volume.<uid>")
	got, err := wire.DecodeVolumeIntent(e.Value())
	require.NoError(t, err)
	assert.Equal(t, "ns_a", got.Disk)
	_, err = intents.Get(ctx, "node1.vol-a")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a volume intent is not a guest intent")

	require.NoError(t, b.DeleteVolumeIntent(ctx, "node1", "vol-a"))
	require.NoError(t, b.DeleteVolumeIntent(ctx, "node1", "vol-a"), "deleting an absent volume intent succeeds")
	_, err = intents.Get(ctx, "node1.volume.vol-a")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound)

	v.Absent = false
	_, err = b.PutVolumeIntent(ctx, "node1", v)
	var de *wire.DecodeError
	assert.ErrorAs(t, err, &de, "a present volume intent is reserved")
	_, err = b.PutVolumeIntent(ctx, "node1", wire.VolumeIntent{UID: "a.b", Disk: "d", Absent: true})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
}

func TestWatchReportsRoutesVolumeReports(t *testing.T) {
	b, js, _, _ := newHub(t)
	events := collect(t, b.WatchReports)
	ctx := context.Background()
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)

	v, err := wire.EncodeVolumeReport(wire.VolumeReport{UID: "vol-a", Gone: true})
	require.NoError(t, err)
	_, err = reports.Put(ctx, "node1.volume.vol-a", v)
	require.NoError(t, err)
	ev := next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Volume != nil })
	assert.Equal(t, bus.VolumeReportEvent{Node: "node1", UID: "vol-a", Revision: ev.Volume.Revision, Report: ev.Volume.Report}, *ev.Volume)
	assert.True(t, ev.Volume.Report.Gone)
	assert.Empty(t, ev.UID, "a volume report is not a guest report")

	require.NoError(t, reports.Delete(ctx, "node1.volume.vol-a"))
	ev = next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Volume != nil })
	assert.True(t, ev.Volume.Deleted)
	assert.Equal(t, "vol-a", ev.Volume.UID)

	cases := map[string]struct {
		key, value string
		reason     string
	}{
		"CorruptVolumeReport":       {key: "node1.volume.vol-x", value: `not json`, reason: natswire.ReasonDecode},
		"NewerVolumeReport":         {key: "node1.volume.vol-y", value: `{"protocolVersion":2,"uid":"vol-y"}`, reason: natswire.ReasonVersion},
		"VolumeReportForOtherUID":   {key: "node1.volume.vol-z", value: `{"protocolVersion":1,"uid":"vol-other"}`, reason: natswire.ReasonMismatch},
		"GuestReportUnderVolumeKey": {key: "node1.volume.vol-w", value: `{"protocolVersion":1,"node":"node1"}`, reason: natswire.ReasonKey},
		"UnknownKindOfKey":          {key: "node1.network.net-a", value: `{"protocolVersion":1,"uid":"net-a","node":"node1"}`, reason: natswire.ReasonKey},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := b.Rejections().Count(tc.reason)
			_, err := reports.Put(ctx, tc.key, []byte(tc.value))
			require.NoError(t, err)
			good, err := wire.EncodeVolumeReport(wire.VolumeReport{UID: "vol-good", Message: name})
			require.NoError(t, err)
			_, err = reports.Put(ctx, "node1.volume.vol-good", good)
			require.NoError(t, err)
			next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Volume != nil && e.Volume.Report.Message == name })
			assert.Equal(t, before+1, b.Rejections().Count(tc.reason))
		})
	}
}

func TestWatchReportsRoutesImageReports(t *testing.T) {
	b, js, _, _ := newHub(t)
	events := collect(t, b.WatchReports)
	ctx := context.Background()
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)

	v, err := wire.EncodeImageReport(wire.ImageReport{UID: "img-a", Node: "node1", Phase: wire.ImagePhaseReady, SizeBytes: 42})
	require.NoError(t, err)
	_, err = reports.Put(ctx, "node1.image.img-a", v)
	require.NoError(t, err)
	ev := next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Image != nil })
	assert.Equal(t, bus.ImageReportEvent{Node: "node1", UID: "img-a", Revision: ev.Image.Revision, Report: ev.Image.Report}, *ev.Image)
	assert.Equal(t, int64(42), ev.Image.Report.SizeBytes)
	assert.Empty(t, ev.UID, "an image report is not a guest report")
	assert.Nil(t, ev.Volume, "an image report is not a volume report")

	require.NoError(t, reports.Delete(ctx, "node1.image.img-a"))
	ev = next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Image != nil })
	assert.True(t, ev.Image.Deleted)
	assert.Equal(t, bus.ImageReportEvent{Node: "node1", UID: "img-a", Revision: ev.Image.Revision, Deleted: true}, *ev.Image)

	cases := map[string]struct {
		key, value string
		reason     string
	}{
		"CorruptImageReport":          {key: "node1.image.img-x", value: `not json`, reason: natswire.ReasonDecode},
		"NewerImageReport":            {key: "node1.image.img-y", value: `{"protocolVersion":2,"uid":"img-y"}`, reason: natswire.ReasonVersion},
		"ImageReportForOtherUID":      {key: "node1.image.img-z", value: `{"protocolVersion":1,"uid":"img-other","node":"node1","phase":"Ready"}`, reason: natswire.ReasonMismatch},
		"ImageReportOfAnotherNode":    {key: "node1.image.img-n", value: `{"protocolVersion":1,"uid":"img-n","node":"node2","phase":"Ready"}`, reason: natswire.ReasonMismatch},
		"ImageReportWithUnknownPhase": {key: "node1.image.img-p", value: `{"protocolVersion":1,"uid":"img-p","node":"node1","phase":"Pruned"}`, reason: natswire.ReasonDecode},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := b.Rejections().Count(tc.reason)
			_, err := reports.Put(ctx, tc.key, []byte(tc.value))
			require.NoError(t, err)
			good, err := wire.EncodeImageReport(wire.ImageReport{UID: "img-good", Node: "node1", Phase: wire.ImagePhaseImporting, Message: name})
			require.NoError(t, err)
			_, err = reports.Put(ctx, "node1.image.img-good", good)
			require.NoError(t, err)
			next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Image != nil && e.Image.Report.Message == name })
			assert.Equal(t, before+1, b.Rejections().Count(tc.reason))
		})
	}
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
	_, err = b.PutIntent(context.Background(), "node1", wire.Intent{UID: "vm-a", Name: "a", Generation: 1})
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
		"PutIntent": func(ctx context.Context, b *bus.NATS) error {
			_, err := b.PutIntent(ctx, "node1", wire.Intent{UID: "vm-a", Name: "a", Generation: 2})
			return err
		},
		"PutVolumeIntent": func(ctx context.Context, b *bus.NATS) error {
			_, err := b.PutVolumeIntent(ctx, "node1", wire.VolumeIntent{UID: "vol-a", Namespace: "ns", Name: "a", Disk: "ns_a", Absent: true})
			return err
		},
		"DeleteIntent":       func(ctx context.Context, b *bus.NATS) error { return b.DeleteIntent(ctx, "node1", "vm-a") },
		"DeleteVolumeIntent": func(ctx context.Context, b *bus.NATS) error { return b.DeleteVolumeIntent(ctx, "node1", "vol-a") },
		"DeleteVolumeReport": func(ctx context.Context, b *bus.NATS) error { return b.DeleteVolumeReport(ctx, "node1", "vol-a") },
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
