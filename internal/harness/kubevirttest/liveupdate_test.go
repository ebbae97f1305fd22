package kubevirttest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestLiveUpdateHotPlugsCPUAndMemoryIntoTheRunningVMI walks one VM through
// KubeVirt's LiveUpdate rollout: each step changes its template and waits
// for what virt-controller and virt-handler make of it. A hot-plug keeps
// the VMI (its uid and creation time); what cannot be hot-plugged is the
// VM's RestartRequired, until the next VMI.
func TestLiveUpdateHotPlugsCPUAndMemoryIntoTheRunningVMI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	ctx := context.Background()
	nn := types.NamespacedName{Namespace: DefaultNamespace, Name: "lu"}
	vm := testVM(nn.Name)
	vm.Spec.Template.Spec.Domain.CPU = &kubevirtv1.CPU{Sockets: 1, Cores: 1, Threads: 1}
	vm.Spec.Template.Spec.Domain.Resources = kubevirtv1.ResourceRequirements{}
	// Only a LiveMigratable VMI is moved into a larger pod, and so gets
	// its hot-plug.
	require.NoError(t, c.Client.Create(ctx, claim(nn.Name+"-root", corev1.ReadWriteMany)))
	require.NoError(t, c.Client.Create(ctx, vm))
	first := runningVMI(t, c, nn, "")
	assert.Equal(t, uint32(MaxHotplugRatio), first.Spec.Domain.CPU.MaxSockets, "defaulted: sockets times the ratio")
	assert.Equal(t, "4Gi", first.Spec.Domain.Memory.MaxGuest.String(), "defaulted: guest memory times the ratio")
	assert.Equal(t, "1Gi", first.Status.Memory.GuestAtBoot.String())

	restartRequired := func(vm *kubevirtv1.VirtualMachine) string {
		if c := findCondition(vm.Status.Conditions, kubevirtv1.VirtualMachineRestartRequired); c != nil && c.Status == corev1.ConditionTrue {
			return c.Message
		}
		return ""
	}
	steps := []struct {
		name   string
		change func(*kubevirtv1.VirtualMachineInstanceSpec)
		// restart deletes the VMI after the change, as a restart does.
		restart bool
		// done is what the step waits for; then the VMI must be the
		// first one unless restart.
		done func(*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance) bool
	}{{
		name:   "MoreSocketsAreHotPlugged",
		change: func(s *kubevirtv1.VirtualMachineInstanceSpec) { s.Domain.CPU.Sockets = 2 },
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return vmi.Spec.Domain.CPU.Sockets == 2 && vmi.Status.CurrentCPUTopology.Sockets == 2 &&
				vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange) == "" && restartRequired(vm) == ""
		},
	}, {
		name:   "MoreGuestMemoryIsHotPlugged",
		change: func(s *kubevirtv1.VirtualMachineInstanceSpec) { s.Domain.Memory.Guest = ptr(resource.MustParse("2Gi")) },
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return vmi.Status.Memory.GuestCurrent.String() == "2Gi" && vmi.Status.Memory.GuestRequested.String() == "2Gi" &&
				vmi.Status.Memory.GuestAtBoot.String() == "1Gi" && restartRequired(vm) == ""
		},
	}, {
		name:   "FewerSocketsNeedARestart",
		change: func(s *kubevirtv1.VirtualMachineInstanceSpec) { s.Domain.CPU.Sockets = 1 },
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return restartRequired(vm) == "Reduction of CPU socket count requires a restart" && vmi.Status.CurrentCPUTopology.Sockets == 2
		},
	}, {
		name:    "ANewVMIRunsTheTemplateAndClearsRestartRequired",
		restart: true,
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return restartRequired(vm) == "" && vmi.Spec.Domain.CPU.Sockets == 1 && vmi.Status.Memory.GuestAtBoot.String() == "2Gi"
		},
	}, {
		name:   "SocketsBeyondMaxSocketsNeedARestart",
		change: func(s *kubevirtv1.VirtualMachineInstanceSpec) { s.Domain.CPU.Sockets = 5 },
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return restartRequired(vm) == "CPU sockets updated in template spec to a value higher than what's available" && vmi.Spec.Domain.CPU.Sockets == 1
		},
	}, {
		name:    "TheNextVMIHasThemAndAMaximumThatHoldsThem",
		restart: true,
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return restartRequired(vm) == "" && vmi.Spec.Domain.CPU.Sockets == 5 && vmi.Spec.Domain.CPU.MaxSockets == 5*MaxHotplugRatio
		},
	}, {
		name:   "OtherCPUFieldsNeedARestart",
		change: func(s *kubevirtv1.VirtualMachineInstanceSpec) { s.Domain.CPU.Cores = 2 },
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return restartRequired(vm) == "a non-live-updatable field was changed in the template spec" && vmi.Spec.Domain.CPU.Cores == 1
		},
	}, {
		name:   "NoLiveChangeWhileARestartIsRequired",
		change: func(s *kubevirtv1.VirtualMachineInstanceSpec) { s.Domain.Memory.Guest = ptr(resource.MustParse("3Gi")) },
		done: func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
			return restartRequired(vm) != "" && vmi.Spec.Domain.Memory.Guest.String() == "2Gi" && vm.Status.ObservedGeneration == vm.Generation
		},
	}}
	current := first
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.change != nil {
				require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
					vm := &kubevirtv1.VirtualMachine{}
					if err := c.Client.Get(ctx, nn, vm); err != nil {
						return err
					}
					s.change(&vm.Spec.Template.Spec)
					return c.Client.Update(ctx, vm)
				}))
			}
			if s.restart {
				require.NoError(t, c.Client.Delete(ctx, current, &client.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &current.UID}}))
				current = runningVMI(t, c, nn, current.UID)
			}
			var vm *kubevirtv1.VirtualMachine
			var vmi *kubevirtv1.VirtualMachineInstance
			require.Eventually(t, func() bool {
				vm, vmi = &kubevirtv1.VirtualMachine{}, &kubevirtv1.VirtualMachineInstance{}
				return c.Client.Get(ctx, nn, vm) == nil && c.Client.Get(ctx, nn, vmi) == nil && s.done(vm, vmi)
			}, 10*time.Second, 20*time.Millisecond, "last VM status %+v, VMI %+v", &vm, &vmi)
			assert.Equal(t, current.UID, vmi.UID, "the same VMI")
			assert.Equal(t, current.CreationTimestamp, vmi.CreationTimestamp)
			assert.Equal(t, kubevirtv1.Running, vmi.Status.Phase)
		})
	}
}

