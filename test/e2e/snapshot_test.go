package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// testSnapshots keeps a VM's state and brings it back through kubectl
// virtfleet, on libvirt's test driver, which implements libvirt's snapshot
// API (real QEMU: test/guest). It shares TestHub's stack.
func testSnapshots(t *testing.T, h *hub) {
	ctx := context.Background()
	plugin := h.plugin
	h.create(t, volume("snap-root"))
	h.create(t, vmWith("snap", "snap-root"))
	vm := h.wait(t, "snap", time.Minute, running)

	t.Run("WithMemoryIsRestoredIntoTheRunningVM", func(t *testing.T) {
		out, err := plugin("snapshot", "snap", "--name", "before", "--memory", "--wait", "1m")
		require.NoError(t, err, out)
		assert.Contains(t, out, "VirtualMachineSnapshot "+ns+"/before succeeded")
		s := getInto(t, h, "before", &v1alpha1.VirtualMachineSnapshot{})
		assert.True(t, s.Status.ReadyToUse)
		assert.True(t, s.Status.Memory, "the running guest's memory is kept")
		assert.Equal(t, string(vm.UID), s.Status.SourceUID)
		assert.Equal(t, vm.Status.AtProvider.Node, s.Status.Node, "the snapshot lives on the VM's node")
		assert.Subset(t, s.Status.Indications, []string{v1alpha1.IndicationOnline, v1alpha1.IndicationMemory})
		require.NotNil(t, s.Status.VM, "the VM's spec as it was")
		assert.Equal(t, vm.Spec.ForProvider.DiskAttachments, s.Status.VM.DiskAttachments)
		require.NotNil(t, s.Status.CreationTime)

		restarts := h.get(t, "snap").Status.AtProvider.RestartCount
		out, err = plugin("restore", "snap", "--snapshot", "before", "--name", "back", "--wait", "1m")
		require.NoError(t, err, out)
		r := getInto(t, h, "back", &v1alpha1.VirtualMachineRestore{})
		assert.True(t, r.Status.Complete)
		assert.Equal(t, string(vm.UID), r.Status.TargetUID)
		vm := h.wait(t, "snap", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return running(vm) && vm.GetAnnotations()[v1alpha1.AnnotationRestore] == ""
		})
		assert.Equal(t, restarts, vm.Status.AtProvider.RestartCount, "a guest resumed from its memory did not restart")
	})

	t.Run("AnotherVMsSnapshotIsNotRestoredIntoIt", func(t *testing.T) {
		h.create(t, volume("snap-other-root"))
		h.create(t, vmWith("snap-other", "snap-other-root"))
		h.wait(t, "snap-other", time.Minute, running)
		out, err := plugin("restore", "snap-other", "--snapshot", "before", "--name", "crossed", "--wait", "1m")
		require.Error(t, err, out)
		r := getInto(t, h, "crossed", &v1alpha1.VirtualMachineRestore{})
		assert.Equal(t, v1alpha1.RestoreFailed, r.Status.Phase)
		assert.Contains(t, r.Status.Message, string(vm.UID), "the message names whose snapshot it is")
	})

	t.Run("DeletedSnapshotIsGoneFromTheAPI", func(t *testing.T) {
		s := getInto(t, h, "before", &v1alpha1.VirtualMachineSnapshot{})
		require.NoError(t, h.kube.Delete(ctx, s))
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "before"}, &v1alpha1.VirtualMachineSnapshot{}))
		}, time.Minute, 200*time.Millisecond, "the node deleted the snapshot and the hub finalized it")
	})

	t.Run("AStoppedVMsSnapshotHasNoMemory", func(t *testing.T) {
		h.patch(t, "snap", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
		h.wait(t, "snap", 30*time.Second, phase(v1alpha1.PhaseStopped))
		out, err := plugin("snapshot", "snap", "--name", "cold", "--memory", "--wait", "1m")
		require.NoError(t, err, out)
		s := getInto(t, h, "cold", &v1alpha1.VirtualMachineSnapshot{})
		assert.True(t, s.Status.ReadyToUse)
		assert.False(t, s.Status.Memory, "a stopped guest has no memory to keep")
		assert.NotContains(t, s.Status.Indications, v1alpha1.IndicationOnline)
		out, err = plugin("restore", "snap", "--snapshot", "cold", "--wait", "1m")
		require.NoError(t, err, out)
		assert.Equal(t, v1alpha1.PhaseStopped, h.get(t, "snap").Status.AtProvider.Phase, "a restore leaves a stopped VM stopped")
	})

	h.delete(t, "snap")
	h.delete(t, "snap-other")
	assert.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cold"}, &v1alpha1.VirtualMachineSnapshot{}),
		"a snapshot is kept when its VM is deleted (vmDeletionPolicy Retain)")
}

// plugin runs kubectl virtfleet in the tests' namespace with args and
// returns what it printed.
func (h *hub) plugin(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.s.Plugin(), append([]string{"--kubeconfig", h.s.ControlPlane.Kubeconfig, "-n", ns}, args...)...) //nolint:gosec // our own binary
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}
