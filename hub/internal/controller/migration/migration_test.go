package migration

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

const (
	ns     = "tenant"
	vmUID  = "11111111-1111-1111-1111-111111111111"
	volUID = "22222222-2222-2222-2222-222222222222"
)

type harness struct {
	t    *testing.T
	kube client.Client
	bus  *bus.Fake
	f    *fleet.Fleet
	r    *Reconciler
	rec  *fleettest.Recorder
}

// onePool hands out one fleet whatever the target.
type onePool struct{ f *fleet.Fleet }

func (p onePool) Get(context.Context, fleet.Target) (*fleet.Fleet, error) { return p.f, nil }

// newHarness runs the controller over a fake API server holding a Running VM
// on node1 with one Volume, both placed by the hub, and three nodes:
// node1 and node2 announce a migration URI, node3 does not.
func newHarness(t *testing.T, grants ...apisv1alpha1.TenantGrant) *harness {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(scheme))
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	cpc := &apisv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	cpc.Spec.NATSURL = "nats://127.0.0.1:4222"
	cpc.Spec.Credentials.Source = xpv2.CredentialsSourceNone
	cpc.Spec.Grants = grants
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", UID: vmUID, Annotations: map[string]string{
		v1alpha1.AnnotationNode: "node1", v1alpha1.AnnotationSeal: f.Seal(vmUID, "node1", ""),
	}}}
	vm.Spec.ForProvider.Vcpu = 1
	vm.Spec.ForProvider.Memory = resource.MustParse("1Gi")
	vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
	vm.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: apisv1alpha1.ClusterProviderConfigKind, Name: "default"})
	vm.Status.AtProvider.Phase = v1alpha1.PhaseRunning
	vol := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "root", UID: volUID, Annotations: map[string]string{
		v1alpha1.AnnotationNode: "node1", v1alpha1.AnnotationSeal: f.Seal(volUID, "node1", ""),
	}}}
	kube := fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&v1alpha1.VirtualMachineMigration{}, &v1alpha1.VirtualMachine{}).
		WithIndex(&v1alpha1.VirtualMachineMigration{}, index.MigrationsOfVM.Index, index.MigrationsOfVM.Uses).
		WithIndex(&v1alpha1.VirtualMachineSnapshot{}, index.SnapshotsOfVM.Index, index.SnapshotsOfVM.Uses).
		WithObjects(cpc, vm, vol).Build()
	rec := &fleettest.Recorder{}
	h := &harness{t: t, kube: kube, bus: b, f: f, rec: rec, r: &Reconciler{
		kube:    kube,
		api:     kube,
		configs: providerconfig.NewResolver(kube),
		opts: Options{Pool: onePool{f}, Placer: placement.New(), Notifier: wake.NewNotifierFor(perobject.NewOwner(nil), func() client.Object { return &v1alpha1.VirtualMachineMigration{} }),
			PerFleet: DefaultPerFleet, PerNode: DefaultPerNode, PerNamespace: DefaultPerNamespace},
		recorder: rec,
	}}
	h.heartbeat("node1", "qemu+tcp://node1/system")
	h.heartbeat("node2", "qemu+tcp://node2/system")
	h.heartbeat("node3", "")
	return h
}

func (h *harness) heartbeat(node, uri string) {
	h.send(wire.NodeHeartbeat{Node: node, Backend: "libvirt", MigrationURI: uri})
}

func (h *harness) send(hb wire.NodeHeartbeat) {
	hb.SentAt, hb.Capacity = time.Now(), wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}
	h.bus.SetNode(bus.NodeEvent{Node: hb.Node, Heartbeat: hb})
	require.Eventually(h.t, func() bool {
		got, ok := h.f.Heard(hb.Node)
		return ok && got.Heartbeat.MigrationURI == hb.MigrationURI && got.Heartbeat.HostMigration == hb.HostMigration
	}, 5*time.Second, time.Millisecond)
}

func (h *harness) report(node string, r wire.Report) {
	r.ProtocolVersion, r.UID, r.Node = wire.ProtocolVersion, vmUID, node
	bus.SetValue(h.bus, wire.GuestReports, node, vmUID, r)
	require.Eventually(h.t, func() bool {
		got, ok := h.f.Guests.Report(node, vmUID)
		return ok && got.Report.Phase == r.Phase && got.Report.Incoming == r.Incoming &&
			(got.Report.Migration == nil) == (r.Migration == nil) && (r.Migration == nil || got.Report.Migration.Phase == r.Migration.Phase)
	}, 5*time.Second, time.Millisecond)
}

