package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/app"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// waitFor bounds every wait for a simulated node; in-memory guests converge
// in milliseconds, the margin is for -race on two cores.
const waitFor = 20 * time.Second

// TestSimulatedNodesAreAgentsOnTheRealWire runs three simulated nodes
// against a real nats-server, each with only its own credentials, and
// drives them as the hub does: every node heartbeats under its own name
// and labels, runs the guest of an intent put under its own key with the
// address the hub allocated, reports it under its own key, and deletes it
// with its report when the intent goes.
func TestSimulatedNodesAreAgentsOnTheRealWire(t *testing.T) {
	nodes := []string{"sim1", "sim2", "sim3"}
	srv, js, ids := natstest.NewFleet(t, natswire.BucketConfig{}, nodes...)
	ctx := context.Background()
	kv := func(name string) jetstream.KeyValue {
		b, err := js.KeyValue(ctx, name)
		require.NoError(t, err)
		return b
	}
	intents, reports, heartbeats := kv(wire.BucketIntents), kv(wire.BucketReports), kv(wire.BucketNodes)

	dir := t.TempDir()
	for n, id := range ids {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n+".nk"), id.Seed, 0o600))
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- serve(sctx, fleet{
			Nodes: nodes, CredentialsDir: dir, NATSURLs: []string{srv.URL()},
			Labels: map[string]string{"zone": "sim"}, HostVCPUs: 8, HostMemory: 16 << 30,
			Node: app.Config{HeartbeatInterval: 200 * time.Millisecond, RequestTimeout: time.Second},
			Log:  logging.NewNopLogger(),
		})
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
			<-done
		}
	})

	for _, n := range nodes {
		t.Run("HeartbeatOf"+n, func(t *testing.T) {
			var hb wire.NodeHeartbeat
			require.Eventually(t, func() bool {
				e, err := heartbeats.Get(ctx, n)
				if err != nil {
					return false
				}
				hb, err = wire.DecodeNodeHeartbeat(e.Value())
				return err == nil
			}, waitFor, 20*time.Millisecond)
			assert.Equal(t, n, hb.Node)
			assert.Equal(t, map[string]string{"zone": "sim", hostnameLabel: n}, hb.Labels)
			assert.Equal(t, int64(8*app.DefaultCPUAllocationRatio), hb.Capacity.VCPU, "the host's CPUs times the allocation ratio")
			assert.Equal(t, int64(16<<30), hb.Capacity.MemoryBytes)
		})
	}

	for i, n := range nodes {
		t.Run("GuestOf"+n, func(t *testing.T) {
			address := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)}), 24)
			in := wire.Intent{
				ProtocolVersion: wire.ProtocolVersion,
				UID:             uuid.NewString(), Namespace: "team-a", Name: "vm-" + n, Generation: 1, Running: true,
				Machine: wire.Machine{
					VCPU: 1, MemoryBytes: 64 << 20,
					Disks:    []wire.Disk{{Name: "root-" + n, SizeBytes: 1 << 20}},
					Networks: []wire.Network{{Name: "lan", CIDR: "10.0.0.0/24", Mode: "nat", Address: address.String()}},
				},
			}
			key, err := wire.GuestIntents.Key(n, in.UID)
			require.NoError(t, err)
			b, err := wire.EncodeIntent(in)
			require.NoError(t, err)
			_, err = intents.Put(ctx, key, b)
			require.NoError(t, err)

			reportKey, err := wire.GuestReports.Key(n, in.UID)
			require.NoError(t, err)
			var rep wire.Report
			require.Eventually(t, func() bool {
				e, err := reports.Get(ctx, reportKey)
				if err != nil {
					return false
				}
				rep, err = wire.DecodeReport(e.Value())
				return err == nil && rep.Phase == wire.PhaseRunning
			}, waitFor, 20*time.Millisecond, "the node reports its guest Running")
			assert.Equal(t, n, rep.Node)
			require.Len(t, rep.Interfaces, 1)
			assert.Equal(t, []string{address.Addr().String()}, rep.Interfaces[0].IPs, "the guest holds the address the hub allocated")

			require.NoError(t, intents.Delete(ctx, key))
			require.Eventually(t, func() bool {
				_, err := reports.Get(ctx, reportKey)
				return err != nil
			}, waitFor, 20*time.Millisecond, "the report goes with the guest")
		})
	}

	stop()
	stopped = true
	select {
	case err := <-done:
		require.NoError(t, err, "stopping the nodes is a clean exit")
	case <-time.After(waitFor):
		t.Fatal("the simulated nodes did not stop")
	}
}

// TestServeRefusesWhatCannotStart pins the errors serve returns before any
// node starts: each names the flag or the node to fix.
func TestServeRefusesWhatCannotStart(t *testing.T) {
	dir := t.TempDir()
	_, ids, _ := natstest.Identities(t, "sim1")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sim1.nk"), ids["sim1"].Seed, 0o600))
	cases := []struct {
		name string
		f    fleet
		want string
	}{
		{name: "NoNodes", f: fleet{CredentialsDir: dir}, want: "--nodes"},
		{name: "NoCredentialsDir", f: fleet{Nodes: []string{"sim1"}}, want: "--credentials-dir"},
		{name: "ANodeWithoutItsSeed", f: fleet{Nodes: []string{"sim1", "sim2"}, CredentialsDir: dir}, want: "node sim2"},
		{name: "MetricsOfSeveralNodes", f: fleet{Nodes: []string{"sim1", "sim1b"}, CredentialsDir: dir, MetricsAddress: "127.0.0.1:0"}, want: "--metrics-bind-address"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.f.NATSURLs, c.f.Log = []string{"nats://127.0.0.1:1"}, logging.NewNopLogger()
			err := serve(context.Background(), c.f)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// TestOneSimulatedNodeServesItsMetrics runs a single simulated node with a
// metrics address and reads its agent's metrics there, as the benchmark
// reads a real agent's.
func TestOneSimulatedNodeServesItsMetrics(t *testing.T) {
	srv, _, ids := natstest.NewFleet(t, natswire.BucketConfig{}, "sim1")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sim1.nk"), ids["sim1"].Seed, 0o600))
	port, err := freeport.Pick()
	require.NoError(t, err)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, fleet{
			Nodes: []string{"sim1"}, CredentialsDir: dir, NATSURLs: []string{srv.URL()},
			HostVCPUs: 8, HostMemory: 16 << 30, MetricsAddress: fmt.Sprintf("127.0.0.1:%d", port),
			Node: app.Config{HeartbeatInterval: 200 * time.Millisecond, RequestTimeout: time.Second},
			Log:  logging.NewNopLogger(),
		})
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get(url) //nolint:noctx // bounded by Eventually
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK
	}, waitFor, 50*time.Millisecond)
	assert.Contains(t, body, "virtfleet_agent_resync_duration_seconds")
}
