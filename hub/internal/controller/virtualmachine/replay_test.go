package virtualmachine

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// TestASealIsNotReplayedOntoALaterBinding pins that a VM's binding
// annotations copied back from an earlier binding, seal and all, bind the
// VM nowhere new: the VM stays on the node of its newest binding, its
// guest's intent there is kept, and the hub writes that binding back.
//
// The attack, by a tenant with edit rights in its namespace:
//  1. kubectl get vm x -o yaml while the VM runs on node1, and keep the
//     compute.virtfleet.io/node, /binding-epoch and /seal annotations;
//  2. wait for the hub to move the VM to node2 (a live migration, an HA
//     restart);
//  3. kubectl annotate vm x --overwrite compute.virtfleet.io/node=node1
//     compute.virtfleet.io/binding-epoch=<kept> compute.virtfleet.io/seal=<kept>.
//
// Before, the seal of node1's binding was a true seal of the VM's uid and
// node1: the hub took the VM for bound to node1 again, counted it there,
// and its stray sweep deleted the intent on node2, and with it the
// running guest.
func TestASealIsNotReplayedOntoALaterBinding(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1", "node2"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	f := env.Fleet
	ns := env.Namespace(t)
	vm := env.VM(t, ns, "moved", "", false, v1alpha1.PhaseRunning)
	// bind does what the hub does on a placement or a move: seals the
	// binding, and its Observe records it in the VM's status.
	bind := func(node string) {
		t.Helper()
		require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) { f.Bind(vm, a, node, "") }))
		vm.Status.AtProvider.Binding = f.Binding(vm)
		require.NotNil(t, vm.Status.AtProvider.Binding, "the hub's binding is sealed")
		require.NoError(t, env.Kube.Status().Update(env.Ctx, vm))
	}
	bind("node1")
	earlier := maps.Clone(vm.GetAnnotations())
	bind("node2")
	_, err := bus.Put(env.Ctx, f.Bus, wire.GuestIntents, "node2", string(vm.UID), wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: string(vm.UID), Namespace: ns, Name: vm.Name, Running: true})
	require.NoError(t, err)

	// The tenant's step 3.
	require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) {
		for _, k := range []string{v1alpha1.AnnotationNode, v1alpha1.AnnotationBindingEpoch, v1alpha1.AnnotationSeal} {
			a[k] = earlier[k]
		}
	}))
	env.Get(t, vm)
	require.Equal(t, "node1", vm.GetAnnotations()[v1alpha1.AnnotationNode])

	assert.False(t, f.Sealed(vm), "the earlier binding's seal seals no later binding")
	fleets := []*fleet.Fleet{f.Fleet}
	for node, want := range map[string]bool{"node1": false, "node2": true} {
		on, err := IsOn(env.Ctx, env.Kube, vm, node, fleets)
		require.NoError(t, err)
		assert.Equal(t, want, on, "the VM counts on %s", node)
	}
	s := NewStrays(env.Kube, env.Kube, func() []*fleet.Fleet { return fleets }, time.Hour, logging.NewNopLogger())
	require.NoError(t, s.Sweep(env.Ctx, f.Fleet))
	_, ok := controllertest.Stored(t, f, wire.GuestIntents, "node2", string(vm.UID))
	assert.True(t, ok, "the intent of the binding the VM holds is kept, and its guest runs on")

	e := &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube}, fleet: f.Fleet}
	_, err = e.Observe(context.Background(), vm)
	var replayed *ReplayedBindingError
	require.ErrorAs(t, err, &replayed)
	assert.Equal(t, "node2", replayed.Node)
	env.Get(t, vm)
	assert.Equal(t, "node2", vm.GetAnnotations()[v1alpha1.AnnotationNode], "the hub wrote back the binding the VM holds")
	assert.True(t, f.Sealed(vm), "the binding written back is sealed")
}