func (h *harness) create(name, target string) *v1alpha1.VirtualMachineMigration {
	m := &v1alpha1.VirtualMachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("mig-" + name)}}
	m.Spec.VMName, m.Spec.TargetNode = "web", target
	require.NoError(h.t, h.kube.Create(context.Background(), m))
	return m
}

// running records migrations of the given names in namespace as running
// from source to target.
func (h *harness) running(namespace, source, target string, names ...string) {
	for _, name := range names {
		m := &v1alpha1.VirtualMachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		m.Spec.VMName = "some-vm"
		require.NoError(h.t, h.kube.Create(context.Background(), m))
		m.Status = v1alpha1.VirtualMachineMigrationStatus{Phase: v1alpha1.MigrationRunning, SourceNode: source, TargetNode: target}
		require.NoError(h.t, h.kube.Status().Update(context.Background(), m))
	}
}

func (h *harness) reconcile(name string) *v1alpha1.VirtualMachineMigration {
	_, err := h.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
	require.NoError(h.t, err)
	m := &v1alpha1.VirtualMachineMigration{}
	require.NoError(h.t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, m))
	return m
}

func (h *harness) vm() *v1alpha1.VirtualMachine {
	vm := &v1alpha1.VirtualMachine{}
	require.NoError(h.t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "web"}, vm))
	return vm
}

func (h *harness) volume() *v1alpha1.Volume {
	v := &v1alpha1.Volume{}
	require.NoError(h.t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "root"}, v))
	return v
}

// A migration goes to a node that takes migrations, follows the source's
// figures, and moves the VM and its Volume only once the guest runs on
// the target; the source is left for the VM controller to clear.
func TestMigrationMovesTheVMOnceItRunsOnTheTarget(t *testing.T) {
	h := newHarness(t)
	h.create("move", "")

	m := h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationScheduled, m.Status.Phase)
	assert.Equal(t, "node1", m.Status.SourceNode)
	assert.Equal(t, "node2", m.Status.TargetNode, "node3 announces no migration URI, node1 is the source")
	mg, ok := virtualmachine.MigrationOf(h.vm(), h.f)
	require.True(t, ok, "the VM carries the hub's sealed migration")
	assert.Equal(t, virtualmachine.Migration{ID: "mig-move", Target: "node2"}, mg)

	started := time.Date(2026, 11, 26, 5, 0, 0, 0, time.UTC)
	h.report("node2", wire.Report{Phase: wire.PhasePending, Incoming: "mig-move"})
	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationRunning, StartedAt: &started, TotalBytes: 2 << 30, ProcessedBytes: 1 << 30}})
	m = h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationRunning, m.Status.Phase)
	assert.Equal(t, int64(1<<30), m.Status.TransferredBytes)
	assert.Equal(t, "node1", h.vm().GetAnnotations()[v1alpha1.AnnotationNode], "the VM stays on the source while it copies")

	finished := started.Add(5 * time.Second)
	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationSucceeded, StartedAt: &started, FinishedAt: &finished, TotalBytes: 2 << 30, ProcessedBytes: 2 << 30, DowntimeMilliseconds: 40}})
	m = h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationRunning, m.Status.Phase, "not over until the target runs the guest")

	succeeded := testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.ResultSucceeded))
	downtimes := samples(t, metrics.MigrationDowntime)
	h.report("node2", wire.Report{Phase: wire.PhaseRunning, Incoming: "mig-move"})
	m = h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationSucceeded, m.Status.Phase)
	assert.Equal(t, int64(40), m.Status.DowntimeMilliseconds)
	assert.InDelta(t, succeeded+1, testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.ResultSucceeded)), 0, "counted once")
	assert.Equal(t, downtimes+1, samples(t, metrics.MigrationDowntime), "the downtime observed")
	assert.Equal(t, finished, m.Status.EndTime.UTC())
	vm := h.vm()
	assert.Equal(t, "node2", vm.GetAnnotations()[v1alpha1.AnnotationNode])
	assert.True(t, h.f.Sealed(vm), "the new node carries the hub's seal")
	assert.Equal(t, []string{"node1"}, virtualmachine.Leftovers(vm))
	_, still := virtualmachine.MigrationOf(vm, h.f)
	assert.False(t, still)
	assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationMigration])
	vol := h.volume()
	assert.Equal(t, "node2", vol.GetAnnotations()[v1alpha1.AnnotationNode], "the Volume moved with its disk")
	assert.True(t, h.f.Sealed(vol))
	assert.NotEmpty(t, h.rec.Events())

	m = h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationSucceeded, m.Status.Phase, "a finished migration stays as it ended")
	assert.NotContains(t, m.Finalizers, Finalizer, "and is no longer held")
}

