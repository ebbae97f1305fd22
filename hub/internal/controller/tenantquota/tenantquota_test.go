package tenantquota

import (
	"fmt"
	"testing"
	"time"

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
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
)

const node = "node-a"

// within bounds every wait: placement and a quota's count take well under
// it.
const within = 30 * time.Second

// start runs the placement loop and the TenantQuota controller as the hub
// does, against a real API server and a real nats-server with one node
// whose heartbeat offers far more than any quota here allows.
func start(t *testing.T) *controllertest.Env {
	t.Helper()
	e := controllertest.Start(t, []string{node}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		quotas := quota.NewCounter(mgr.GetCache(), e.Pool.Fleets)
		s := virtualmachine.NewScheduler(mgr.GetClient(), mgr.GetCache(), e.Pool, placement.New(), quotas, event.NewNopRecorder(), o.Logger, false)
		if err := virtualmachine.SetupScheduler(mgr, s); err != nil {
			return err
		}
		return Setup(mgr, o, quotas)
	})
	e.Fleet.Agent(node).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 256, MemoryBytes: 1 << 40}})
	return e
}

// tenant makes a namespace with the boot Volume its VMs name, and a
// TenantQuota of it with hard.
func tenant(t *testing.T, e *controllertest.Env, hard apisv1alpha1.QuotaAmounts) (string, *apisv1alpha1.TenantQuota) {
	t.Helper()
	ns := e.Namespace(t)
	require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "root"},
		Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}},
	}))
	q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: ns}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: ns, Hard: hard}}
	require.NoError(t, e.Kube.Create(e.Ctx, q))
	return ns, q
}

// shape is a VM's own vcpu and memory.
func shape(vcpu int32, memory string) func(*v1alpha1.VirtualMachine) {
	return func(vm *v1alpha1.VirtualMachine) {
		vm.Spec.ForProvider.Vcpu, vm.Spec.ForProvider.Memory = vcpu, resource.MustParse(memory)
	}
}

// ofType makes the VM take its shape from the cluster-wide instance type
// name.
func ofType(name string) func(*v1alpha1.VirtualMachine) {
	return func(vm *v1alpha1.VirtualMachine) {
		vm.Spec.ForProvider.Instancetype = &v1alpha1.InstancetypeRef{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: name}
	}
}

// createVM creates VM name in ns of the given shape, booting from root.
func createVM(t *testing.T, e *controllertest.Env, ns, name string, shaped func(*v1alpha1.VirtualMachine)) *v1alpha1.VirtualMachine {
	t.Helper()
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
	shaped(vm)
	require.NoError(t, e.Kube.Create(e.Ctx, vm))
	return vm
}

func placed(c *assert.CollectT, vm *v1alpha1.VirtualMachine) {
	assert.Equal(c, node, vm.GetAnnotations()[v1alpha1.AnnotationNode], "the VM is placed")
}

// deleteVM deletes vm as its controller would once its node deleted the
// guest: the finalizer the placement loop added goes too.
func deleteVM(t *testing.T, e *controllertest.Env, vm *v1alpha1.VirtualMachine) {
	t.Helper()
	e.Get(t, vm)
	require.NoError(t, e.Kube.Delete(e.Ctx, vm))
	e.Get(t, vm)
	vm.SetFinalizers(nil)
	require.NoError(t, e.Kube.Update(e.Ctx, vm))
}

