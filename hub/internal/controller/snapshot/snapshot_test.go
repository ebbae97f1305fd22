package snapshot_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/migration"
	"github.com/virtfleet/virtfleet/hub/internal/controller/snapshot"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// The nodes of the tests: two libvirt nodes that keep snapshots and take
// part in live migration, a Nova node that keeps none, and one a test
// loses.
const (
	nodeA = "node-a"
	nodeB = "node-b"
	nova  = "nova-1"
	lost  = "lost-1"
)

// fencing is the fencing timeout of the tests' hub.
const fencing = time.Second

// within bounds every wait for the hub.
const within = 30 * time.Second

// startHub runs the snapshot controller, and the migration controller that
// refuses to move a VM with snapshots, against a real API server and a
// fleet over a real nats-server.
func startHub(t *testing.T) *controllertest.Env {
	t.Helper()
	e := controllertest.Start(t, []string{nodeA, nodeB, nova, lost}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		memory := perobject.NewOwner(nil)
		snapshots := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineSnapshot{} })
		e.Fleet.Snapshots.Subscribe(snapshots.Notify)
		quotas := quota.NewCounter(mgr.GetCache(), e.Pool.Fleets)
		if err := snapshot.Setup(mgr, o, snapshot.Options{Pool: e.Pool, Notifier: snapshots, FencingTimeout: fencing, Memory: memory, Quotas: quotas}); err != nil {
			return err
		}
		migrations := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineMigration{} })
		e.Fleet.Guests.Subscribe(migrations.Notify)
		return migration.Setup(mgr, o, migration.Options{Pool: e.Pool, Placer: placement.New(), Notifier: migrations})
	})
	for _, n := range []string{nodeA, nodeB, lost} {
		e.Fleet.Agent(n).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Snapshots: true, MigrationURI: "qemu+tcp://" + n + "/system", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	}
	e.Fleet.Agent(nova).Heartbeat(wire.NodeHeartbeat{Backend: "nova", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	return e
}

// newSnapshot creates snapshot name of the VM vm in namespace.
func newSnapshot(t *testing.T, e *controllertest.Env, namespace, name, vm string, edit ...func(*v1alpha1.VirtualMachineSnapshot)) *v1alpha1.VirtualMachineSnapshot {
	t.Helper()
	s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	s.Spec.VMName = v1alpha1.LocalName(vm)
	for _, fn := range edit {
		fn(s)
	}
	require.NoError(t, e.Kube.Create(e.Ctx, s))
	return s
}

// await waits until the snapshot s shows what check asserts, and returns
// it as it then is.
func await(t *testing.T, e *controllertest.Env, s *v1alpha1.VirtualMachineSnapshot, check func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot)) *v1alpha1.VirtualMachineSnapshot {
	t.Helper()
	got := &v1alpha1.VirtualMachineSnapshot{}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if !assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(s), got)) {
			return
		}
		check(c, got)
	}, within, 10*time.Millisecond)
	return got
}

// inPhase asserts that a snapshot is in phase, and usable only if it
// Succeeded.
func inPhase(phase v1alpha1.SnapshotPhase) func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot) {
	return func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot) {
		assert.Equal(c, phase, s.Status.Phase, s.Status.Message)
		assert.Equal(c, phase == v1alpha1.SnapshotSucceeded, s.Status.ReadyToUse, "readyToUse")
	}
}

// report plays node's agent reporting r of snapshot s, of the VM vm.
func report(t *testing.T, e *controllertest.Env, node string, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, r wire.SnapshotReport) {
	t.Helper()
	r.UID, r.Node, r.VM, r.ObservedAt = string(s.UID), node, string(vm.UID), time.Now()
	controllertest.Report(t, e.Fleet.Agent(node), wire.SnapshotReports, string(s.UID), r)
}

// intent is the snapshot intent of s on node the server holds.
func intent(t *testing.T, e *controllertest.Env, node string, s *v1alpha1.VirtualMachineSnapshot) (wire.SnapshotIntent, bool) {
	t.Helper()
	return controllertest.Stored(t, e.Fleet, wire.SnapshotIntents, node, string(s.UID))
}

