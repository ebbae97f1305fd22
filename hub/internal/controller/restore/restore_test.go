package restore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/restore"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// The nodes of the tests: two that keep snapshots.
const (
	nodeA = "node-a"
	nodeB = "node-b"
)

// within bounds every wait for the hub.
const within = 30 * time.Second

// startHub runs the restore controller against a real API server and a
// fleet over a real nats-server. The snapshots the tests restore are
// written by hand, as the snapshot controller would show them.
func startHub(t *testing.T) *controllertest.Env {
	t.Helper()
	e := controllertest.Start(t, []string{nodeA, nodeB}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		restores := wake.NewNotifierFor(perobject.NewOwner(nil), func() client.Object { return &v1alpha1.VirtualMachineRestore{} })
		e.Fleet.Guests.Subscribe(restores.Notify)
		return restore.Setup(mgr, o, restore.Options{Pool: e.Pool, Notifier: restores})
	})
	for _, n := range []string{nodeA, nodeB} {
		e.Fleet.Agent(n).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Snapshots: true})
	}
	return e
}

// snapshotOf creates snapshot name of vm, taken (ready to use) on node
// unless phase says otherwise, and of the VM of uid source.
func snapshotOf(t *testing.T, e *controllertest.Env, vm *v1alpha1.VirtualMachine, name, node, source string, phase v1alpha1.SnapshotPhase) *v1alpha1.VirtualMachineSnapshot {
	t.Helper()
	s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: name}, Spec: v1alpha1.VirtualMachineSnapshotSpec{VMName: v1alpha1.LocalName(vm.Name)}}
	require.NoError(t, e.Kube.Create(e.Ctx, s))
	s.Status = v1alpha1.VirtualMachineSnapshotStatus{Phase: phase, ReadyToUse: phase == v1alpha1.SnapshotSucceeded, SourceUID: source, Node: node}
	require.NoError(t, e.Kube.Status().Update(e.Ctx, s))
	return s
}

// newRestore creates restore name of snapshot.
func newRestore(t *testing.T, e *controllertest.Env, namespace, name, snapshot string) *v1alpha1.VirtualMachineRestore {
	t.Helper()
	rs := &v1alpha1.VirtualMachineRestore{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: v1alpha1.VirtualMachineRestoreSpec{SnapshotName: v1alpha1.LocalName(snapshot)}}
	require.NoError(t, e.Kube.Create(e.Ctx, rs))
	return rs
}

// await waits until the restore rs is in phase, and returns it as it then
// is.
func await(t *testing.T, e *controllertest.Env, rs *v1alpha1.VirtualMachineRestore, phase v1alpha1.RestorePhase) *v1alpha1.VirtualMachineRestore {
	t.Helper()
	got := &v1alpha1.VirtualMachineRestore{}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(rs), got)) {
			assert.Equal(c, phase, got.Status.Phase, got.Status.Message)
		}
	}, within, 10*time.Millisecond)
	return got
}

// marked waits until vm shows whether it carries a restore sealed by the
// hub, and returns it.
func marked(t *testing.T, e *controllertest.Env, vm *v1alpha1.VirtualMachine, want bool) (virtualmachine.Restore, *v1alpha1.VirtualMachine) {
	t.Helper()
	var r virtualmachine.Restore
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if !assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(vm), vm)) {
			return
		}
		var ok bool
		r, ok = virtualmachine.RestoreOf(vm, e.Fleet.Fleet)
		assert.Equal(c, want, ok, "the VM carries a sealed restore")
	}, within, 10*time.Millisecond)
	return r, vm
}

// progress plays node reporting the restore rs of vm.
func progress(t *testing.T, e *controllertest.Env, node string, vm *v1alpha1.VirtualMachine, rs *v1alpha1.VirtualMachineRestore, p wire.RestoreReport) {
	t.Helper()
	p.ID = string(rs.UID)
	controllertest.Report(t, e.Fleet.Agent(node), wire.GuestReports, string(vm.UID), wire.Report{UID: string(vm.UID), Node: node, Phase: wire.PhaseRunning, Restore: &p, ObservedAt: time.Now()})
}

