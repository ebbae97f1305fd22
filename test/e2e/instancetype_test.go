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

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestInstancetypes runs a VM of an instance type through the Kubernetes
// API alone, on a simulated node: it runs with the type's shape; an edit of
// the type leaves it as it is, even when its spec changes otherwise; the
// update request moves it to the type's current revision and shows
// RestartRequired until a restart gives the guest the new shape.
func TestInstancetypes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	h := startStack(t, "vf-itypes-", stack.Options{Nodes: []string{"sim-1"}, Simulated: true})
	ctx := context.Background()
	it := &v1alpha1.VirtualMachineClusterInstancetype{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-small"},
		Spec: v1alpha1.InstancetypeSpec{
			CPU:    v1alpha1.InstancetypeCPU{Guest: 1},
			Memory: v1alpha1.InstancetypeMemory{Guest: resource.MustParse("256Mi")},
		},
	}
	h.create(t, it)
	h.create(t, volume("typed-root"))
	vm := vmWith("typed", "typed-root")
	vm.Spec.ForProvider.VirtualNetworks = nil
	vm.Spec.ForProvider.Vcpu, vm.Spec.ForProvider.Memory = 0, resource.Quantity{}
	vm.Spec.ForProvider.Instancetype = &v1alpha1.InstancetypeRef{Name: it.Name}
	h.create(t, vm)

	shape := func(vcpu int32, memory string) func(*v1alpha1.VirtualMachine) bool {
		return func(vm *v1alpha1.VirtualMachine) bool {
			o := vm.Status.AtProvider
			return running(vm) && o.Vcpu == vcpu && o.Memory != nil && o.Memory.String() == memory
		}
	}
	restartRequired := func(vm *v1alpha1.VirtualMachine) bool {
		return vm.GetCondition("RestartRequired").Status == corev1.ConditionTrue
	}

	t.Run("RunsWithTheTypesShape", func(t *testing.T) {
		got := h.wait(t, "typed", time.Minute, shape(1, "256Mi"))
		require.NotNil(t, got.Status.InstancetypeRef)
		assert.Equal(t, int64(1), got.Status.InstancetypeRef.Revision)
	})

	t.Run("AnEditOfTheTypeLeavesIt", func(t *testing.T) {
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Name: it.Name}, it))
		it.Spec.CPU.Guest, it.Spec.Memory.Guest = 2, resource.MustParse("512Mi")
		require.NoError(t, h.kube.Update(ctx, it))
		// A spec change of the VM that its node acts on, as a point in
		// time after which the hub has looked at the VM again.
		h.patch(t, "typed", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.EvictionStrategy = ptr(v1alpha1.EvictionNone) })
		generation := h.get(t, "typed").Generation
		got := h.wait(t, "typed", time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.AtProvider.ObservedGeneration == generation
		})
		assert.True(t, shape(1, "256Mi")(got), "the guest keeps its shape: %+v", got.Status.AtProvider)
		assert.False(t, restartRequired(got))
		assert.Equal(t, int64(1), got.Status.InstancetypeRef.Revision)
	})

	t.Run("TheUpdateRequestMovesItAtItsNextStart", func(t *testing.T) {
		h.patch(t, "typed", func(vm *v1alpha1.VirtualMachine) {
			vm.Annotations = merge(vm.Annotations, v1alpha1.AnnotationInstancetypeUpdateRequestedAt, "now")
		})
		got := h.wait(t, "typed", time.Minute, restartRequired)
		assert.Equal(t, int64(2), got.Status.InstancetypeRef.Revision)
		assert.Equal(t, int32(1), got.Status.AtProvider.Vcpu, "the guest runs as it was until it restarts")

		h.patch(t, "typed", func(vm *v1alpha1.VirtualMachine) {
			vm.Annotations = merge(vm.Annotations, v1alpha1.AnnotationRestartRequestedAt, "now")
		})
		got = h.wait(t, "typed", time.Minute, shape(2, "512Mi"))
		assert.False(t, restartRequired(got))
	})
}
