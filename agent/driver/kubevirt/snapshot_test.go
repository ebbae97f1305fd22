package kubevirt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	kubevirtv1 "kubevirt.io/api/core/v1"
	snapshotv1 "kubevirt.io/api/snapshot/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
)

func (e *env) snapshots() []snapshotv1.VirtualMachineSnapshot {
	e.t.Helper()
	list := &snapshotv1.VirtualMachineSnapshotList{}
	require.NoError(e.t, e.kube.List(context.Background(), list, client.InNamespace(e.ns)))
	return list.Items
}

// running is a guest of the env that runs.
func (e *env) running() driver.Machine {
	e.t.Helper()
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	return m
}

func TestTakeSnapshotOfARunningGuestIsReadyAndOnline(t *testing.T) {
	e := newEnv(t)
	m := e.running()
	id := string(uuid.NewUUID())

	s, err := e.d.TakeSnapshot(context.Background(), m.UID, driver.SnapshotRequest{ID: id})
	require.NoError(t, err)
	assert.Equal(t, id, s.ID)
	assert.False(t, s.CreatedAt.IsZero(), "KubeVirt's creationTime")
	assert.Positive(t, s.Duration, "taken in this call")
	assert.True(t, s.Online, "its VMI ran")
	assert.False(t, s.Frozen, "no guest agent is connected")
	assert.False(t, s.Memory)
	assert.Zero(t, s.SizeBytes, "KubeVirt tells no size")

	objs := e.snapshots()
	require.Len(t, objs, 1)
	obj := objs[0]
	assert.Equal(t, SnapshotName(id), obj.Name)
	assert.Equal(t, VMName(m.UID), obj.Spec.Source.Name)
	assert.Equal(t, "VirtualMachine", obj.Spec.Source.Kind)
	assert.Equal(t, m.UID, obj.Labels[LabelUID])
	assert.Equal(t, managedBy, obj.Labels[labelManagedBy])
	assert.Equal(t, m.Name, obj.Annotations[AnnotationName])
	assert.Equal(t, snapshotv1.Succeeded, obj.Status.Phase)

	again, err := e.d.TakeSnapshot(context.Background(), m.UID, driver.SnapshotRequest{ID: id})
	require.NoError(t, err)
	assert.Equal(t, s.CreatedAt, again.CreatedAt, "the snapshot it has is returned as it is")
	assert.Zero(t, again.Duration, "not taken again")
	assert.Len(t, e.snapshots(), 1, "one object for one id")
}

func TestTakeSnapshotWithMemoryOfARunningGuestIsRefused(t *testing.T) {
	e := newEnv(t)
	m := e.running()

	_, err := e.d.TakeSnapshot(context.Background(), m.UID, driver.SnapshotRequest{ID: string(uuid.NewUUID()), Memory: true})
	require.Error(t, err)
	assert.True(t, driver.IsTerminal(err), "%v", err)
	assert.Contains(t, err.Error(), "KubeVirt keeps no guest memory in its snapshots")
	assert.Empty(t, e.snapshots(), "nothing is created")
}

func TestSnapshotsListsTheGuestsOwnOldestFirst(t *testing.T) {
	e := newEnv(t)
	m, other := e.running(), e.running()
	var ids []string
	for range 2 {
		id := string(uuid.NewUUID())
		_, err := e.d.TakeSnapshot(context.Background(), m.UID, driver.SnapshotRequest{ID: id})
		require.NoError(t, err)
		ids = append(ids, id)
		time.Sleep(1100 * time.Millisecond) // KubeVirt's times are whole seconds
	}
	_, err := e.d.TakeSnapshot(context.Background(), other.UID, driver.SnapshotRequest{ID: string(uuid.NewUUID())})
	require.NoError(t, err)

	list, err := e.d.Snapshots(context.Background(), m.UID)
	require.NoError(t, err)
	var got []string
	for _, s := range list {
		got = append(got, s.ID)
		assert.True(t, s.Online)
	}
	assert.Equal(t, ids, got, "the guest's own, oldest first")
}