func TestRestores(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	e := startHub(t)

	t.Run("MarksTheVMSealedAndSucceedsOnTheNodesWord", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		snap := snapshotOf(t, e, vm, "before-upgrade", nodeA, string(vm.UID), v1alpha1.SnapshotSucceeded)
		rs := newRestore(t, e, ns, "back", "before-upgrade")

		got := await(t, e, rs, v1alpha1.RestoreInProgress)
		assert.Equal(t, string(vm.UID), got.Status.TargetUID)
		assert.Contains(t, got.Finalizers, restore.Finalizer)
		m, vm := marked(t, e, vm, true)
		assert.Equal(t, virtualmachine.Restore{ID: string(rs.UID), Snapshot: string(snap.UID)}, m)
		assert.Equal(t, string(rs.UID)+"/"+string(snap.UID), vm.Annotations[v1alpha1.AnnotationRestore])

		started := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
		progress(t, e, nodeA, vm, rs, wire.RestoreReport{Phase: wire.RestoreRunning, StartedAt: &started})
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(rs), got))
			assert.Equal(c, "node node-a is restoring VirtualMachine web", got.Status.Message)
		}, within, 10*time.Millisecond)
		assert.False(t, got.Status.Complete)

		finished := started.Add(2500 * time.Millisecond)
		progress(t, e, nodeA, vm, rs, wire.RestoreReport{Phase: wire.RestoreSucceeded, StartedAt: &started, FinishedAt: &finished})
		got = await(t, e, rs, v1alpha1.RestoreSucceeded)
		assert.True(t, got.Status.Complete)
		require.NotNil(t, got.Status.RestoreTime)
		assert.Equal(t, finished.Truncate(time.Second), got.Status.RestoreTime.UTC(), "as the API keeps times, to the second")
		assert.Equal(t, int64(2500), got.Status.DurationMilliseconds)
		_, vm = marked(t, e, vm, false)
		assert.NotContains(t, vm.Annotations, v1alpha1.AnnotationRestore)
		assert.NotContains(t, vm.Annotations, v1alpha1.AnnotationRestoreSeal)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(rs), got))
			assert.NotContains(c, got.Finalizers, restore.Finalizer, "let go once the VM is")
			assert.Contains(c, e.Events(t, got), "Normal/RestoreSucceeded", "on the restore")
			assert.Contains(c, e.Events(t, vm), "Normal/RestoreSucceeded", "on the VM")
		}, within, 50*time.Millisecond)
	})

	t.Run("TheNodesFailureFailsItAndDropsTheMark", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		snapshotOf(t, e, vm, "s", nodeA, string(vm.UID), v1alpha1.SnapshotSucceeded)
		rs := newRestore(t, e, ns, "back", "s")
		await(t, e, rs, v1alpha1.RestoreInProgress)
		_, vm = marked(t, e, vm, true)

		progress(t, e, nodeA, vm, rs, wire.RestoreReport{Phase: wire.RestoreFailed, Message: "snapshot metadata is corrupt"})
		got := await(t, e, rs, v1alpha1.RestoreFailed)
		assert.Equal(t, "node node-a could not restore the VM: snapshot metadata is corrupt", got.Status.Message)
		assert.False(t, got.Status.Complete)
		marked(t, e, vm, false)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.Events(t, got), "Warning/RestoreFailed", "on the restore")
			assert.Contains(c, e.Events(t, vm), "Warning/RestoreFailed", "on the VM")
		}, within, 50*time.Millisecond)
	})

	t.Run("RefusesOrWaits", func(t *testing.T) {
		cases := map[string]struct {
			// snapshotNode is the node the snapshot is on; node-a, the
			// VM's, when empty.
			snapshotNode string
			// otherVM makes the snapshot one of another VM of the same
			// name.
			otherVM bool
			phase   v1alpha1.SnapshotPhase
			want    v1alpha1.RestorePhase
			message string
		}{
			"ASnapshotOfAnotherVMOfTheSameName": {
				otherVM: true, phase: v1alpha1.SnapshotSucceeded, want: v1alpha1.RestoreFailed,
				message: "snapshot s is of VM uid an-earlier-web, not of VM web (uid ",
			},
			"ASnapshotOnAnotherNode": {
				snapshotNode: nodeB, phase: v1alpha1.SnapshotSucceeded, want: v1alpha1.RestoreFailed,
				message: "VirtualMachine web is on node node-a and snapshot s on node node-b: a snapshot is restored on its own node only",
			},
			"ASnapshotThatFailed": {
				phase: v1alpha1.SnapshotFailed, want: v1alpha1.RestoreFailed,
				message: "VirtualMachineSnapshot s failed",
			},
			"ASnapshotNotTakenYet": {
				phase: v1alpha1.SnapshotInProgress, want: v1alpha1.RestorePending,
				message: "waiting for VirtualMachineSnapshot s to be ready to use (it is InProgress)",
			},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				ns := e.Namespace(t)
				vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
				source := string(vm.UID)
				if tc.otherVM {
					source = "an-earlier-web"
				}
				node := nodeA
				if tc.snapshotNode != "" {
					node = tc.snapshotNode
				}
				snapshotOf(t, e, vm, "s", node, source, tc.phase)
				rs := newRestore(t, e, ns, "back", "s")

				got := await(t, e, rs, tc.want)
				assert.Contains(t, got.Status.Message, tc.message)
				_, vm = marked(t, e, vm, false)
				assert.NotContains(t, vm.Annotations, v1alpha1.AnnotationRestore, "the VM is not marked")
			})
		}
	})

	t.Run("ARestoreWaitsForTheVMsRestoreUnderWay", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		snapshotOf(t, e, vm, "s", nodeA, string(vm.UID), v1alpha1.SnapshotSucceeded)
		first := newRestore(t, e, ns, "first", "s")
		await(t, e, first, v1alpha1.RestoreInProgress)

		second := newRestore(t, e, ns, "second", "s")
		got := await(t, e, second, v1alpha1.RestorePending)
		assert.Equal(t, "VirtualMachine web is being restored by VirtualMachineRestore first; this restore waits for it", got.Status.Message)
		m, _ := marked(t, e, vm, true)
		assert.Equal(t, string(first.UID), m.ID, "the VM stays the first's")

		progress(t, e, nodeA, vm, first, wire.RestoreReport{Phase: wire.RestoreSucceeded})
		await(t, e, first, v1alpha1.RestoreSucceeded)
		await(t, e, second, v1alpha1.RestoreInProgress)
		m, _ = marked(t, e, vm, true)
		assert.Equal(t, string(second.UID), m.ID, "then it is the second's")
	})

	t.Run("DeletingARestoreUnderWayDropsTheMark", func(t *testing.T) {
		ns := e.Namespace(t)
		vm := e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		snapshotOf(t, e, vm, "s", nodeA, string(vm.UID), v1alpha1.SnapshotSucceeded)
		rs := newRestore(t, e, ns, "back", "s")
		await(t, e, rs, v1alpha1.RestoreInProgress)
		marked(t, e, vm, true)

		require.NoError(t, e.Kube.Delete(e.Ctx, rs))
		marked(t, e, vm, false)
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(rs), &v1alpha1.VirtualMachineRestore{}))
		}, within, 10*time.Millisecond)
	})
}