// ready plays node taking s of vm and reporting it Ready, and waits for
// the snapshot to show it.
func ready(t *testing.T, e *controllertest.Env, node string, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachineSnapshot {
	t.Helper()
	await(t, e, s, inPhase(v1alpha1.SnapshotInProgress))
	created := time.Now().Truncate(time.Second)
	report(t, e, node, s, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseReady, CreatedAt: &created, DurationMilliseconds: 1500, SizeBytes: 1 << 30, Online: true, Memory: true})
	return await(t, e, s, inPhase(v1alpha1.SnapshotSucceeded))
}

func TestSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	e := startHub(t)

	t.Run("TakenOnTheVMsSealedNodeAndReadyOnlyOnceTheNodeSaysSo", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		s := newSnapshot(t, e, ns, "before-upgrade", "web", func(s *v1alpha1.VirtualMachineSnapshot) { s.Spec.IncludeMemory = true })

		got := await(t, e, s, func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot) {
			inPhase(v1alpha1.SnapshotInProgress)(c, s)
			assert.Equal(c, nodeA, s.Status.Node)
		})
		assert.Equal(t, string(vm.UID), got.Status.SourceUID)
		require.NotNil(t, got.Status.VM, "the VM's spec as it was")
		assert.Equal(t, vm.Spec.ForProvider.Memory.String(), got.Status.VM.Memory.String())
		assert.Contains(t, got.Finalizers, snapshot.Finalizer)
		// The status names the node before the node is asked, so that a
		// hub restarted in between asks the same node.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			in, ok := intent(t, e, nodeA, got)
			assert.True(c, ok, "the snapshot is asked of the VM's node")
			assert.Equal(c, wire.SnapshotIntent{ProtocolVersion: wire.ProtocolVersion, UID: string(s.UID), Namespace: ns, Name: "before-upgrade", VM: string(vm.UID), Memory: true}, in)
		}, within, 10*time.Millisecond)

		// Another node's word that it is ready is counted and ignored.
		foreign := metrics.ForeignReports.WithLabelValues(v1alpha1.VirtualMachineSnapshotKind, nodeB, "put")
		before := testutil.ToFloat64(foreign)
		report(t, e, nodeB, got, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseReady})
		require.Eventually(t, func() bool { return testutil.ToFloat64(foreign) > before }, within, 10*time.Millisecond, "the report from node-b is seen and flagged")
		got = await(t, e, s, inPhase(v1alpha1.SnapshotInProgress))
		assert.Nil(t, got.Status.CreationTime)

		report(t, e, nodeA, got, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseTaking})
		created := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
		report(t, e, nodeA, got, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseReady, CreatedAt: &created, DurationMilliseconds: 1500, SizeBytes: 3 << 30, Online: true, Memory: true})
		got = await(t, e, s, inPhase(v1alpha1.SnapshotSucceeded))
		assert.Equal(t, created, got.Status.CreationTime.UTC())
		assert.Equal(t, int64(1500), got.Status.DurationMilliseconds)
		require.NotNil(t, got.Status.Size)
		assert.Equal(t, resource.NewQuantity(3<<30, resource.BinarySI).String(), got.Status.Size.String())
		assert.True(t, got.Status.Memory)
		assert.False(t, got.Status.Frozen)
		assert.ElementsMatch(t, []string{v1alpha1.IndicationOnline, v1alpha1.IndicationMemory, v1alpha1.IndicationNoGuestAgent}, got.Status.Indications)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.Events(t, got), "Normal/SnapshotTaken", "on the snapshot")
			assert.Contains(c, e.Events(t, vm), "Normal/SnapshotTaken", "on the VM")
		}, within, 50*time.Millisecond)
	})

	t.Run("ANodeThatKeepsNoSnapshotsFailsItAtOnceAndIsAskedNothing", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "db", nova, true, v1alpha1.PhaseRunning)
		s := newSnapshot(t, e, ns, "nightly", "db")

		got := await(t, e, s, inPhase(v1alpha1.SnapshotFailed))
		assert.Equal(t, "node nova-1 (backend nova) keeps no snapshots", got.Status.Message)
		assert.Empty(t, got.Status.Node)
		_, asked := intent(t, e, nova, got)
		assert.False(t, asked)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.Events(t, got), "Warning/SnapshotFailed", "on the snapshot")
			assert.Contains(c, e.Events(t, vm), "Warning/SnapshotFailed", "on the VM")
		}, within, 50*time.Millisecond)
	})

	t.Run("ANodeAnnotationWrittenByHandIsNoPlacement", func(t *testing.T) {
		ns := e.Namespace(t)
		e.VM(t, ns, "web", nodeA, false, v1alpha1.PhaseRunning)
		s := newSnapshot(t, e, ns, "forged", "web")

		got := await(t, e, s, inPhase(v1alpha1.SnapshotPending))
		assert.Contains(t, got.Status.Message, "VirtualMachine web is not admitted to node node-a: refused")
		assert.Empty(t, got.Status.Node)
		_, asked := intent(t, e, nodeA, got)
		assert.False(t, asked, "nothing is published to a node the VM was never published to")
	})

	t.Run("WaitsForTheVM", func(t *testing.T) {
		cases := map[string]struct {
			node    string
			phase   v1alpha1.Phase
			moving  bool
			message string
		}{
			"ThatDoesNotExist":    {message: "VirtualMachine web does not exist"},
			"OnNoNodeYet":         {phase: v1alpha1.PhasePending, message: "VirtualMachine web is on no node yet"},
			"WhoseGuestIsNotMade": {node: nodeA, phase: v1alpha1.PhaseProvisioning, message: "VirtualMachine web is Provisioning; a snapshot is taken of a guest that is Running, Paused or Stopped"},
			"MovingLive":          {node: nodeA, phase: v1alpha1.PhaseRunning, moving: true, message: "VirtualMachine web is moving to node node-b; the snapshot is taken once it is there"},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				ns := e.Namespace(t)
				if tc.phase != "" {
					vm := e.VM(t, ns, "web", tc.node, true, tc.phase)
					if tc.moving {
						m := virtualmachine.Migration{ID: "m1", Target: nodeB}
						vm.Annotations[v1alpha1.AnnotationMigration] = m.String()
						vm.Annotations[v1alpha1.AnnotationMigrationSeal] = virtualmachine.MigrationSeal(e.Fleet.Fleet, string(vm.UID), m)
						require.NoError(t, e.Kube.Update(e.Ctx, vm))
						controllertest.AwaitCached(t, e, vm, func(cached *v1alpha1.VirtualMachine) bool {
							return cached.Annotations[v1alpha1.AnnotationMigration] != ""
						})
					}
				}
				s := newSnapshot(t, e, ns, "waits", "web")
				got := await(t, e, s, inPhase(v1alpha1.SnapshotPending))
				assert.Equal(t, tc.message, got.Status.Message)
				_, asked := intent(t, e, nodeA, got)
				assert.False(t, asked)
			})
		}
	})

	t.Run("DeletionWaitsForTheNodeToReportItGone", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		s := ready(t, e, nodeA, newSnapshot(t, e, ns, "old", "web"), vm)

		require.NoError(t, e.Kube.Delete(e.Ctx, s))
		askedToDelete(t, e, nodeA, s, "the node is asked to delete it")
		e.Get(t, s)
		assert.NotNil(t, s.DeletionTimestamp, "held until the node says it is gone")
		assert.Contains(t, s.Finalizers, snapshot.Finalizer)

		report(t, e, nodeA, s, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseGone})
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(s), &v1alpha1.VirtualMachineSnapshot{}))
		}, within, 10*time.Millisecond, "gone once the node deleted it")
		_, left := intent(t, e, nodeA, s)
		assert.False(t, left, "and its intent with it")
	})

	t.Run("ARestoreFromTheSnapshotHoldsItsDeletion", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		s := ready(t, e, nodeA, newSnapshot(t, e, ns, "golden", "web"), vm)
		rs := &v1alpha1.VirtualMachineRestore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "back"}, Spec: v1alpha1.VirtualMachineRestoreSpec{SnapshotName: "golden"}}
		require.NoError(t, e.Kube.Create(e.Ctx, rs))
		rs.Status = v1alpha1.VirtualMachineRestoreStatus{Phase: v1alpha1.RestoreInProgress}
		require.NoError(t, e.Kube.Status().Update(e.Ctx, rs))

		require.NoError(t, e.Kube.Delete(e.Ctx, s))
		await(t, e, s, func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot) {
			assert.Equal(c, "VirtualMachineRestore back restores from the snapshot; it is deleted once the restore is over", s.Status.Message)
		})
		in, _ := intent(t, e, nodeA, s)
		assert.False(t, in.Absent, "the node keeps it while it is restored from")

		rs.Status = v1alpha1.VirtualMachineRestoreStatus{Phase: v1alpha1.RestoreSucceeded, Complete: true}
		require.NoError(t, e.Kube.Status().Update(e.Ctx, rs))
		askedToDelete(t, e, nodeA, s, "deleted once the restore is over")
	})

	// A user clones a VM from its snapshot (or makes a DiskImage of a
	// disk as the snapshot holds it), then deletes the snapshot before
	// the copy is made. The deletion waits, and the snapshot says for
	// what; its node keeps it until the clone is over (the image made),
	// then is asked to delete it.
	t.Run("AClonesReadersHoldItsDeletionUntilTheyAreDone", func(t *testing.T) {
		cases := map[string]struct {
			// read makes what reads the snapshot, under way, in ns.
			read func(t *testing.T, ns, snapshot string) client.Object
			// finish ends it.
			finish  func(t *testing.T, o client.Object)
			message string
		}{
			"AClone": {
				read: func(t *testing.T, ns, snapshot string) client.Object {
					return clone(t, e, ns, "copy", snapshot, v1alpha1.CloneInProgress)
				},
				finish: func(t *testing.T, o client.Object) {
					c := o.(*v1alpha1.VirtualMachineClone)
					c.Status.Phase = v1alpha1.CloneSucceeded
					require.NoError(t, e.Kube.Status().Update(e.Ctx, c))
				},
				message: "VirtualMachineClone copy copies the snapshot; it is deleted once the clone is over",
			},
			"ADiskImage": {
				read: func(t *testing.T, ns, snapshot string) client.Object {
					return image(t, e, ns, "copy", snapshot, v1alpha1.ImagePhaseImporting)
				},
				finish: func(t *testing.T, o client.Object) {
					img := o.(*v1alpha1.DiskImage)
					img.Status.AtProvider.Phase = v1alpha1.ImagePhaseReady
					require.NoError(t, e.Kube.Status().Update(e.Ctx, img))
				},
				message: "DiskImage copy copies a disk as the snapshot holds it; it is deleted once the image is made",
			},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				ns := e.Namespace(t)
				vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
				s := ready(t, e, nodeA, newSnapshot(t, e, ns, "golden", "web"), vm)
				reader := tc.read(t, ns, "golden")

				require.NoError(t, e.Kube.Delete(e.Ctx, s))
				got := await(t, e, s, func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot) {
					assert.Equal(c, tc.message, s.Status.Message)
				})
				assert.True(t, got.Status.ReadyToUse, "still read from")
				in, _ := intent(t, e, nodeA, s)
				assert.False(t, in.Absent, "the node keeps it while it is copied")

				tc.finish(t, reader)
				askedToDelete(t, e, nodeA, s, "deleted once the copy is made")
			})
		}
	})

	// A clone holds the snapshot's deletion; the user then makes a
	// DiskImage of it, and a clone that fails: neither holds it, and once
	// the first clone is over the snapshot goes.
	t.Run("ReadersMadeAfterTheDeletionOrOverHoldNothing", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		s := ready(t, e, nodeA, newSnapshot(t, e, ns, "golden", "web"), vm)
		first := clone(t, e, ns, "first", "golden", v1alpha1.ClonePending)
		clone(t, e, ns, "failed", "golden", v1alpha1.CloneFailed)
		require.NoError(t, e.Kube.Delete(e.Ctx, s))
		e.Get(t, s)
		// Timestamps are whole seconds: an image made within the second
		// of the deletion counts as made before it.
		require.Eventually(t, func() bool { return time.Now().After(s.DeletionTimestamp.Add(time.Second)) }, within, 10*time.Millisecond)
		image(t, e, ns, "late", "golden", v1alpha1.ImagePhasePending)
		await(t, e, s, func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot) {
			assert.Equal(c, "VirtualMachineClone first copies the snapshot; it is deleted once the clone is over", s.Status.Message)
		})

		first.Status.Phase = v1alpha1.CloneFailed
		require.NoError(t, e.Kube.Status().Update(e.Ctx, first))
		askedToDelete(t, e, nodeA, s, "deleted: the late image holds nothing")
	})

	t.Run("AReportGoneAfterReadyIsLost", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		s := ready(t, e, nodeA, newSnapshot(t, e, ns, "vanishes", "web"), vm)

		report(t, e, nodeA, s, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseGone, Message: "the guest's disks were replaced"})
		got := await(t, e, s, inPhase(v1alpha1.SnapshotLost))
		assert.Equal(t, "node node-a no longer has the snapshot: the guest's disks were replaced", got.Status.Message)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.Events(t, got), "Warning/SnapshotLost")
		}, within, 50*time.Millisecond)
	})

	t.Run("ANodeThatFailsItKeepsNothing", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		s := newSnapshot(t, e, ns, "too-big", "web")
		await(t, e, s, inPhase(v1alpha1.SnapshotInProgress))

		report(t, e, nodeA, s, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseFailed, Message: "disk vdb cannot be snapshotted"})
		got := await(t, e, s, inPhase(v1alpha1.SnapshotFailed))
		assert.Equal(t, "node node-a could not take the snapshot: disk vdb cannot be snapshotted", got.Status.Message)
		askedToDelete(t, e, nodeA, s, "the node deletes what it left")
		report(t, e, nodeA, s, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseGone})
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, ok := intent(t, e, nodeA, s)
			assert.False(c, ok, "and the intent goes once it did")
		}, within, 10*time.Millisecond)
		assert.Equal(t, v1alpha1.SnapshotFailed, got.Status.Phase, "a failure is final")
	})

	t.Run("WhenItsVMIsDeleted", func(t *testing.T) {
		cases := map[string]struct {
			policy  v1alpha1.SnapshotVMDeletionPolicy
			deleted bool
		}{
			"DeleteGoesWithIt": {policy: v1alpha1.SnapshotDelete, deleted: true},
			"RetainKeepsIt":    {policy: v1alpha1.SnapshotRetain},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				ns := e.Namespace(t)
				vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
				s := ready(t, e, nodeA, newSnapshot(t, e, ns, "kept", "web", func(s *v1alpha1.VirtualMachineSnapshot) { s.Spec.VMDeletionPolicy = tc.policy }), vm)
				owned := false
				for _, o := range s.OwnerReferences {
					owned = owned || o.UID == vm.UID
				}
				assert.Equal(t, tc.deleted, owned, "owned by its VM, for the garbage collector, only when it goes with it")

				require.NoError(t, e.Kube.Delete(e.Ctx, vm))
				if !tc.deleted {
					got := await(t, e, s, func(c *assert.CollectT, s *v1alpha1.VirtualMachineSnapshot) {
						assert.Contains(c, s.Status.Message, "VirtualMachine web is gone and the snapshot is kept (vmDeletionPolicy Retain)")
					})
					assert.Equal(t, v1alpha1.SnapshotSucceeded, got.Status.Phase)
					assert.True(t, got.Status.ReadyToUse, "its node still has it")
					return
				}
				askedToDelete(t, e, nodeA, s, "the node is asked to delete it")
				report(t, e, nodeA, s, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseGone})
				require.Eventually(t, func() bool {
					return kerrors.IsNotFound(e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(s), &v1alpha1.VirtualMachineSnapshot{}))
				}, within, 10*time.Millisecond)
			})
		}
	})

	t.Run("AMigrationOfItsVMIsRefusedNamingIt", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		ready(t, e, nodeA, newSnapshot(t, e, ns, "pinned", "web"), vm)

		m := &v1alpha1.VirtualMachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "away"}, Spec: v1alpha1.VirtualMachineMigrationSpec{VMName: "web"}}
		require.NoError(t, e.Kube.Create(e.Ctx, m))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(m), m))
			assert.Equal(c, v1alpha1.MigrationFailed, m.Status.Phase)
		}, within, 10*time.Millisecond)
		assert.Equal(t, "VM has snapshots pinned on node node-a that cannot move with it: delete them first", m.Status.Message)
		e.Get(t, vm)
		_, moving := virtualmachine.MigrationOf(vm, e.Fleet.Fleet)
		assert.False(t, moving)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, m.Status.Message, e.EventMessage(t, vm, corev1.EventTypeWarning, migration.ReasonFailed), "the VM says why it stays")
		}, within, 50*time.Millisecond)
	})

	// Last: it loses a node for good.
	t.Run("ALostNodeMakesItLostAndItsDeletionEndsAfterTheFencingTimeout", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", lost, true, v1alpha1.PhaseRunning)
		s := ready(t, e, lost, newSnapshot(t, e, ns, "on-a-node-that-goes", "web"), vm)

		e.Fleet.Agent(lost).Stop()
		got := await(t, e, s, inPhase(v1alpha1.SnapshotLost))
		assert.Contains(t, got.Status.Message, "node lost-1 has sent no heartbeat since")

		require.NoError(t, e.Kube.Delete(e.Ctx, got))
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(s), &v1alpha1.VirtualMachineSnapshot{}))
		}, within, 10*time.Millisecond, "let go without the node's word")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.EventMessage(t, got, corev1.EventTypeWarning, snapshot.ReasonNodeLost), "after the fencing timeout (1s)")
		}, within, 50*time.Millisecond)
		in, ok := intent(t, e, lost, s)
		assert.True(t, ok && in.Absent, "the node deletes it when its agent is back")
	})
}

