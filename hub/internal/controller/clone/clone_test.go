package clone_test

import (
	"cmp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/clone"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
)

const (
	nodeA = "node-a"
	nodeB = "node-b"
)

// within bounds every wait for the hub.
const within = 30 * time.Second

// startHub runs the clone controller against a real API server and a
// fleet over a real nats-server, in which node-a is a libvirt node and
// node-b a nova one. The VMs, Volumes and images the clones read are
// written by hand, as their controllers would show them.
func startHub(t *testing.T) *controllertest.Env {
	t.Helper()
	e := controllertest.Start(t, []string{nodeA, nodeB}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		return clone.Setup(mgr, o, clone.Options{Pool: e.Pool})
	})
	e.Fleet.Agent(nodeA).Heartbeat(wire.NodeHeartbeat{Backend: string(v1alpha1.BackendLibvirt)})
	e.Fleet.Agent(nodeB).Heartbeat(wire.NodeHeartbeat{Backend: string(v1alpha1.BackendNova)})
	return e
}

// sourceVM makes VM name in namespace on node (none when empty), running,
// with its root Volume bound to node as the hub binds it.
func sourceVM(t *testing.T, e *controllertest.Env, namespace, name, node string, mutate func(*v1alpha1.VirtualMachine, *v1alpha1.Volume)) *v1alpha1.VirtualMachine {
	t.Helper()
	v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-root"}}
	v.Spec.ForProvider.Size = resource.MustParse("4Gi")
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app": "web", "tier": "front", "secret": "x"}}}
	vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{
		Vcpu: 1, Memory: resource.MustParse("1Gi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(v.Name)}},
		VirtualNetworks: []v1alpha1.LocalName{"net"}, Addresses: []v1alpha1.InterfaceAddress{{Network: "net", Address: "10.0.0.10"}},
		UserData: "#cloud-config\n",
	}
	vm.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: name + "-conn"}
	if node != "" {
		v.Annotations = map[string]string{v1alpha1.AnnotationNode: node}
		vm.Annotations = map[string]string{v1alpha1.AnnotationNode: node, "crossplane.io/external-name": "the-source-guest"}
	}
	if mutate != nil {
		mutate(vm, v)
	}
	require.NoError(t, e.Kube.Create(e.Ctx, v))
	require.NoError(t, e.Kube.Create(e.Ctx, vm))
	vm.Status.AtProvider.Phase, vm.Status.AtProvider.Node = v1alpha1.PhaseRunning, node
	require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))
	return vm
}

// newClone creates clone name in namespace of the source of kind and
// name into target.
func newClone(t *testing.T, e *controllertest.Env, namespace, name string, kind v1alpha1.CloneSourceKind, source, target string, filters ...string) *v1alpha1.VirtualMachineClone {
	t.Helper()
	c := &v1alpha1.VirtualMachineClone{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.VirtualMachineCloneSpec{
			Source: v1alpha1.CloneSource{Kind: kind, Name: v1alpha1.LocalName(source)}, Target: v1alpha1.CloneTarget{Name: v1alpha1.LocalName(target)},
			LabelFilters: filters,
		},
	}
	require.NoError(t, e.Kube.Create(e.Ctx, c))
	return c
}

// throughBackup creates clone name in namespace of VM source into
// target, through a backup into the BackupLocation offsite.
func throughBackup(t *testing.T, e *controllertest.Env, namespace, name, source, target string) *v1alpha1.VirtualMachineClone {
	t.Helper()
	c := &v1alpha1.VirtualMachineClone{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.VirtualMachineCloneSpec{
			Source: v1alpha1.CloneSource{Name: v1alpha1.LocalName(source)}, Target: v1alpha1.CloneTarget{Name: v1alpha1.LocalName(target)},
			BackupLocation: "offsite",
		},
	}
	require.NoError(t, e.Kube.Create(e.Ctx, c))
	return c
}

