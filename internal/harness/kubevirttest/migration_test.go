package kubevirttest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// migrations is a test cluster and what the migration tests share.
type migrations struct {
	t    *testing.T
	c    *Cluster
	kube client.Client
}

// runningVM creates a VM whose root PVC has the access mode given and
// waits until its VMI runs.
func (m *migrations) runningVM(name string, mode corev1.PersistentVolumeAccessMode) *kubevirtv1.VirtualMachineInstance {
	m.t.Helper()
	ctx := context.Background()
	require.NoError(m.t, m.kube.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name + "-root"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{mode},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}))
	require.NoError(m.t, m.kube.Create(ctx, testVM(name)))
	return m.vmiRunning(name)
}

func (m *migrations) vmiRunning(name string) *kubevirtv1.VirtualMachineInstance {
	m.t.Helper()
	vmi := &kubevirtv1.VirtualMachineInstance{}
	require.Eventually(m.t, func() bool {
		return m.kube.Get(context.Background(), types.NamespacedName{Namespace: DefaultNamespace, Name: name}, vmi) == nil && vmi.Status.Phase == kubevirtv1.Running
	}, 10*time.Second, 20*time.Millisecond)
	return vmi
}

func (m *migrations) vmi(name string) *kubevirtv1.VirtualMachineInstance {
	m.t.Helper()
	vmi := &kubevirtv1.VirtualMachineInstance{}
	require.NoError(m.t, m.kube.Get(context.Background(), types.NamespacedName{Namespace: DefaultNamespace, Name: name}, vmi))
	return vmi
}

// migrate creates a migration of the VMI vmi, changed by opts.
func (m *migrations) migrate(name, vmi string, opts ...func(*kubevirtv1.VirtualMachineInstanceMigration)) {
	m.t.Helper()
	mig := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
	}
	for _, o := range opts {
		o(mig)
	}
	require.NoError(m.t, m.kube.Create(context.Background(), mig))
}

// final waits until the migration is over and returns it.
func (m *migrations) final(name string) *kubevirtv1.VirtualMachineInstanceMigration {
	m.t.Helper()
	mig := &kubevirtv1.VirtualMachineInstanceMigration{}
	require.Eventually(m.t, func() bool {
		err := m.kube.Get(context.Background(), types.NamespacedName{Namespace: DefaultNamespace, Name: name}, mig)
		return err == nil && mig.IsFinal() && len(mig.Finalizers) == 0
	}, 15*time.Second, 20*time.Millisecond, "migration %s, last %+v", name, &mig.Status)
	return mig
}

// warnings are the messages of the warning events on the migration.
func (m *migrations) warnings(mig *kubevirtv1.VirtualMachineInstanceMigration) []string {
	m.t.Helper()
	events := &corev1.EventList{}
	require.NoError(m.t, m.kube.List(context.Background(), events, client.InNamespace(mig.Namespace)))
	var out []string
	for _, e := range events.Items {
		if e.InvolvedObject.UID == mig.UID && e.Type == corev1.EventTypeWarning {
			out = append(out, e.Message)
		}
	}
	return out
}

func phasesOf(mig *kubevirtv1.VirtualMachineInstanceMigration) []kubevirtv1.VirtualMachineInstanceMigrationPhase {
	var out []kubevirtv1.VirtualMachineInstanceMigrationPhase
	for _, p := range mig.Status.PhaseTransitionTimestamps {
		out = append(out, p.Phase)
	}
	return out
}

func onNode(host string) func(*kubevirtv1.VirtualMachineInstanceMigration) {
	return func(mig *kubevirtv1.VirtualMachineInstanceMigration) {
		mig.Spec.AddedNodeSelector = map[string]string{corev1.LabelHostname: host}
	}
}

