package virtualmachine

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
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

// TestGrowthsAtOnceGrowOnlyWhatTheQuotaTakes pins that Volumes of one
// namespace grown at the same moment pass its storage quota together, not
// each alone: the hub reconciles the VMs that use them side by side (or one
// VM with both), and asks about every growth before any size record lands.
// Exactly one grows; the other keeps its size, and its Volume and its VM
// say which limit holds it.
//
// Attacker's steps, a tenant whose namespace has a TenantQuota of 20Gi of
// storage and two 8Gi Volumes a and b on node1 (attached to VMs web-a and
// web-b, or both to VM web), all running: `kubectl -n team patch volume a
// --type merge -p '{"spec":{"forProvider":{"size":"12Gi"}}}'` and the same
// for b, in one go. Before, each growth of 4Gi was checked against the
// 16Gi recorded, each fit alone, and node1 was sent both: 24Gi.
func TestGrowthsAtOnceGrowOnlyWhatTheQuotaTakes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env, counter := placementEnv(t)

	cases := map[string]struct {
		// vms are the VMs of the namespace, by name, with the Volumes
		// each attaches.
		vms map[string][]string
	}{
		"TwoVMsReconciledAtOnce": {vms: map[string][]string{"web-a": {"a"}, "web-b": {"b"}}},
		"OneVMWithBoth":          {vms: map[string][]string{"web": {"a", "b"}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.StorageQuota(t, ns, "20Gi")
			volumes := map[string]*v1alpha1.Volume{"a": env.Volume(t, ns, "a", "8Gi"), "b": env.Volume(t, ns, "b", "8Gi")}
			e := hubClient(t, env, counter, ns)
			var vms []*v1alpha1.VirtualMachine
			for _, n := range slices.Sorted(maps.Keys(tc.vms)) {
				vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n}}
				vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{Vcpu: 1, Memory: resource.MustParse("1Gi")}
				for _, v := range tc.vms[n] {
					vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: v1alpha1.LocalName(v)})
				}
				require.NoError(t, env.Kube.Create(env.Ctx, vm))
				vm = awaitPlaced(t, env, vm)
				_, err := publishSteps(env, e, vm)
				require.NoError(t, err, "the first publish, at 8Gi")
				vms = append(vms, vm)
			}

			// The tenant's steps.
			for _, v := range volumes {
				env.Get(t, v)
				v.Spec.ForProvider.Size = resource.MustParse("12Gi")
				require.NoError(t, env.Kube.Update(env.Ctx, v))
			}

			// The hub's workers each resolve their VM, and then, side by
			// side, record what they found.
			ds := make([]dependencies, len(vms))
			for i, vm := range vms {
				var err error
				ds[i], err = e.resolve(env.Ctx, vm)
				require.NoError(t, err)
				require.Len(t, ds[i].grows, len(tc.vms[vm.Name]), "each growth fits alone")
			}
			errs := make([]error, len(vms))
			var wg sync.WaitGroup
			for i := range vms {
				wg.Go(func() { errs[i] = recordSteps(env, e, vms[i], &ds[i]) })
			}
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}

			sent := map[string]int64{}
			var heldGrowth []string
			for i, vm := range vms {
				for _, disk := range e.plan(vm, ds[i], "node1")["node1"].Machine.Disks {
					sent[disk.Name] = disk.SizeBytes
				}
				heldGrowth = append(heldGrowth, ds[i].heldGrowth...)
			}
			var grown []string
			for n, size := range sent {
				if size == 12<<30 {
					grown = append(grown, n)
				}
			}
			require.Len(t, grown, 1, "exactly one Volume grows; node1 is sent %v", sent)
			heldName := map[string]string{"a": "b", "b": "a"}[grown[0]]
			assert.Equal(t, int64(8<<30), sent[heldName], "the other keeps its size")
			exceeded := fmt.Sprintf("quota of namespace %s exceeded: storage would be 24Gi of 20Gi (TenantQuota %s; 20Gi in use, this Volume's growth 4Gi)", ns, ns)
			assert.Equal(t, []string{fmt.Sprintf("Volume %s keeps its size of 8Gi: %s", heldName, exceeded)}, heldGrowth, "what the VM's Ready says")

			held := volumes[heldName]
			env.Get(t, held)
			size, err := counter.HeldGrowth(env.Ctx, held)
			assert.Equal(t, int64(8<<30), size)
			require.EqualError(t, err, exceeded, "what the held Volume says")
			used, err := counter.Used(env.Ctx, ns)
			require.NoError(t, err)
			assert.Equal(t, int64(20<<30), used.StorageBytes, "the namespace holds its quota, not more")

			// The hub, reconciling again, holds it still.
			for _, vm := range vms {
				d, err := e.resolve(env.Ctx, vm)
				require.NoError(t, err)
				assert.Empty(t, d.grows, "nothing more to admit")
			}
		})
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