// TestSnapshotsPastTheQuotaFailBeforeAnyNodeIsAsked plays a tenant that
// asks for many snapshots at once, to fill its VM's node with more
// snapshots, or more storage, than the administrator's TenantQuota allows.
//
// Attacker's steps, for each limit: with a VM running on node-a and its
// 4Gi root Volume there, `kubectl -n t1 apply` several
// VirtualMachineSnapshots of it in one go. Before these limits, node-a was
// asked for every one. Now as many are asked for as fit (a snapshot being
// taken counts the size of the VM's disks, which it may grow to); the
// others are Failed before any node is asked, naming namespace, limit, use
// and what they would add. Once its node reports a snapshot's real size,
// that is what counts, and a new snapshot fits again.
func TestSnapshotsPastTheQuotaFailBeforeAnyNodeIsAsked(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	e := startHub(t)
	cases := map[string]struct {
		hard apisv1alpha1.QuotaAmounts
		// snapshots are how many the tenant asks for at once, fit how
		// many the quota takes.
		snapshots, fit int
		// refused is why the others failed, after "quota of namespace
		// <ns> exceeded: ", with %s the quota's name.
		refused string
	}{
		"Snapshots": {
			hard: apisv1alpha1.QuotaAmounts{Snapshots: ptr.To[int64](2)}, snapshots: 4, fit: 2,
			refused: "snapshots would be 3 of 2 (TenantQuota %s; 2 in use, this snapshot 1)",
		},
		"Storage": {
			hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("10Gi"))}, snapshots: 3, fit: 1,
			refused: "storage would be 12Gi of 10Gi (TenantQuota %s; 8Gi in use, this snapshot 4Gi)",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := e.Namespace(t)
			q := &apisv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: ns}, Spec: apisv1alpha1.TenantQuotaSpec{Namespace: ns, Hard: tc.hard}}
			require.NoError(t, e.Kube.Create(e.Ctx, q))
			require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.Volume{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "root", Annotations: map[string]string{v1alpha1.AnnotationNode: nodeA}},
				Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("4Gi")}},
			}))
			vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
			snaps := make([]*v1alpha1.VirtualMachineSnapshot, tc.snapshots)
			for i := range snaps {
				snaps[i] = newSnapshot(t, e, ns, fmt.Sprintf("s-%d", i), "web")
			}

			want := fmt.Sprintf("quota of namespace %s exceeded: "+tc.refused, ns, q.Name)
			var taking []*v1alpha1.VirtualMachineSnapshot
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				taking = nil
				refused, other := 0, []string{}
				for _, s := range snaps {
					got := &v1alpha1.VirtualMachineSnapshot{}
					if !assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(s), got)) {
						return
					}
					switch {
					case got.Status.Phase == v1alpha1.SnapshotInProgress:
						taking = append(taking, got)
					case got.Status.Phase == v1alpha1.SnapshotFailed && got.Status.Message == want && got.Status.Node == "":
						refused++
					default:
						other = append(other, string(got.Status.Phase)+": "+got.Status.Message)
					}
				}
				assert.Len(c, taking, tc.fit, "as many are asked of the node as the quota takes; others say %q", other)
				assert.Equal(c, tc.snapshots-tc.fit, refused, "the others failed, naming the limit")
			}, within, 50*time.Millisecond)
			for _, s := range snaps {
				got := &v1alpha1.VirtualMachineSnapshot{}
				require.NoError(t, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(s), got))
				if got.Status.Phase == v1alpha1.SnapshotFailed {
					_, asked := intent(t, e, nodeA, got)
					assert.False(t, asked, "no node is asked for a snapshot past the quota")
				}
			}

			// Its node reports each snapshot's real size, which counts from
			// then on: room for one more.
			for _, s := range taking {
				created := time.Now().Truncate(time.Second)
				report(t, e, nodeA, s, vm, wire.SnapshotReport{Phase: wire.SnapshotPhaseReady, CreatedAt: &created, SizeBytes: 1 << 20})
				await(t, e, s, inPhase(v1alpha1.SnapshotSucceeded))
			}
			if tc.hard.Storage != nil {
				another := newSnapshot(t, e, ns, "another", "web")
				await(t, e, another, inPhase(v1alpha1.SnapshotInProgress))
			}
		})
	}
}

