package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestAnOperatorSeesTheFleet drives a small fleet as an operator watches it:
// the hub's and the agents' metrics agree with what kubectl shows, and what
// stops work (an object the hub cannot decode, a node that stops) is named
// in the hub's log at the default level.
func TestAnOperatorSeesTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	h := startStack(t, "vf-ops-", stack.Options{})
	s := h.s
	k := kubectl{t: t, path: s.ControlPlane.Kubectl, kubeconfig: s.ControlPlane.Kubeconfig}
	ctx := context.Background()
	h.create(t, &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-db"},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: "10.10.120.0/24"}},
	})

	const burst = 12
	t.Run("MetricsAgreeWithKubectlAfterABurst", func(t *testing.T) {
		for i := range burst {
			name := fmt.Sprintf("ops-%02d", i)
			h.create(t, volume(name+"-disk"))
			h.create(t, vmWith(name, name+"-disk"))
		}
		for i := range burst {
			h.wait(t, fmt.Sprintf("ops-%02d", i), 3*time.Minute, running)
		}

		// What kubectl shows: each VM's phase and node.
		phases, perNode := map[string]int{}, map[string]int{}
		for _, line := range k.lines("get", "vm", "--no-headers", "-o", "custom-columns=PHASE:.status.atProvider.phase,NODE:.status.atProvider.node") {
			f := strings.Fields(line)
			require.Len(t, f, 2, "kubectl line %q", line)
			phases[f[0]]++
			perNode[f[1]]++
		}
		require.Equal(t, map[string]int{"Running": burst}, phases)

		hub := scrape(t, s.HubMetricsURL())
		got := map[string]int{}
		for _, m := range hub.series("virtfleet_hub_vms") {
			got[m.labels["phase"]] += int(m.value)
			assert.Equal(t, "libvirt", m.labels["backend"], "every node of this stack is a libvirt node")
		}
		assert.Equal(t, phases, got, "VMs by phase, as kubectl shows them")
		assert.Equal(t, uint64(burst), hub.histogramCount("virtfleet_hub_vm_create_to_running_seconds"), "one create→Running per VM")
		assert.Equal(t, uint64(burst), hub.histogramCount("virtfleet_hub_placement_duration_seconds"), "one placement per VM")

		for _, node := range []string{"node1", "node2", "node3"} {
			assert.Equal(t, 1.0, hub.value("virtfleet_hub_node_ready", "node", node), "%s is ready", node)
			assert.Equal(t, float64(perNode[node]), hub.value("virtfleet_hub_node_vms", "node", node), "VMs on %s", node)
			hb, err := s.Heartbeat(ctx, node)
			require.NoError(t, err)
			assert.Equal(t, float64(hb.Capacity.VCPU), hub.value("virtfleet_hub_node_capacity", "node", node, "resource", "vcpu"), "%s's vCPUs", node)
			assert.Equal(t, float64(hb.Capacity.MemoryBytes), hub.value("virtfleet_hub_node_capacity", "node", node, "resource", "memory"), "%s's memory", node)

			agent := scrape(t, s.AgentMetricsURL(node))
			assert.Equal(t, float64(perNode[node]), agent.value("virtfleet_agent_guests", "phase", "Running"), "guests %s's agent runs", node)
			assert.Positive(t, agent.histogramCount("virtfleet_agent_driver_call_duration_seconds"), "%s's agent timed its driver calls", node)
		}
	})

	t.Run("AnObjectTheHubCannotDecodeIsNamedInItsLog", func(t *testing.T) {
		// A CRD of another virtfleet version, say, that lets a memory
		// through which the hub's types cannot hold.
		scheme := runtime.NewScheme()
		require.NoError(t, apiextensionsv1.AddToScheme(scheme))
		admin, err := client.New(s.ControlPlane.Config, client.Options{Scheme: scheme})
		require.NoError(t, err)
		crd := &apiextensionsv1.CustomResourceDefinition{}
		require.NoError(t, admin.Get(ctx, types.NamespacedName{Name: "virtualmachines.compute.virtfleet.io"}, crd))
		original := crd.DeepCopy()
		memory := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["forProvider"].Properties["memory"]
		memory.Pattern, memory.XValidations = "", nil
		crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["forProvider"].Properties["memory"] = memory
		require.NoError(t, admin.Update(ctx, crd))
		restore := func() {
			now := &apiextensionsv1.CustomResourceDefinition{}
			require.NoError(t, admin.Get(ctx, types.NamespacedName{Name: crd.Name}, now))
			now.Spec = original.Spec
			require.NoError(t, admin.Update(ctx, now))
		}
		defer restore()

		bad := &unstructured.Unstructured{}
		bad.SetGroupVersionKind(v1alpha1.VirtualMachineGroupVersionKind)
		bad.SetNamespace(ns)
		bad.SetName("undecodable")
		require.NoError(t, unstructured.SetNestedMap(bad.Object, map[string]any{
			"vcpu": int64(1), "memory": "a lot", "virtualNetworks": []any{}, "diskAttachments": []any{map[string]any{"name": "nothing"}},
		}, "spec", "forProvider"))
		// The API server takes the loosened schema once its CRD handler
		// reloaded it.
		createErr := h.kube.Create(ctx, bad.DeepCopy())
		for deadline := time.Now().Add(30 * time.Second); createErr != nil && time.Now().Before(deadline); {
			time.Sleep(250 * time.Millisecond)
			createErr = h.kube.Create(ctx, bad.DeepCopy())
		}
		require.NoError(t, createErr)
		require.Eventually(t, func() bool {
			return logHas(t, s, "hub", "Cannot decode an object", `"name":"undecodable"`, `"kind":"VirtualMachine"`)
		}, 60*time.Second, 500*time.Millisecond, "the hub's log names the object it cannot decode")
		assertEventOn(t, h, "VirtualMachine", "undecodable", "Undecodable", "cannot decode") // and so does an event on it
		assert.Positive(t, scrape(t, s.HubMetricsURL()).value("virtfleet_hub_undecodable_objects_total", "kind", "VirtualMachine"))

		// Deleted, the hub sees VirtualMachines again.
		require.NoError(t, h.kube.Delete(ctx, bad))
		restore()
		h.create(t, volume("after-disk"))
		h.create(t, vmWith("after", "after-disk"))
		h.wait(t, "after", 2*time.Minute, running)
	})

	t.Run("ANodeThatStopsIsNamedInTheLogAndTheMetrics", func(t *testing.T) {
		s.KillAgent("node3")
		require.Eventually(t, func() bool {
			return logHas(t, s, "hub", "Node lost", `"node":"node3"`)
		}, 30*time.Second, 500*time.Millisecond, "the hub's log names the lost node")
		assert.Equal(t, 0.0, scrape(t, s.HubMetricsURL()).value("virtfleet_hub_node_ready", "node", "node3"))
		require.NoError(t, s.StartAgent("node3"))
		require.Eventually(t, func() bool {
			return scrape(t, s.HubMetricsURL()).value("virtfleet_hub_node_ready", "node", "node3") == 1
		}, 30*time.Second, 500*time.Millisecond, "node3 is ready again")
	})
}

// logHas is whether one line of component's log holds every part.
func logHas(t *testing.T, s *stack.Stack, component string, parts ...string) bool {
	t.Helper()
	raw, err := os.ReadFile(s.LogPath(component))
	require.NoError(t, err)
	for _, line := range strings.Split(string(raw), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
