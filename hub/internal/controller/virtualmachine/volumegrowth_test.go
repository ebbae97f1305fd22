package virtualmachine

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
)

// TestAVolumeGrowsOnlyWithinQuota pins that growing a Volume counts
// against its namespace's storage quota: the node is sent the larger size
// only once the hub admitted it, and a growth past the quota leaves the
// Volume at its size in effect, counted at that size, with the limit named
// in the VM's Ready message. It holds from the moment the placement loop
// admitted the Volume with its VM, before anything was published.
//
// Attacker's steps, a tenant whose namespace has a TenantQuota of 10Gi of
// storage and an 8Gi Volume attached to its VM:
//   - AfterTheFirstPublish: the Volume is on node1 and the VM runs; `kubectl
//     -n team patch volume root --type merge -p
//     '{"spec":{"forProvider":{"size":"100Gi"}}}'`. Before, the hub sent
//     node1 the new size at once, the guest's disk grew to 100Gi, and no
//     quota ever said no.
//   - BeforeTheFirstPublish: the same patch the moment the placement loop
//     placed the VM (kubectl get vm web -w shows its node), before the hub
//     first published its intent. Before, the placement loop admitted the
//     Volume at 8Gi, the first publish recorded whatever size the spec then
//     had, unchecked, and node1 made a 100Gi disk.
func TestAVolumeGrowsOnlyWithinQuota(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env, counter := placementEnv(t)

	// published is whether the hub published the VM's intent, with its
	// Volume at 8Gi, before the tenant's step.
	published := map[string]bool{"AfterTheFirstPublish": true, "BeforeTheFirstPublish": false}
	cases := map[string]struct {
		grow string
		// want is the size node1 is sent once the hub recorded what it
		// admitted, held the growth's refusal, "" when it is admitted.
		want, held string
	}{
		"WithinTheQuota": {grow: "10Gi", want: "10Gi"},
		"PastTheQuota": {grow: "100Gi", want: "8Gi",
			held: "Volume root keeps its size of 8Gi: quota of namespace %s exceeded: storage would be 100Gi of 10Gi (TenantQuota %s; 8Gi in use, this Volume's growth 92Gi)"},
	}
	for when, first := range published {
		for name, tc := range cases {
			t.Run(when+"/"+name, func(t *testing.T) {
				ns := env.Namespace(t)
				vm, root, e := placedWeb(t, env, counter, ns)
				if first {
					_, err := publishSteps(env, e, vm)
					require.NoError(t, err)
				}

				// The tenant's step.
				env.Get(t, root)
				root.Spec.ForProvider.Size = resource.MustParse(tc.grow)
				require.NoError(t, env.Kube.Update(env.Ctx, root))

				want := resource.MustParse(tc.want)
				d, err := publishSteps(env, e, vm)
				require.NoError(t, err)
				sent := e.plan(vm, d, "node1")["node1"].Machine.Disks
				require.Len(t, sent, 1)
				assert.Equal(t, want.Value(), sent[0].SizeBytes, "the size node1 is sent")
				if tc.held == "" {
					assert.Empty(t, d.heldGrowth)
				} else {
					assert.Equal(t, []string{fmt.Sprintf(tc.held, ns, ns)}, d.heldGrowth)
				}
				used, err := counter.Used(env.Ctx, ns)
				require.NoError(t, err)
				assert.Equal(t, want.Value(), used.StorageBytes, "the namespace holds the size in effect")

				// The hub, reconciling again, sends what it sent.
				d, err = e.resolve(env.Ctx, vm)
				require.NoError(t, err)
				assert.Empty(t, d.grows, "nothing more to admit")
				assert.Equal(t, want.Value(), e.plan(vm, d, "node1")["node1"].Machine.Disks[0].SizeBytes)
			})
		}
	}
}

