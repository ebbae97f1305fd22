package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestPlacementGroups spreads the replicas of an application over three
// simulated nodes with a required anti-affinity group, through the
// Kubernetes API alone: each lands on a node of its own, though one node
// is much emptier than the others, a fourth stays Pending naming the rule,
// and takes the node one of the others leaves.
func TestPlacementGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	h := startStack(t, "vf-groups-", stack.Options{Nodes: []string{"sim-1", "sim-2", "sim-3"}, Simulated: true, SimulatedHost: stack.SimulatedHost{VCPUs: 16, MemoryBytes: 8 << 30}})
	// Half of sim-2 and sim-3 are taken, so that placement by how full
	// the nodes are alone would put every replica on sim-1.
	for _, node := range []string{"sim-2", "sim-3"} {
		name := "filler-" + node
		h.create(t, volume(name+"-root"))
		vm := vmWith(name, name+"-root")
		vm.Spec.ForProvider.VirtualNetworks = nil
		vm.Spec.ForProvider.Memory = resource.MustParse("4Gi")
		vm.Annotations = map[string]string{v1alpha1.AnnotationNode: node}
		h.create(t, vm)
		h.wait(t, name, time.Minute, running)
		require.Eventually(t, func() bool {
			n := &v1alpha1.HypervisorNode{}
			return h.kube.Get(context.Background(), types.NamespacedName{Name: node}, n) == nil && n.Status.Allocated.Memory.Cmp(vm.Spec.ForProvider.Memory) >= 0
		}, time.Minute, 100*time.Millisecond, "node %s counts %s", node, name)
	}
	h.create(t, &v1alpha1.PlacementGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec:       v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity},
	})
	replica := func(name string) {
		h.create(t, volume(name+"-root"))
		vm := vmWith(name, name+"-root")
		vm.Spec.ForProvider.VirtualNetworks = nil
		vm.Spec.ForProvider.PlacementGroup = ptr(v1alpha1.LocalName("web"))
		h.create(t, vm)
	}

	nodes := map[string]string{}
	t.Run("EachReplicaRunsOnANodeOfItsOwn", func(t *testing.T) {
		for _, name := range []string{"web-0", "web-1", "web-2"} {
			replica(name)
		}
		for _, name := range []string{"web-0", "web-1", "web-2"} {
			node := h.wait(t, name, time.Minute, running).Status.AtProvider.Node
			assert.NotContains(t, nodes, node, "%s shares node %s with %s", name, node, nodes[node])
			nodes[node] = name
		}
	})

	t.Run("AFourthStaysPendingNamingTheRule", func(t *testing.T) {
		replica("web-3")
		vm := h.wait(t, "web-3", time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
			return strings.Contains(vm.GetCondition(xpv2.TypeReady).Message, "placement group web (anti-affinity) has a VM in node")
		})
		assert.Empty(t, vm.Status.AtProvider.Node)
		assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
	})

	t.Run("ItTakesTheNodeAReplicaLeaves", func(t *testing.T) {
		require.Len(t, nodes, 3)
		freed := h.get(t, "web-1").Status.AtProvider.Node
		h.delete(t, "web-1")
		vm := h.wait(t, "web-3", time.Minute, running)
		assert.Equal(t, freed, vm.Status.AtProvider.Node)
	})
}