func TestDeleteSnapshotRemovesIt(t *testing.T) {
	e := newEnv(t)
	m := e.running()
	id := string(uuid.NewUUID())
	_, err := e.d.TakeSnapshot(context.Background(), m.UID, driver.SnapshotRequest{ID: id})
	require.NoError(t, err)

	require.NoError(t, e.d.DeleteSnapshot(context.Background(), m.UID, id))
	list, err := e.d.Snapshots(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Empty(t, list, "gone at once for the driver")
	require.Eventually(t, func() bool { return len(e.snapshots()) == 0 }, 10*time.Second, 50*time.Millisecond,
		"KubeVirt lets it go with its content")
	require.NoError(t, e.d.DeleteSnapshot(context.Background(), m.UID, id), "deleting it again succeeds")
}

func TestRevertSnapshotOfARunningGuestLeavesItStoppedWithTheSnapshotsSpec(t *testing.T) {
	e := newEnv(t)
	m := e.running()
	m.RestartNonce = "handled"
	e.ensureUntil(m, func(o driver.Observation) bool { return o.Phase == driver.PhaseRunning && o.RestartCount == 1 })
	taken := e.vm(m.UID).Spec.Template.Spec.Volumes
	id := string(uuid.NewUUID())
	_, err := e.d.TakeSnapshot(context.Background(), m.UID, driver.SnapshotRequest{ID: id})
	require.NoError(t, err)
	bigger := m
	bigger.SwapBytes = 1 << 30
	o, err := e.d.Ensure(context.Background(), bigger)
	require.NoError(t, err)
	require.True(t, o.RestartRequired, "the new shape waits for the next start")
	require.NotEqual(t, taken, e.vm(m.UID).Spec.Template.Spec.Volumes)

	require.NoError(t, e.d.RevertSnapshot(context.Background(), m.UID, driver.RevertRequest{Snapshot: id, Running: true}))
	vm := e.vm(m.UID)
	assert.Equal(t, kubevirtv1.RunStrategyHalted, *vm.Spec.RunStrategy, "a revert without memory leaves the guest stopped")
	err = e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: vm.Name}, &kubevirtv1.VirtualMachineInstance{})
	assert.True(t, kerrors.IsNotFound(err), "no VMI: %v", err)
	assert.Equal(t, taken, vm.Spec.Template.Spec.Volumes, "the VM's spec is the snapshot's again")
	assert.Equal(t, "handled", vm.Annotations[AnnotationRestartNonce], "the nonce handled is still recorded")
	assert.Equal(t, "1", vm.Annotations[AnnotationRestarts])
	assert.Equal(t, m.UID, vm.Labels[LabelUID])
	restores := &snapshotv1.VirtualMachineRestoreList{}
	require.NoError(t, e.kube.List(context.Background(), restores, client.InNamespace(e.ns)))
	for _, r := range restores.Items {
		assert.NotNil(t, r.DeletionTimestamp, "the finished restore %s is deleted", r.Name)
	}

	o = e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Equal(t, int32(1), o.RestartCount, "the next Ensure starts it and replays no restart")
	assert.False(t, o.RestartRequired, "it runs the shape it was started with")

	require.NoError(t, e.d.RevertSnapshot(context.Background(), m.UID, driver.RevertRequest{Snapshot: id, Restore: "r1", Running: false}), "the same snapshot can be reverted to again")
	assert.Equal(t, kubevirtv1.RunStrategyHalted, *e.vm(m.UID).Spec.RunStrategy)
	assert.Equal(t, "r1", e.vm(m.UID).Annotations[AnnotationLastRestore])

	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	require.NoError(t, e.d.RevertSnapshot(context.Background(), m.UID, driver.RevertRequest{Snapshot: id, Restore: "r1", Running: false}), "asked again after a restart")
	assert.NotEqual(t, kubevirtv1.RunStrategyHalted, *e.vm(m.UID).Spec.RunStrategy, "a named revert is made once: the guest was not stopped again")
}

func TestSnapshotCallsOfWhatIsNotThere(t *testing.T) {
	e := newEnv(t)
	m := e.running()
	absent := string(uuid.NewUUID())
	cases := map[string]struct {
		call  func() error
		check func(error) bool
	}{
		"TakeOfAnAbsentGuestIsNotFound": {
			call: func() error {
				_, err := e.d.TakeSnapshot(context.Background(), absent, driver.SnapshotRequest{ID: "s1"})
				return err
			},
			check: driver.IsNotFound,
		},
		"RevertOfAnAbsentGuestIsNotFound": {
			call: func() error {
				return e.d.RevertSnapshot(context.Background(), absent, driver.RevertRequest{Snapshot: "s1", Running: false})
			},
			check: driver.IsNotFound,
		},
		"RevertToAnUnknownSnapshotIsTerminal": {
			call: func() error {
				return e.d.RevertSnapshot(context.Background(), m.UID, driver.RevertRequest{Snapshot: "unknown", Running: false})
			},
			check: driver.IsTerminal,
		},
		"DeleteOfAnUnknownSnapshotSucceeds": {
			call:  func() error { return e.d.DeleteSnapshot(context.Background(), m.UID, "unknown") },
			check: func(err error) bool { return err == nil },
		},
		"ListOfAnAbsentGuestIsEmpty": {
			call: func() error {
				list, err := e.d.Snapshots(context.Background(), absent)
				if err == nil && len(list) > 0 {
					return assert.AnError
				}
				return err
			},
			check: func(err error) bool { return err == nil },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			assert.True(t, tc.check(err), "error %v", err)
		})
	}
	assert.Empty(t, e.snapshots(), "nothing is created")
	assert.Equal(t, kubevirtv1.RunStrategyAlways, *e.vm(m.UID).Spec.RunStrategy, "the guest is not stopped for an unknown snapshot")
}