// snapshotOf makes snapshot name of vm, in phase, with the spec vm has
// now; a Succeeded one is ready to use on vm's node.
func snapshotOf(t *testing.T, e *controllertest.Env, vm *v1alpha1.VirtualMachine, name string, phase v1alpha1.SnapshotPhase) *v1alpha1.VirtualMachineSnapshot {
	t.Helper()
	s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: name}, Spec: v1alpha1.VirtualMachineSnapshotSpec{VMName: v1alpha1.LocalName(vm.Name)}}
	require.NoError(t, e.Kube.Create(e.Ctx, s))
	setSnapshot(t, e, s, vm, phase)
	return s
}

// setSnapshot shows s in phase, as the hub's snapshot controller would.
func setSnapshot(t *testing.T, e *controllertest.Env, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, phase v1alpha1.SnapshotPhase) {
	t.Helper()
	s.Status = v1alpha1.VirtualMachineSnapshotStatus{Phase: phase, SourceUID: string(vm.UID), Node: vm.Annotations[v1alpha1.AnnotationNode], Message: "why not"}
	if phase == v1alpha1.SnapshotSucceeded {
		s.Status.ReadyToUse, s.Status.VM, s.Status.Message = true, vm.Spec.ForProvider.DeepCopy(), ""
		s.Status.Indications = []string{v1alpha1.IndicationOnline, v1alpha1.IndicationMemory, v1alpha1.IndicationNoGuestAgent}
	}
	require.NoError(t, e.Kube.Status().Update(e.Ctx, s))
}

// await waits until the clone c is in phase, and returns it.
func await(t *testing.T, e *controllertest.Env, c *v1alpha1.VirtualMachineClone, phase v1alpha1.ClonePhase) *v1alpha1.VirtualMachineClone {
	t.Helper()
	return controllertest.Await(t, e, c, within, func(ct *assert.CollectT, got *v1alpha1.VirtualMachineClone) {
		assert.Equal(ct, phase, got.Status.Phase, got.Status.Message)
	})
}

// absent says whether namespace holds no object o of name.
func absent(t *testing.T, e *controllertest.Env, namespace, name string, o client.Object) bool {
	t.Helper()
	err := e.Kube.Get(e.Ctx, types.NamespacedName{Namespace: namespace, Name: name}, o)
	return client.IgnoreNotFound(err) == nil && err != nil
}

