package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// fleet is a real nats-server with the buckets, the hub's view of them, and
// identities for node1 and node2.
type fleet struct {
	srv     *natstest.Server
	js      jetstream.JetStream // the hub's
	intents jetstream.KeyValue  // written as the hub
	// reports are the report keys where the agents write them.
	reports nodeReports
	// bucket is the reports bucket the hub watches, which sources them.
	bucket jetstream.KeyValue
	agents map[string]natswire.Identity
}

// nodeReports reads and writes report keys in their node's own stream
// (natswire.NodeReportsStream), whose revisions are those the agent
// compares and sets against. The bucket that sources it follows a moment
// later.
type nodeReports struct{ js jetstream.JetStream }

// reportEntry is a report key's last value in its node's stream.
type reportEntry struct{ m *jetstream.RawStreamMsg }

func (e reportEntry) Key() string {
	return strings.TrimPrefix(e.m.Subject, wire.Subject(wire.BucketReports, ""))
}
func (e reportEntry) Value() []byte    { return e.m.Data }
func (e reportEntry) Revision() uint64 { return e.m.Sequence }

// Get is key's value, or jetstream.ErrKeyNotFound if it has none or was
// deleted.
func (r nodeReports) Get(ctx context.Context, key string) (reportEntry, error) {
	name, err := natswire.NodeReportsStreamOfKey(key)
	if err != nil {
		return reportEntry{}, err
	}
	s, err := r.js.Stream(ctx, name)
	if err != nil {
		return reportEntry{}, err
	}
	m, err := s.GetLastMsgForSubject(ctx, wire.Subject(wire.BucketReports, key))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return reportEntry{}, jetstream.ErrKeyNotFound
	case err != nil:
		return reportEntry{}, err
	case m.Header.Get("KV-Operation") != "":
		return reportEntry{}, jetstream.ErrKeyNotFound
	}
	return reportEntry{m: m}, nil
}

// Put writes key as its node's agent would, unconditionally.
func (r nodeReports) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	ack, err := r.js.Publish(ctx, wire.Subject(wire.BucketReports, key), value)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// Count is how many messages node's stream holds.
func (r nodeReports) Count(ctx context.Context, node string) (uint64, error) {
	s, err := r.js.Stream(ctx, natswire.NodeReportsStream(wire.NodeToken(node)))
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

func newFleet(t testing.TB) *fleet {
	t.Helper()
	srv, js, agents := natstest.NewFleet(t, natswire.BucketConfig{NodeTTL: 3 * time.Second}, "node1", "node2")
	ctx := context.Background()
	f := &fleet{srv: srv, js: js, agents: agents}
	var err error
	f.intents, err = js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)
	f.reports = nodeReports{js: js}
	f.bucket, err = js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	return f
}

// agent connects node's agent and returns its bus.
func (f *fleet) agent(t testing.TB, node string) (*bus.NATS, *nats.Conn, *natstest.AsyncErrors) {
	t.Helper()
	nc, async := natstest.Connect(t, f.srv, f.agents[node])
	// Requests wait as long as an agent's do (bus.DefaultTimeout): a
	// loaded machine answers a put in more than half a second.
	b, err := bus.New(nc, bus.Config{Node: node, RetryInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	return b, nc, async
}

// putIntent writes an intent as the hub does.
func (f *fleet) putIntent(t testing.TB, node, uid string, generation int64) uint64 {
	t.Helper()
	key, err := wire.GuestIntents.Key(node, uid)
	require.NoError(t, err)
	b, err := wire.EncodeIntent(wire.Intent{UID: uid, Name: uid, Generation: generation, Running: true})
	require.NoError(t, err)
	rev, err := f.intents.Put(context.Background(), key, b)
	require.NoError(t, err)
	return rev
}

// putIntentEventually writes an intent as the hub does after a server
// restart: retrying until the connection and the stream are back.
func (f *fleet) putIntentEventually(t testing.TB, node, uid string, generation int64) {
	t.Helper()
	key, err := wire.GuestIntents.Key(node, uid)
	require.NoError(t, err)
	b, err := wire.EncodeIntent(wire.Intent{UID: uid, Name: uid, Generation: generation, Running: true})
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = f.intents.Put(ctx, key, b)
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err, "cannot put intent %s after the server restart", key)
}

// syncedMarker is what a watch's Synced call records among the events.
type syncedMarker struct{}

// events collects what a watch delivers, for assertions from the test
// goroutine: bus.Event values of each kind watched, and syncedMarker.
type events struct {
	ch chan any
}

// kind is a handler that sends the events of one kind to ch; into makes one.
type kind func(ch chan<- any) bus.Handler

func into[V any](k wire.Kind[V]) kind {
	return func(ch chan<- any) bus.Handler { return bus.On(k, func(ev bus.Event[V]) { ch <- ev }) }
}

// watch watches b's intents of the given kinds, by default guests' and
// Volumes'.
func watch(t testing.TB, b bus.Bus, kinds ...kind) *events {
	t.Helper()
	if len(kinds) == 0 {
		kinds = []kind{into(wire.GuestIntents), into(wire.VolumeIntents)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e := &events{ch: make(chan any, 4096)}
	hs := bus.Handlers{Synced: func() { e.ch <- syncedMarker{} }}
	for _, k := range kinds {
		hs.Kinds = append(hs.Kinds, k(e.ch))
	}
	go func() {
		defer close(done)
		_ = b.WatchIntents(ctx, hs)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// until returns the events received until one satisfies stop, failing the
// test after d.
func (e *events) until(t testing.TB, d time.Duration, stop func(any) bool) []any {
	t.Helper()
	var got []any
	timeout := time.After(d)
	for {
		select {
		case ev := <-e.ch:
			got = append(got, ev)
			if stop(ev) {
				return got
			}
		case <-timeout:
			t.Fatalf("no matching event within %s; got %+v", d, got)
		}
	}
}

func synced(ev any) bool { return ev == syncedMarker{} }

// guest is ev as a guest intent's event, if it is one.
func guest(ev any) (bus.Event[wire.Intent], bool) {
	g, ok := ev.(bus.Event[wire.Intent])
	return g, ok
}

func generation(uid string, g int64) func(any) bool {
	return func(ev any) bool {
		in, ok := guest(ev)
		return ok && in.UID == uid && in.Value.Generation == g
	}
}
