package app_test

import (
	"context"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver/libvirt"
	"github.com/virtfleet/virtfleet/agent/internal/app"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Settings of the simulated fleet.
const (
	// testPool is the storage pool of libvirt's test driver (100 GiB).
	testPool = "default-pool"
	// waitFor bounds every wait for the agent to converge. Guests on the
	// test driver converge in milliseconds; the margin is for -race on two
	// cores.
	waitFor = 20 * time.Second
)

// fleet is what surrounds agents in production, made of real parts: a
// nats-server with the wire buckets created as the hub creates them, the
// hub's view of those buckets, and one private libvirtd per node.
type fleet struct {
	srv     *natstest.Server
	intents jetstream.KeyValue
	reports jetstream.KeyValue
	nodes   jetstream.KeyValue
	ids     map[string]natswire.Identity
	hosts   map[string]*libvirttest.Node
}

// newFleet starts a fleet of the named nodes. nodeTTL 0 keeps the default.
func newFleet(t testing.TB, nodeTTL time.Duration, nodes ...string) *fleet {
	t.Helper()
	f := newWire(t, nodeTTL, nodes...)
	for _, n := range nodes {
		f.hosts[n] = libvirttest.Start(t, n)
	}
	return f
}

// newWire starts a fleet of the named nodes without a libvirtd: each
// node's agent is given its driver (app.Config.Driver) by the test.
func newWire(t testing.TB, nodeTTL time.Duration, nodes ...string) *fleet {
	t.Helper()
	srv, js, ids := natstest.NewFleet(t, natswire.BucketConfig{NodeTTL: nodeTTL}, nodes...)
	ctx := context.Background()
	var err error
	f := &fleet{srv: srv, ids: ids, hosts: map[string]*libvirttest.Node{}}
	for name, kv := range map[string]*jetstream.KeyValue{wire.BucketIntents: &f.intents, wire.BucketReports: &f.reports, wire.BucketNodes: &f.nodes} {
		*kv, err = js.KeyValue(ctx, name)
		require.NoError(t, err)
	}
	return f
}

// config is an agent's configuration for node, tuned for tests: short
// timeouts and heartbeats, and guests that stop at once on the node's
// libvirtd, where it has one.
func (f *fleet) config(node string) app.Config {
	cfg := app.Config{
		Node:              node,
		Labels:            map[string]string{"zone": "test"},
		NATSURLs:          []string{f.srv.URL()},
		Seed:              f.ids[node].Seed,
		RequestTimeout:    500 * time.Millisecond,
		HeartbeatInterval: 250 * time.Millisecond,
		Log:               testLog(),
	}
	if h, ok := f.hosts[node]; ok {
		cfg.Libvirt = libvirt.Config{Socket: h.Socket, URI: h.URI, Pool: testPool, ShutdownGrace: 50 * time.Millisecond}
	}
	return cfg
}

// testLog discards logs unless VIRTFLEET_TEST_LOG is set.
func testLog() logging.Logger {
	if os.Getenv("VIRTFLEET_TEST_LOG") == "" {
		return logging.NewNopLogger()
	}
	return logging.NewLogrLogger(zap.New(zap.UseDevMode(true)))
}

// runningAgent is an agent running in a goroutine; stopping it is cancelling
// its context, which is what SIGTERM does to the binary.
type runningAgent struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs an agent until stop or the end of the test.
func (f *fleet) start(t testing.TB, cfg app.Config) *runningAgent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &runningAgent{cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- app.Run(ctx, cfg) }()
	t.Cleanup(func() { a.stop(t) })
	return a
}

