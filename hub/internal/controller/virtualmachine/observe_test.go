package virtualmachine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

var errWrite = errors.New("Observe must not write")

// writeless is a client over objs that fails every write and counts the
// attempts.
func writeless(t *testing.T, writes *atomic.Int32, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	fail := func() error { writes.Add(1); return errWrite }
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return fail() },
		Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error { return fail() },
		Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
			return fail()
		},
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error { return fail() },
		DeleteAllOf: func(context.Context, client.WithWatch, client.Object, ...client.DeleteAllOfOption) error {
			return fail()
		},
		Apply: func(context.Context, client.WithWatch, runtime.ApplyConfiguration, ...client.ApplyOption) error {
			return fail()
		},
		SubResourceCreate: func(context.Context, client.Client, string, client.Object, client.Object, ...client.SubResourceCreateOption) error {
			return fail()
		},
		SubResourceUpdate: func(context.Context, client.Client, string, client.Object, ...client.SubResourceUpdateOption) error {
			return fail()
		},
		SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
			return fail()
		},
		SubResourceApply: func(context.Context, client.Client, string, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
			return fail()
		},
	}).Build()
}

// TestObserveOnlyReads proves crossplane-runtime's contract for Observe:
// whatever the VM's state, it makes no API write (the client fails any),
// publishes nothing to the nodes, places or adopts nothing, changes no
// annotation or finalizer of the VM and records no event before the
// reconcile is over.
func TestObserveOnlyReads(t *testing.T) {
	const other = "node2"
	unbound := vol("root", "")
	observeOnly := xpv2.ManagementPolicies{xpv2.ManagementActionObserve}
	keepGuest := xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize}
	cases := map[string]struct {
		vm func(*v1alpha1.VirtualMachine)
		// report is the phase testNode reports, if any; foreign makes
		// another node report the VM too.
		report  wire.Phase
		foreign bool
		lost    bool
		// orphan makes testNode report a guest orphaned from the VM's
		// namespace/name.
		orphan bool
		// published is an intent already on testNode.
		published bool

		wantExists bool
		wantErr    any
	}{
		"AVMOnNoNodeIsNotPlacedHere": {
			vm: func(*v1alpha1.VirtualMachine) {},
		},
		"AVMJustPlacedIsNotPublishedHere": {
			vm:         onNode,
			wantExists: true,
		},
		"ARunningVMWithAReportFromAnotherNode": {
			vm:         onNode,
			report:     wire.PhaseRunning,
			foreign:    true,
			published:  true,
			wantExists: true,
		},
		"AVMWhoseNodeIsLost": {
			vm:         onNode,
			report:     wire.PhaseRunning,
			lost:       true,
			published:  true,
			wantExists: true,
		},
		"AVMThatWouldAdoptAnOrphanIsNotBoundHere": {
			vm:     func(*v1alpha1.VirtualMachine) {},
			orphan: true,
		},
		"AnObserveOnlyVMThatWouldAdoptAnOrphan": {
			vm:     func(vm *v1alpha1.VirtualMachine) { vm.SetManagementPolicies(observeOnly) },
			orphan: true,
		},
		"AnImportedObserveOnlyVMIsNotPublishedNorFinalizedHere": {
			vm: func(vm *v1alpha1.VirtualMachine) {
				onNode(vm)
				meta.SetExternalName(vm, "legacy-db")
				vm.SetManagementPolicies(observeOnly)
			},
			report:     wire.PhaseRunning,
			wantExists: true,
		},
		"AnImportWithoutANodeIsAnError": {
			vm:      func(vm *v1alpha1.VirtualMachine) { meta.SetExternalName(vm, "legacy-db") },
			wantErr: new(*ImportNodeError),
		},
		"ADeletedVMThatKeepsItsGuestIsNotReleasedHere": {
			vm: func(vm *v1alpha1.VirtualMachine) {
				onNode(vm)
				vm.SetManagementPolicies(keepGuest)
				deleted := metav1.NewTime(time.Now())
				vm.DeletionTimestamp = &deleted
				vm.Finalizers = []string{"finalizer.managed.crossplane.io", FinalizerKeep}
			},
			report:    wire.PhaseRunning,
			published: true,
			wantErr:   new(*ReleasingError),
		},
		"ADeletedVMWhoseNodeIsLostPastTheFencingTimeout": {
			vm: func(vm *v1alpha1.VirtualMachine) {
				onNode(vm)
				deleted := metav1.NewTime(time.Now().Add(-2 * testFencing))
				vm.DeletionTimestamp = &deleted
				vm.Finalizers = []string{"finalizer.managed.crossplane.io"}
			},
			lost:      true,
			published: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			f := fleettest.Start(t, b)
			rec := &fleettest.Recorder{}
			placer := placement.New()
			var writes atomic.Int32
			v := vm(func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
				vm.Spec.ForProvider.VirtualNetworks = nil
				// The CRD's default; the connector has policies enabled.
				vm.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionAll})
			}, tc.vm)
			uid := string(v.UID)
			b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 64, MemoryBytes: 64 << 30}}})
			if tc.lost {
				b.SetNode(bus.NodeEvent{Node: testNode, Lost: true})
			}
			require.Eventually(t, func() bool { return f.Node(testNode).Lost == tc.lost }, 5*time.Second, time.Millisecond)
			if tc.published {
				_, err := bus.Put(context.Background(), b, wire.GuestIntents, testNode, uid, wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: uid, Namespace: v.Namespace, Name: v.Name})
				require.NoError(t, err)
			}
			if tc.orphan {
				const orphanUID = "uid-orphan"
				bus.SetValue(b, wire.GuestReports, testNode, orphanUID, wire.Report{
					ProtocolVersion: wire.ProtocolVersion, UID: orphanUID, Node: testNode, Phase: wire.PhaseRunning,
					Released: true, Orphan: &wire.Orphan{Namespace: v.Namespace, Name: v.Name, Seal: f.OrphanSeal(orphanUID, testNode, v.Namespace, v.Name)},
				})
				require.Eventually(t, func() bool { _, found, _ := f.Orphan(v.Namespace, v.Name); return found }, 5*time.Second, time.Millisecond)
			}
			for node, phase := range map[string]wire.Phase{testNode: tc.report, other: map[bool]wire.Phase{true: wire.PhaseRunning}[tc.foreign]} {
				if phase == "" {
					continue
				}
				bus.SetValue(b, wire.GuestReports, node, uid, wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: uid, Node: node, Phase: phase})
				require.Eventually(t, func() bool { _, ok := f.Guests.Report(node, uid); return ok }, 5*time.Second, time.Millisecond)
			}
			n := wake.NewNotifier(perobject.NewOwner(nil))
			kube := writeless(t, &writes, unbound)
			c := &connector{log: logging.NewNopLogger(), kube: kube, opts: Options{FencingTimeout: testFencing, Notifier: n, Placer: placer, Addresses: ipam.New(kube, kube)}, recorder: rec, state: newState(perobject.NewOwner(nil)), policies: true}
			e := &external{connector: c, fleet: f, grant: trusted}
			before := v.DeepCopy()

			obs, err := e.Observe(context.Background(), v)

			if tc.wantErr != nil {
				require.ErrorAs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, before.GetAnnotations(), v.GetAnnotations(), "annotations as they were: no node, no orphan recorded")
			assert.Equal(t, before.GetFinalizers(), v.GetFinalizers(), "finalizers as they were")
			assert.Equal(t, tc.wantExists, obs.ResourceExists, "exists")
			assert.Zero(t, writes.Load(), "API writes")
			for _, ev := range rec.Events() {
				// Observe records what it saw change on the node, never
				// an action of its own.
				assert.Contains(t, []event.Reason{ReasonStarted, ReasonStopped, ReasonPaused, ReasonResumed, ReasonFailed, ReasonNodeLost, ReasonRestartRequired}, ev.Reason, "event %q", ev.Message)
			}
			in, published := bus.Stored(b, wire.GuestIntents, testNode, uid)
			assert.Equal(t, tc.published, published, "the intent on the VM's node is as it was")
			assert.False(t, in.Release, "no release marker")
			_, elsewhere := bus.Stored(b, wire.GuestIntents, other, uid)
			assert.False(t, elsewhere, "nothing published to another node")
			_, reserved := placer.Reserved(uid)
			assert.False(t, reserved, "nothing placed")
			got := &v1alpha1.Volume{}
			require.NoError(t, c.kube.Get(context.Background(), client.ObjectKeyFromObject(unbound), got))
			assert.Empty(t, got.GetAnnotations()[v1alpha1.AnnotationNode], "no Volume bound")
		})
	}
}

