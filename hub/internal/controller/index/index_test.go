package index

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
)

func TestUses(t *testing.T) {
	vm := &v1alpha1.VirtualMachine{}
	vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}, {Name: "data"}}
	vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"net-db", "net-backend"}
	fromImage := &v1alpha1.Volume{}
	fromImage.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "debian"}}
	snap := &v1alpha1.VirtualMachineSnapshot{Spec: v1alpha1.VirtualMachineSnapshotSpec{VMName: "web"}}
	restore := &v1alpha1.VirtualMachineRestore{Spec: v1alpha1.VirtualMachineRestoreSpec{SnapshotName: "before-upgrade", VMName: "web"}}
	cloneOfSnap := &v1alpha1.VirtualMachineClone{Spec: v1alpha1.VirtualMachineCloneSpec{Source: v1alpha1.CloneSource{Kind: v1alpha1.CloneFromVirtualMachineSnapshot, Name: "monday"}}}
	cloneOfVM := &v1alpha1.VirtualMachineClone{Spec: v1alpha1.VirtualMachineCloneSpec{Source: v1alpha1.CloneSource{Kind: v1alpha1.CloneFromVirtualMachine, Name: "monday"}}}
	imageOfSnap := &v1alpha1.DiskImage{}
	imageOfSnap.Spec.ForProvider.Source = v1alpha1.DiskImageSource{VolumeRef: &v1alpha1.LocalReference{Name: "root"}, SnapshotRef: &v1alpha1.LocalReference{Name: "monday"}}
	detaching := vm.DeepCopy()
	detaching.Spec.ForProvider.DiskAttachments = detaching.Spec.ForProvider.DiskAttachments[:1]
	detaching.Status.AtProvider.Disks = []string{"root", "data"}
	attaching := vm.DeepCopy()
	attaching.Status.AtProvider.Disks = []string{"root"}
	reordered := vm.DeepCopy()
	reordered.Status.AtProvider.Disks = []string{"data", "root"}
	imageOfVolume := &v1alpha1.DiskImage{}
	imageOfVolume.Spec.ForProvider.Source = v1alpha1.DiskImageSource{VolumeRef: &v1alpha1.LocalReference{Name: "monday"}}

	cases := map[string]struct {
		user inuse.User
		obj  client.Object
		want []string
	}{
		"AVMUsesItsDisksVolumesInOrder":    {user: VolumeUsers, obj: vm, want: []string{"root", "data"}},
		"AVMUsesADiskItsGuestStillHolds":   {user: VolumeUsers, obj: detaching, want: []string{"root", "data"}},
		"AVMUsesADiskNotAttachedYet":       {user: VolumeUsers, obj: attaching, want: []string{"root", "data"}},
		"AVMUsesEachDiskOnceInSpecOrder":   {user: VolumeUsers, obj: reordered, want: []string{"root", "data"}},
		"AVMUsesItsNetworksInOrder":        {user: NetworkUsers, obj: vm, want: []string{"net-db", "net-backend"}},
		"AVolumeUsesTheImageItIsMadeFrom":  {user: ImageUsers, obj: fromImage, want: []string{"debian"}},
		"AnEmptyVolumeUsesNoImage":         {user: ImageUsers, obj: &v1alpha1.Volume{}},
		"AnObjectOfAnotherKindUsesNothing": {user: VolumeUsers, obj: &v1alpha1.Volume{}},
		"ASnapshotIsOfItsVM":               {user: SnapshotsOfVM, obj: snap, want: []string{"web"}},
		"ARestoreUsesItsSnapshot":          {user: RestoresOfSnapshot, obj: restore, want: []string{"before-upgrade"}},
		"ARestoreIsNoSnapshotOfItsVM":      {user: SnapshotsOfVM, obj: restore},
		"ACloneOfASnapshotUsesIt":          {user: ClonesOfSnapshot, obj: cloneOfSnap, want: []string{"monday"}},
		"ACloneOfAVMUsesNoSnapshot":        {user: ClonesOfSnapshot, obj: cloneOfVM},
		"AnImageOfASnapshotUsesIt":         {user: ImagesOfSnapshot, obj: imageOfSnap, want: []string{"monday"}},
		"AnImageOfAVolumeUsesNoSnapshot":   {user: ImagesOfSnapshot, obj: imageOfVolume},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.user.Uses(tc.obj))
		})
	}
}

// TestNodeOfAUser: a network's VMs are on the node their status shows, an
// image's Volumes on the node they are bound to; the other kinds of users
// say no node.
func TestNodeOfAUser(t *testing.T) {
	vm := &v1alpha1.VirtualMachine{}
	vm.Status.AtProvider.Node = "node2"
	vm.SetAnnotations(map[string]string{v1alpha1.AnnotationNode: "node1"})
	vol := &v1alpha1.Volume{}
	vol.SetAnnotations(map[string]string{v1alpha1.AnnotationNode: "node3"})
	for _, tc := range []struct {
		name string
		user inuse.User
		obj  client.Object
		want string
	}{
		{"a network's VM, where it runs", NetworkUsers, vm, "node2"},
		{"an image's Volume, where it is bound", ImageUsers, vol, "node3"},
		{"a network's user that is no VM", NetworkUsers, vol, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.user.Node(tc.obj))
		})
	}
	assert.Nil(t, VolumeUsers.Node, "a Volume shows its own binding, not its VMs' nodes")
}
