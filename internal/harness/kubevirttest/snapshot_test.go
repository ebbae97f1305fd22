package kubevirttest

import (
	"context"
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
	snapshotv1 "kubevirt.io/api/snapshot/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func snapshotOf(name, vm string) *snapshotv1.VirtualMachineSnapshot {
	return &snapshotv1.VirtualMachineSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name},
		Spec:       snapshotv1.VirtualMachineSnapshotSpec{Source: corev1.TypedLocalObjectReference{APIGroup: ptr(kubevirtv1.GroupVersion.Group), Kind: "VirtualMachine", Name: vm}},
	}
}

func restoreOf(name, vm, snapshot string) *snapshotv1.VirtualMachineRestore {
	return &snapshotv1.VirtualMachineRestore{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name},
		Spec: snapshotv1.VirtualMachineRestoreSpec{
			Target:                     corev1.TypedLocalObjectReference{APIGroup: ptr(kubevirtv1.GroupVersion.Group), Kind: "VirtualMachine", Name: vm},
			VirtualMachineSnapshotName: snapshot,
		},
	}
}

// TestFakeVirtControllerSnapshotsAndRestores starts one cluster and
// snapshots and restores VMs as KubeVirt's snapshot and restore
// controllers would.
func TestFakeVirtControllerSnapshotsAndRestores(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	m := &migrations{t: t, c: c, kube: c.Client}
	ctx := context.Background()
	key := func(name string) types.NamespacedName {
		return types.NamespacedName{Namespace: DefaultNamespace, Name: name}
	}
	ready := func(name string) *snapshotv1.VirtualMachineSnapshot {
		t.Helper()
		s := &snapshotv1.VirtualMachineSnapshot{}
		require.Eventually(t, func() bool {
			return c.Client.Get(ctx, key(name), s) == nil && s.Status != nil && s.Status.ReadyToUse != nil && *s.Status.ReadyToUse
		}, 10*time.Second, 20*time.Millisecond, "snapshot %s, last %+v", name, &s.Status)
		return s
	}
	vmi := m.runningVM("snapped", corev1.ReadWriteOnce)

	t.Run("AnOnlineSnapshotKeepsTheVMItsVMIStartedFrom", func(t *testing.T) {
		vm := &kubevirtv1.VirtualMachine{}
		require.NoError(t, c.Client.Get(ctx, key("snapped"), vm))
		started := vm.Spec.Template.Spec.Domain.Memory.Guest.String()
		bigger := vm.DeepCopy()
		bigger.Spec.Template.Spec.Domain.Memory.Guest = ptr(resource.MustParse("2Gi"))
		require.NoError(t, c.Client.Patch(ctx, bigger, client.MergeFrom(vm)))
		require.NoError(t, c.Client.Create(ctx, snapshotOf("online", "snapped")))

		s := ready("online")
		assert.Equal(t, snapshotv1.Succeeded, s.Status.Phase)
		assert.Equal(t, vm.UID, *s.Status.SourceUID)
		assert.NotNil(t, s.Status.CreationTime)
		assert.Equal(t, []snapshotv1.Indication{snapshotv1.VMSnapshotNoGuestAgentIndication, snapshotv1.VMSnapshotOnlineSnapshotIndication}, s.Status.Indications,
			"online, and no guest agent connected")
		assert.Contains(t, s.Finalizers, FinalizerSnapshot)
		content := &snapshotv1.VirtualMachineSnapshotContent{}
		require.NoError(t, c.Client.Get(ctx, key(*s.Status.VirtualMachineSnapshotContentName), content))
		assert.Equal(t, "vmsnapshot-content-"+string(s.UID), content.Name)
		assert.Equal(t, started, content.Spec.Source.VirtualMachine.Spec.Template.Spec.Domain.Memory.Guest.String(),
			"the VM the running VMI was started from, not the one changed since")
		require.Len(t, content.Spec.VolumeBackups, 1, "a backup per PVC")
		assert.Equal(t, "snapped-root", content.Spec.VolumeBackups[0].PersistentVolumeClaim.Name)
		assert.Equal(t, "vmsnapshot-"+string(s.UID)+"-volume-root", *content.Spec.VolumeBackups[0].VolumeSnapshotName)
	})

	t.Run("ASnapshotOfNoVMStaysInProgressUntilItsDeadline", func(t *testing.T) {
		s := snapshotOf("orphan", "absent")
		// The controller's first look must come before the deadline for
		// the snapshot to be seen InProgress at all. The deadline counts
		// from the creation timestamp, which has whole seconds: a deadline
		// of a second could end a moment after the create, and on a
		// loaded machine the snapshot went straight to Failed.
		const deadline = 5 * time.Second
		s.Spec.FailureDeadline = &metav1.Duration{Duration: deadline}
		require.NoError(t, c.Client.Create(ctx, s))
		require.Eventually(t, func() bool {
			return c.Client.Get(ctx, key("orphan"), s) == nil && s.Status != nil && s.Status.Phase == snapshotv1.InProgress
		}, deadline, 20*time.Millisecond)
		assert.Contains(t, s.Status.Conditions, snapshotv1.Condition{Type: snapshotv1.ConditionProgressing, Status: corev1.ConditionFalse, Reason: MsgSourceMissing,
			LastTransitionTime: findSnapshotCondition(s.Status.Conditions, snapshotv1.ConditionProgressing).LastTransitionTime})
		require.Eventually(t, func() bool {
			return c.Client.Get(ctx, key("orphan"), s) == nil && s.Status.Phase == snapshotv1.Failed
		}, deadline+10*time.Second, 50*time.Millisecond)
		failure := findSnapshotCondition(s.Status.Conditions, snapshotv1.ConditionFailure)
		require.NotNil(t, failure)
		assert.Equal(t, MsgDeadlineExceeded, failure.Reason)
		assert.False(t, *s.Status.ReadyToUse)
	})

	t.Run("ARestoreOfARunningVMIsRefused", func(t *testing.T) {
		r := restoreOf("while-running", "snapped", "online")
		r.Spec.TargetReadinessPolicy = ptr(snapshotv1.VirtualMachineRestoreFailImmediate)
		require.NoError(t, c.Client.Create(ctx, r))
		require.Eventually(t, func() bool {
			return c.Client.Get(ctx, key(r.Name), r) == nil && restoreFailed(r)
		}, 10*time.Second, 20*time.Millisecond, "last %+v", &r.Status)
		assert.False(t, *r.Status.Complete)
		assert.Equal(t, MsgTargetNotReadyFailed, findSnapshotCondition(r.Status.Conditions, snapshotv1.ConditionFailure).Reason)
		assert.Equal(t, vmi.UID, m.vmi("snapped").UID, "the VM runs on")

		waiting := restoreOf("wait", "snapped", "online")
		require.NoError(t, c.Client.Create(ctx, waiting))
		require.Eventually(t, func() bool {
			err := c.Client.Get(ctx, key(waiting.Name), waiting)
			return err == nil && waiting.Status != nil && findSnapshotCondition(waiting.Status.Conditions, snapshotv1.ConditionReady).Reason == MsgWaitGracePeriod
		}, 10*time.Second, 20*time.Millisecond, "under the default policy it waits, saying why; last %+v", &waiting.Status)
		assert.False(t, *waiting.Status.Complete)
		assert.False(t, restoreFailed(waiting))
		events := &corev1.EventList{}
		require.NoError(t, c.Client.List(ctx, events, client.InNamespace(DefaultNamespace)))
		var said []string
		for _, e := range events.Items {
			if e.InvolvedObject.UID == waiting.UID {
				said = append(said, e.Reason+": "+e.Message)
			}
		}
		assert.Contains(t, said, ReasonRestoreTargetNotReady+": "+MsgTargetVMIExists)
		require.NoError(t, c.Client.Delete(ctx, waiting))
	})

	t.Run("ARestoreOfAStoppedVMRewritesItsSpecAndKeepsItsMetadata", func(t *testing.T) {
		vm := &kubevirtv1.VirtualMachine{}
		require.NoError(t, c.Client.Get(ctx, key("snapped"), vm))
		stopped := vm.DeepCopy()
		stopped.Spec.RunStrategy = ptr(kubevirtv1.RunStrategyHalted)
		stopped.Annotations = map[string]string{"kept": "yes"}
		require.NoError(t, c.Client.Patch(ctx, stopped, client.MergeFrom(vm)))
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(c.Client.Get(ctx, key("snapped"), &kubevirtv1.VirtualMachineInstance{}))
		}, 10*time.Second, 20*time.Millisecond)

		r := restoreOf("in-place", "snapped", "online")
		r.Spec.VolumeRestorePolicy = ptr(snapshotv1.VolumeRestorePolicyInPlace)
		require.NoError(t, c.Client.Create(ctx, r))
		require.Eventually(t, func() bool {
			return c.Client.Get(ctx, key(r.Name), r) == nil && restoreComplete(r)
		}, 10*time.Second, 20*time.Millisecond, "last %+v", &r.Status)
		assert.NotNil(t, r.Status.RestoreTime)
		assert.Equal(t, []snapshotv1.VolumeRestore{{VolumeName: "root", PersistentVolumeClaimName: "snapped-root", VolumeSnapshotName: "vmsnapshot-" + string(ready("online").UID) + "-volume-root"}},
			r.Status.Restores, "in place: the same PVC")

		require.NoError(t, c.Client.Get(ctx, key("snapped"), vm))
		assert.Equal(t, "1Gi", vm.Spec.Template.Spec.Domain.Memory.Guest.String(), "the snapshot's spec")
		assert.Equal(t, kubevirtv1.RunStrategyHalted, *vm.Spec.RunStrategy, "the run strategy it had")
		assert.Equal(t, "yes", vm.Annotations["kept"], "its metadata kept")
		assert.Equal(t, r.Name+"-"+string(r.UID), vm.Annotations[AnnotationLastRestore])
		assert.NotEmpty(t, vm.Spec.Template.Spec.Domain.Firmware.UUID, "the legacy firmware UUID")
		assert.Nil(t, vm.Status.RestoreInProgress)
	})
}
