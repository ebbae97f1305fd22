package virtualmachine

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
				hubBinds(t, env, vm, node)
			}
			bind("node1")
			earlier := maps.Clone(vm.GetAnnotations())
			bind("node2")
			_, err := bus.Put(env.Ctx, f.Bus, wire.GuestIntents, "node2", string(vm.UID), wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: string(vm.UID), Namespace: ns, Name: vm.Name, Running: true})
			require.NoError(t, err)

			require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) { tc.tamper(earlier, a) }))
			env.Get(t, vm)
			require.Equal(t, "node1", vm.GetAnnotations()[v1alpha1.AnnotationNode])

			assertHeldOnNode2(t, env, f.Fleet, vm, ns)
			assert.NotEqual(t, v1alpha1.PhaseFailed, vm.Status.AtProvider.Phase, "a VM whose guest runs is not shown Failed")
			env.Get(t, vm)
			assert.Equal(t, "node2", vm.GetAnnotations()[v1alpha1.AnnotationNode], "the hub wrote back the binding the VM holds")
			assert.True(t, f.Sealed(vm), "the binding written back is sealed")
		})
	}
}

// hubBinds does what the hub does on a placement or a move of vm to node:
// it seals the binding in vm's annotations, records it before it
// publishes (Fleet.Record), and its Observe shows it in vm's status.
func hubBinds(t *testing.T, env *controllertest.Env, vm *v1alpha1.VirtualMachine, node string) {
	t.Helper()
	f := env.Fleet
	require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) { f.Bind(vm, a, node, "") }))
	b := f.Binding(vm)
	require.NotNil(t, b, "the hub's binding is sealed")
	require.NoError(t, f.Record(env.Ctx, string(vm.UID), *b))
	vm.Status.AtProvider.Binding = b
	require.NoError(t, env.Kube.Status().Update(env.Ctx, vm))
}

// tenantClient is a client of a user with what Crossplane's RBAC manager
// grants a namespace's editors on a provider's kinds: its
// crossplane:provider:...:aggregate-to-edit ClusterRole, "*" on every
// resource of the provider's groups, subresources (status) included. The
// control plane runs no aggregation controller, so the user is bound to
// that role itself rather than to edit.
func tenantClient(t *testing.T, env *controllertest.Env, ns string) client.Client {
	t.Helper()
	role := "crossplane:provider:virtfleet:aggregate-to-edit"
	err := env.Kube.Create(env.Ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role, Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.Group}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	})
	if !kerrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	user := "tenant-of-" + ns
	require.NoError(t, env.Kube.Create(env.Ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}))
	require.NoError(t, env.CP.AwaitAllowed(env.Ctx, user,
		authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Group: v1alpha1.Group, Resource: "virtualmachines"},
		authorizationv1.ResourceAttributes{Namespace: ns, Verb: "update", Group: v1alpha1.Group, Resource: "virtualmachines", Subresource: "status"}))
	kube, err := env.CP.UserClient(user)
	require.NoError(t, err)
	return kube
}

// TestATenantWritingStatusRewindsNoBinding pins that the binding a VM's
// status shows is a mirror: the hub trusts only its own record of it, in
// the intents bucket no tenant can write, so a tenant who writes the
// status moves no guest and gets no binding sealed.
//
// The attacks, by a tenant with Crossplane's aggregated edit rights in its
// namespace, on a VM the hub moved from node1 to node2 (a live migration,
// an HA restart), whose guest now runs on node2:
//   - AnEarlierBindingWithItsSeal: while the VM ran on node1 the tenant
//     kept its annotations and status (kubectl get vm x -o yaml). Now it
//     writes the old binding back into status (kubectl edit vm x
//     --subresource=status: status.atProvider.binding = {node: node1,
//     epoch: <kept>}), then the old annotations (kubectl annotate vm x
//     --overwrite compute.virtfleet.io/node=node1
//     compute.virtfleet.io/binding-epoch=<kept>
//     compute.virtfleet.io/seal=<kept>). Before, status and annotations
//     agreed on a true seal of the older epoch: the hub took the VM for
//     bound to node1, counted it there, and its stray sweep deleted the
//     intent on node2 and so the running guest.
//   - ANewerBindingWithoutASeal: the tenant writes status.atProvider.binding
//     = {node: node1, epoch: <kept>+10^15}, a binding newer than any, and
//     annotates compute.virtfleet.io/node=node1 with no seal. Before, the
//     hub "restored" the binding of status: it sealed node1 itself, and the
//     VM was moved there by the hub's own hand.
func TestATenantWritingStatusRewindsNoBinding(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1", "node2"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	f := env.Fleet
	for name, tc := range statusRewinds {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			vm, before := movedToNode2(t, env, ns)

			tc.rewind(t, env, vm, before)

			assertHeldOnNode2(t, env, f.Fleet, vm, ns)
			env.Get(t, vm)
			assert.Equal(t, "node2", vm.GetAnnotations()[v1alpha1.AnnotationNode], "the hub wrote back the binding the VM holds")
			assert.True(t, f.Sealed(vm), "the binding written back is sealed")
			held, err := f.Held(string(vm.UID))
			require.NoError(t, err)
			assert.Equal(t, "node2", held.Node, "the hub's record is untouched")
		})
	}
}