func TestClones(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	e := startHub(t)

	t.Run("MakesANewVMOnTheSourcesNodeWhileTheSourceRuns", func(t *testing.T) {
		ns := e.Namespace(t)
		src := sourceVM(t, e, ns, "web", nodeA, nil)
		c := newClone(t, e, ns, "copy", v1alpha1.CloneFromVirtualMachine, "web", "web2", "*", "!secret")

		got := await(t, e, c, v1alpha1.CloneInProgress)
		assert.Equal(t, nodeA, got.Status.Node)
		assert.Equal(t, string(src.UID), got.Status.SourceUID)
		assert.Equal(t, []v1alpha1.CloneDisk{{Source: "web-root", Image: "web2-web-root", Volume: "web2-web-root"}}, got.Status.Disks)
		assert.Equal(t, []string{v1alpha1.IndicationOnline}, got.Status.Indications, "the source ran: its copy is crash-consistent")
		assert.Contains(t, got.Status.Message, "node node-a copies the disks of VirtualMachine web")

		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2"}}
		got = controllertest.Await(t, e, c, within, func(ct *assert.CollectT, got *v1alpha1.VirtualMachineClone) {
			assert.NotEmpty(ct, got.Status.TargetUID)
		})
		e.Get(t, vm)
		assert.Equal(t, string(vm.UID), got.Status.TargetUID)
		assert.NotEqual(t, src.UID, vm.UID, "a new object: MACs, instance id and addresses derive from its own uid")
		assert.Equal(t, []v1alpha1.DiskAttachment{{Name: "web2-web-root"}}, vm.Spec.ForProvider.DiskAttachments)
		assert.Empty(t, vm.Spec.ForProvider.Addresses, "the source's fixed address is its own")
		assert.Equal(t, src.Spec.ForProvider.VirtualNetworks, vm.Spec.ForProvider.VirtualNetworks)
		assert.Equal(t, src.Spec.ForProvider.UserData, vm.Spec.ForProvider.UserData)
		assert.Nil(t, vm.Spec.WriteConnectionSecretToReference, "the source's connection Secret is its own")
		assert.Equal(t, map[string]string{"app": "web", "tier": "front", clone.LabelClone: "copy"}, vm.Labels)
		assert.Equal(t, map[string]string{v1alpha1.AnnotationClonedBy: string(c.UID)}, vm.Annotations,
			"no node, seal or external name of the source: the new VM is placed anew and never adopts the source's guest")

		v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2-web-root"}}
		e.Get(t, v)
		assert.Equal(t, resource.MustParse("4Gi"), v.Spec.ForProvider.Size)
		require.NotNil(t, v.Spec.ForProvider.Source)
		assert.Equal(t, &v1alpha1.LocalReference{Name: "web2-web-root"}, v.Spec.ForProvider.Source.DiskImageRef)
		assert.Empty(t, v.Annotations[v1alpha1.AnnotationNode], "bound by the hub where the image is made")
		img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2-web-root"}}
		e.Get(t, img)
		assert.Equal(t, &v1alpha1.LocalReference{Name: "web-root"}, img.Spec.ForProvider.Source.VolumeRef)
		require.Len(t, img.OwnerReferences, 1)
		assert.Equal(t, v.UID, img.OwnerReferences[0].UID, "the image goes with the disk made from it")
		assert.Equal(t, "Normal/CloneStarted", e.Events(t, got)[0])

		vm.Status.AtProvider.Phase, vm.Status.AtProvider.Node = v1alpha1.PhaseRunning, nodeA
		require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))
		got = await(t, e, c, v1alpha1.CloneSucceeded)
		assert.Equal(t, "VirtualMachine web2 is Running on node node-a", got.Status.Message)
		require.NotNil(t, got.Status.CreationTime)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			assert.Contains(ct, e.Events(t, got), "Normal/CloneSucceeded", "on the clone")
			assert.Contains(ct, e.Events(t, vm), "Normal/CloneSucceeded", "on the new VM")
		}, within, 50*time.Millisecond)
		e.Get(t, src)
		assert.Equal(t, v1alpha1.PhaseRunning, src.Status.AtProvider.Phase, "the source is untouched")
	})

	t.Run("MakesANewVMFromASnapshotAsItWas", func(t *testing.T) {
		ns := e.Namespace(t)
		src := sourceVM(t, e, ns, "web", nodeA, nil)
		snap := snapshotOf(t, e, src, "nightly", v1alpha1.SnapshotInProgress)
		// After the snapshot the VM grows: the clone is of the VM as the
		// snapshot kept it.
		kept := src.Spec.ForProvider.DeepCopy()
		src.Spec.ForProvider.Vcpu, src.Spec.ForProvider.UserData = 4, "#cloud-config\nlater: true\n"
		require.NoError(t, e.Kube.Update(e.Ctx, src))
		c := newClone(t, e, ns, "copy", v1alpha1.CloneFromVirtualMachineSnapshot, "nightly", "web2", "*")

		got := await(t, e, c, v1alpha1.ClonePending)
		assert.Equal(t, "VirtualMachineSnapshot nightly is not ready to use (it is InProgress); the clone waits for it", got.Status.Message)
		assert.True(t, absent(t, e, ns, "web2-web-root", &v1alpha1.DiskImage{}), "nothing is copied from a snapshot not taken yet")

		e.Get(t, src)
		live := src.Spec.ForProvider.DeepCopy()
		src.Spec.ForProvider = *kept
		setSnapshot(t, e, snap, src, v1alpha1.SnapshotSucceeded)
		got = await(t, e, c, v1alpha1.CloneInProgress)
		assert.Equal(t, nodeA, got.Status.Node, "where the snapshot is")
		assert.Equal(t, string(src.UID), got.Status.SourceUID)
		assert.Equal(t, []string{v1alpha1.IndicationOnline, v1alpha1.IndicationNoGuestAgent}, got.Status.Indications, "as consistent as the snapshot, without its memory")
		assert.Contains(t, got.Status.Message, "node node-a copies the disks of VirtualMachineSnapshot nightly of VirtualMachine web")

		img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2-web-root"}}
		e.Get(t, img)
		assert.Equal(t, &v1alpha1.LocalReference{Name: "web-root"}, img.Spec.ForProvider.Source.VolumeRef)
		assert.Equal(t, &v1alpha1.LocalReference{Name: "nightly"}, img.Spec.ForProvider.Source.SnapshotRef, "the Volume as the snapshot holds it")
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2"}}
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			assert.NoError(ct, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(vm), vm))
		}, within, 50*time.Millisecond)
		assert.Equal(t, kept.Vcpu, vm.Spec.ForProvider.Vcpu, "the snapshot's spec, not the VM's now (%d)", live.Vcpu)
		assert.Equal(t, kept.UserData, vm.Spec.ForProvider.UserData)
		assert.Equal(t, []v1alpha1.DiskAttachment{{Name: "web2-web-root"}}, vm.Spec.ForProvider.DiskAttachments)
		assert.Empty(t, vm.Spec.ForProvider.Addresses, "the source's fixed address is its own")
		assert.Nil(t, vm.Spec.WriteConnectionSecretToReference)
		assert.Equal(t, map[string]string{"app": "web", "tier": "front", "secret": "x", clone.LabelClone: "copy"}, vm.Labels, "the labels of the snapshot's VM")
		assert.NotEqual(t, src.UID, vm.UID)

		vm.Status.AtProvider.Phase, vm.Status.AtProvider.Node = v1alpha1.PhaseRunning, nodeA
		require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))
		await(t, e, c, v1alpha1.CloneSucceeded)
		e.Get(t, src)
		assert.Equal(t, v1alpha1.PhaseRunning, src.Status.AtProvider.Phase, "the source is untouched")
	})

	// A nova node copies no Volume as it is, but makes a volume of the
	// Cinder snapshot a VirtualMachineSnapshot took: a clone of the
	// snapshot is made there.
	t.Run("MakesANewVMFromASnapshotOnANovaNode", func(t *testing.T) {
		ns := e.Namespace(t)
		src := sourceVM(t, e, ns, "web", nodeB, nil)
		snapshotOf(t, e, src, "nightly", v1alpha1.SnapshotSucceeded)
		c := newClone(t, e, ns, "copy", v1alpha1.CloneFromVirtualMachineSnapshot, "nightly", "web2")
		got := await(t, e, c, v1alpha1.CloneInProgress)
		assert.Equal(t, nodeB, got.Status.Node, "where the snapshot is")
		img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2-web-root"}}
		e.Get(t, img)
		assert.Equal(t, &v1alpha1.LocalReference{Name: "nightly"}, img.Spec.ForProvider.Source.SnapshotRef, "the Volume as the snapshot holds it")
		controllertest.Await(t, e, c, within, func(ct *assert.CollectT, got *v1alpha1.VirtualMachineClone) {
			assert.NotEmpty(ct, got.Status.TargetUID)
		})
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2"}}
		e.Get(t, vm)

		vm.Status.AtProvider.Phase, vm.Status.AtProvider.Node = v1alpha1.PhaseRunning, nodeB
		require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))
		got = await(t, e, c, v1alpha1.CloneSucceeded)
		assert.Equal(t, "VirtualMachine web2 is Running on node node-b", got.Status.Message)
	})

	t.Run("MakesANewVMFromASnapshotWhoseVMIsGone", func(t *testing.T) {
		ns := e.Namespace(t)
		src := sourceVM(t, e, ns, "web", nodeA, nil)
		snapshotOf(t, e, src, "nightly", v1alpha1.SnapshotSucceeded)
		require.NoError(t, e.Kube.Delete(e.Ctx, src))
		e.AwaitCachedGone(t, src)
		c := newClone(t, e, ns, "copy", v1alpha1.CloneFromVirtualMachineSnapshot, "nightly", "web2")
		got := await(t, e, c, v1alpha1.CloneInProgress)
		assert.Equal(t, nodeA, got.Status.Node)
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2"}}
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			assert.NoError(ct, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(vm), vm))
		}, within, 50*time.Millisecond)
		assert.Equal(t, src.Spec.ForProvider.Vcpu, vm.Spec.ForProvider.Vcpu)
		assert.Equal(t, map[string]string{clone.LabelClone: "copy"}, vm.Labels, "no VM to copy labels of")
	})

	// A clone waits for a snapshot being taken; the user deletes the
	// snapshot, which is then never taken: the clone fails, and so no
	// longer holds the snapshot's deletion.
	t.Run("FailsWhenTheSnapshotItWaitsForIsDeleted", func(t *testing.T) {
		ns := e.Namespace(t)
		src := sourceVM(t, e, ns, "web", nodeA, nil)
		snap := snapshotOf(t, e, src, "nightly", v1alpha1.SnapshotInProgress)
		snap.Finalizers = []string{"test.virtfleet.io/keep"}
		require.NoError(t, e.Kube.Update(e.Ctx, snap))
		c := newClone(t, e, ns, "copy", v1alpha1.CloneFromVirtualMachineSnapshot, "nightly", "web2")
		await(t, e, c, v1alpha1.ClonePending)

		require.NoError(t, e.Kube.Delete(e.Ctx, snap))
		got := await(t, e, c, v1alpha1.CloneFailed)
		assert.Equal(t, "VirtualMachineSnapshot nightly is being deleted", got.Status.Message)
		assert.True(t, absent(t, e, ns, "web2-web-root", &v1alpha1.DiskImage{}), "nothing copied")
	})

	t.Run("MakesANewVMThroughABackupForAnyNode", func(t *testing.T) {
		ns := e.Namespace(t)
		// On shared storage: a clone on the source's node would refuse it.
		src := sourceVM(t, e, ns, "web", nodeA, func(_ *v1alpha1.VirtualMachine, v *v1alpha1.Volume) { v.Spec.ForProvider.StoragePool = "ceph" })
		c := throughBackup(t, e, ns, "copy", "web", "web2")

		got := await(t, e, c, v1alpha1.ClonePending)
		assert.Equal(t, "VirtualMachineBackup copy backs VirtualMachine web up to BackupLocation offsite for the clone (it is none yet)", got.Status.Message)
		b := &v1alpha1.VirtualMachineBackup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copy"}}
		e.Get(t, b)
		assert.Equal(t, v1alpha1.VirtualMachineBackupSpec{VMName: "web", Location: "offsite", Full: true, DeletionPolicy: v1alpha1.BackupRetain}, b.Spec)
		assert.Equal(t, "copy", b.Labels[clone.LabelClone])
		assert.True(t, absent(t, e, ns, "web2-web-root", &v1alpha1.Volume{}), "no disk before the backup is whole")

		b.Status = v1alpha1.VirtualMachineBackupStatus{Phase: v1alpha1.BackupSucceeded, SourceUID: string(src.UID), Node: nodeA}
		require.NoError(t, e.Kube.Status().Update(e.Ctx, b))
		got = controllertest.Await(t, e, c, within, func(ct *assert.CollectT, got *v1alpha1.VirtualMachineClone) {
			assert.NotEmpty(ct, got.Status.TargetUID, got.Status.Message)
		})
		assert.Equal(t, v1alpha1.CloneInProgress, got.Status.Phase)
		assert.Equal(t, "copy", got.Status.Backup)
		assert.Empty(t, got.Status.Node, "placed as any VM is")
		assert.Equal(t, []v1alpha1.CloneDisk{{Source: "web-root", Image: "web2-web-root", Volume: "web2-web-root"}}, got.Status.Disks)
		img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2-web-root"}}
		e.Get(t, img)
		assert.Equal(t, v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: "offsite", ID: string(b.UID), Disk: v1alpha1.BackupRootDisk}}, img.Spec.ForProvider.Source)
		assert.Equal(t, ptr.To(v1alpha1.DiskFormatRaw), img.Spec.ForProvider.Format)
		v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2-web-root"}}
		e.Get(t, v)
		assert.Empty(t, v.Spec.ForProvider.StoragePool, "on the new VM's node's own storage")
		assert.Equal(t, resource.MustParse("4Gi"), v.Spec.ForProvider.Size)
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2"}}
		e.Get(t, vm)
		assert.Empty(t, vm.Annotations[v1alpha1.AnnotationNode])

		vm.Status.AtProvider.Phase, vm.Status.AtProvider.Node = v1alpha1.PhaseRunning, nodeB
		require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))
		got = await(t, e, c, v1alpha1.CloneSucceeded)
		assert.Equal(t, nodeB, got.Status.Node, "another node than the source's")
	})

	t.Run("OfASnapshotThroughABackupIsRefusedByTheAPI", func(t *testing.T) {
		c := &v1alpha1.VirtualMachineClone{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace(t), Name: "copy"},
			Spec: v1alpha1.VirtualMachineCloneSpec{
				Source: v1alpha1.CloneSource{Kind: v1alpha1.CloneFromVirtualMachineSnapshot, Name: "nightly"}, Target: v1alpha1.CloneTarget{Name: "web2"},
				BackupLocation: "offsite",
			},
		}
		assert.ErrorContains(t, e.Kube.Create(e.Ctx, c), "backupLocation copies a VirtualMachine")
	})

	t.Run("FailsWithItsBackup", func(t *testing.T) {
		ns := e.Namespace(t)
		sourceVM(t, e, ns, "web", nodeA, nil)
		c := throughBackup(t, e, ns, "copy", "web", "web2")
		b := &v1alpha1.VirtualMachineBackup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copy"}}
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			assert.NoError(ct, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(b), b))
		}, within, 50*time.Millisecond)
		b.Status = v1alpha1.VirtualMachineBackupStatus{Phase: v1alpha1.BackupFailed, Message: "location offsite is not granted to the namespace"}
		require.NoError(t, e.Kube.Status().Update(e.Ctx, b))
		got := await(t, e, c, v1alpha1.CloneFailed)
		assert.Equal(t, "VirtualMachineBackup copy of VirtualMachine web, which the clone copies the disks through, failed: location offsite is not granted to the namespace", got.Status.Message)
		assert.True(t, absent(t, e, ns, "web2", &v1alpha1.VirtualMachine{}))
	})

	t.Run("WaitsForTheSourceToBePlaced", func(t *testing.T) {
		ns := e.Namespace(t)
		sourceVM(t, e, ns, "web", "", nil)
		c := newClone(t, e, ns, "copy", v1alpha1.CloneFromVirtualMachine, "web", "web2")
		got := await(t, e, c, v1alpha1.ClonePending)
		assert.Equal(t, "Volume web-root of VirtualMachine web is on no node yet; the clone waits until the VM is placed", got.Status.Message)
		assert.True(t, absent(t, e, ns, "web2", &v1alpha1.VirtualMachine{}))

		v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-root"}}
		e.Get(t, v)
		v.Annotations = map[string]string{v1alpha1.AnnotationNode: nodeA}
		require.NoError(t, e.Kube.Update(e.Ctx, v))
		got = await(t, e, c, v1alpha1.CloneInProgress)
		assert.Equal(t, nodeA, got.Status.Node, "where the disk is")
	})

	t.Run("Refuses", func(t *testing.T) {
		// sourceOf is the source VM sourceVM made in ns.
		sourceOf := func(t *testing.T, ns string) *v1alpha1.VirtualMachine {
			t.Helper()
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}}
			e.Get(t, vm)
			return vm
		}
		cases := map[string]struct {
			kind    v1alpha1.CloneSourceKind
			node    string
			target  string
			mutate  func(*v1alpha1.VirtualMachine, *v1alpha1.Volume)
			before  func(t *testing.T, ns string)
			message string
		}{
			"ATargetThatExists": {
				before: func(t *testing.T, ns string) {
					sourceVM(t, e, ns, "web2", nodeB, nil)
				},
				message: "VirtualMachine web2 exists already and is not this clone's: a clone never overwrites",
			},
			"ADiskNameThatIsTaken": {
				before: func(t *testing.T, ns string) {
					v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web2-web-root"}}
					v.Spec.ForProvider.Size = resource.MustParse("1Gi")
					require.NoError(t, e.Kube.Create(e.Ctx, v))
				},
				message: "Volume web2-web-root exists already and is not this clone's",
			},
			"ASourceOnASharedPool": {
				mutate:  func(_ *v1alpha1.VirtualMachine, v *v1alpha1.Volume) { v.Spec.ForProvider.StoragePool = "ceph" },
				message: "Volume web-root is on the shared storage pool ceph, and a clone copies a node's own disks only; clone it through a backup instead (spec.backupLocation)",
			},
			"ASourceOnANodeThatCannotCopyVolumes": {
				node:    nodeB,
				message: "VirtualMachine web is on node node-b, a nova node: only libvirt nodes copy a Volume into a DiskImage; snapshot the VM and clone the snapshot",
			},
			"ATargetNameTooLongForItsDisks": {
				target:  "a-name-that-leaves-no-room-for-the-disks-of-the-source-vm",
				message: "which is not a valid name",
			},
			"TheSourceAsTarget": {
				target:  "web",
				message: "VirtualMachine web exists already and is not this clone's",
			},
			"AFailedSnapshot": {
				kind: v1alpha1.CloneFromVirtualMachineSnapshot,
				before: func(t *testing.T, ns string) {
					snapshotOf(t, e, sourceOf(t, ns), "web", v1alpha1.SnapshotFailed)
				},
				message: "VirtualMachineSnapshot web failed, and holds nothing to copy: why not",
			},
			"ASnapshotBeingDeleted": {
				kind: v1alpha1.CloneFromVirtualMachineSnapshot,
				before: func(t *testing.T, ns string) {
					s := snapshotOf(t, e, sourceOf(t, ns), "web", v1alpha1.SnapshotSucceeded)
					s.Finalizers = []string{"test.virtfleet.io/keep"}
					require.NoError(t, e.Kube.Update(e.Ctx, s))
					require.NoError(t, e.Kube.Delete(e.Ctx, s))
					e.Get(t, s)
					// A clone made within the second of the deletion
					// counts as made before it (timestamps are whole
					// seconds), which the deletion would wait for.
					require.Eventually(t, func() bool { return time.Now().After(s.DeletionTimestamp.Add(time.Second)) }, within, 50*time.Millisecond)
				},
				message: "VirtualMachineSnapshot web is being deleted",
			},
			"ASnapshotWhoseVolumeIsGone": {
				kind: v1alpha1.CloneFromVirtualMachineSnapshot,
				before: func(t *testing.T, ns string) {
					snapshotOf(t, e, sourceOf(t, ns), "web", v1alpha1.SnapshotSucceeded)
					v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-root"}}
					require.NoError(t, e.Kube.Delete(e.Ctx, v))
					// A clone that read the Volume before its deletion
					// reached the hub copies it, as it should.
					e.AwaitCachedGone(t, v)
				},
				message: "Volume web-root is gone, and with it the disk VirtualMachineSnapshot web kept in it",
			},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				ns := e.Namespace(t)
				sourceVM(t, e, ns, "web", cmp.Or(tc.node, nodeA), tc.mutate)
				if tc.before != nil {
					tc.before(t, ns)
				}
				target := "web2"
				if tc.target != "" {
					target = tc.target
				}
				c := newClone(t, e, ns, "copy", cmp.Or(tc.kind, v1alpha1.CloneFromVirtualMachine), "web", target)
				got := await(t, e, c, v1alpha1.CloneFailed)
				assert.Contains(t, got.Status.Message, tc.message)
				require.EventuallyWithT(t, func(ct *assert.CollectT) {
					assert.Contains(ct, e.Events(t, got), "Warning/CloneFailed")
				}, within, 50*time.Millisecond)
				l := &v1alpha1.VirtualMachineList{}
				require.NoError(t, e.Kube.List(e.Ctx, l, client.InNamespace(ns), client.MatchingLabels{clone.LabelClone: "copy"}))
				assert.Empty(t, l.Items, "a refused clone makes no VM")
			})
		}
	})

	// A tenant of namespace b names namespace a's VM and snapshot: a name
	// in a clone is of the clone's namespace, so neither is found.
	t.Run("NeverReadsAnotherNamespace", func(t *testing.T) {
		victim := e.Namespace(t)
		attacker := victim + "-b"
		require.Less(t, len(attacker), 64)
		require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attacker}}))
		sourceVM(t, e, victim, "web", nodeA, nil)
		require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: victim, Name: "nightly"}, Spec: v1alpha1.VirtualMachineSnapshotSpec{VMName: "web"}}))

		for name, tc := range map[string]struct {
			clone   string
			kind    v1alpha1.CloneSourceKind
			source  string
			message string
		}{
			"TheVM":       {"steal-vm", v1alpha1.CloneFromVirtualMachine, "web", "VirtualMachine web does not exist in namespace " + attacker},
			"TheSnapshot": {"steal-snapshot", v1alpha1.CloneFromVirtualMachineSnapshot, "nightly", "VirtualMachineSnapshot nightly does not exist in namespace " + attacker},
		} {
			t.Run(name, func(t *testing.T) {
				c := newClone(t, e, attacker, tc.clone, tc.kind, tc.source, "loot")
				got := await(t, e, c, v1alpha1.ClonePending)
				assert.Equal(t, tc.message, got.Status.Message)
				assert.True(t, absent(t, e, attacker, "loot", &v1alpha1.VirtualMachine{}))
				assert.True(t, absent(t, e, attacker, "loot-web-root", &v1alpha1.DiskImage{}), "no image of the victim's disk")
				assert.True(t, absent(t, e, victim, "loot", &v1alpha1.VirtualMachine{}))
			})
		}
	})
}

func TestFilterLabels(t *testing.T) {
	labels := map[string]string{"app": "web", "app.kubernetes.io/name": "web", "app.kubernetes.io/version": "2", "team": "a"}
	cases := map[string]struct {
		filters []string
		want    map[string]string
	}{
		"NoneCopiesNothing":           {nil, map[string]string{}},
		"AStarCopiesAllSlashesToo":    {[]string{"*"}, labels},
		"AnExactKey":                  {[]string{"team"}, map[string]string{"team": "a"}},
		"APrefix":                     {[]string{"app.kubernetes.io/*"}, map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/version": "2"}},
		"ANegationRemovesWhatMatched": {[]string{"*", "!app.kubernetes.io/*"}, map[string]string{"app": "web", "team": "a"}},
		"LaterEntriesWin":             {[]string{"!team", "team"}, map[string]string{"team": "a"}},
		"AStarInTheMiddle":            {[]string{"app*name"}, map[string]string{"app.kubernetes.io/name": "web"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, clone.FilterLabels(labels, tc.filters))
		})
	}
}