// TestVolumesAttachedAtOnceMakeOnlyWhatTheQuotaTakes pins that Volumes
// given to placed VMs of one namespace at the same moment pass its quota
// together, not each alone: the hub reconciles the VMs side by side (or
// one VM given both), and asks about every Volume before the cache shows
// any of them bound. Exactly one is made; the VM of the other waits, its
// update (Synced) saying which limit holds the Volume back. The same holds
// while the VMs migrate.
//
// Attacker's steps, a tenant whose namespace has a TenantQuota of 10Gi of
// storage (or of as many volumes as it holds and one) and placed VMs
// web-a and web-b with a 2Gi Volume each (or one VM web): `kubectl -n team
// apply` Volumes data-a and data-b of 5Gi, then, in one go, patch web-a to
// attach data-a and web-b to attach data-b (or web to attach both).
// Before, each Volume was checked alone against what the cache held, each
// fit, and node1 made both: 14Gi under a 10Gi quota. Migrating: the same
// steps once a VirtualMachineMigration moves each VM to node2. Before, the
// migration's path published the Volumes without admitting them, and
// node1 and node2 were sent both.
func TestVolumesAttachedAtOnceMakeOnlyWhatTheQuotaTakes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env, counter := placementEnv(t)

	vmsOf := map[string]map[string][]string{
		"TwoVMsReconciledAtOnce": {"web-a": {"data-a"}, "web-b": {"data-b"}},
		"OneVMGivenBoth":         {"web": {"data-a", "data-b"}},
	}
	limits := map[string]struct {
		// hard is the quota, given how many VMs (each with its root) the
		// namespace holds.
		hard func(vms int64) apisv1alpha1.QuotaAmounts
		// exceeded is what the refused Volume is told, given how many VMs
		// the namespace holds.
		exceeded func(vms int64) string
	}{
		"Storage": {
			hard: func(int64) apisv1alpha1.QuotaAmounts {
				return apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("10Gi"))}
			},
			exceeded: func(vms int64) string {
				return fmt.Sprintf("storage would be %dGi of 10Gi (TenantQuota %%s; %dGi in use, this Volume 5Gi)", 2*vms+10, 2*vms+5)
			},
		},
		"Volumes": {
			hard: func(vms int64) apisv1alpha1.QuotaAmounts { return apisv1alpha1.QuotaAmounts{Volumes: ptr.To(vms + 1)} },
			exceeded: func(vms int64) string {
				return fmt.Sprintf("volumes would be %d of %d (TenantQuota %%s; %d in use, this Volume 1)", vms+2, vms+1, vms+1)
			},
		},
	}
	moves := map[string]bool{"Staying": false, "Migrating": true}
	for shape, attach := range vmsOf {
		for limit, l := range limits {
			for move, migrating := range moves {
				t.Run(shape+"/"+limit+"/"+move, func(t *testing.T) {
					ns := env.Namespace(t)
					n := int64(len(attach))
					require.NoError(t, env.Kube.Create(env.Ctx, &apisv1alpha1.TenantQuota{
						ObjectMeta: metav1.ObjectMeta{Name: ns},
						Spec:       apisv1alpha1.TenantQuotaSpec{Namespace: ns, Hard: l.hard(n)},
					}))
					e := hubClient(t, env, counter, ns)
					var vms []*v1alpha1.VirtualMachine
					for _, name := range slices.Sorted(maps.Keys(attach)) {
						env.Volume(t, ns, "root-"+name, "2Gi")
						vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
						vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{Vcpu: 1, Memory: resource.MustParse("1Gi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName("root-" + name)}}}
						require.NoError(t, env.Kube.Create(env.Ctx, vm))
						vm = awaitPlaced(t, env, vm)
						require.NoError(t, updateSteps(env, e, vm), "the first publish, with its root")
						if migrating {
							// As the migration controller records a
							// migration it started.
							m := Migration{ID: "move-" + name, Target: "node2"}
							require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) {
								a[v1alpha1.AnnotationMigration] = m.String()
								a[v1alpha1.AnnotationMigrationSeal] = MigrationSeal(e.fleet, string(vm.UID), m)
							}))
						}
						vms = append(vms, vm)
					}

					// The tenant's steps.
					data := map[string]*v1alpha1.Volume{"data-a": env.Volume(t, ns, "data-a", "5Gi"), "data-b": env.Volume(t, ns, "data-b", "5Gi")}
					for _, vm := range vms {
						for _, v := range attach[vm.Name] {
							vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: v1alpha1.LocalName(v)})
						}
						require.NoError(t, env.Kube.Update(env.Ctx, vm))
					}

					// The hub's workers each resolve their VM, and then, side
					// by side, bind and publish what they found.
					ds := make([]dependencies, len(vms))
					for i, vm := range vms {
						var err error
						ds[i], err = e.resolve(env.Ctx, vm)
						require.NoError(t, err, "each Volume fits alone")
					}
					errs := make([]error, len(vms))
					var wg sync.WaitGroup
					for i := range vms {
						wg.Go(func() { errs[i] = e.ensure(env.Ctx, vms[i], ds[i], "node1") })
					}
					wg.Wait()

					var made []string
					for name, v := range data {
						env.Get(t, v)
						if v.GetAnnotations()[v1alpha1.AnnotationNode] == "node1" {
							made = append(made, name)
						}
					}
					require.Len(t, made, 1, "exactly one Volume is made")
					refused := map[string]string{"data-a": "data-b", "data-b": "data-a"}[made[0]]
					want := fmt.Sprintf("cannot make Volume %s: quota of namespace %s exceeded: "+l.exceeded(n), refused, ns, ns)
					var got []string
					for _, err := range errs {
						if err != nil {
							got = append(got, err.Error())
						}
					}
					assert.Equal(t, []string{want}, got, "what the refused VM's Synced says")
					used, err := counter.Used(env.Ctx, ns)
					require.NoError(t, err)
					assert.Equal(t, 2*n<<30+5<<30, used.StorageBytes, "the roots and the Volume made")
					assert.Equal(t, n+1, used.Volumes)

					// The refused VM, reconciled again, is refused again.
					for _, vm := range vms {
						if !slices.Contains(attach[vm.Name], refused) {
							continue
						}
						require.EqualError(t, updateSteps(env, e, vm), want)
					}
				})
			}
		}
	}
}

