package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestVirtualMachineClone runs the whole system on two nodes and clones a
// running VM with kubectl virtfleet clone: the new VM runs on the source's
// node (where its disks are, though the other node is emptier) with a MAC
// and an address of its own, while the source runs on untouched. A tenant
// of another namespace naming the source gets nothing. A clone of a
// snapshot of the VM is the VM as the snapshot kept it.
func TestVirtualMachineClone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	h := startStack(t, "vf-vmclone-", stack.Options{Nodes: []string{"node1", "node2"}})
	ctx := context.Background()
	h.create(t, &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-db"},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.10.170.0/24"}},
	})
	h.create(t, volume("src-root"))
	src := vmWith("src", "src-root")
	src.Labels = map[string]string{"app": "db", "backup": "nightly"}
	h.create(t, src)
	addressed := func(vm *v1alpha1.VirtualMachine) bool {
		i := vm.Status.AtProvider.Interfaces
		return running(vm) && len(i) == 1 && i[0].MAC != "" && len(i[0].IPs) > 0
	}
	src = h.wait(t, "src", time.Minute, addressed)

	t.Run("TheCloneRunsBesideItsSourceWithItsOwnIdentity", func(t *testing.T) {
		start := time.Now()
		out, err := h.plugin("clone", "src", "dup", "--name", "dup", "--label-filter", "*", "--label-filter", "!backup", "--wait", "100s")
		require.NoError(t, err, out)
		assert.Contains(t, out, "VirtualMachineClone "+ns+"/dup succeeded")
		t.Logf("clone of a running VM running %s after kubectl virtfleet clone", time.Since(start).Round(100*time.Millisecond))

		c := getInto(t, h, "dup", &v1alpha1.VirtualMachineClone{})
		dup := h.wait(t, "dup", 30*time.Second, addressed)
		assert.Equal(t, src.Status.AtProvider.Node, dup.Status.AtProvider.Node, "the clone runs where its source's disks are")
		assert.Equal(t, src.Status.AtProvider.Node, c.Status.Node)
		assert.Equal(t, string(dup.UID), c.Status.TargetUID)
		assert.Contains(t, c.Status.Indications, v1alpha1.IndicationOnline, "copied while the source ran")
		assert.NotEqual(t, src.UID, dup.UID)
		assert.NotEqual(t, src.Status.AtProvider.Interfaces[0].MAC, dup.Status.AtProvider.Interfaces[0].MAC, "a MAC of its own")
		assert.NotEqual(t, src.Status.AtProvider.Interfaces[0].IPs, dup.Status.AtProvider.Interfaces[0].IPs, "an address of its own")
		held := map[string]string{}
		l := &v1alpha1.NetworkAddressList{}
		require.NoError(t, h.kube.List(ctx, l, client.InNamespace(ns)))
		for _, a := range l.Items {
			held[a.Spec.VirtualMachineUID] = a.Spec.Address
		}
		assert.NotEmpty(t, held[string(dup.UID)], "the hub allocated the clone an address")
		assert.NotEqual(t, held[string(src.UID)], held[string(dup.UID)], "not the source's")
		assert.Equal(t, map[string]string{"app": "db", "compute.virtfleet.io/clone": "dup"}, dup.Labels)
		h.assertEvent(t, "dup", "CloneSucceeded", "VM dup cloned from src on node "+dup.Status.AtProvider.Node)

		now := h.get(t, "src")
		assert.True(t, running(now), "the source runs on")
		assert.Equal(t, src.Status.AtProvider.RestartCount, now.Status.AtProvider.RestartCount, "the source was not restarted")
		assert.Equal(t, src.Status.AtProvider.Interfaces, now.Status.AtProvider.Interfaces, "and kept its MAC and address")
		assert.Equal(t, 1, h.domains(t, dup.Status.AtProvider.Node)[string(dup.UID)], "the clone is a guest of its own")
		assert.Equal(t, 1, h.domains(t, src.Status.AtProvider.Node)[string(src.UID)])
	})

	t.Run("ACloneOfASnapshotIsItsVMAsItWas", func(t *testing.T) {
		out, err := h.plugin("snapshot", "src", "--name", "kept", "--wait", "1m")
		require.NoError(t, err, out)
		// After the snapshot the VM gets a swap disk: the clone is of the
		// VM as the snapshot kept it, without one.
		h.patch(t, "src", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Swap = ptr(resource.MustParse("64Mi")) })

		out, err = h.plugin("clone", "kept", "dup2", "--snapshot", "--name", "dup2", "--wait", "100s")
		require.NoError(t, err, out)
		assert.Contains(t, out, "VirtualMachineClone "+ns+"/dup2 succeeded")
		c := getInto(t, h, "dup2", &v1alpha1.VirtualMachineClone{})
		dup := h.wait(t, "dup2", 30*time.Second, addressed)
		assert.Equal(t, src.Status.AtProvider.Node, dup.Status.AtProvider.Node, "the clone runs where the snapshot is")
		assert.NotContains(t, c.Status.Indications, v1alpha1.IndicationMemory, "a clone boots")
		require.NotNil(t, dup.Spec.ForProvider.Swap, "the API server defaults it")
		assert.True(t, dup.Spec.ForProvider.Swap.IsZero(), "the spec the snapshot kept, not %s", dup.Spec.ForProvider.Swap)
		img := getInto(t, h, "dup2-src-root", &v1alpha1.DiskImage{})
		assert.Equal(t, &v1alpha1.LocalReference{Name: "src-root"}, img.Spec.ForProvider.Source.VolumeRef)
		assert.Equal(t, &v1alpha1.LocalReference{Name: "kept"}, img.Spec.ForProvider.Source.SnapshotRef)
		assert.NotEqual(t, src.Status.AtProvider.Interfaces[0].MAC, dup.Status.AtProvider.Interfaces[0].MAC, "a MAC of its own")
		assert.True(t, running(h.get(t, "src")), "the snapshot's VM runs on")
		assert.Equal(t, 1, h.domains(t, dup.Status.AtProvider.Node)[string(dup.UID)], "the clone is a guest of its own")
	})

	// The snapshot held its deletion until the clone was over; then it
	// goes, and the clone is the hub's to change as any VM.
	t.Run("ACloneOfASnapshotRunsOnWithoutIt", func(t *testing.T) {
		h.deleteObject(t, &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kept"}})
		h.changesWithoutItsSource(t, "dup2")
	})

	t.Run("AnotherNamespaceCannotNameTheSource", func(t *testing.T) {
		const attacker = "vmclone-attacker"
		h.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attacker}})
		h.create(t, &v1alpha1.VirtualMachineClone{
			ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "steal"},
			Spec:       v1alpha1.VirtualMachineCloneSpec{Source: v1alpha1.CloneSource{Name: "src"}, Target: v1alpha1.CloneTarget{Name: "loot"}},
		})
		c := &v1alpha1.VirtualMachineClone{}
		require.Eventually(t, func() bool {
			return h.kube.Get(ctx, types.NamespacedName{Namespace: attacker, Name: "steal"}, c) == nil && c.Status.Phase == v1alpha1.ClonePending
		}, 30*time.Second, 100*time.Millisecond)
		assert.Equal(t, "VirtualMachine src does not exist in namespace "+attacker, c.Status.Message)
		l := &v1alpha1.DiskImageList{}
		require.NoError(t, h.kube.List(ctx, l))
		for _, img := range l.Items {
			assert.NotEqual(t, attacker, img.Namespace, "no copy of another namespace's disk: %s", img.Name)
		}
	})
}
