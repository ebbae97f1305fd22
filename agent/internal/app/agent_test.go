package app_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/agent/internal/app"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/version"
)

// TestIntentLifecycle walks one guest through what a user does to a
// VirtualMachine, each step an intent the hub writes and a report it reads.
func TestIntentLifecycle(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "life1")
	f.start(t, f.config("life1"))
	in := vm("web")

	steps := []struct {
		name     string
		change   func(in *wire.Intent)
		phase    wire.Phase
		restarts int32
		active   bool
	}{
		{name: "AnIntentBecomesARunningGuest", change: func(*wire.Intent) {}, phase: wire.PhaseRunning, active: true},
		{name: "RunningFalseStopsIt", change: func(in *wire.Intent) { in.Running = false }, phase: wire.PhaseStopped},
		{name: "RunningTrueStartsIt", change: func(in *wire.Intent) { in.Running = true }, phase: wire.PhaseRunning, active: true},
		{name: "ARestartNonceRestartsItOnce", change: func(in *wire.Intent) { in.RestartNonce = "2026-11-02T10:00:00Z" }, phase: wire.PhaseRunning, restarts: 1, active: true},
		{name: "TheSameNonceInALaterIntentDoesNotRestartAgain", change: func(*wire.Intent) {}, phase: wire.PhaseRunning, restarts: 1, active: true},
	}
	for i, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&in)
			in.Generation = int64(i + 1)
			f.put(t, "life1", in)
			r := f.waitReport(t, "life1", in.UID, string(s.phase), phase(s.phase, in.Generation))

			assert.Equal(t, in.UID, r.ID, "the libvirt domain UUID is the VM's uid")
			assert.Equal(t, "life1", r.Node)
			assert.Equal(t, s.restarts, r.RestartCount)
			assert.Equal(t, map[string]bool{in.UID: s.active}, f.guests(t, "life1"), "exactly this guest, active when Running")
			if s.phase == wire.PhaseRunning {
				require.Len(t, r.Interfaces, 1)
				assert.Equal(t, "net-db", r.Interfaces[0].Network, "interfaces carry the VirtualNetwork name the user wrote")
				assert.Equal(t, []string{strings.TrimSuffix(in.Machine.Networks[0].Address, "/24")}, r.Interfaces[0].IPs, "the address the hub gave it")
				assert.NotEmpty(t, r.Interfaces[0].Source)
			}
		})
	}

	t.Run("DeletingTheIntentDeletesTheGuestThenTheReport", func(t *testing.T) {
		f.remove(t, "life1", in.UID)
		f.waitNoReport(t, "life1", in.UID)
		// The hub finishes a deletion when the report goes, so by then the
		// guest must already be gone.
		assert.Empty(t, f.guests(t, "life1"))
	})
}

// TestAgentStoppedMidCreate stops the agent while it creates a guest and
// starts a new one: the guest is created once, whatever the first agent got
// done.
func TestAgentStoppedMidCreate(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "crash1")
	cases := []struct {
		name string
		// stopAfter returns once the first agent should be stopped.
		stopAfter func(t *testing.T, in wire.Intent)
	}{
		{name: "StoppedAsTheIntentIsWritten", stopAfter: func(*testing.T, wire.Intent) {}},
		{name: "StoppedOnceTheBootVolumeExists", stopAfter: func(t *testing.T, in wire.Intent) {
			// The volume is made before the domain is defined, so stopping
			// now lands in the middle of the create (or just after it, on a
			// slow poll: the log says which).
			f.waitVolume(t, "crash1", in.Namespace+"_"+in.Machine.Disks[0].Name)
		}},
		{name: "Stopped5msIn", stopAfter: func(*testing.T, wire.Intent) { time.Sleep(5 * time.Millisecond) }},
	}
	want := map[string]bool{}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			first := f.start(t, f.config("crash1"))
			in := vm(fmt.Sprintf("crash%d", i))
			f.put(t, "crash1", in)
			tc.stopAfter(t, in)
			first.stop(t)
			// Where the first agent got to varies from run to run; the log
			// shows which paths a run took.
			// A stop waits for the Ensure in flight, so a started create is
			// finished; a crash (SIGKILL) is what could leave less behind.
			active, defined := f.guests(t, "crash1")[in.UID]
			t.Logf("the first agent left the guest defined=%t active=%t", defined, active)

			f.start(t, f.config("crash1"))
			f.waitReport(t, "crash1", in.UID, "Running", running(1))
			want[in.UID] = true
			assert.Equal(t, want, f.guests(t, "crash1"), "one domain per intent, no duplicate")
		})
	}
}