// A Volume given to the VM as its migration ends follows it to the target,
// even when the VM controller binds it to the source between the moment
// the migration bound the VM's Volumes and the moment it moved the VM
// (the VM controller's read of the VM was from before the move).
func TestAVolumeBoundToTheSourceAsTheVMMovesFollowsIt(t *testing.T) {
	h := newHarness(t)
	h.create("move", "")
	h.reconcile("move")

	// The tenant attaches a new, unbound Volume while the VM migrates.
	const dataUID = "33333333-3333-3333-3333-333333333333"
	require.NoError(t, h.kube.Create(context.Background(), &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data", UID: dataUID}}))
	vm := h.vm()
	vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: "data"})
	require.NoError(t, h.kube.Update(context.Background(), vm))

	// The VM controller's binding lands just before the VM's move.
	bindAsTheVMControllerDid := func(ctx context.Context, c client.WithWatch) error {
		v := &v1alpha1.Volume{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data"}, v); err != nil {
			return err
		}
		if v.GetAnnotations()[v1alpha1.AnnotationNode] != "" {
			return nil
		}
		v.SetAnnotations(map[string]string{v1alpha1.AnnotationNode: "node1", v1alpha1.AnnotationSeal: h.f.Seal(dataUID, "node1", "")})
		return c.Update(ctx, v)
	}
	h.r.kube = interceptor.NewClient(h.kube.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if moving, ok := obj.(*v1alpha1.VirtualMachine); ok && moving.GetAnnotations()[v1alpha1.AnnotationNode] == "node2" {
				if err := bindAsTheVMControllerDid(ctx, c); err != nil {
					return err
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})

	started := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	finished := started.Add(5 * time.Second)
	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationSucceeded, StartedAt: &started, FinishedAt: &finished}})
	h.report("node2", wire.Report{Phase: wire.PhaseRunning, Incoming: "mig-move"})
	m := h.reconcile("move")
	require.Equal(t, v1alpha1.MigrationSucceeded, m.Status.Phase)
	require.Equal(t, "node2", h.vm().GetAnnotations()[v1alpha1.AnnotationNode])

	data := &v1alpha1.Volume{}
	require.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "data"}, data))
	assert.Equal(t, "node2", data.GetAnnotations()[v1alpha1.AnnotationNode], "the Volume bound to the source as the VM moved follows it")
	assert.True(t, h.f.Sealed(data), "bound by the hub")
	assert.Equal(t, "node2", h.volume().GetAnnotations()[v1alpha1.AnnotationNode])
}

// A migration the source reports failed ends Failed; the VM stays where it
// runs and the target goes among its leftovers.
func TestMigrationThatFailsLeavesTheVMWhereItRuns(t *testing.T) {
	h := newHarness(t)
	h.create("move", "")
	h.reconcile("move")
	h.report("node2", wire.Report{Phase: wire.PhasePending, Incoming: "mig-move"})
	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationFailed, Message: "unable to connect"}})

	m := h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationFailed, m.Status.Phase)
	assert.Contains(t, m.Status.Message, "unable to connect")
	vm := h.vm()
	assert.Equal(t, "node1", vm.GetAnnotations()[v1alpha1.AnnotationNode])
	assert.Equal(t, []string{"node2"}, virtualmachine.Leftovers(vm))
	_, still := virtualmachine.MigrationOf(vm, h.f)
	assert.False(t, still)
	assert.Equal(t, "node1", h.volume().GetAnnotations()[v1alpha1.AnnotationNode])
	var warned []event.Reason
	for _, e := range h.rec.Events() {
		if e.Type == event.TypeWarning {
			warned = append(warned, e.Reason)
		}
	}
	assert.Equal(t, []event.Reason{ReasonFailed, ReasonFailed}, warned, "on the migration and on its VM")
}