// TestAVMOverItsNamespacesQuotaStaysPending plays a tenant with edit
// rights in its namespace, and nothing more, against the TenantQuota an
// administrator set for it (cluster-scoped: the tenant cannot edit it).
//
// Attacker's steps, for each limit: `kubectl -n t1 apply` VMs up to the
// quota (all placed), then one more, to have the fleet run more than the
// administrator allowed; for vcpu, also through an instance type rather
// than the VM's own vcpu. Before quotas, every VM was placed. Now the one
// more stays Pending with the limit named in its Ready condition, the
// quota's status shows the namespace's use against its limits, and once
// the tenant deletes a VM the Pending one is placed without anyone
// touching it.
func TestAVMOverItsNamespacesQuotaStaysPending(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	e := start(t)
	require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.VirtualMachineClusterInstancetype{
		ObjectMeta: metav1.ObjectMeta{Name: "two-cpus"},
		Spec:       v1alpha1.InstancetypeSpec{CPU: v1alpha1.InstancetypeCPU{Guest: 2}, Memory: v1alpha1.InstancetypeMemory{Guest: resource.MustParse("1Gi")}},
	}))
	cases := map[string]struct {
		hard  apisv1alpha1.QuotaAmounts
		shape func(*v1alpha1.VirtualMachine)
		// fit is how many VMs of shape the quota takes.
		fit int
		// refused is the reason the next one is Pending, after "quota of
		// namespace <ns> exceeded: ", with %s the quota's name.
		refused string
		// summary is what the quota's status shows with fit VMs placed.
		summary string
	}{
		"VMs": {
			hard: apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](2)}, shape: shape(1, "1Gi"), fit: 2,
			refused: "vms would be 3 of 2 (TenantQuota %s; 2 in use, this VM 1)",
			summary: "vms: 2/2, vcpu: 2, memory: 2Gi, storage: 1Gi, volumes: 1",
		},
		"VCPU": {
			hard: apisv1alpha1.QuotaAmounts{VCPU: ptr.To[int64](3)}, shape: shape(2, "1Gi"), fit: 1,
			refused: "vcpu would be 4 of 3 (TenantQuota %s; 2 in use, this VM 2)",
			summary: "vms: 1, vcpu: 2/3, memory: 1Gi, storage: 1Gi, volumes: 1",
		},
		"VCPUOfAnInstanceType": {
			hard: apisv1alpha1.QuotaAmounts{VCPU: ptr.To[int64](3)}, shape: ofType("two-cpus"), fit: 1,
			refused: "vcpu would be 4 of 3 (TenantQuota %s; 2 in use, this VM 2)",
			summary: "vms: 1, vcpu: 2/3, memory: 1Gi, storage: 1Gi, volumes: 1",
		},
		"Memory": {
			hard: apisv1alpha1.QuotaAmounts{Memory: ptr.To(resource.MustParse("1536Mi"))}, shape: shape(1, "1Gi"), fit: 1,
			refused: "memory would be 2Gi of 1536Mi (TenantQuota %s; 1Gi in use, this VM 1Gi)",
			summary: "vms: 1, vcpu: 1, memory: 1Gi/1536Mi, storage: 1Gi, volumes: 1",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns, q := tenant(t, e, tc.hard)
			var fitting []*v1alpha1.VirtualMachine
			for i := range tc.fit {
				vm := createVM(t, e, ns, fmt.Sprintf("vm-%d", i), tc.shape)
				controllertest.Await(t, e, vm, within, placed)
				fitting = append(fitting, vm)
			}
			over := createVM(t, e, ns, "one-too-many", tc.shape)
			want := fmt.Sprintf("quota of namespace %s exceeded: "+tc.refused, ns, q.Name)
			got := controllertest.Await(t, e, over, within, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
				assert.Equal(c, v1alpha1.PhasePending, got.Status.AtProvider.Phase)
				assert.Equal(c, want, got.GetCondition(xpv2.TypeReady).Message)
			})
			assert.Empty(t, got.GetAnnotations()[v1alpha1.AnnotationNode], "a VM over quota is on no node")
			controllertest.Await(t, e, q, within, func(c *assert.CollectT, got *apisv1alpha1.TenantQuota) {
				assert.Equal(c, tc.summary, got.Status.Summary, "kubectl get tenantquota shows use against the limits")
			})

			deleteVM(t, e, fitting[0])
			controllertest.Await(t, e, over, within, placed)
		})
	}
}

// TestAnOrphanedGuestCountsUntilDeleted plays a tenant that releases a
// guest from its VM to run it beside new VMs past its quota.
//
// Attacker's steps: with a quota of one VM, `kubectl -n t1 delete vm
// old` of a VM whose deletion policy orphans its guest (the guest keeps
// running on its node, reported as orphaned from t1/old), then `kubectl -n
// t1 apply` a VM "new". The orphan still counts: "new" stays Pending,
// naming the vms limit. A VM named "old" adopts the orphan whatever the
// quota, since the guest it takes over is counted already, and counts once.
func TestAnOrphanedGuestCountsUntilDeleted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	e := start(t)
	ns, q := tenant(t, e, apisv1alpha1.QuotaAmounts{VMs: ptr.To[int64](1)})
	const orphan = "uid-of-the-released-guest"
	controllertest.Report(t, e.Fleet.Agent(node), wire.GuestReports, orphan, wire.Report{
		UID: orphan, Node: node, Phase: wire.PhaseRunning, ObservedAt: time.Now(), VCPU: 2, MemoryBytes: 2 << 30,
		Orphan: &wire.Orphan{Namespace: ns, Name: "old", Seal: e.Fleet.OrphanSeal(orphan, node, ns, "old")},
	})
	controllertest.Await(t, e, q, within, func(c *assert.CollectT, got *apisv1alpha1.TenantQuota) {
		assert.Equal(c, "vms: 1/1, vcpu: 2, memory: 2Gi", got.Status.Summary, "the orphan counts, at its reported shape")
	})

	over := createVM(t, e, ns, "new", shape(1, "1Gi"))
	controllertest.Await(t, e, over, within, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
		assert.Equal(c, fmt.Sprintf("quota of namespace %s exceeded: vms would be 2 of 1 (TenantQuota %s; 1 in use, this VM 1)", ns, q.Name),
			got.GetCondition(xpv2.TypeReady).Message)
	})

	adopter := createVM(t, e, ns, "old", shape(2, "2Gi"))
	got := controllertest.Await(t, e, adopter, within, placed)
	assert.Equal(t, orphan, got.GetAnnotations()[v1alpha1.AnnotationAdopted], "the VM of the orphan's name adopts it")
	controllertest.Await(t, e, q, within, func(c *assert.CollectT, got *apisv1alpha1.TenantQuota) {
		assert.Equal(c, "vms: 1/1, vcpu: 2, memory: 2Gi", got.Status.Summary, "the adopted orphan counts once")
	})
	e.Get(t, over)
	assert.Empty(t, over.GetAnnotations()[v1alpha1.AnnotationNode], "the namespace is still at its quota")
}