// stop stops the agent and fails the test unless it exits cleanly and soon.
func (a *runningAgent) stop(t testing.TB) {
	t.Helper()
	a.cancel()
	select {
	case err, ok := <-a.done:
		if ok {
			require.NoError(t, err, "the agent must exit cleanly when stopped")
			close(a.done)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not stop within 10s of its context being cancelled")
	}
}

// addresses counts the addresses vm gave out, so that no two guests of a
// test's network are given the same one, as the hub's allocator sees to.
var addresses atomic.Uint32

// vm is the intent for a small guest with one disk and one network, as the
// hub would write it.
func vm(name string) wire.Intent {
	address := netip.AddrFrom4([4]byte{10, 10, 120, byte(2 + addresses.Add(1)%250)})
	return wire.Intent{
		UID:        uuid.NewString(),
		Namespace:  "team-a",
		Name:       name,
		Generation: 1,
		Running:    true,
		Machine: wire.Machine{
			VCPU:        2,
			MemoryBytes: 512 << 20,
			Disks:       []wire.Disk{{Name: name + "-root", SizeBytes: 1 << 20}},
			Networks:    []wire.Network{{Name: "net-db", CIDR: "10.10.120.0/24", Mode: "nat", Address: netip.PrefixFrom(address, 24).String()}},
		},
	}
}

// put writes in as node's intent, as the hub does.
func (f *fleet) put(t testing.TB, node string, in wire.Intent) {
	t.Helper()
	putIntent(t, f, wire.GuestIntents, node, in.UID, in)
}

// putIntent writes v as node's intent of kind k of uid, as the hub does.
func putIntent[V any](t testing.TB, f *fleet, k wire.Kind[V], node, uid string, v V) {
	t.Helper()
	key, err := k.Key(node, uid)
	require.NoError(t, err)
	b, err := k.Encode(v)
	require.NoError(t, err)
	_, err = f.intents.Put(context.Background(), key, b)
	require.NoError(t, err)
}

// remove deletes node's intent for uid, as the hub does for a deleted VM.
func (f *fleet) remove(t testing.TB, node, uid string) {
	t.Helper()
	key, err := wire.GuestIntents.Key(node, uid)
	require.NoError(t, err)
	require.NoError(t, f.intents.Delete(context.Background(), key))
}

// report reads node's report for uid as the hub does; false if there is none.
func (f *fleet) report(t testing.TB, node, uid string) (wire.Report, bool) {
	t.Helper()
	return reportOf(t, f, wire.GuestReports, node, uid)
}

// reportOf reads node's report of kind k for uid as the hub does; false if
// there is none.
func reportOf[V any](t testing.TB, f *fleet, k wire.Kind[V], node, uid string) (V, bool) {
	t.Helper()
	var v V
	key, err := k.Key(node, uid)
	require.NoError(t, err)
	e, err := f.reports.Get(context.Background(), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return v, false
	}
	require.NoError(t, err)
	v, err = k.Decode(e.Value())
	require.NoError(t, err)
	return v, true
}

// waitReport waits until node's report for uid satisfies ok and returns it.
func (f *fleet) waitReport(t testing.TB, node, uid, what string, ok func(wire.Report) bool) wire.Report {
	t.Helper()
	return waitReportOf(t, f, wire.GuestReports, node, uid, what, ok)
}

// waitReportOf waits until node's report of kind k for uid satisfies ok and
// returns it.
func waitReportOf[V any](t testing.TB, f *fleet, k wire.Kind[V], node, uid, what string, ok func(V) bool) V {
	t.Helper()
	var last V
	var found bool
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		if last, found = reportOf(t, f, k, node, uid); found && ok(last) {
			return last
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %s of %s on %s is %s within %s; last (found=%t): %+v", k.Name, uid, node, what, waitFor, found, last)
	return last
}

// waitNoReport waits until node has no report for uid.
func (f *fleet) waitNoReport(t testing.TB, node, uid string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		if _, found := f.report(t, node, uid); !found {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the report of %s on %s was not deleted within %s", uid, node, waitFor)
}

// running is a report condition: phase Running for the given generation.
func running(gen int64) func(wire.Report) bool {
	return phase(wire.PhaseRunning, gen)
}

func phase(p wire.Phase, gen int64) func(wire.Report) bool {
	return func(r wire.Report) bool { return r.Phase == p && r.ObservedGeneration == gen }
}

// guests lists the domains on node's libvirtd by uuid, with whether each is
// active, looking behind the agent's back. The test driver's own sample
// domain "test" is left out.
func (f *fleet) guests(t testing.TB, node string) map[string]bool {
	t.Helper()
	l, err := f.hosts[node].Dial()
	require.NoError(t, err)
	defer l.Disconnect() //nolint:errcheck // read-only connection
	doms, _, err := l.ConnectListAllDomains(1, 0)
	require.NoError(t, err)
	out := map[string]bool{}
	for _, d := range doms {
		if d.Name == "test" {
			continue
		}
		state, _, err := l.DomainGetState(d, 0)
		require.NoError(t, err)
		out[uuid.UUID(d.UUID).String()] = golibvirt.DomainState(state) == golibvirt.DomainRunning
	}
	return out
}

// waitVolume polls node's libvirtd as fast as it answers until the volume
// exists in the test pool.
func (f *fleet) waitVolume(t testing.TB, node, name string) {
	t.Helper()
	l, err := f.hosts[node].Dial()
	require.NoError(t, err)
	defer l.Disconnect() //nolint:errcheck // read-only connection
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		if _, err := l.StorageVolLookupByName(p, name); err == nil {
			return
		}
	}
	t.Fatalf("volume %s did not appear on %s within %s", name, node, waitFor)
}