// TestLibvirtdRestart kills the node's libvirtd, which loses every guest (the
// test driver keeps no state), and starts it again: the agent reconnects,
// resyncs without waiting for its periodic resync, and recreates the guest.
func TestLibvirtdRestart(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "restart1")
	cfg := f.config("restart1")
	cfg.ResyncInterval = time.Hour // so only the reconnect can trigger the resync
	f.start(t, cfg)
	in := vm("survivor")
	f.put(t, "restart1", in)
	f.waitReport(t, "restart1", in.UID, "Running", running(1))

	start := time.Now()
	require.NoError(t, f.hosts["restart1"].Restart(context.Background()))
	require.Empty(t, f.guests(t, "restart1"), "a restarted test driver starts empty")
	require.Eventually(t, func() bool { return f.guests(t, "restart1")[in.UID] },
		waitFor, 10*time.Millisecond, "the agent must recreate and start the guest on the new daemon")
	t.Logf("guest recreated and running %s after libvirtd was killed", time.Since(start))

	r := f.waitReport(t, "restart1", in.UID, "Running", running(1))
	assert.Equal(t, in.UID, r.ID)
	assert.Len(t, f.guests(t, "restart1"), 1)
}

// TestBadIntentsFail sends intents that cannot succeed next to a good one:
// each bad one ends as a Failed report whose message tells the user what to
// change, and the good one still runs.
func TestBadIntentsFail(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "bad1")
	f.start(t, f.config("bad1"))
	good := vm("good")
	f.put(t, "bad1", good)

	cases := []struct {
		name    string
		change  func(in *wire.Intent)
		message string
	}{
		{
			name:    "UnknownNetworkWithoutCIDR",
			change:  func(in *wire.Intent) { in.Machine.Networks = []wire.Network{{Name: "net-nowhere"}} },
			message: "has no cidr to create it from",
		},
		{
			name:    "VolumeBiggerThanThePool",
			change:  func(in *wire.Intent) { in.Machine.Disks[0].SizeBytes = 200 << 30 },
			message: "bytes free",
		},
		{
			name:    "MoreVCPUsThanTheHost",
			change:  func(in *wire.Intent) { in.Machine.VCPU = 64 },
			message: "more than the 16 CPUs of node bad1",
		},
		{
			name:    "NoDisks",
			change:  func(in *wire.Intent) { in.Machine.Disks = nil },
			message: "machine.disks is empty, need a boot disk",
		},
	}
	bad := map[string]wire.Intent{}
	for _, tc := range cases {
		in := vm("bad")
		tc.change(&in)
		f.put(t, "bad1", in)
		bad[tc.name] = in
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := bad[tc.name]
			r := f.waitReport(t, "bad1", in.UID, "Failed", phase(wire.PhaseFailed, 1))
			assert.Contains(t, r.Message, tc.message)
			t.Logf("message: %s", r.Message)
			assert.NotContains(t, f.guests(t, "bad1"), in.UID, "a failed intent leaves no domain")
		})
	}
	t.Run("TheGoodGuestStillRuns", func(t *testing.T) {
		f.waitReport(t, "bad1", good.UID, "Running", running(1))
		assert.Equal(t, map[string]bool{good.UID: true}, f.guests(t, "bad1"))
	})
}

// TestHeartbeat reads the node's heartbeat as the hub does: it offers the
// host's capacity times the allocation ratios, counts the agent's guests, and
// ages out once the agent stops.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	f := newFleet(t, ttl, "hb1")
	cfg := f.config("hb1")
	cfg.CPUAllocationRatio, cfg.MemoryAllocationRatio = 4, 2
	agent := f.start(t, cfg)
	for _, name := range []string{"a", "b"} {
		in := vm(name)
		f.put(t, "hb1", in)
		f.waitReport(t, "hb1", in.UID, "Running", running(1))
	}

	var hb wire.NodeHeartbeat
	require.Eventually(t, func() bool {
		e, err := f.nodes.Get(context.Background(), "hb1")
		if err != nil {
			return false
		}
		hb, err = wire.DecodeNodeHeartbeat(e.Value())
		require.NoError(t, err)
		return hb.Allocated.VCPU == 4
	}, waitFor, 50*time.Millisecond, "a heartbeat counting both guests")

	l, err := f.hosts["hb1"].Dial()
	require.NoError(t, err)
	_, hostKiB, hostCPUs, _, _, _, _, _, err := l.NodeGetInfo()
	require.NoError(t, err)
	require.NoError(t, l.Disconnect())
	assert.Equal(t, wire.Resources{VCPU: int64(hostCPUs) * 4, MemoryBytes: int64(hostKiB) << 10 * 2}, hb.Capacity, "host capacity times the ratios")
	assert.Equal(t, wire.Resources{VCPU: 4, MemoryBytes: 1 << 30}, hb.Allocated, "two guests of 2 vCPUs and 512 MiB")
	assert.Equal(t, "libvirt", hb.Backend)
	assert.Equal(t, "test", hb.Hypervisor, "the domain type guests get on this host")
	assert.Equal(t, map[string]string{"zone": "test"}, hb.Labels)
	assert.Equal(t, version.Get(), hb.AgentVersion, "the agent reports its own version")
	assert.Equal(t, wire.ProtocolVersion, hb.ProtocolVersion)

	agent.stop(t)
	stopped := time.Now()
	require.Eventually(t, func() bool {
		_, err := f.nodes.Get(context.Background(), "hb1")
		return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
	}, ttl+5*time.Second, 50*time.Millisecond, "the heartbeat must age out after the agent stops")
	t.Logf("heartbeat purged %s after the agent stopped (bucket TTL %s)", time.Since(stopped), ttl)
}

