package index

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
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

// refusing is a reader whose every read fails.
type refusing struct{}

func (refusing) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("refused")
}

func (refusing) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("refused")
}

// TestUsersAreReadFromTheInformersIndex: a resource's users are read from
// its users' informer's index, as the cache holds them, with no List: they
// are found when every List fails, and are the very objects of the cache.
// What no index holds is asked of the reader, whose List then says.
func TestUsersAreReadFromTheInformersIndex(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	informers, ctx := cp.InformersForTest(t)
	require.NoError(t, Register(ctx, informers))
	require.NoError(t, cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}))
	vm := func(namespace, name, network string) *v1alpha1.VirtualMachine {
		return &v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Vcpu: 1, Memory: resource.MustParse("512Mi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName("root-" + name)}},
				VirtualNetworks: []v1alpha1.LocalName{v1alpha1.LocalName(network)},
			}},
		}
	}
	for _, o := range []*v1alpha1.VirtualMachine{vm("default", "web-2", "db"), vm("default", "web-1", "db"), vm("other", "web-3", "db"), vm("default", "cache", "old")} {
		require.NoError(t, cp.Client.Create(ctx, o))
	}
	inf, err := informers.GetInformer(ctx, &v1alpha1.VirtualMachine{})
	require.NoError(t, err)
	store := inf.(toolscache.SharedIndexInformer).GetStore()
	require.Eventually(t, func() bool { return len(store.List()) == 4 }, 30*time.Second, 10*time.Millisecond, "the cache holds every VM")

	users, err := NetworkUsers.Users(ctx, refusing{}, informers, "default", "db")
	require.NoError(t, err, "read with no List")
	require.Equal(t, []string{"web-1", "web-2"}, users.Names(), "this namespace's users, sorted")
	cached, _, err := store.GetByKey("default/web-1")
	require.NoError(t, err)
	assert.Same(t, cached, users[0], "the cache's own object, not a copy")

	_, err = NetworkUsers.Users(ctx, refusing{}, informers, "default", "unused")
	assert.ErrorContains(t, err, "refused", "no user indexed: the reader is asked")
	users, err = NetworkUsers.Users(ctx, informers, informers, "default", "unused")
	require.NoError(t, err)
	assert.Empty(t, users)

	users, err = NetworkUsers.Users(ctx, informers, nil, "other", "db")
	require.NoError(t, err)
	assert.Equal(t, []string{"web-3"}, users.Names(), "without informers, listed")
}
