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
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// TestABindingChangedByHandMovesNoGuest pins that a VM's binding
// annotations changed by hand bind the VM nowhere new and show no false
// phase: the VM stays on the node of the sealed binding it holds, its
// guest's intent there is kept, its status is not Failed, and the hub
// writes that binding back.
//
// The attacks, by a tenant with edit rights in its namespace, on a VM the
// hub moved from node1 to node2 (a live migration, an HA restart):
//   - AnEarlierBindingsSeal: while the VM ran on node1 the tenant kept its
//     compute.virtfleet.io/node, /binding-epoch and /seal annotations
//     (kubectl get vm x -o yaml); now it writes them back (kubectl
//     annotate vm x --overwrite compute.virtfleet.io/node=node1
//     compute.virtfleet.io/binding-epoch=<kept> compute.virtfleet.io/seal=<kept>).
//     Before, that seal was a true one of the VM's uid and node1: the hub
//     took the VM for bound to node1 again, counted it there, and its
//     stray sweep deleted the intent on node2 and so the running guest.
//   - ANodeWrittenByHand: kubectl annotate vm x --overwrite
//     compute.virtfleet.io/node=node1, no seal. Before, the VM showed
//     Failed while its guest ran on node2, and the sweep deleted that
//     guest's intent.
func TestABindingChangedByHandMovesNoGuest(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1", "node2"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	f := env.Fleet
	fleets := []*fleet.Fleet{f.Fleet}
	keys := []string{v1alpha1.AnnotationNode, v1alpha1.AnnotationBindingEpoch, v1alpha1.AnnotationSeal}

	cases := map[string]struct {
		tamper func(earlier, a map[string]string)
	}{
		"AnEarlierBindingsSeal": {tamper: func(earlier, a map[string]string) {
			for _, k := range keys {
				a[k] = earlier[k]
			}
		}},
		"ANodeWrittenByHand": {tamper: func(_, a map[string]string) { a[v1alpha1.AnnotationNode] = "node1" }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			vm := env.VM(t, ns, "moved", "", false, v1alpha1.PhaseRunning)
			// bind does what the hub does on a placement or a move: seals
			// the binding, and its Observe records it in the VM's status.
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

			require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) { tc.tamper(earlier, a) }))
			env.Get(t, vm)
			require.Equal(t, "node1", vm.GetAnnotations()[v1alpha1.AnnotationNode])

			assert.False(t, f.Sealed(vm), "what the tenant wrote seals no binding")
			for node, want := range map[string]bool{"node1": false, "node2": true} {
				on, err := IsOn(env.Ctx, env.Kube, vm, node, fleets)
				require.NoError(t, err)
				assert.Equal(t, want, on, "the VM counts on %s", node)
			}
			s := NewStrays(env.Kube, env.Kube, func() []*fleet.Fleet { return fleets }, time.Hour, logging.NewNopLogger())
			require.NoError(t, s.Sweep(env.Ctx, f.Fleet))
			_, ok := controllertest.Stored(t, f, wire.GuestIntents, "node2", string(vm.UID))
			assert.True(t, ok, "the intent of the binding the VM holds is kept, and its guest runs on")

			g, err := providerconfig.GrantOf(env.Ctx, env.Kube, ns)
			require.NoError(t, err)
			e := &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube}, fleet: f.Fleet, grant: g}
			_, err = e.Observe(context.Background(), vm)
			var restored *RestoredBindingError
			require.ErrorAs(t, err, &restored)
			assert.Equal(t, "node2", restored.Node)
			assert.NotEqual(t, v1alpha1.PhaseFailed, vm.Status.AtProvider.Phase, "a VM whose guest runs is not shown Failed")
			env.Get(t, vm)
			assert.Equal(t, "node2", vm.GetAnnotations()[v1alpha1.AnnotationNode], "the hub wrote back the binding the VM holds")
			assert.True(t, f.Sealed(vm), "the binding written back is sealed")
		})
	}
}