// TestFakeVirtControllerMigrates starts one cluster and migrates VMIs as
// KubeVirt would, and fails migrations as KubeVirt would.
func TestFakeVirtControllerMigrates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	m := &migrations{t: t, c: c, kube: c.Client}
	ctx := context.Background()
	before := m.runningVM("mover", corev1.ReadWriteMany)
	require.Contains(t, before.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue},
		"a VMI on ReadWriteMany PVCs is LiveMigratable")
	other := map[string]string{"kv-node-a": "kv-node-b", "kv-node-b": "kv-node-a"}

	t.Run("MovesTheVMIToAnotherNodeThroughEveryPhase", func(t *testing.T) {
		from := m.vmi("mover").Status.NodeName
		m.migrate("move-1", "mover")
		mig := m.final("move-1")
		assert.Equal(t, kubevirtv1.MigrationSucceeded, mig.Status.Phase)
		assert.Equal(t, []kubevirtv1.VirtualMachineInstanceMigrationPhase{
			kubevirtv1.MigrationPending, kubevirtv1.MigrationScheduling, kubevirtv1.MigrationScheduled, kubevirtv1.MigrationPreparingTarget,
			kubevirtv1.MigrationTargetReady, kubevirtv1.MigrationRunning, kubevirtv1.MigrationSucceeded,
		}, phasesOf(mig))
		assert.Equal(t, "mover", mig.Labels[kubevirtv1.MigrationSelectorLabel], "virt-api labels the migration with its VMI")

		vmi := m.vmi("mover")
		assert.Equal(t, before.UID, vmi.UID, "the same VMI, moved")
		assert.Equal(t, other[from], vmi.Status.NodeName, "the VMI runs on the other node now")
		s := vmi.Status.MigrationState
		require.NotNil(t, s)
		assert.Equal(t, mig.UID, s.MigrationUID)
		assert.Equal(t, from, s.SourceNode)
		assert.Equal(t, other[from], s.TargetNode)
		assert.Regexp(t, `^10\.199\.0\.\d+$`, s.TargetNodeAddress)
		require.NotNil(t, s.StartTimestamp)
		require.NotNil(t, s.EndTimestamp)
		assert.False(t, s.EndTimestamp.Before(s.StartTimestamp))
		assert.True(t, s.Completed)
		assert.False(t, s.Failed)
		assert.Equal(t, kubevirtv1.MigrationPreCopy, s.Mode)
		assert.Equal(t, s, mig.Status.MigrationState, "the finished migration keeps the VMI's migration state")
		assert.Empty(t, m.warnings(mig))

		vm := &kubevirtv1.VirtualMachine{}
		require.Eventually(t, func() bool {
			require.NoError(t, m.kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "mover"}, vm))
			return vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusRunning
		}, 5*time.Second, 20*time.Millisecond, "the VM no longer shows Migrating")

		m.migrate("move-2", "mover")
		assert.Equal(t, kubevirtv1.MigrationSucceeded, m.final("move-2").Status.Phase)
		assert.Equal(t, from, m.vmi("mover").Status.NodeName, "and back")
	})

	t.Run("AFailureVirtHandlerReportsLeavesTheVMIWhereItWas", func(t *testing.T) {
		from := m.vmi("mover").Status.NodeName
		c.Controller.FailNextMigration(types.NamespacedName{Namespace: DefaultNamespace, Name: "mover"}, "Live migration failed: injected")
		m.migrate("fail-1", "mover")
		mig := m.final("fail-1")
		assert.Equal(t, kubevirtv1.MigrationFailed, mig.Status.Phase)
		assert.Contains(t, phasesOf(mig), kubevirtv1.MigrationRunning, "it failed while it ran")
		vmi := m.vmi("mover")
		assert.Equal(t, from, vmi.Status.NodeName)
		assert.Equal(t, kubevirtv1.Running, vmi.Status.Phase)
		s := vmi.Status.MigrationState
		require.NotNil(t, s)
		assert.True(t, s.Failed)
		assert.True(t, s.Completed)
		assert.Equal(t, "Live migration failed: injected", s.FailureReason)
		require.NotNil(t, mig.Status.MigrationState)
		assert.Equal(t, "Live migration failed: injected", mig.Status.MigrationState.FailureReason)
		assert.Equal(t, []string{msgSourceFailed}, m.warnings(mig))

		m.migrate("fail-2", "mover")
		assert.Equal(t, kubevirtv1.MigrationSucceeded, m.final("fail-2").Status.Phase, "only the next migration fails")
	})

	t.Run("NoOtherNodeFailsAfterTheUnschedulableTimeout", func(t *testing.T) {
		from := m.vmi("mover").Status.NodeName
		m.migrate("nowhere", "mover", onNode("kv-node-cordoned"), func(mig *kubevirtv1.VirtualMachineInstanceMigration) {
			mig.Annotations = map[string]string{kubevirtv1.MigrationUnschedulablePodTimeoutSecondsAnnotation: "1"}
		})
		mig := m.final("nowhere")
		assert.Equal(t, kubevirtv1.MigrationFailed, mig.Status.Phase)
		assert.Equal(t, []string{fmt.Sprintf("Migration target pod for VMI [%s/mover] is currently unschedulable.", DefaultNamespace), msgTargetRemoved}, m.warnings(mig))
		vmi := m.vmi("mover")
		assert.Equal(t, from, vmi.Status.NodeName)
		assert.NotEqual(t, mig.UID, vmi.Status.MigrationState.MigrationUID, "never handed off to the VMI")
		assert.Nil(t, mig.Status.MigrationState)
	})

	t.Run("DeletingAMigrationThatRunsAbortsIt", func(t *testing.T) {
		from := m.vmi("mover").Status.NodeName
		m.migrate("abort", "mover", onNode("kv-node-notready"))
		mig := &kubevirtv1.VirtualMachineInstanceMigration{}
		nn := types.NamespacedName{Namespace: DefaultNamespace, Name: "abort"}
		require.Eventually(t, func() bool {
			return m.kube.Get(ctx, nn, mig) == nil && mig.Status.Phase == kubevirtv1.MigrationScheduling
		}, 5*time.Second, 20*time.Millisecond)
		require.NoError(t, m.kube.Delete(ctx, mig))
		require.Eventually(t, func() bool { return kerrors.IsNotFound(m.kube.Get(ctx, nn, mig)) }, 5*time.Second, 20*time.Millisecond)
		assert.Equal(t, from, m.vmi("mover").Status.NodeName)
	})

	t.Run("WhatVirtAPIRefusesFails", func(t *testing.T) {
		m.runningVM("pinned", corev1.ReadWriteOnce)
		finished := &kubevirtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: "finished"},
			Spec:       testVM("finished").Spec.Template.Spec,
			Status:     kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Succeeded},
		}
		require.NoError(t, m.kube.Create(ctx, finished))
		m.migrate("busy", "mover", onNode("kv-node-cordoned"))

		cases := map[string]struct {
			vmi, want string
		}{
			"NoVMI":         {vmi: "absent", want: fmt.Sprintf("the VMI \"%s/absent\" does not exist", DefaultNamespace)},
			"FinishedVMI":   {vmi: "finished", want: "Cannot migrate VMI in finalized state."},
			"NotMigratable": {vmi: "pinned", want: "Cannot migrate VMI, Reason: DisksNotLiveMigratable, Message: cannot migrate VMI: PVC pinned-root is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"},
			"InFlight":      {vmi: "mover", want: "in-flight migration detected"},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				m.migrate("refused-"+tc.vmi, tc.vmi)
				mig := m.final("refused-" + tc.vmi)
				assert.Equal(t, kubevirtv1.MigrationFailed, mig.Status.Phase)
				assert.Equal(t, []kubevirtv1.VirtualMachineInstanceMigrationPhase{kubevirtv1.MigrationFailed}, phasesOf(mig), "never accepted")
				warnings := m.warnings(mig)
				require.Len(t, warnings, 1)
				assert.Contains(t, warnings[0], tc.want)
			})
		}
		busy := &kubevirtv1.VirtualMachineInstanceMigration{}
		require.NoError(t, m.kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "busy"}, busy))
		assert.False(t, busy.IsFinal(), "the migration in flight goes on")
		require.NoError(t, m.kube.Delete(ctx, busy))
	})

	t.Run("KeepsTheNewestFinishedMigrationsOfAVMI", func(t *testing.T) {
		require.NoError(t, m.kube.Create(ctx, &kubevirtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: "collected"},
			Spec:       testVM("collected").Spec.Template.Spec,
			Status:     kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Failed},
		}))
		for i := range FinalizedMigrationsKept + 2 {
			m.migrate(fmt.Sprintf("gc-%d", i), "collected")
			m.final(fmt.Sprintf("gc-%d", i))
		}
		require.Eventually(t, func() bool {
			migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
			require.NoError(t, m.kube.List(ctx, migs, client.InNamespace(DefaultNamespace)))
			var names []string
			for _, mig := range migs.Items {
				if mig.Spec.VMIName == "collected" {
					names = append(names, mig.Name)
				}
			}
			return assert.ObjectsAreEqual([]string{"gc-2", "gc-3", "gc-4", "gc-5", "gc-6"}, names)
		}, 5*time.Second, 20*time.Millisecond)
	})

	t.Run("MigrationsGoWithTheirVMI", func(t *testing.T) {
		vm := &kubevirtv1.VirtualMachine{}
		require.Eventually(t, func() bool { // the controller writes the VM too: retry on conflicts
			require.NoError(t, m.kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "mover"}, vm))
			vm.Spec.RunStrategy = ptr(kubevirtv1.RunStrategyHalted)
			return m.kube.Update(ctx, vm) == nil
		}, 5*time.Second, 20*time.Millisecond)
		require.Eventually(t, func() bool {
			migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
			require.NoError(t, m.kube.List(ctx, migs, client.InNamespace(DefaultNamespace)))
			for _, mig := range migs.Items {
				if mig.Spec.VMIName == "mover" && accepted(&mig) {
					return false
				}
			}
			return true
		}, 5*time.Second, 20*time.Millisecond)
	})
}