// clone makes a clone named name of snapshot in namespace, in phase, as
// the clone controller (not run here) would show it.
func clone(t *testing.T, e *controllertest.Env, namespace, name, snapshot string, phase v1alpha1.ClonePhase) *v1alpha1.VirtualMachineClone {
	t.Helper()
	c := &v1alpha1.VirtualMachineClone{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	c.Spec.Source = v1alpha1.CloneSource{Kind: v1alpha1.CloneFromVirtualMachineSnapshot, Name: v1alpha1.LocalName(snapshot)}
	c.Spec.Target.Name = v1alpha1.LocalName(name + "-vm")
	require.NoError(t, e.Kube.Create(e.Ctx, c))
	c.Status.Phase = phase
	require.NoError(t, e.Kube.Status().Update(e.Ctx, c))
	return c
}

// image makes a DiskImage named name copying Volume web-root as snapshot
// holds it, in namespace, in phase, as the nodes' reports would show it.
func image(t *testing.T, e *controllertest.Env, namespace, name, snapshot string, phase v1alpha1.ImagePhase) *v1alpha1.DiskImage {
	t.Helper()
	img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	img.Spec.ForProvider.Source = v1alpha1.DiskImageSource{
		VolumeRef: &v1alpha1.LocalReference{Name: "web-root"}, SnapshotRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(snapshot)},
	}
	require.NoError(t, e.Kube.Create(e.Ctx, img))
	img.Status.AtProvider.Phase = phase
	require.NoError(t, e.Kube.Status().Update(e.Ctx, img))
	return img
}

// askedToDelete waits until node is asked to delete s.
func askedToDelete(t *testing.T, e *controllertest.Env, node string, s *v1alpha1.VirtualMachineSnapshot, why string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		in, ok := intent(t, e, node, s)
		assert.True(c, ok && in.Absent, why)
	}, within, 10*time.Millisecond)
}