// TestAVolumeAttachedToAPlacedVMIsAdmitted pins that a Volume attached to
// a VM after its placement counts against its namespace's storage quota
// before its node makes it: placement admitted only the Volumes the VM had
// then.
//
// Attacker's steps, a tenant whose namespace has a TenantQuota of 10Gi of
// storage and a placed VM with an 8Gi Volume: `kubectl -n team apply` a
// Volume data of 100Gi, then `kubectl -n team patch vm web --type json -p
// '[{"op":"add","path":"/spec/forProvider/diskAttachments/-","value":{"name":"data"}}]'`.
// Before, the hub bound data to node1 and sent it at 100Gi with the VM's
// next intent, and no quota ever said no.
func TestAVolumeAttachedToAPlacedVMIsAdmitted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env, counter := placementEnv(t)

	cases := map[string]struct {
		size string
		// refused is the error the VM's update ends with, "" when data
		// is sent to node1.
		refused string
	}{
		"WithinTheQuota": {size: "2Gi"},
		"PastTheQuota": {size: "100Gi",
			refused: "cannot make Volume data: quota of namespace %s exceeded: storage would be 108Gi of 10Gi (TenantQuota %s; 8Gi in use, this Volume 100Gi)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			vm, _, e := placedWeb(t, env, counter, ns)
			_, err := publishSteps(env, e, vm)
			require.NoError(t, err)

			// The tenant's steps.
			data := env.Volume(t, ns, "data", tc.size)
			vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: "data"})
			require.NoError(t, env.Kube.Update(env.Ctx, vm))

			d, err := publishSteps(env, e, vm)
			used, uerr := counter.Used(env.Ctx, ns)
			require.NoError(t, uerr)
			env.Get(t, data)
			if tc.refused != "" {
				require.EqualError(t, err, fmt.Sprintf(tc.refused, ns, ns))
				assert.Empty(t, data.GetAnnotations()[v1alpha1.AnnotationNode], "no node makes data")
				assert.Equal(t, int64(8<<30), used.StorageBytes, "the namespace holds what it held")
				return
			}
			require.NoError(t, err)
			size := resource.MustParse(tc.size)
			sent := e.plan(vm, d, "node1")["node1"].Machine.Disks
			require.Len(t, sent, 2)
			assert.Equal(t, size.Value(), sent[1].SizeBytes, "the size node1 is sent")
			assert.Equal(t, "node1", data.GetAnnotations()[v1alpha1.AnnotationNode])
			assert.Equal(t, int64(8<<30)+size.Value(), used.StorageBytes)
		})
	}
}

// placementEnv starts a control plane and a fleet of node1 with the
// placement loop running, its quotas counted by the Counter returned.
func placementEnv(t *testing.T) (*controllertest.Env, *quota.Counter) {
	t.Helper()
	var counter *quota.Counter
	env := controllertest.Start(t, []string{"node1"}, func(mgr ctrl.Manager, _ controller.Options, e *controllertest.Env) error {
		counter = quota.NewCounter(e.Kube, func() []*fleet.Fleet { return []*fleet.Fleet{e.Fleet.Fleet} })
		return mgr.Add(NewScheduler(mgr.GetClient(), mgr.GetCache(), e.Pool, placement.New(), counter, &fleettest.Recorder{}, logging.NewNopLogger(), false))
	})
	env.Fleet.Agent("node1").Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	return env, counter
}

// placedWeb gives ns a TenantQuota of 10Gi of storage and has the
// placement loop place VM web of ns with its Volume root of 8Gi. It
// returns the VM as placed, root, and the hub's client of the VM.
func placedWeb(t *testing.T, env *controllertest.Env, counter *quota.Counter, ns string) (*v1alpha1.VirtualMachine, *v1alpha1.Volume, *external) {
	t.Helper()
	env.StorageQuota(t, ns, "10Gi")
	root := env.Volume(t, ns, "root", "8Gi")
	vm := controllertest.Await(t, env, env.VM(t, ns, "web", "", false, ""), 30*time.Second, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
		assert.Equal(c, "node1", got.GetAnnotations()[v1alpha1.AnnotationNode], "the placement loop placed the VM")
	})
	g, err := providerconfig.GrantOf(env.Ctx, env.Kube, ns)
	require.NoError(t, err)
	return vm, root, &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube, reader: env.Kube, opts: Options{Quotas: counter}}, fleet: env.Fleet.Fleet, grant: g}
}

// publishSteps does what Update does before it publishes vm's intent:
// resolve what the VM refers to, bind its Volumes to its node and record
// their sizes.
func publishSteps(env *controllertest.Env, e *external, vm *v1alpha1.VirtualMachine) (dependencies, error) {
	d, err := e.resolve(env.Ctx, vm)
	if err != nil {
		return d, err
	}
	if err := e.bindVolumes(env.Ctx, d, "node1"); err != nil {
		return d, err
	}
	return d, e.recordGrowth(env.Ctx, &d)
}
