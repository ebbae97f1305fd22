package hypervisornode_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/hypervisornode"
	"github.com/virtfleet/virtfleet/hub/internal/controller/migration"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// TestARequiredSpreadGroupHoldsAtPlacementAndDrain runs the placement
// loop, the migration controller and the HypervisorNode controller as the
// hub does, with one Placer, against a real API server and three nodes
// over a real nats-server. Three VMs of a required anti-affinity group land
// on three nodes, though one node is far emptier than the others; a fourth
// stays Pending naming the rule; and a drain of a node whose VM could only
// move next to another of the group is Blocked saying so, rather than
// Draining forever or breaking the rule.
func TestARequiredSpreadGroupHoldsAtPlacementAndDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	nodes := []string{"node-a", "node-b", "node-c"}
	e := controllertest.Start(t, nodes, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		placer := placement.New()
		s := virtualmachine.NewScheduler(mgr.GetClient(), mgr.GetCache(), e.Pool, placer, quota.NewCounter(mgr.GetCache(), e.Pool.Fleets), event.NewNopRecorder(), o.Logger, false)
		if err := virtualmachine.SetupScheduler(mgr, s); err != nil {
			return err
		}
		migrations := wake.NewNotifierFor(perobject.NewOwner(nil), func() client.Object { return &v1alpha1.VirtualMachineMigration{} })
		e.Fleet.Guests.Subscribe(migrations.Notify)
		if err := migration.Setup(mgr, o, migration.Options{Pool: e.Pool, Placer: placer, Notifier: migrations}); err != nil {
			return err
		}
		changes := hypervisornode.NewChanges()
		e.Fleet.SubscribeNodeChanges(changes.Notify)
		return hypervisornode.Setup(mgr, o, e.Pool.Fleets, changes, nil)
	})
	for i, n := range nodes {
		// node-a is all but empty, the others half full: placement by room
		// alone would put every VM on node-a.
		used := wire.Resources{VCPU: int64(8 * min(i, 1)), MemoryBytes: int64(16*min(i, 1)) << 30}
		e.Fleet.Agent(n).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", MigrationURI: "qemu+tcp://" + n + "/system", Capacity: wire.Resources{VCPU: 16, MemoryBytes: 32 << 30}, Allocated: used})
	}
	ns := e.Namespace(t)
	require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.PlacementGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec:       v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity},
	}))
	replica := func(i int) *v1alpha1.VirtualMachine {
		name := fmt.Sprintf("web-%d", i)
		require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-root"},
			Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}},
		}))
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{
			Vcpu: 1, Memory: resource.MustParse("1Gi"),
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(name + "-root")}},
			PlacementGroup:  ptr.To(v1alpha1.LocalName("web")),
		}
		require.NoError(t, e.Kube.Create(e.Ctx, vm))
		return vm
	}

	on := map[string]*v1alpha1.VirtualMachine{}
	t.Run("ThreeLandOnThreeNodes", func(t *testing.T) {
		vms := []*v1alpha1.VirtualMachine{replica(0), replica(1), replica(2)}
		for _, vm := range vms {
			vm = controllertest.Await(t, e, vm, within, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
				assert.NotEmpty(c, got.GetAnnotations()[v1alpha1.AnnotationNode], "%s is placed", got.Name)
			})
			node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
			require.NotContains(t, on, node, "%s shares %s with another of its group", vm.Name, node)
			on[node] = vm
		}
	})

	t.Run("AFourthStaysPendingNamingTheRule", func(t *testing.T) {
		vm := controllertest.Await(t, e, replica(3), within, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
			assert.Equal(c, v1alpha1.PhasePending, got.Status.AtProvider.Phase)
			assert.Contains(c, got.GetCondition(xpv2.TypeReady).Message, "placement group web (anti-affinity) has a VM in node ")
		})
		assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
	})

	t.Run("ADrainThatWouldBreakTheRuleIsBlocked", func(t *testing.T) {
		require.Len(t, on, len(nodes))
		// The VM controller's part: each guest runs, as its node reports.
		for _, vm := range on {
			e.Get(t, vm)
			vm.Status.AtProvider.Phase = v1alpha1.PhaseRunning
			require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))
		}
		n := &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
		e.Get(t, n)
		n.Spec.Drain = true
		require.NoError(t, e.Kube.Update(e.Ctx, n))
		n = controllertest.Await(t, e, n, within, func(c *assert.CollectT, got *v1alpha1.HypervisorNode) {
			if assert.NotNil(c, got.Status.Drain) {
				assert.Equal(c, v1alpha1.DrainBlocked, got.Status.Drain.Phase)
			}
		})
		stays := on["node-a"]
		assert.Contains(t, n.Status.Drain.Message, ns+"/"+stays.Name+": migration ")
		assert.Contains(t, n.Status.Drain.Message, "placement group web (anti-affinity) has a VM in node node-b already")
		assert.Contains(t, n.Status.Drain.Message, "placement group web (anti-affinity) has a VM in node node-c already")
		e.Get(t, stays)
		assert.Equal(t, "node-a", stays.GetAnnotations()[v1alpha1.AnnotationNode], "the VM stays where the rule lets it be")
		assert.Empty(t, stays.GetAnnotations()[v1alpha1.AnnotationMigration], "and no move is under way")
	})
}
