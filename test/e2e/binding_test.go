package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestAVMStrippedOfItsBinding settles what issue 51 asked of a VM whose
// binding a tenant removes by hand. The attacker has edit rights in its
// namespace and nothing else: it creates a VM, waits for it to run, then
// removes the VM's node and seal annotations (kubectl annotate vm x
// compute.virtfleet.io/node- compute.virtfleet.io/seal-), and in the
// second case its Volume's too, hoping the hub places it again on another
// node while the first guest runs on, unbound and uncounted. The VM is
// bound again to the node it ran on, and exactly one guest of it runs in
// the fleet. (Placement chose the first node again here even without the
// rebinding of guestNode, whose choice TestGuestNode pins.)
func TestAVMStrippedOfItsBinding(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	nodes := []string{"node1", "node2"}
	h := startStack(t, "vf-binding-", stack.Options{Nodes: nodes})
	cases := []struct {
		name string
		// volumeToo strips the binding of the VM's Volume as well, which
		// otherwise holds the VM on its node: placement alone would then
		// pick the other node, emptier by this very VM.
		volumeToo bool
	}{
		{name: "TheVMsOwn"},
		{name: "TheVMsAndItsVolumes", volumeToo: true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vmName := fmt.Sprintf("stripped-%d", i)
			h.create(t, volume(vmName+"-root"))
			vm := vmWith(vmName, vmName+"-root")
			vm.Spec.ForProvider.VirtualNetworks = nil
			h.create(t, vm)
			first := h.wait(t, vmName, time.Minute, running)
			uid, node := string(first.UID), first.Status.AtProvider.Node
			require.NotEmpty(t, node)

			if tc.volumeToo {
				v := getInto(t, h, vmName+"-root", &v1alpha1.Volume{})
				p := client.MergeFrom(v.DeepCopy())
				delete(v.Annotations, v1alpha1.AnnotationNode)
				delete(v.Annotations, v1alpha1.AnnotationSeal)
				require.NoError(t, h.kube.Patch(context.Background(), v, p))
			}
			h.patch(t, vmName, func(vm *v1alpha1.VirtualMachine) {
				delete(vm.Annotations, v1alpha1.AnnotationNode)
				delete(vm.Annotations, v1alpha1.AnnotationSeal)
			})
			// Once it is Running and bound again, one guest of it runs,
			// where it is bound: the node it ran on.
			vm = h.wait(t, vmName, time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
				return running(vm) && vm.GetAnnotations()[v1alpha1.AnnotationNode] != ""
			})
			bound := vm.GetAnnotations()[v1alpha1.AnnotationNode]
			assert.Equal(t, node, bound, "bound to another node than its guest's")
			assert.Equal(t, bound, vm.Status.AtProvider.Node)
			guests := func() map[string]int {
				on := map[string]int{}
				for _, n := range nodes {
					if c := h.domains(t, n)[uid]; c > 0 {
						on[n] = c
					}
				}
				return on
			}
			assert.Eventually(t, func() bool {
				g := guests()
				return len(g) == 1 && g[bound] == 1
			}, 30*time.Second, 100*time.Millisecond, "one guest of the VM, on %s (first on %s)", bound, node)
			t.Logf("first on %s, bound again to %s; guests %v", node, bound, guests())
			h.delete(t, vmName)
			assert.Empty(t, guests(), "the VM is deleted and a guest of it runs on")
		})
	}
}

// TestAVMGoneWhileTheHubWasStopped settles what issue 51 asked of a guest
// whose VM goes without the hub. The hub is stopped (a rollout, a crash);
// an operator, tired of a VM stuck in deletion, removes its finalizer and
// deletes it (kubectl patch vm x --type=merge -p
// '{"metadata":{"finalizers":null}}'; kubectl delete vm x), as deleting
// its namespace so would. The hub comes back and never reconciles the VM
// again: its intent stayed, and its guest ran on, for good. The hub's
// periodic sweep deletes the intent no VM binds, and the node's agent the
// guest, within a sweep's period.
func TestAVMGoneWhileTheHubWasStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	const sweep = 2 * time.Second
	h := startStack(t, "vf-strays-", stack.Options{Nodes: []string{"node1"}, StraySweep: sweep})
	h.create(t, volume("gone-root"))
	vm := vmWith("gone", "gone-root")
	vm.Spec.ForProvider.VirtualNetworks = nil
	h.create(t, vm)
	vm = h.wait(t, "gone", time.Minute, running)
	uid, node := string(vm.UID), vm.Status.AtProvider.Node
	require.Equal(t, 1, h.domains(t, node)[uid], "the VM's guest runs")

	require.NoError(t, h.s.StopHub())
	h.patch(t, "gone", func(vm *v1alpha1.VirtualMachine) { vm.Finalizers = nil })
	require.NoError(t, h.kube.Delete(context.Background(), vm))
	require.Eventually(t, func() bool {
		return kerrors.IsNotFound(h.kube.Get(context.Background(), client.ObjectKeyFromObject(vm), &v1alpha1.VirtualMachine{}))
	}, 10*time.Second, 50*time.Millisecond, "the VM is gone without the hub")
	require.NoError(t, h.s.StartHub())

	assert.Eventually(t, func() bool { return h.domains(t, node)[uid] == 0 }, 5*sweep+30*time.Second, 100*time.Millisecond,
		"the guest of a VM that went while the hub was stopped still runs on %s", node)
}