// TestAVMPlacedBeforeTheRecordsIsRecordedOnStart pins that a VM placed by
// a hub from before the binding records (wire.BindingRecord) is as safe
// from a tenant who writes its status and annotations as any other, from
// the hub's first reconcile of it after an upgrade: the hub records the
// binding sealed in its annotations, the one it trusted until then,
// without publishing the intent again.
//
// The attacker's steps are TestATenantWritingStatusRewindsNoBinding's, on
// a VM the older hub moved from node1 to node2 and left without a record,
// once the upgraded hub started. Before, the upgraded hub recorded the
// binding only with the VM's next publish, and until then took the
// earlier seal the tenant wrote back for the VM's own: it counted the VM
// on node1 and its stray sweep deleted the intent on node2, and so the
// running guest.
func TestAVMPlacedBeforeTheRecordsIsRecordedOnStart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1", "node2"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	for name, tc := range statusRewinds {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			vm, before := movedToNode2(t, env, ns)
			published, ok := controllertest.Stored(t, env.Fleet, wire.GuestIntents, "node2", string(vm.UID))
			require.True(t, ok)
			// What a hub from before the records leaves: no record.
			key, err := wire.BindingKey(string(vm.UID))
			require.NoError(t, err)
			require.NoError(t, env.Fleet.Bus.Delete(env.Ctx, wire.BucketIntents, key))

			f := env.Fleet.Restarted(t)
			held, err := f.Held(string(vm.UID))
			require.NoError(t, err)
			require.Nil(t, held, "the upgraded hub finds no record")
			g, err := providerconfig.GrantOf(env.Ctx, env.Kube, ns)
			require.NoError(t, err)
			e := &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube}, fleet: f, grant: g}
			require.NoError(t, e.recordBinding(env.Ctx, vm), "the VM's first reconcile")
			held, err = f.Held(string(vm.UID))
			require.NoError(t, err)
			require.NotNil(t, held, "the record is back")
			assert.Equal(t, *vm.Status.AtProvider.Binding, *held, "the record is the binding the VM held")
			again, ok := controllertest.Stored(t, env.Fleet, wire.GuestIntents, "node2", string(vm.UID))
			require.True(t, ok)
			assert.Equal(t, published, again, "the intent is not published again")

			tc.rewind(t, env, vm, before)

			assertHeldOnNode2(t, env, f, vm, ns)
		})
	}
}

// movedToNode2 makes VM "moved" in ns and has the hub bind it to node1,
// then move it to node2 and publish its intent there. It returns the VM
// and what the VM was while on node1.
func movedToNode2(t *testing.T, env *controllertest.Env, ns string) (*v1alpha1.VirtualMachine, *v1alpha1.VirtualMachine) {
	t.Helper()
	vm := env.VM(t, ns, "moved", "", false, v1alpha1.PhaseRunning)
	hubBinds(t, env, vm, "node1")
	before := vm.DeepCopy()
	hubBinds(t, env, vm, "node2")
	_, err := bus.Put(env.Ctx, env.Fleet.Bus, wire.GuestIntents, "node2", string(vm.UID), wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: string(vm.UID), Namespace: ns, Name: vm.Name, Running: true})
	require.NoError(t, err)
	return vm, before
}

