package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestNATSClusterLosesAServer runs NATS as a cluster of three nats-server
// processes with every bucket replicated on all three (R3), and kills one
// server with SIGKILL after another — the JetStream meta leader first —
// during a burst of 100 VMs, each server back and caught up before the
// next goes. Every VM ends Running, every intent is in the bucket, and no
// guest exists twice. About 2.5 minutes on 2 shared cores, 70 s of it the
// stack's start.
func TestNATSClusterLosesAServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	const vms = 100
	start := time.Now()
	h := startStack(t, "vf-natsc-", stack.Options{NATSCluster: 3, MemoryAllocationRatio: 16})
	ctx := context.Background()
	t.Logf("stack with a 3-server NATS cluster up after %s", time.Since(start))

	leader, err := h.s.NATSMetaLeader(ctx)
	require.NoError(t, err)
	order := []int{leader}
	for i := range h.s.NATSServers() {
		if i != leader {
			order = append(order, i)
		}
	}

	countRunning := func() int {
		l := &v1alpha1.VirtualMachineList{}
		if err := h.kube.List(ctx, l); err != nil {
			return 0
		}
		n := 0
		for i := range l.Items {
			if running(&l.Items[i]) {
				n++
			}
		}
		return n
	}

	// The burst comes in one wave per server, each created the moment its
	// server is killed, so that every kill lands in the middle of creates,
	// placements, intents and reports.
	burst := time.Now()
	name := func(i int) string { return fmt.Sprintf("burst-%03d", i) }
	for round, i := range order {
		from, to := round*vms/len(order), (round+1)*vms/len(order)
		h.s.KillNATSServer(i)
		for j := from; j < to; j++ {
			h.create(t, volume(name(j)))
			h.create(t, imageVM(name(j), name(j)))
		}
		require.Eventually(t, func() bool { return countRunning() >= to }, 3*time.Minute, 200*time.Millisecond,
			"the VMs created with nats-server %d down come up (want %d Running)", i, to)
		t.Logf("nats-server %d killed; %d VMs Running %s into the burst", i, countRunning(), time.Since(burst))
		require.NoError(t, h.s.StartNATSServer(i))
		require.Eventually(t, func() bool { return h.s.NATSServerHealthy(ctx, i) }, 2*time.Minute, 200*time.Millisecond,
			"nats-server %d catches up after its restart", i)
	}
	require.Eventually(t, func() bool { return countRunning() == vms }, 5*time.Minute, 500*time.Millisecond, "every VM Running")
	t.Logf("all %d VMs Running %s after the burst began", vms, time.Since(burst))

	id := h.s.HubIdentity()
	opts, err := id.ConnectOptions()
	require.NoError(t, err)
	nc, err := nats.Connect(h.s.NATSURL(), opts...)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	intents, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)
	status, err := intents.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, status.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas, "the buckets are replicated on every server")

	guests := map[string]int{}
	for _, n := range []string{"node1", "node2", "node3"} {
		for uid, c := range h.domains(t, n) {
			guests[uid] += c
		}
	}
	for i := range vms {
		vm := &v1alpha1.VirtualMachine{}
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name(i)}, vm))
		key, err := wire.GuestIntents.Key(vm.Status.AtProvider.Node, string(vm.UID))
		require.NoError(t, err)
		_, err = intents.Get(ctx, key)
		assert.NoError(t, err, "the intent of %s is in the bucket", vm.Name)
		assert.Equal(t, 1, guests[string(vm.UID)], "exactly one guest of %s", vm.Name)
	}
	t.Logf("whole test %s", time.Since(start))
}
