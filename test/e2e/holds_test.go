package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestASpecItsNodeNoLongerFitsIsNotPublished pins issue 51's "what
// placement checked holds at every publish" for the node selector. The
// VM's owner places a VM with nodeSelector zone=a, which only node1
// carries; then, in one edit, points the selector at zone=b (node2's) and
// stops the VM (kubectl patch vm x --type=merge -p '{"spec":{"forProvider":
// {"nodeSelector":{"zone":"b"},"running":false}}}'). Before, the hub
// published the changed intent to node1 all the same, which no longer
// matches what the VM asks for. Now nothing is published: the guest runs
// on as it was, and the VM's Synced condition names the field; put back,
// the stop is published.
func TestASpecItsNodeNoLongerFitsIsNotPublished(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	h := startStack(t, "vf-holds-", stack.Options{
		Nodes:  []string{"node1", "node2"},
		Labels: map[string]map[string]string{"node1": {"zone": "a"}, "node2": {"zone": "b"}},
	})
	h.create(t, volume("zoned-root"))
	vm := vmWith("zoned", "zoned-root")
	vm.Spec.ForProvider.VirtualNetworks = nil
	vm.Spec.ForProvider.NodeSelector = map[string]string{"zone": "a"}
	h.create(t, vm)
	vm = h.wait(t, "zoned", time.Minute, running)
	require.Equal(t, "node1", vm.Status.AtProvider.Node)
	uid := string(vm.UID)

	h.patch(t, "zoned", func(vm *v1alpha1.VirtualMachine) {
		vm.Spec.ForProvider.NodeSelector = map[string]string{"zone": "b"}
		vm.Spec.ForProvider.Running = ptr(false)
	})
	vm = h.wait(t, "zoned", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
		c := vm.GetCondition(xpv2.TypeSynced)
		return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "spec.forProvider.nodeSelector")
	})
	assert.Contains(t, vm.GetCondition(xpv2.TypeSynced).Message, "label zone=b not present")
	h.assertEvent(t, "zoned", "CannotUpdateExternalResource", "spec.forProvider.nodeSelector")
	h.never(t, "zoned", 5*time.Second, func(vm *v1alpha1.VirtualMachine) bool { return !running(vm) }, "the stop was published to a node the VM no longer fits")
	g, err := h.s.RunningGuests(context.Background(), "node1")
	require.NoError(t, err)
	assert.Equal(t, 1, g[uid], "the guest runs on as it was")
	assert.Equal(t, "node1", h.get(t, "zoned").GetAnnotations()[v1alpha1.AnnotationNode], "the VM is not moved")

	h.patch(t, "zoned", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.NodeSelector = map[string]string{"zone": "a"} })
	h.wait(t, "zoned", time.Minute, phase(v1alpha1.PhaseStopped))
}