// statusRewind is one way a tenant with Crossplane's aggregated edit
// rights in its namespace tries to rewind a VM, kept as it was on an
// earlier binding (before), to that binding, writing the VM's status and
// annotations.
type statusRewind struct {
	// forge is the binding the tenant writes into status, from the one
	// the VM held before.
	forge func(earlier v1alpha1.Binding) v1alpha1.Binding
	// annotate is what the tenant writes over the VM's annotations, from
	// those it had before.
	annotate func(earlier, a map[string]string)
}

// statusRewinds are the attacks TestATenantWritingStatusRewindsNoBinding
// describes, by name.
var statusRewinds = map[string]statusRewind{
	"AnEarlierBindingWithItsSeal": {
		forge: func(earlier v1alpha1.Binding) v1alpha1.Binding { return earlier },
		annotate: func(earlier, a map[string]string) {
			for _, k := range []string{v1alpha1.AnnotationNode, v1alpha1.AnnotationBindingEpoch, v1alpha1.AnnotationSeal} {
				a[k] = earlier[k]
			}
		},
	},
	"ANewerBindingWithoutASeal": {
		forge: func(earlier v1alpha1.Binding) v1alpha1.Binding {
			earlier.Epoch += 1_000_000_000_000_000
			return earlier
		},
		annotate: func(_, a map[string]string) {
			a[v1alpha1.AnnotationNode] = "node1"
			delete(a, v1alpha1.AnnotationSeal)
		},
	},
}

// rewind takes the tenant's steps, with its own rights, on vm, and reads
// vm back.
func (r statusRewind) rewind(t *testing.T, env *controllertest.Env, vm, before *v1alpha1.VirtualMachine) {
	t.Helper()
	tenant := tenantClient(t, env, vm.Namespace)
	mine := &v1alpha1.VirtualMachine{}
	require.NoError(t, tenant.Get(env.Ctx, client.ObjectKeyFromObject(vm), mine))
	forged := r.forge(*before.Status.AtProvider.Binding)
	mine.Status.AtProvider.Binding = &forged
	require.NoError(t, tenant.Status().Update(env.Ctx, mine), "the tenant may write the VM's status")
	a := maps.Clone(mine.GetAnnotations())
	r.annotate(before.GetAnnotations(), a)
	mine.SetAnnotations(a)
	require.NoError(t, tenant.Update(env.Ctx, mine), "the tenant may write the VM's annotations")
	env.Get(t, vm)
	require.Equal(t, forged, *vm.Status.AtProvider.Binding)
	require.Equal(t, "node1", vm.GetAnnotations()[v1alpha1.AnnotationNode])
}

// assertHeldOnNode2 checks that what a tenant wrote left the VM bound where
// the hub bound it last, node2: no seal of the tenant's, counted on node2
// alone, the intent there kept by the stray sweep, and Observe restoring
// the binding the hub recorded.
func assertHeldOnNode2(t *testing.T, env *controllertest.Env, f *fleet.Fleet, vm *v1alpha1.VirtualMachine, ns string) {
	t.Helper()
	fleets := []*fleet.Fleet{f}
	assert.False(t, f.Sealed(vm), "what the tenant wrote seals no binding")
	for node, want := range map[string]bool{"node1": false, "node2": true} {
		on, err := IsOn(env.Ctx, env.Kube, vm, node, fleets)
		require.NoError(t, err)
		assert.Equal(t, want, on, "the VM counts on %s", node)
	}
	s := NewStrays(env.Kube, env.Kube, func() []*fleet.Fleet { return fleets }, time.Hour, logging.NewNopLogger())
	require.NoError(t, s.Sweep(env.Ctx, f))
	_, ok := controllertest.Stored(t, env.Fleet, wire.GuestIntents, "node2", string(vm.UID))
	assert.True(t, ok, "the intent of the binding the VM holds is kept, and its guest runs on")

	g, err := providerconfig.GrantOf(env.Ctx, env.Kube, ns)
	require.NoError(t, err)
	e := &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube}, fleet: f, grant: g}
	_, err = e.Observe(context.Background(), vm)
	var restored *RestoredBindingError
	require.ErrorAs(t, err, &restored)
	assert.Equal(t, "node2", restored.Node, "the hub restores the binding it recorded, not the one in status")
}