// What a migration refuses, or waits for, each with a message naming why.
func TestMigrationRefusesOrWaits(t *testing.T) {
	cases := map[string]struct {
		setup   func(h *harness)
		target  string
		grants  []apisv1alpha1.TenantGrant
		phase   v1alpha1.MigrationPhase
		message string
	}{
		"AStoppedVMDoesNotMigrateLive": {
			setup: func(h *harness) {
				vm := h.vm()
				vm.Status.AtProvider.Phase = v1alpha1.PhaseStopped
				require.NoError(t, h.kube.Status().Update(context.Background(), vm))
			},
			phase: v1alpha1.MigrationFailed, message: "only a Running VM migrates live",
		},
		"AVMOnNoNode": {
			setup: func(h *harness) {
				vm := h.vm()
				delete(vm.Annotations, v1alpha1.AnnotationNode)
				require.NoError(t, h.kube.Update(context.Background(), vm))
			},
			phase: v1alpha1.MigrationFailed, message: "is on no node yet",
		},
		"ASourceWithoutAMigrationURI": {
			setup: func(h *harness) { h.heartbeat("node1", "") },
			phase: v1alpha1.MigrationFailed, message: "node node1 takes no part in live migration",
		},
		"ATargetNodeTheNamespaceMayNotChoose": {
			target: "node2",
			phase:  v1alpha1.MigrationFailed, message: "chooseNode: true",
		},
		"ATargetNodeTheNamespaceMayChoose": {
			target: "node2",
			grants: []apisv1alpha1.TenantGrant{{Namespaces: []string{ns}, ChooseNode: true}},
			phase:  v1alpha1.MigrationScheduled,
		},
		"ATargetThatTakesNoMigrations": {
			target: "node3",
			grants: []apisv1alpha1.TenantGrant{{Namespaces: []string{ns}, ChooseNode: true}},
			phase:  v1alpha1.MigrationPending, message: "no node can take the VM",
		},
		"NoSlotLeftOnTheNode": {
			setup: func(h *harness) { h.running("other", "node1", "node2", "a", "b") },
			phase: v1alpha1.MigrationPending, message: "2 migrations run from or to node node1",
		},
		"NoSlotLeftInTheNamespace": {
			setup: func(h *harness) { h.running(ns, "node3", "node3", "a", "b") },
			phase: v1alpha1.MigrationPending, message: "2 migrations run in namespace tenant",
		},
		"ATargetThatDoesNotReachTheVolumesSharedPool": {
			setup: func(h *harness) {
				v := h.volume()
				v.Spec.ForProvider.StoragePool = "ceph"
				require.NoError(t, h.kube.Update(context.Background(), v))
			},
			phase: v1alpha1.MigrationPending, message: "node2: does not reach shared storage pool ceph",
		},
		"ATargetAtItsLimitIsPassedOver": {
			setup: func(h *harness) { h.running("other", "node3", "node2", "a", "b") },
			phase: v1alpha1.MigrationPending, message: "no node can take the VM",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, tc.grants...)
			if tc.setup != nil {
				tc.setup(h)
			}
			h.create("move", tc.target)
			m := h.reconcile("move")
			assert.Equal(t, tc.phase, m.Status.Phase, m.Status.Message)
			assert.Contains(t, m.Status.Message, tc.message)
			_, migrating := virtualmachine.MigrationOf(h.vm(), h.f)
			assert.Equal(t, tc.phase == v1alpha1.MigrationScheduled, migrating, "only a scheduled migration marks the VM")
		})
	}
}

// A second migration of a VM already moving waits for the first.
func TestMigrationWaitsForTheVMsOtherMigration(t *testing.T) {
	h := newHarness(t)
	h.create("first", "")
	require.Equal(t, v1alpha1.MigrationScheduled, h.reconcile("first").Status.Phase)
	h.create("second", "")
	m := h.reconcile("second")
	assert.Equal(t, v1alpha1.MigrationPending, m.Status.Phase)
	assert.Contains(t, m.Status.Message, "another migration")
}

// A node that moves guests between its backend's own hosts (Nova,
// KubeVirt) migrates within itself: no other node takes part, and the VM
// stays on the node, with nothing left over.
func TestMigrationWithinANodeOfManyHosts(t *testing.T) {
	h := newHarness(t)
	h.send(wire.NodeHeartbeat{Node: "node1", Backend: "nova", HostMigration: true})
	h.create("move", "")
	m := h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationScheduled, m.Status.Phase)
	assert.Equal(t, "node1", m.Status.TargetNode)
	mg, ok := virtualmachine.MigrationOf(h.vm(), h.f)
	require.True(t, ok)
	assert.Equal(t, "node1", mg.Target)

	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Host: "compute-2", Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationSucceeded, DowntimeMilliseconds: 300,
		Message: "moved from host compute-1 to host compute-2"}})
	m = h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationSucceeded, m.Status.Phase)
	assert.Equal(t, "the VM runs on node node1: moved from host compute-1 to host compute-2", m.Status.Message, "with the backend's word of where")
	assert.Equal(t, int64(300), m.Status.DowntimeMilliseconds)
	vm := h.vm()
	assert.Equal(t, "node1", vm.GetAnnotations()[v1alpha1.AnnotationNode])
	assert.Empty(t, virtualmachine.Leftovers(vm), "no node left anything behind")
	_, still := virtualmachine.MigrationOf(vm, h.f)
	assert.False(t, still)
	assert.Equal(t, "node1", h.volume().GetAnnotations()[v1alpha1.AnnotationNode])

	h.create("elsewhere", "node2")
	m = h.reconcile("elsewhere")
	assert.Equal(t, v1alpha1.MigrationFailed, m.Status.Phase)
	assert.Contains(t, m.Status.Message, "moves its VMs between its own hosts only")
}