// TestObjectsPlacedAtOnceStayWithinTheirQuota plays a tenant that creates
// many VMs at once, each bringing a Volume of its own not on any node yet
// and an address on a VirtualNetwork of the hub's, to have the fleet make
// more storage, Volumes or addresses than the administrator allowed: the
// placement loop takes them in one batch, and the cache shows none of the
// first ones bound when the last ones are admitted.
//
// Attacker's steps, for each limit: `kubectl -n t1 apply` in one go a
// VirtualNetwork with a cidr, then several Volumes and a VM on each, so
// that together they pass the limit. Before these limits, every VM was
// placed and every Volume made on its node. Now exactly as many are
// placed as fit; the others stay Pending, on no node, their Ready
// condition naming namespace, limit, use and what they would add; and the
// quota's status shows the limit reached, not passed.
func TestObjectsPlacedAtOnceStayWithinTheirQuota(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	e := start(t)
	cases := map[string]struct {
		hard apisv1alpha1.QuotaAmounts
		// size is each VM's Volume's.
		size string
		// cidr is the VirtualNetwork's: no two namespaces' overlap.
		cidr string
		// vms are how many the tenant creates at once, fit how many the
		// quota takes.
		vms, fit int
		// refused is the reason the others are Pending, after "quota of
		// namespace <ns> exceeded: ", with %s the quota's name.
		refused string
		// summary is what the quota's status shows then.
		summary string
	}{
		"Storage": {
			hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("5Gi"))}, size: "2Gi", cidr: "10.77.1.0/24", vms: 5, fit: 2,
			refused: "storage would be 6Gi of 5Gi (TenantQuota %s; 4Gi in use, this VM 2Gi)",
			summary: "vms: 2, vcpu: 2, memory: 2Gi, storage: 4Gi/5Gi, volumes: 2, addresses: 2",
		},
		"Volumes": {
			hard: apisv1alpha1.QuotaAmounts{Volumes: ptr.To[int64](3)}, size: "1Gi", cidr: "10.77.2.0/24", vms: 5, fit: 3,
			refused: "volumes would be 4 of 3 (TenantQuota %s; 3 in use, this VM 1)",
			summary: "vms: 3, vcpu: 3, memory: 3Gi, storage: 3Gi, volumes: 3/3, addresses: 3",
		},
		"Addresses": {
			hard: apisv1alpha1.QuotaAmounts{Addresses: ptr.To[int64](2)}, size: "1Gi", cidr: "10.77.3.0/24", vms: 5, fit: 2,
			refused: "addresses would be 3 of 2 (TenantQuota %s; 2 in use, this VM 1)",
			summary: "vms: 2, vcpu: 2, memory: 2Gi, storage: 2Gi, volumes: 2, addresses: 2/2",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := e.Namespace(t)
			q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: ns}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: ns, Hard: tc.hard}}
			require.NoError(t, e.Kube.Create(e.Ctx, q))
			require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.VirtualNetwork{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
				Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: tc.cidr}},
			}))
			vms := make([]*v1alpha1.VirtualMachine, tc.vms)
			for i := range vms {
				name := fmt.Sprintf("vm-%d", i)
				require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.Volume{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
					Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse(tc.size)}},
				}))
				vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
				vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(name)}}
				vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"net"}
				shape(1, "1Gi")(vm)
				vms[i] = vm
			}
			for _, vm := range vms {
				require.NoError(t, e.Kube.Create(e.Ctx, vm))
			}

			want := fmt.Sprintf("quota of namespace %s exceeded: "+tc.refused, ns, q.Name)
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				placed, refused, other := 0, 0, []string{}
				for _, vm := range vms {
					got := &v1alpha1.VirtualMachine{}
					if !assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(vm), got)) {
						return
					}
					switch {
					case got.GetAnnotations()[v1alpha1.AnnotationNode] != "":
						placed++
					case got.GetCondition(xpv2.TypeReady).Message == want:
						refused++
					default:
						other = append(other, got.GetCondition(xpv2.TypeReady).Message)
					}
				}
				assert.Equal(c, tc.fit, placed, "as many VMs are placed as the quota takes; others say %q", other)
				assert.Equal(c, tc.vms-tc.fit, refused, "the others are Pending, naming the limit")
			}, within, 100*time.Millisecond)
			controllertest.Await(t, e, q, within, func(c *assert.CollectT, got *apisv1alpha1.TenantQuota) {
				assert.Equal(c, tc.summary, got.Status.Summary, "kubectl get tenantquota shows the limit reached, not passed")
			})
		})
	}
}
