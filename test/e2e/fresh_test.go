package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestAFreshInstallComesUpByItself starts the stack as a fresh install:
// nothing but the hub creates the buckets, which it does as it connects to
// the default ClusterProviderConfig's NATS at its start, so the agents
// heartbeat before any VM exists (the stack only waits for that). The first
// 30 VMs, created at once, are then placed evenly over every node, and
// kubectl shows each node by its real, dotted name.
func TestAFreshInstallComesUpByItself(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	const vms = 30
	nodes := []string{"node-1.rack-a.example.com", "node-2.rack-a.example.com", "node-3.rack-b.example.com"}
	start := time.Now()
	h := startStack(t, "vf-fresh-", stack.Options{Nodes: nodes})
	t.Logf("stack up, every agent heartbeating, after %s", time.Since(start))

	created := time.Now()
	for i := range vms {
		name := fmt.Sprintf("fresh-%02d", i)
		h.create(t, volume(name))
		h.create(t, imageVM(name, name))
	}
	for i := range vms {
		h.wait(t, fmt.Sprintf("fresh-%02d", i), 3*time.Minute, running)
	}
	t.Logf("%d VMs Running %s after their creation", vms, time.Since(created))

	k := kubectl{t: t, path: h.s.ControlPlane.Kubectl, kubeconfig: h.s.ControlPlane.Kubeconfig}
	perNode := map[string]int{}
	for _, line := range k.lines("get", "vm", "-o", "wide", "--no-headers") {
		// NAME STATUS RESTARTS AGE NODE NETWORKS(IP) READY SYNCED; no networks here.
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 5, "kubectl line %q", line)
		perNode[f[4]]++
	}
	t.Logf("VMs per node: %v", perNode)
	for _, n := range nodes {
		assert.InDelta(t, vms/len(nodes), perNode[n], 1, "node %s has its share of the first VMs", n)
	}
	assert.Len(t, perNode, len(nodes), "NODE shows only the nodes' real names")
}