// The target runs the guest before the source has read libvirt's final
// figures: the migration ends only with them, so its downtime is known.
func TestMigrationEndsWithTheSourcesFinalFigures(t *testing.T) {
	h := newHarness(t)
	h.create("move", "")
	h.reconcile("move")
	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationRunning, ProcessedBytes: 1 << 30}})
	h.report("node2", wire.Report{Phase: wire.PhaseRunning, Incoming: "mig-move"})
	m := h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationRunning, m.Status.Phase)
	assert.Contains(t, m.Status.Message, "node node1 finishes the migration")
	assert.Equal(t, "node1", h.vm().GetAnnotations()[v1alpha1.AnnotationNode])

	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationSucceeded, ProcessedBytes: 2 << 30, DowntimeMilliseconds: 55}})
	m = h.reconcile("move")
	assert.Equal(t, v1alpha1.MigrationSucceeded, m.Status.Phase)
	assert.Equal(t, int64(55), m.Status.DowntimeMilliseconds)
	assert.Equal(t, "node2", h.vm().GetAnnotations()[v1alpha1.AnnotationNode])
}

// Deleting a migration under way cancels it: the VM asks its source to
// abort, the migration follows the move to its end (here, aborted), and
// only then goes, the VM running where it was.
func TestDeletingAMigrationCancelsIt(t *testing.T) {
	h := newHarness(t)
	h.create("move", "")
	h.reconcile("move")
	h.report("node2", wire.Report{Phase: wire.PhasePending, Incoming: "mig-move"})
	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationRunning}})
	m := h.reconcile("move")
	require.Contains(t, m.Finalizers, Finalizer, "a migration that marked its VM is held")

	require.NoError(t, h.kube.Delete(context.Background(), m))
	m = h.reconcile("move")
	assert.Equal(t, "mig-move", h.vm().GetAnnotations()[v1alpha1.AnnotationMigrationCancel], "the source is asked to abort")
	assert.Equal(t, v1alpha1.MigrationRunning, m.Status.Phase, "followed to its end")

	h.report("node1", wire.Report{Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "mig-move", Phase: wire.MigrationFailed, Message: "operation aborted"}})
	_, err := h.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "move"}})
	require.NoError(t, err)
	_, err = h.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "move"}})
	require.NoError(t, err)
	err = h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "move"}, &v1alpha1.VirtualMachineMigration{})
	assert.True(t, kerrors.IsNotFound(err), "gone once over: %v", err)
	vm := h.vm()
	assert.Equal(t, "node1", vm.GetAnnotations()[v1alpha1.AnnotationNode])
	assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationMigrationCancel])
	assert.Equal(t, []string{"node2"}, virtualmachine.Leftovers(vm))
}

// samples is how many observations the histogram h (of no labels) holds.
func samples(t *testing.T, h *prometheus.HistogramVec) uint64 {
	t.Helper()
	m := &dto.Metric{}
	o, ok := h.WithLabelValues().(prometheus.Metric)
	require.True(t, ok)
	require.NoError(t, o.Write(m))
	return m.GetHistogram().GetSampleCount()
}

