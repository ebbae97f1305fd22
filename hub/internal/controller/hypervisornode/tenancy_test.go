package hypervisornode_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/hypervisornode"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

// within bounds every wait for the hub: a node's status is written at most
// every MinInterval, and in a full `make test` this package's API server
// shares two cores with a load of thirty, where a migration's scheduling
// took longer than half a minute.
const within = time.Minute

// A tenant cannot make its VMs count on a node, nor hold up or ride along
// with that node's drain, by naming the node in the annotation only the
// hub's placement may set. The attacker, with no more than the RBAC to
// write VirtualMachines in its own namespace "tenant" and no TenantGrant:
//
//  1. kubectl get hvnode (or guesses) the name of a node, node-a;
//  2. kubectl -n tenant apply a VirtualMachine "squatter" with
//     metadata.annotations["compute.virtfleet.io/node"]: node-a and
//     spec.forProvider.evictionStrategy: None, and a VirtualMachine
//     "rider" with the same annotation and the default eviction;
//     neither carries the hub's seal (compute.virtfleet.io/seal),
//     which only the hub can make.
//
// Before issue 51 node-a showed both in its VMS column, a drain of node-a
// waited for "tenant/squatter stays (evictionStrategy None)" forever, and
// made a VirtualMachineMigration for the rider in the tenant's namespace.
// Now only the VM the hub placed there, in another tenant's namespace,
// counts and is moved; the attacker's VMs are refused, as they were.
func TestAHandWrittenNodeAnnotationNeitherCountsNorBlocksADrain(t *testing.T) {
	const nodeA, nodeB = "node-a", "node-b"
	e := controllertest.Start(t, []string{nodeA, nodeB}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		changes := hypervisornode.NewChanges()
		e.Fleet.SubscribeNodeChanges(changes.Notify)
		return hypervisornode.Setup(mgr, o, e.Pool.Fleets, changes, nil)
	})
	for _, n := range []string{nodeA, nodeB} {
		e.Fleet.Agent(n).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	}
	victim, tenant := e.Namespace(t), "tenant"
	require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}))

	web := e.VM(t, victim, "web", nodeA, true, v1alpha1.PhaseRunning)
	// The attacker's writes: the annotation by hand, no seal.
	squatter := e.VM(t, tenant, "squatter", nodeA, false, v1alpha1.PhaseRunning)
	none := v1alpha1.EvictionNone
	squatter.Spec.ForProvider.EvictionStrategy = &none
	require.NoError(t, e.Kube.Update(e.Ctx, squatter))
	rider := e.VM(t, tenant, "rider", nodeA, false, v1alpha1.PhaseRunning)

	// The VM controller refuses both, by the rule the node's count now
	// follows too.
	for _, vm := range []*v1alpha1.VirtualMachine{squatter, rider} {
		_, err := virtualmachine.AdmittedNode(e.Ctx, e.Kube, vm, e.Fleet.Fleet)
		var refused *tenancy.RefusedError
		assert.True(t, errors.As(err, &refused), "VM %s/%s is refused on %s: %v", vm.Namespace, vm.Name, nodeA, err)
	}

	n := &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: nodeA}}
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(n), n))
		assert.Equal(c, int32(1), n.Status.VirtualMachines, "only the VM the hub placed counts on %s", nodeA)
	}, within, 100*time.Millisecond)

	n.Spec.Drain = true
	require.NoError(t, e.Kube.Update(e.Ctx, n))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(n), n))
		if assert.NotNil(c, n.Status.Drain) {
			assert.Equal(c, v1alpha1.DrainStatus{Phase: v1alpha1.DrainDraining, Remaining: 1, Migrating: 1}, *n.Status.Drain,
				"the drain moves the hub's VM and waits for no VM of the tenant's")
		}
	}, within, 100*time.Millisecond)

	for ns, want := range map[string][]v1alpha1.LocalName{victim: {v1alpha1.LocalName(web.Name)}, tenant: nil} {
		l := &v1alpha1.VirtualMachineMigrationList{}
		require.NoError(t, e.Kube.List(e.Ctx, l, client.InNamespace(ns)))
		var got []v1alpha1.LocalName
		for _, m := range l.Items {
			got = append(got, m.Spec.VMName)
		}
		assert.Equal(t, want, got, "the drain's migrations in namespace %s", ns)
	}
}
