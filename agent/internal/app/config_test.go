package app

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/version"
)

// TestHeartbeatNext pins what the hub's placement is offered, including while
// the backend does not answer.
func TestHeartbeatNext(t *testing.T) {
	ctx := context.Background()
	drv := fake.New("n1")
	drv.Host = driver.Capacity{VCPU: 16, MemoryBytes: 3 << 30}
	_, err := drv.Ensure(ctx, driver.Machine{UID: "u1", Namespace: "default", Name: "vm-1", Disks: []driver.Disk{{Name: "root"}}, VCPU: 3, MemoryBytes: 512 << 20, Running: true})
	require.NoError(t, err)
	cfg := Config{Node: "n1", Labels: map[string]string{"zone": "a"}, CPUAllocationRatio: 2.5, MemoryAllocationRatio: 1.5}
	cfg.defaults()
	h := &heartbeat{cfg: cfg, driver: drv, log: logging.NewNopLogger()}
	used := wire.Resources{VCPU: 3, MemoryBytes: 512 << 20}

	steps := []struct {
		name      string
		capErr    error
		capacity  wire.Resources
		allocated wire.Resources
	}{
		{name: "CapacityIsTheHostTimesTheRatios", capacity: wire.Resources{VCPU: 40, MemoryBytes: 4831838208}, allocated: used},
		{name: "ABackendThatDoesNotAnswerOffersNothingButKeepsItsAllocation", capErr: errors.New("cannot reach libvirtd"), allocated: used},
		{name: "ItOffersCapacityAgainOnceTheBackendAnswers", capacity: wire.Resources{VCPU: 40, MemoryBytes: 4831838208}, allocated: used},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			drv.NextCapacityErr = s.capErr
			hb := h.next(ctx)
			assert.Equal(t, s.capacity, hb.Capacity)
			assert.Equal(t, s.allocated, hb.Allocated)
			assert.Equal(t, "n1", hb.Node)
			assert.Equal(t, driver.BackendLibvirt, hb.Backend)
			assert.Equal(t, map[string]string{"zone": "a"}, hb.Labels)
			assert.Equal(t, version.Get(), hb.AgentVersion, "the agent reports its own version")
			assert.False(t, hb.SentAt.IsZero())
		})
	}
}

// TestHeartbeatAnnouncesSnapshots: the hub sends snapshot intents and
// restores only to a node whose heartbeat says its backend keeps
// snapshots.
func TestHeartbeatAnnouncesSnapshots(t *testing.T) {
	cases := map[string]struct {
		driver driver.Driver
		want   bool
	}{
		"ABackendThatKeepsSnapshots":  {driver: fake.New("n1"), want: true},
		"ABackendThatKeepsNoneSaysNo": {driver: struct{ driver.Driver }{fake.New("n1")}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Node: "n1"}
			cfg.defaults()
			h := &heartbeat{cfg: cfg, driver: tc.driver, log: logging.NewNopLogger()}
			assert.Equal(t, tc.want, h.next(t.Context()).Snapshots)
		})
	}
}

// hangingCapacity is a backend whose capacity reads wait for release, as
// libvirtd's do while it hangs on a storage pool.
type hangingCapacity struct {
	*fake.Driver
	release chan struct{}
	reads   atomic.Int32
}

func (h *hangingCapacity) Capacity(ctx context.Context) (driver.Capacity, error) {
	h.reads.Add(1)
	<-h.release
	return h.Driver.Capacity(ctx)
}

// TestHeartbeatDoesNotWaitForAHangingBackend: a heartbeat goes out within
// its interval while the backend hangs, offering nothing, and the read
// under way is awaited by the next heartbeat rather than asked again.
func TestHeartbeatDoesNotWaitForAHangingBackend(t *testing.T) {
	ctx := context.Background()
	drv := &hangingCapacity{Driver: fake.New("n1"), release: make(chan struct{})}
	drv.Host = driver.Capacity{VCPU: 4, MemoryBytes: 1 << 30}
	cfg := Config{Node: "n1", HeartbeatInterval: 20 * time.Millisecond}
	cfg.defaults()
	h := &heartbeat{cfg: cfg, driver: drv, log: logging.NewNopLogger()}
	next := func() wire.NodeHeartbeat {
		t.Helper()
		out := make(chan wire.NodeHeartbeat, 1)
		go func() { out <- h.next(ctx) }()
		select {
		case hb := <-out:
			return hb
		case <-time.After(time.Minute):
			t.Fatal("the heartbeat waits for the backend")
			return wire.NodeHeartbeat{}
		}
	}

	for range 2 {
		hb := next()
		assert.Zero(t, hb.Capacity, "a backend that does not answer offers nothing")
		assert.Equal(t, "n1", hb.Node)
	}
	assert.Equal(t, int32(1), drv.reads.Load(), "a read under way is asked again")
	close(drv.release)
	require.Eventually(t, func() bool { return next().Capacity.VCPU > 0 }, 10*time.Second, time.Millisecond,
		"the backend answers and the heartbeat never offers its capacity")
	assert.Equal(t, int32(1), drv.reads.Load(), "the heartbeat asked again instead of using the answer of the read under way")
}

func TestParseList(t *testing.T) {
	for in, want := range map[string][]string{
		"":               nil,
		"nfs-a":          {"nfs-a"},
		" nfs-a , ceph,": {"nfs-a", "ceph"},
		",,":             nil,
	} {
		assert.Equal(t, want, ParseList(in), "%q", in)
	}
}

func TestDefaults(t *testing.T) {
	var c Config
	c.defaults()
	assert.Equal(t, DefaultCPUAllocationRatio, c.CPUAllocationRatio)
	assert.Equal(t, 1.0, c.MemoryAllocationRatio, "memory is not overcommitted unless asked")
	assert.Equal(t, driver.BackendLibvirt, c.Backend)
	assert.Equal(t, 8, c.Workers)
}

func TestParseLabels(t *testing.T) {
	cases := []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{in: "", want: map[string]string{}},
		{in: "zone=a,rack=r1", want: map[string]string{"zone": "a", "rack": "r1"}},
		{in: " zone = a , ,gpu=", want: map[string]string{"zone": "a", "gpu": ""}},
		{in: "zone", wantErr: `"zone" is not key=value`},
		{in: "=a", wantErr: "is not key=value"},
		{in: "zone=a,zone=b", wantErr: "given twice"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseLabels(tc.in)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestReadSeed(t *testing.T) {
	id, err := natswire.NewAgentIdentity("n1")
	require.NoError(t, err)
	account, err := nkeys.CreateAccount()
	require.NoError(t, err)
	accountSeed, err := account.Seed()
	require.NoError(t, err)

	cases := []struct {
		name    string
		content []byte
		wantErr string
	}{
		// What hack/mint-agent-credentials writes: the bare seed.
		{name: "MintedSeed", content: id.Seed},
		{name: "SeedWithATrailingNewline", content: append(append([]byte{}, id.Seed...), '\n')},
		{name: "Garbage", content: []byte("not a seed\n"), wantErr: "holds no user nkey seed"},
		{name: "AnAccountSeedIsNotAUsers", content: accountSeed, wantErr: "holds no user nkey seed"},
		{name: "Missing", wantErr: "cannot read NATS credentials"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "n1.nk")
			if tc.content != nil {
				require.NoError(t, os.WriteFile(path, tc.content, 0o600))
			}
			seed, err := ReadSeed(path)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.NotContains(t, err.Error(), string(accountSeed), "errors never quote a seed")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, id.Seed, seed)
		})
	}
}