// TestNodesAreIsolated runs two agents on two nodes: each makes only its own
// node's guests, on its own libvirtd, and reports only under its own node.
func TestNodesAreIsolated(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "iso1", "iso2")
	f.start(t, f.config("iso1"))
	f.start(t, f.config("iso2"))
	in1, in2 := vm("one"), vm("two")
	f.put(t, "iso1", in1)
	f.put(t, "iso2", in2)

	r1 := f.waitReport(t, "iso1", in1.UID, "Running", running(1))
	r2 := f.waitReport(t, "iso2", in2.UID, "Running", running(1))
	assert.Equal(t, "iso1", r1.Node)
	assert.Equal(t, "iso2", r2.Node)
	assert.Equal(t, map[string]bool{in1.UID: true}, f.guests(t, "iso1"))
	assert.Equal(t, map[string]bool{in2.UID: true}, f.guests(t, "iso2"))
	_, found := f.report(t, "iso1", in2.UID)
	assert.False(t, found, "iso1 must not report iso2's guest")
	_, found = f.report(t, "iso2", in1.UID)
	assert.False(t, found, "iso2 must not report iso1's guest")
}

// TestRunRefusesBadConfiguration checks that the agent refuses to start,
// naming the setting, instead of running half-configured.
func TestRunRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "cfg1")
	clouds := filepath.Join(t.TempDir(), "clouds.yaml")
	y, err := yaml.Marshal(map[string]any{"clouds": map[string]any{"lab": map[string]any{"auth": map[string]string{"auth_url": "http://127.0.0.1:1/v3"}}}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(clouds, y, 0o600))
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	novaBackend := func(cfg nova.Config) func(c *app.Config) {
		return func(c *app.Config) { c.Backend, c.Nova = driver.BackendNova, cfg }
	}
	cases := []struct {
		name    string
		change  func(c *app.Config)
		message string
	}{
		{name: "NoNode", change: func(c *app.Config) { c.Node = "" }, message: "--node"},
		{name: "NodeLongerThanAKubernetesName", change: func(c *app.Config) { c.Node = strings.Repeat("a", wire.MaxNodeNameLen+1) }, message: "--node"},
		{name: "NoNATS", change: func(c *app.Config) { c.NATSURLs = nil }, message: "--nats-url"},
		{name: "NoSeed", change: func(c *app.Config) { c.Seed = nil }, message: "--nats-credentials"},
		{name: "SeedThatIsNotOne", change: func(c *app.Config) { c.Seed = []byte("SUnotaseed") }, message: "--nats-credentials"},
		{name: "UnknownBackend", change: func(c *app.Config) { c.Backend = "xen" }, message: `unknown backend "xen"`},
		{name: "LibvirtdUnreachable", change: func(c *app.Config) { c.Libvirt.Socket = "/nonexistent/libvirt-sock" }, message: "cannot reach libvirtd"},
		{name: "NovaCloudsFileMissing", change: novaBackend(nova.Config{CloudsFile: "/nonexistent/clouds.yaml", Cloud: "lab"}), message: "--openstack-clouds-file"},
		{name: "NovaUnknownCloud", change: novaBackend(nova.Config{CloudsFile: clouds, Cloud: "elsewhere"}), message: `--openstack-cloud: no cloud "elsewhere"`},
		{name: "MetricsAddressTaken", change: func(c *app.Config) { c.MetricsAddress = taken.Addr().String() }, message: "--metrics-bind-address"},
		{name: "NegativeFenceAfter", change: func(c *app.Config) { c.FenceAfter = -time.Second }, message: "--fence-after must not be negative"},
		{name: "FenceAfterWithinTwoHeartbeats", change: func(c *app.Config) { c.FenceAfter, c.HeartbeatInterval = 3*time.Second, 2*time.Second }, message: "--fence-after 3s is shorter than twice --heartbeat-interval 2s"},
		{name: "SharedPoolNotAName", change: func(c *app.Config) { c.SharedPools = []string{"nfs-a", "nfs/b"} }, message: `--shared-pools: invalid pool "nfs/b"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config("cfg1")
			tc.change(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := app.Run(ctx, cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.message)
			assert.NotContains(t, err.Error(), string(f.ids["cfg1"].Seed), "errors never quote the seed")
		})
	}
}