// TestLiveUpdateOfMemoryNeedsAMigratableVMI pins KubeVirt's refusal to
// hot-plug memory into a VMI it cannot migrate to a larger pod.
func TestLiveUpdateOfMemoryNeedsAMigratableVMI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	ctx := context.Background()
	nn := types.NamespacedName{Namespace: DefaultNamespace, Name: "rwo"}
	require.NoError(t, c.Client.Create(ctx, claim(nn.Name+"-root", corev1.ReadWriteOnce)))
	require.NoError(t, c.Client.Create(ctx, testVM(nn.Name)))
	first := runningVMI(t, c, nn, "")
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vm := &kubevirtv1.VirtualMachine{}
		if err := c.Client.Get(ctx, nn, vm); err != nil {
			return err
		}
		vm.Spec.Template.Spec.Domain.Memory.Guest = ptr(resource.MustParse("2Gi"))
		return c.Client.Update(ctx, vm)
	}))
	require.Eventually(t, func() bool {
		vm := &kubevirtv1.VirtualMachine{}
		require.NoError(t, c.Client.Get(ctx, nn, vm))
		cond := findCondition(vm.Status.Conditions, kubevirtv1.VirtualMachineRestartRequired)
		return cond != nil && cond.Message == "memory updated in template spec. Memory-hotplug is only available for migratable VMs"
	}, 10*time.Second, 20*time.Millisecond)
	vmi := &kubevirtv1.VirtualMachineInstance{}
	require.NoError(t, c.Client.Get(ctx, nn, vmi))
	assert.Equal(t, first.UID, vmi.UID)
	assert.Equal(t, "1Gi", vmi.Spec.Domain.Memory.Guest.String(), "not hot-plugged")
}

func claim(name string, mode corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{mode},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}
}

// runningVMI waits for the VM's VMI to run, one other than the VMI
// replaced (empty for any) and returns it.
func runningVMI(t *testing.T, c *Cluster, nn types.NamespacedName, replaced types.UID) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	vmi := &kubevirtv1.VirtualMachineInstance{}
	require.Eventually(t, func() bool {
		err := c.Client.Get(context.Background(), nn, vmi)
		if kerrors.IsNotFound(err) {
			return false
		}
		require.NoError(t, err)
		return vmi.UID != replaced && vmi.DeletionTimestamp == nil && vmi.Status.Phase == kubevirtv1.Running
	}, 10*time.Second, 20*time.Millisecond)
	return vmi
}