// A Volume given to a migrating VM follows the VM to the target when the
// migration ends between the VM controller's read of the VM and its
// binding of the Volume: bound to the source from that read, the Volume
// would stay on the node the guest left. (The migration controller's half,
// a binding made just before it moves the VM, is migration's
// TestAVolumeBoundToTheSourceAsTheVMMovesFollowsIt.)
func TestAVolumeBoundAsTheMigrationEndsFollowsTheVM(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env, counter := placementEnv(t)
	ns := env.Namespace(t)
	vm, root, e := placedWeb(t, env, counter, ns)
	require.NoError(t, updateSteps(env, e, vm), "the first publish binds root to node1")
	m := Migration{ID: "move-web", Target: "node2"}
	require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) {
		a[v1alpha1.AnnotationMigration] = m.String()
		a[v1alpha1.AnnotationMigrationSeal] = MigrationSeal(e.fleet, string(vm.UID), m)
	}))

	// The tenant attaches a new Volume; a VM reconcile reads the VM, still
	// migrating from node1.
	data := env.Volume(t, ns, "data", "1Gi")
	vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: "data"})
	require.NoError(t, env.Kube.Update(env.Ctx, vm))
	d, err := e.resolve(env.Ctx, vm)
	require.NoError(t, err)
	read := vm.DeepCopy()

	// The migration ends, as its controller ends it: root to node2, then
	// the VM, with node1 among its leftovers.
	env.Get(t, root)
	meta.AddAnnotations(root, map[string]string{v1alpha1.AnnotationNode: "node2", v1alpha1.AnnotationSeal: e.fleet.Seal(string(root.UID), "node2", "")})
	require.NoError(t, env.Kube.Update(env.Ctx, root))
	require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(a map[string]string) {
		e.fleet.Bind(vm, a, "node2", "")
		delete(a, v1alpha1.AnnotationMigration)
		delete(a, v1alpha1.AnnotationMigrationSeal)
		WithLeftover(e.fleet, string(vm.UID), a, "node1")
	}))

	// The reconcile goes on from its read.
	err = e.ensure(env.Ctx, read, d, "node1")
	require.ErrorContains(t, err, "the VM moved to node node2 while Volumes data were bound to node node1", "the reconcile ends, to read the VM as it is")
	env.Get(t, data)
	assert.Equal(t, "node2", data.GetAnnotations()[v1alpha1.AnnotationNode], "the Volume follows the VM")
	assert.True(t, e.fleet.Sealed(data), "bound by the hub")
}

