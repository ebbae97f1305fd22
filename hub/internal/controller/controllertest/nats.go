package controllertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Heartbeats is how often an Agent's heartbeat is put: well within any
// node TTL a test gives StartNATS.
const Heartbeats = 250 * time.Millisecond

// sealKey is what a NATS's fleets seal placements with.
const sealKey = "fleettest"

// NATS is a Fleet over a real nats-server, as the hub has it, with each
// node's agent played by an Agent through that node's own credentials: a
// node can write only what its agent may.
type NATS struct {
	*fleet.Fleet
	// URL is the server's.
	URL string

	t       *testing.T
	kv      map[string]jetstream.KeyValue
	agents  map[string]*Agent
	stopped sync.WaitGroup
}

// StartNATS starts a nats-server with an agent identity for each of
// nodes, and a Fleet over it with the hub's, until the test ends. Nodes
// heartbeat nothing until told to (Agent.Heartbeat); one that stops is lost
// about ttl later. It returns once the fleet has read the reports.
func StartNATS(t *testing.T, ttl time.Duration, nodes ...string) *NATS {
	t.Helper()
	return startNATS(t, ttl, nil, nodes)
}

// startNATS is StartNATS with a fleet bounded by allowances, when not nil.
func startNATS(t *testing.T, ttl time.Duration, allowances *fleet.Allowances, nodes []string) *NATS {
	t.Helper()
	hub, ids, users := natstest.Identities(t, nodes...)
	srv := natstest.New(t, users...)
	ctx := context.Background()
	nc, _ := natstest.Connect(t, srv, hub)
	b, err := bus.New(ctx, nc, bus.Config{Buckets: natswire.BucketConfig{NodeTTL: ttl}, RetryInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	n := &NATS{Fleet: fleet.New(b, logging.NewNopLogger()).WithSealKey([]byte(sealKey)), URL: srv.URL(), t: t, kv: map[string]jetstream.KeyValue{}, agents: map[string]*Agent{}}
	if allowances != nil {
		n.WithAllowances(allowances)
	}
	for _, bucket := range []string{wire.BucketIntents, wire.BucketReports} {
		n.kv[bucket], err = js.KeyValue(ctx, bucket)
		require.NoError(t, err)
	}
	for _, node := range nodes {
		// As the hub does at the node's first heartbeat, which a test's
		// agent may never send.
		require.NoError(t, natswire.EnsureNodeReports(ctx, js, natswire.BucketConfig{}, node))
		anc, _ := natstest.Connect(t, srv, ids[node])
		ajs, err := jetstream.New(anc)
		require.NoError(t, err)
		n.agents[node] = &Agent{n: n, node: node, js: ajs}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); n.Run(runCtx) }()
	t.Cleanup(func() {
		for _, a := range n.agents {
			a.Stop()
		}
		n.stopped.Wait()
		cancel()
		<-done
	})
	require.Eventually(t, n.Synced, 10*time.Second, 5*time.Millisecond, "the fleet reads the reports")
	return n
}

// Agent plays node's agent.
func (n *NATS) Agent(node string) *Agent {
	a, ok := n.agents[node]
	require.True(n.t, ok, "node %s has no agent identity: name it to StartNATS", node)
	return a
}

// Stored returns the value of kind k of uid on node that the server holds,
// as the node's agent would read it.
func Stored[V any](t *testing.T, n *NATS, k wire.Kind[V], node, uid string) (V, bool) {
	t.Helper()
	var v V
	key, err := k.Key(node, uid)
	require.NoError(t, err)
	e, err := n.kv[k.Bucket].Get(context.Background(), key)
	if err != nil {
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
		return v, false
	}
	v, err = k.Decode(e.Value())
	require.NoError(t, err)
	return v, true
}

// Restarted is the fleet a hub restarted now holds: a new one over the
// same server and seal key, with nothing in memory but what it read back
// from the buckets. It runs until the test ends, and is returned once it
// has read the reports and the hub's records.
func (n *NATS) Restarted(t *testing.T) *fleet.Fleet {
	t.Helper()
	f := fleet.New(n.Bus, logging.NewNopLogger()).WithSealKey([]byte(sealKey))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool {
		_, err := f.Held("any")
		return f.Synced() && err == nil
	}, 10*time.Second, 5*time.Millisecond, "the restarted fleet reads the reports and the hub's records")
	return f
}

// Agent is one node's agent, as far as the hub sees it: its heartbeat and
// its reports.
type Agent struct {
	n    *NATS
	node string
	js   jetstream.JetStream

	mu   sync.Mutex
	hb   wire.NodeHeartbeat
	stop chan struct{}
}

// Heartbeat makes the agent put hb as its heartbeat every Heartbeats from
// now until Stop, and returns once the fleet shows it.
func (a *Agent) Heartbeat(hb wire.NodeHeartbeat) {
	a.n.t.Helper()
	hb.Node = a.node
	a.mu.Lock()
	a.hb = hb
	if a.stop == nil {
		a.stop = make(chan struct{})
		a.n.stopped.Add(1)
		go a.beat(a.stop)
	}
	a.mu.Unlock()
	require.Eventually(a.n.t, func() bool {
		s, ok := a.n.Heard(a.node)
		return ok && !s.Lost && s.Claimed.Backend == hb.Backend && s.Claimed.Snapshots == hb.Snapshots && s.Claimed.MigrationURI == hb.MigrationURI
	}, 10*time.Second, 5*time.Millisecond, "the fleet hears node %s", a.node)
}

// Stop stops the heartbeats; the node is lost once its key expires.
func (a *Agent) Stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stop != nil {
		close(a.stop)
		a.stop = nil
	}
}

func (a *Agent) beat(stop <-chan struct{}) {
	defer a.n.stopped.Done()
	tick := time.NewTicker(Heartbeats)
	defer tick.Stop()
	key, err := wire.NodeKey(a.node)
	if err != nil {
		panic(err)
	}
	for {
		a.mu.Lock()
		hb := a.hb
		a.mu.Unlock()
		hb.SentAt = time.Now()
		if b, err := wire.EncodeNodeHeartbeat(hb); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = a.js.Publish(ctx, wire.Subject(wire.BucketNodes, key), b)
			cancel()
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// Report plays a's agent putting v as its value of kind k of uid.
func Report[V any](t *testing.T, a *Agent, k wire.Kind[V], uid string, v V) {
	t.Helper()
	key, err := k.Key(a.node, uid)
	require.NoError(t, err)
	b, err := k.Encode(v)
	require.NoError(t, err)
	_, err = a.js.Publish(context.Background(), wire.Subject(k.Bucket, key), b)
	require.NoError(t, err)
}
