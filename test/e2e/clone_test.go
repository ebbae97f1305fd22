package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestClone runs the whole system on three nodes and boots a VM from a
// DiskImage cloned from another VM's root Volume. Placement alone would put
// the second VM on an emptier node, where the source is not: it must land
// on the source's node. Once the source is gone, a third VM from the image
// must land where the image is held.
func TestClone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	nodes := []string{"node1", "node2", "node3"}
	h := startStack(t, "vf-clone-", stack.Options{Nodes: nodes})
	ctx := context.Background()

	h.create(t, volume("a-root"))
	h.create(t, &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a-golden"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source: v1alpha1.DiskImageSource{VolumeRef: &v1alpha1.LocalReference{Name: "a-root"}},
		}},
	})
	bRoot := volume("b-root")
	bRoot.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "a-golden"}}
	h.create(t, bRoot)
	h.create(t, cloneTestVM("b", "b-root"))

	t.Run("AVMFromACloneOfAVolumeOnNoNodeWaitsAndSaysWhy", func(t *testing.T) {
		vm := h.wait(t, "b", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.GetCondition(xpv2.TypeReady).Message != ""
		})
		assert.Equal(t, v1alpha1.PhasePending, vm.Status.AtProvider.Phase)
		assert.Contains(t, vm.GetCondition(xpv2.TypeReady).Message, "DiskImage a-golden clones Volume a-root, which is on no node yet")
	})

	var node string
	t.Run("TheSourceVMRuns", func(t *testing.T) {
		// On node2: the first name, which wins a tie between empty
		// nodes, would be the source's node by chance.
		a := cloneTestVM("a", "a-root")
		a.Spec.ForProvider.NodeSelector = map[string]string{"kubernetes.io/hostname": "node2"}
		h.create(t, a)
		node = h.wait(t, "a", 60*time.Second, running).Status.AtProvider.Node
		require.Equal(t, "node2", node)
	})

	t.Run("TheCloneVMRunsOnTheSourcesNode", func(t *testing.T) {
		start := time.Now()
		vm := h.wait(t, "b", 90*time.Second, running)
		t.Logf("VM b Running %s after VM a", time.Since(start))
		assert.Equal(t, node, vm.Status.AtProvider.Node, "the image can only be made where a-root is")

		img := &v1alpha1.DiskImage{}
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "a-golden"}, img))
		assert.True(t, h.cloneNodeHas(t, node, "image_"+string(img.UID)), "the image was cloned on the node")
		assert.True(t, h.cloneNodeHas(t, node, ns+"_b-root"), "b-root was made from it")
		assert.False(t, h.cloneNodeHas(t, node, "cloning_"+string(img.UID)), "the clone finished")
		for _, other := range nodes {
			if other != node {
				assert.False(t, h.cloneNodeHas(t, other, "image_"+string(img.UID)), "no copy on %s", other)
			}
		}
	})

	// The clone's disk is made: its source may go, VM and Volume, and the
	// clone is the hub's to change as any VM.
	t.Run("TheCloneRunsOnWithoutItsSource", func(t *testing.T) {
		h.delete(t, "a")
		h.deleteObject(t, &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a-root"}})
		h.changesWithoutItsSource(t, "b")
	})

	// Its source gone, a new disk of the image can be made only of the copy
	// node holds: a new VM from it is placed there, though the other nodes
	// are emptier, and its disk is made of that copy.
	t.Run("ANewCloneWithoutItsSourceRunsWhereTheImageIsHeld", func(t *testing.T) {
		cRoot := volume("c-root")
		cRoot.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "a-golden"}}
		h.create(t, cRoot)
		h.create(t, cloneTestVM("c", "c-root"))
		vm := h.wait(t, "c", 90*time.Second, running)
		assert.Equal(t, node, vm.Status.AtProvider.Node, "only node %s holds a-golden", node)
		assert.True(t, h.cloneNodeHas(t, node, ns+"_c-root"), "c-root was made of the node's copy")
	})
}

// changesWithoutItsSource checks that the clone name, whose source is gone,
// is still the hub's to change: stopping it stops its guest, and it stays
// Synced.
func (h *hub) changesWithoutItsSource(t *testing.T, name string) {
	t.Helper()
	h.patch(t, name, func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
	vm := h.wait(t, name, time.Minute, phase(v1alpha1.PhaseStopped))
	synced := vm.GetCondition(xpv2.TypeSynced)
	assert.Equal(t, corev1.ConditionTrue, synced.Status, synced.Message)
}

// cloneTestVM is a small VM without networks that boots from disk.
func cloneTestVM(name, disk string) *v1alpha1.VirtualMachine {
	vm := vmWith(name, disk)
	vm.Spec.ForProvider.VirtualNetworks = nil
	return vm
}

// cloneNodeHas looks behind virtfleet's back for a volume in the node's
// storage pool.
func (h *hub) cloneNodeHas(t *testing.T, node, volume string) bool {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	p, err := l.StoragePoolLookupByName(libvirttest.Pool)
	require.NoError(t, err)
	_, err = l.StorageVolLookupByName(p, volume)
	var le libvirt.Error
	if errors.As(err, &le) && le.Code == uint32(libvirt.ErrNoStorageVol) {
		return false
	}
	require.NoError(t, err)
	return true
}
