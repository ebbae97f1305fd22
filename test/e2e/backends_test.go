package e2e

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/testing/stack"
)

// TestBackends runs the hub's scenarios against one agent of each proxy
// backend, in a fleet that also has a libvirt node. The VMs ask for the
// backend by spec.forProvider.backend and nothing else: the hub knows a
// node's backend only from its heartbeat. Each backend gets its own stack,
// so a failure in one does not hide the other.
func TestBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	for _, backend := range []string{driver.BackendNova, driver.BackendKubeVirt} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			testBackend(t, backend)
		})
	}
}

func testBackend(t *testing.T, backend string) {
	node := backend + "1"
	h := startStack(t, "vf-"+backend+"-", stack.Options{
		Nodes:    []string{"node1", node},
		Backends: map[string]string{node: backend},
	})
	h.create(t, &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-db"},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.10.120.0/24"}},
	})
	on := func(vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine {
		vm.Spec.ForProvider.Backend = ptr(v1alpha1.Backend(backend))
		vm.Spec.ForProvider.PublicKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx5ZHQgZmxlZXQgdGVzdCBrZXkgZm9yIHZpcnRmbGVldA== test@virtfleet"
		return vm
	}
	h.create(t, volume("vm-root"))
	h.create(t, on(vmWith("vm", "vm-root")))

	t.Run("CreateRunsOnTheBackendWithHostAndAddresses", func(t *testing.T) {
		vm := h.wait(t, "vm", 60*time.Second, running)
		assert.Equal(t, node, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed on the %s agent's node", backend)
		assert.NotEmpty(t, vm.Status.AtProvider.Node, "the real host the backend runs the guest on")
		assert.NotEmpty(t, vm.Status.AtProvider.ID, "the backend's id of the guest")
		assert.Regexp(t, regexp.MustCompile(`^net-db\(\d+\.\d+\.\d+\.\d+\)$`), vm.Status.AtProvider.IP)
		for _, i := range vm.Status.AtProvider.Interfaces {
			assert.NotEmpty(t, i.Source, "interface %s has no address source", i.Network)
		}
		assert.Equal(t, 1, h.domains(t, node)[string(vm.UID)])
	})

	t.Run("RunningFalseStopsAndTrueStarts", func(t *testing.T) {
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
		h.wait(t, "vm", 60*time.Second, phase(v1alpha1.PhaseStopped))
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(true) })
		h.wait(t, "vm", 60*time.Second, running)
	})

	t.Run("RestartAnnotationRestartsOnce", func(t *testing.T) {
		before := h.get(t, "vm").Status.AtProvider.RestartCount
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) {
			vm.SetAnnotations(merge(vm.GetAnnotations(), v1alpha1.AnnotationRestartRequestedAt, time.Now().Format(time.RFC3339)))
		})
		h.wait(t, "vm", 60*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.AtProvider.RestartCount == before+1 && running(vm)
		})
		time.Sleep(3 * time.Second)
		assert.Equal(t, before+1, h.get(t, "vm").Status.AtProvider.RestartCount, "one restart per annotation value")
	})

	t.Run("SpecChangeWhileRunningSetsRestartRequired", func(t *testing.T) {
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Vcpu = 2 })
		vm := h.wait(t, "vm", 60*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.GetCondition("RestartRequired").Status == corev1.ConditionTrue
		})
		assert.Equal(t, v1alpha1.PhaseRunning, vm.Status.AtProvider.Phase, "the VM keeps running")
	})

	t.Run("AgentKilledMidCreateLeavesExactlyOneGuest", func(t *testing.T) {
		const n = 5
		for i := range n {
			h.create(t, volume(fmt.Sprintf("burst-%d", i)))
			h.create(t, on(vmWith(fmt.Sprintf("burst-%d", i), fmt.Sprintf("burst-%d", i))))
		}
		h.s.KillAgent(node)
		h.wait(t, "vm", 20*time.Second, phase(v1alpha1.PhaseUnknown))
		require.NoError(t, h.s.StartAgent(node))
		guests := h.domains(t, node)
		for i := range n {
			vm := h.wait(t, fmt.Sprintf("burst-%d", i), 90*time.Second, running)
			guests = h.domains(t, node)
			assert.Equal(t, 1, guests[string(vm.UID)], "VM %s", vm.Name)
		}
		vm := h.wait(t, "vm", 60*time.Second, running)
		assert.Equal(t, 1, guests[string(vm.UID)], "the first VM survived the agent's restart once")
	})

	t.Run("DeleteRemovesTheGuestAndKeepsTheVolume", func(t *testing.T) {
		uid := string(h.get(t, "vm").UID)
		h.delete(t, "vm")
		assert.Zero(t, h.domains(t, node)[uid], "the guest is deleted with the VM")
		err := h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "vm-root"}, &v1alpha1.Volume{})
		assert.False(t, kerrors.IsNotFound(err), "the Volume stays")
	})
}