// A VM's status writes wake no migration; its phase, node or migration
// changing does.
func TestOnlyAVMsMovesOrRunsWakeItsMigrations(t *testing.T) {
	vm := func(phase v1alpha1.Phase, annotations map[string]string) *v1alpha1.VirtualMachine {
		v := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Annotations: annotations}}
		v.Status.AtProvider.Phase = phase
		return v
	}
	on := func(node string) map[string]string { return map[string]string{v1alpha1.AnnotationNode: node} }
	cases := map[string]struct {
		before, after *v1alpha1.VirtualMachine
		wake          bool
	}{
		"AStatusWrite":       {before: vm(v1alpha1.PhaseRunning, on("node1")), after: vm(v1alpha1.PhaseRunning, on("node1"))},
		"StartsRunning":      {before: vm(v1alpha1.PhaseStarting, on("node1")), after: vm(v1alpha1.PhaseRunning, on("node1")), wake: true},
		"MovesToAnotherNode": {before: vm(v1alpha1.PhaseRunning, on("node1")), after: vm(v1alpha1.PhaseRunning, on("node2")), wake: true},
		"IsMarkedForAMigration": {
			before: vm(v1alpha1.PhaseRunning, on("node1")),
			after:  vm(v1alpha1.PhaseRunning, map[string]string{v1alpha1.AnnotationNode: "node1", v1alpha1.AnnotationMigration: "m/node2"}),
			wake:   true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.wake, movesOrRuns(tc.before, tc.after))
		})
	}
}

// A VM whose snapshots live on its node does not move: libvirt keeps them
// in the node's qcow2 files, which the move would leave behind. The
// migration fails naming them, and the VM says so too; snapshots that
// hold nothing on the node do not hold the VM.
func TestAMigrationOfAVMWithSnapshotsIsRefused(t *testing.T) {
	type snap struct {
		phase     v1alpha1.SnapshotPhase
		node, uid string
	}
	cases := map[string]struct {
		snapshots map[string]snap
		phase     v1alpha1.MigrationPhase
		message   string
	}{
		"TakenAndBeingTakenSnapshotsHoldIt": {
			snapshots: map[string]snap{
				"snap-b": {phase: v1alpha1.SnapshotSucceeded, node: "node1", uid: vmUID},
				"snap-a": {phase: v1alpha1.SnapshotInProgress, node: "node1", uid: vmUID},
			},
			phase:   v1alpha1.MigrationFailed,
			message: "VM has snapshots snap-a, snap-b on node node1 that cannot move with it: delete them first",
		},
		"ASnapshotNotYetTakenHoldsIt": {
			snapshots: map[string]snap{"soon": {phase: v1alpha1.SnapshotPending}},
			phase:     v1alpha1.MigrationFailed,
			message:   "VM has snapshots soon on node node1 that cannot move with it: delete them first",
		},
		"FailedAndLostSnapshotsHoldNothing": {
			snapshots: map[string]snap{
				"failed": {phase: v1alpha1.SnapshotFailed, node: "node1", uid: vmUID},
				"lost":   {phase: v1alpha1.SnapshotLost, node: "node1", uid: vmUID},
			},
			phase: v1alpha1.MigrationScheduled,
		},
		"ASnapshotOfAnEarlierVMOfTheSameNameHoldsNothing": {
			snapshots: map[string]snap{"old": {phase: v1alpha1.SnapshotSucceeded, node: "node1", uid: "an-earlier-vm"}},
			phase:     v1alpha1.MigrationScheduled,
		},
		"ASnapshotOnAnotherNodeHoldsNothing": {
			snapshots: map[string]snap{"elsewhere": {phase: v1alpha1.SnapshotSucceeded, node: "node3", uid: vmUID}},
			phase:     v1alpha1.MigrationScheduled,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			for sname, sn := range tc.snapshots {
				s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sname}, Spec: v1alpha1.VirtualMachineSnapshotSpec{VMName: "web"}}
				s.Status = v1alpha1.VirtualMachineSnapshotStatus{Phase: sn.phase, Node: sn.node, SourceUID: sn.uid}
				require.NoError(t, h.kube.Create(context.Background(), s))
			}
			h.create("move", "")

			m := h.reconcile("move")

			assert.Equal(t, tc.phase, m.Status.Phase, m.Status.Message)
			assert.Contains(t, m.Status.Message, tc.message)
			_, migrating := virtualmachine.MigrationOf(h.vm(), h.f)
			assert.Equal(t, tc.phase == v1alpha1.MigrationScheduled, migrating, "only a scheduled migration marks the VM")
			var warned []event.Reason
			for _, e := range h.rec.Events() {
				if e.Type == event.TypeWarning {
					warned = append(warned, e.Reason)
					assert.Equal(t, tc.message, e.Message)
				}
			}
			if tc.phase == v1alpha1.MigrationFailed {
				assert.Equal(t, []event.Reason{ReasonFailed, ReasonFailed}, warned, "on the migration and on its VM")
			} else {
				assert.Empty(t, warned)
			}
		})
	}
}
