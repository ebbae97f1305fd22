package placementgroup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
)

// within bounds every wait: a status write takes well under it.
const within = 30 * time.Second

// TestStatusShowsWhereTheGroupsVMsAreAndWhetherThePolicyHolds walks a
// group through VMs joining it, against a real API server and nodes whose
// heartbeats label them with their rack: each step pins the VMs, nodes
// and domains the status shows and its Satisfied condition.
func TestStatusShowsWhereTheGroupsVMsAreAndWhetherThePolicyHolds(t *testing.T) {
	e := controllertest.Start(t, []string{"node-a", "node-b", "node-c"}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		return Setup(mgr, o, e.Pool.Fleets)
	})
	for node, rack := range map[string]string{"node-a": "r1", "node-b": "r1", "node-c": "r2"} {
		e.Fleet.Agent(node).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Labels: map[string]string{"rack": rack}, Capacity: wire.Resources{VCPU: 64, MemoryBytes: 1 << 40}})
	}
	ns := e.Namespace(t)
	pg := &v1alpha1.PlacementGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec:       v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity, TopologyKey: "rack"},
	}
	require.NoError(t, e.Kube.Create(e.Ctx, pg))
	group := v1alpha1.LocalName("web")
	join := func(name, node string, sealed bool) {
		vm := e.VM(t, ns, name, node, sealed, v1alpha1.PhaseRunning)
		vm.Spec.ForProvider.PlacementGroup = &group
		require.NoError(t, e.Kube.Update(e.Ctx, vm))
	}
	type vm = v1alpha1.PlacementGroupVM
	for _, step := range []struct {
		name            string
		change          func()
		vms             []vm
		placed, domains int32
		satisfied       metav1.ConditionStatus
		message         string
	}{
		{name: "a group no VM names holds", change: func() {},
			satisfied: metav1.ConditionTrue, message: "0 of 0 VMs placed, in 0 domains"},
		{name: "two VMs in two racks hold",
			change: func() { join("web-1", "node-a", true); join("web-2", "node-c", true) },
			vms:    []vm{{Name: "web-1", Node: "node-a", Domain: "rack=r1"}, {Name: "web-2", Node: "node-c", Domain: "rack=r2"}},
			placed: 2, domains: 2,
			satisfied: metav1.ConditionTrue, message: "2 of 2 VMs placed, in 2 domains, as the AntiAffinity policy asks"},
		{name: "a VM not placed yet is listed with no node",
			change: func() { join("web-3", "", false) },
			vms:    []vm{{Name: "web-1", Node: "node-a", Domain: "rack=r1"}, {Name: "web-2", Node: "node-c", Domain: "rack=r2"}, {Name: "web-3"}},
			placed: 2, domains: 2,
			satisfied: metav1.ConditionTrue, message: "1 not placed yet"},
		// A tenant writes the node annotation of its own VM by hand,
		// hoping the group reports it placed on node-b: the hub never put
		// it there (no seal), so it is on no node.
		{name: "a node annotation a tenant wrote places no VM",
			change: func() { join("web-4", "node-b", false) },
			vms:    []vm{{Name: "web-1", Node: "node-a", Domain: "rack=r1"}, {Name: "web-2", Node: "node-c", Domain: "rack=r2"}, {Name: "web-3"}, {Name: "web-4"}},
			placed: 2, domains: 2,
			satisfied: metav1.ConditionTrue, message: "2 not placed yet"},
		{name: "a VM sharing a rack breaks the policy, named",
			change: func() { join("web-5", "node-b", true) },
			vms:    []vm{{Name: "web-1", Node: "node-a", Domain: "rack=r1"}, {Name: "web-2", Node: "node-c", Domain: "rack=r2"}, {Name: "web-3"}, {Name: "web-4"}, {Name: "web-5", Node: "node-b", Domain: "rack=r1"}},
			placed: 3, domains: 2,
			satisfied: metav1.ConditionFalse, message: "the AntiAffinity policy does not hold: web-1, web-5 share rack=r1"},
		{name: "without a topology key each node is a domain",
			change: func() {
				e.Get(t, pg)
				pg.Spec.TopologyKey = ""
				require.NoError(t, e.Kube.Update(e.Ctx, pg))
			},
			vms:    []vm{{Name: "web-1", Node: "node-a", Domain: "node node-a"}, {Name: "web-2", Node: "node-c", Domain: "node node-c"}, {Name: "web-3"}, {Name: "web-4"}, {Name: "web-5", Node: "node-b", Domain: "node node-b"}},
			placed: 3, domains: 3,
			satisfied: metav1.ConditionTrue, message: "3 of 5 VMs placed, in 3 domains"},
		{name: "affinity over three nodes does not hold, each named",
			change: func() {
				e.Get(t, pg)
				pg.Spec.Policy = v1alpha1.PlacementAffinity
				require.NoError(t, e.Kube.Update(e.Ctx, pg))
			},
			vms:    []vm{{Name: "web-1", Node: "node-a", Domain: "node node-a"}, {Name: "web-2", Node: "node-c", Domain: "node node-c"}, {Name: "web-3"}, {Name: "web-4"}, {Name: "web-5", Node: "node-b", Domain: "node node-b"}},
			placed: 3, domains: 3,
			satisfied: metav1.ConditionFalse, message: "the Affinity policy does not hold: web-1 in node node-a; web-5 in node node-b; web-2 in node node-c"},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.change()
			controllertest.Await(t, e, pg, within, func(c *assert.CollectT, got *v1alpha1.PlacementGroup) {
				assert.Equal(c, step.vms, got.Status.VMs)
				assert.Equal(c, step.placed, got.Status.Placed)
				assert.Equal(c, step.domains, got.Status.Domains)
				require.Len(c, got.Status.Conditions, 1)
				cond := got.Status.Conditions[0]
				assert.Equal(c, v1alpha1.PlacementGroupSatisfied, cond.Type)
				assert.Equal(c, step.satisfied, cond.Status)
				assert.Contains(c, cond.Message, step.message)
				assert.Equal(c, got.Generation, cond.ObservedGeneration)
			})
		})
	}
}