// placementEnv starts a control plane and a fleet of node1 and node2 with
// the placement loop running, its quotas counted by the Counter returned.
func placementEnv(t *testing.T) (*controllertest.Env, *quota.Counter) {
	t.Helper()
	var counter *quota.Counter
	// node2 sends no heartbeat, so nothing is placed there: it is only
	// the target of migrations.
	env := controllertest.Start(t, []string{"node1", "node2"}, func(mgr ctrl.Manager, _ controller.Options, e *controllertest.Env) error {
		counter = quota.NewCounter(e.Kube, func() []*fleet.Fleet { return []*fleet.Fleet{e.Fleet.Fleet} })
		return mgr.Add(NewScheduler(mgr.GetClient(), mgr.GetCache(), e.Pool, placement.New(), counter, &fleettest.Recorder{}, logging.NewNopLogger(), false))
	})
	// Room for every VM the tests of one run place there.
	env.Fleet.Agent("node1").Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 64, MemoryBytes: 64 << 30}})
	return env, counter
}

// placedWeb gives ns a TenantQuota of 10Gi of storage and has the
// placement loop place VM web of ns with its Volume root of 8Gi. It
// returns the VM as placed, root, and the hub's client of the VM.
func placedWeb(t *testing.T, env *controllertest.Env, counter *quota.Counter, ns string) (*v1alpha1.VirtualMachine, *v1alpha1.Volume, *external) {
	t.Helper()
	env.StorageQuota(t, ns, "10Gi")
	root := env.Volume(t, ns, "root", "8Gi")
	vm := awaitPlaced(t, env, env.VM(t, ns, "web", "", false, ""))
	return vm, root, hubClient(t, env, counter, ns)
}

// awaitPlaced returns vm once the placement loop placed it on node1.
func awaitPlaced(t *testing.T, env *controllertest.Env, vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine {
	t.Helper()
	return controllertest.Await(t, env, vm, 30*time.Second, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
		assert.Equal(c, "node1", got.GetAnnotations()[v1alpha1.AnnotationNode], "the placement loop placed the VM")
	})
}

// hubClient is the hub's client of ns's VMs, its quotas counted by
// counter.
func hubClient(t *testing.T, env *controllertest.Env, counter *quota.Counter, ns string) *external {
	t.Helper()
	g, err := providerconfig.GrantOf(env.Ctx, env.Kube, ns)
	require.NoError(t, err)
	return &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube, reader: env.Kube, opts: Options{Quotas: counter}, state: newState(perobject.NewOwner(nil))}, fleet: env.Fleet.Fleet, grant: g}
}

// updateSteps does what Update does with vm on node1: resolve what the VM
// refers to, then bind its Volumes and publish its intent (ensure).
func updateSteps(env *controllertest.Env, e *external, vm *v1alpha1.VirtualMachine) error {
	d, err := e.resolve(env.Ctx, vm)
	if err != nil {
		return err
	}
	return e.ensure(env.Ctx, vm, d, "node1")
}

// publishSteps does what Update does before it publishes vm's intent:
// resolve what the VM refers to, bind its Volumes to its node and record
// their sizes.
func publishSteps(env *controllertest.Env, e *external, vm *v1alpha1.VirtualMachine) (dependencies, error) {
	d, err := e.resolve(env.Ctx, vm)
	if err != nil {
		return d, err
	}
	return d, recordSteps(env, e, vm, &d)
}

// recordSteps is the second half of publishSteps: what Update does with d,
// resolved for vm, before it publishes.
func recordSteps(env *controllertest.Env, e *external, vm *v1alpha1.VirtualMachine, d *dependencies) error {
	if err := e.bindVolumes(env.Ctx, vm, *d, "node1"); err != nil {
		return err
	}
	return e.recordGrowth(env.Ctx, d)
}