func onNode(vm *v1alpha1.VirtualMachine) {
	vm.Annotations = map[string]string{v1alpha1.AnnotationNode: testNode}
}

// TestARestartedHubTakesTheIntentItsNodeHoldsAsPublished pins what a hub
// that just started (a fresh connector's state and a fleet that reads the
// bus as the hub before it left it) finds of a placed VM whose node holds
// the intent the VM asks for: up to date, its bytes counted in its
// namespace, so that no Update publishes it again (crossplane-runtime
// would record an event of each). An intent that differs, or none, is not
// up to date; nor is one the hub put after it read the bucket, which its
// own record of what it published speaks for.
func TestARestartedHubTakesTheIntentItsNodeHoldsAsPublished(t *testing.T) {
	cases := map[string]struct {
		// stored changes the intent the hub before published; nil
		// deletes it.
		stored   func(*wire.Intent)
		upToDate bool
	}{
		"TheIntentTheVMAsksFor": {stored: func(*wire.Intent) {}, upToDate: true},
		"AnotherIntent":         {stored: func(in *wire.Intent) { in.Running = !in.Running }},
		"NoIntent":              {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := bus.NewFake()
			v := vm(onNode, func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
				vm.Spec.ForProvider.VirtualNetworks = nil
				vm.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionAll})
			})
			uid := string(v.UID)
			b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 64, MemoryBytes: 64 << 30}}})
			bus.SetValue(b, wire.GuestReports, testNode, uid, wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: uid, Node: testNode, Phase: wire.PhaseRunning})
			var writes atomic.Int32
			kube := writeless(t, &writes, vol("root", testNode))
			started := func() *external {
				f := fleettest.Start(t, b)
				require.Eventually(t, func() bool { _, ok := f.Guests.Report(testNode, uid); return ok }, 5*time.Second, time.Millisecond)
				n := wake.NewNotifier(perobject.NewOwner(nil))
				c := &connector{log: logging.NewNopLogger(), kube: kube, opts: Options{FencingTimeout: testFencing, Notifier: n, Placer: placement.New(), Addresses: ipam.New(kube, kube)},
					recorder: &fleettest.Recorder{}, state: newState(perobject.NewOwner(nil)), policies: true}
				return &external{connector: c, fleet: f, grant: trusted}
			}
			observe := func(e *external) managed.ExternalObservation {
				t.Helper()
				puts := b.Puts()
				obs, err := e.Observe(ctx, v)
				require.NoError(t, err)
				assert.True(t, obs.ResourceExists)
				assert.Equal(t, puts, b.Puts(), "Observe publishes nothing")
				assert.Zero(t, writes.Load(), "API writes")
				return obs
			}

			// The hub before publishes the VM (and records its Volume's
			// size); what it put is its own, not found.
			before := started()
			d, err := before.resolve(ctx, v)
			require.NoError(t, err)
			require.NoError(t, before.publish(ctx, v, d, testNode))
			in, ok := bus.Stored(b, wire.GuestIntents, testNode, uid)
			require.True(t, ok)
			before.state = newState(perobject.NewOwner(nil))
			assert.False(t, observe(before).ResourceUpToDate, "an intent put after the bucket was read is not found")
			if tc.stored != nil {
				tc.stored(&in)
				_, err = bus.Put(ctx, b, wire.GuestIntents, testNode, uid, in)
			} else {
				err = bus.Delete(ctx, b, wire.GuestIntents, testNode, uid)
			}
			require.NoError(t, err)

			// Then it leaves, and a new one starts.
			e := started()
			assert.Equal(t, tc.upToDate, observe(e).ResourceUpToDate)
			if tc.upToDate {
				assert.Positive(t, e.state.intentBytes.held(v.Namespace), "the intent's bytes count in its namespace")
			}
			e.state = newState(perobject.NewOwner(nil))
			assert.False(t, observe(e).ResourceUpToDate, "what the bucket held is answered once")
		})
	}
}
