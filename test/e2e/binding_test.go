package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestAVMStrippedOfItsBinding settles what issue 51 asked of a VM whose
// binding a tenant removes by hand. The attacker has edit rights in its
// namespace and nothing else: it creates a VM, waits for it to run, then
// removes the VM's node and seal annotations (kubectl annotate vm x
// compute.virtfleet.io/node- compute.virtfleet.io/seal-), hoping the hub
// places it again on another node while the first guest runs on, unbound
// and uncounted. The VM is bound again, and exactly one guest of it runs
// in the fleet, on the node it is bound to.
func TestAVMStrippedOfItsBinding(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	nodes := []string{"node1", "node2"}
	h := startStack(t, "vf-binding-", stack.Options{Nodes: nodes})
	cases := map[string]func(name string) *v1alpha1.VirtualMachine{
		// A Volume bound to the first node holds its VM there.
		"WithAVolume": func(name string) *v1alpha1.VirtualMachine {
			h.create(t, volume(name+"-root"))
			vm := vmWith(name, name+"-root")
			vm.Spec.ForProvider.VirtualNetworks = nil
			return vm
		},
		// Nothing holds a diskless VM: placement alone would pick the
		// emptier node, which is not the first.
		"Diskless": func(name string) *v1alpha1.VirtualMachine {
			vm := vmWith(name, "")
			vm.Spec.ForProvider.VirtualNetworks, vm.Spec.ForProvider.DiskAttachments = nil, nil
			return vm
		},
	}
	names := map[string]string{"WithAVolume": "stripped-vol", "Diskless": "stripped-bare"}
	for name, build := range cases {
		t.Run(name, func(t *testing.T) {
			vmName := names[name]
			h.create(t, build(vmName))
			first := h.wait(t, vmName, time.Minute, running)
			uid, node := string(first.UID), first.Status.AtProvider.Node
			require.NotEmpty(t, node)

			h.patch(t, vmName, func(vm *v1alpha1.VirtualMachine) {
				delete(vm.Annotations, v1alpha1.AnnotationNode)
				delete(vm.Annotations, v1alpha1.AnnotationSeal)
			})
			// The hub binds it again (or keeps it unbound): either way,
			// once it is Running and bound, one guest of it runs, where it
			// is bound.
			vm := h.wait(t, vmName, time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
				return running(vm) && vm.GetAnnotations()[v1alpha1.AnnotationNode] != ""
			})
			bound := vm.GetAnnotations()[v1alpha1.AnnotationNode]
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
