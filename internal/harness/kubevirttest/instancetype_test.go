package kubevirttest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// instancetypeOf is a namespaced instance type of vcpu sockets (up to
// maxSockets) and memory (up to maxGuest).
func instancetypeOf(name string, vcpu, maxSockets uint32, memory, maxGuest string) *instancetypev1beta1.VirtualMachineInstancetype {
	return &instancetypev1beta1.VirtualMachineInstancetype{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name},
		Spec: instancetypev1beta1.VirtualMachineInstancetypeSpec{
			CPU:    instancetypev1beta1.CPUInstancetype{Guest: vcpu, MaxSockets: ptr(maxSockets)},
			Memory: instancetypev1beta1.MemoryInstancetype{Guest: resource.MustParse(memory), MaxGuest: ptr(resource.MustParse(maxGuest))},
		},
	}
}

// typedVM is testVM taking its CPU and memory from the namespaced
// instance type it names.
func typedVM(name, it string) *kubevirtv1.VirtualMachine {
	vm := testVM(name)
	dom := &vm.Spec.Template.Spec.Domain
	dom.CPU, dom.Memory, dom.Resources = nil, nil, kubevirtv1.ResourceRequirements{}
	vm.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Kind: "VirtualMachineInstancetype", Name: it}
	return vm
}

// TestVMAdmissionRefusesWhatAnInstancetypeCannotApply pins virt-api's
// refusals, with its messages, of a VM whose instance type is missing or
// whose template sets what the type provides; a VM that names none is
// not judged on it.
func TestVMAdmissionRefusesWhatAnInstancetypeCannotApply(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	ctx := context.Background()
	require.NoError(t, c.Client.Create(ctx, instancetypeOf("small", 1, 4, "1Gi", "4Gi")))
	cases := map[string]struct {
		vm   func() *kubevirtv1.VirtualMachine
		want []string
	}{
		"AMissingNamespacedTypeIsRefused": {
			vm:   func() *kubevirtv1.VirtualMachine { return typedVM("missing", "large") },
			want: []string{`admission webhook "virtualmachine-validator.kubevirt.io" denied the request: Failure to find instancetype: virtualmachineinstancetypes.instancetype.kubevirt.io "large" not found`},
		},
		"AMissingClusterTypeIsRefused": {
			vm: func() *kubevirtv1.VirtualMachine {
				vm := typedVM("missing-cluster", "small")
				vm.Spec.Instancetype.Kind = ""
				return vm
			},
			want: []string{`Failure to find instancetype: virtualmachineclusterinstancetypes.instancetype.kubevirt.io "small" not found`},
		},
		"SocketsAndGuestMemoryConflict": {
			vm: func() *kubevirtv1.VirtualMachine {
				vm := typedVM("conflict", "small")
				vm.Spec.Template.Spec.Domain.CPU = &kubevirtv1.CPU{Sockets: 2}
				vm.Spec.Template.Spec.Domain.Memory = &kubevirtv1.Memory{Guest: ptr(resource.MustParse("2Gi"))}
				return vm
			},
			want: []string{
				"VM field(s) spec.template.spec.domain.cpu.sockets conflicts with selected instance type, " +
					"VM field(s) spec.template.spec.domain.memory.guest conflicts with selected instance type",
			},
		},
		"AMemoryRequestConflicts": {
			vm: func() *kubevirtv1.VirtualMachine {
				vm := typedVM("request", "small")
				vm.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
				return vm
			},
			want: []string{"VM field(s) spec.template.spec.domain.resources.requests.memory conflicts with selected instance type"},
		},
		"ATypedVMWithoutConflictsIsAccepted": {vm: func() *kubevirtv1.VirtualMachine { return typedVM("fine", "small") }},
		"AnUntypedVMIsAccepted":              {vm: func() *kubevirtv1.VirtualMachine { return testVM("untyped") }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vm := tc.vm()
			vm.Spec.RunStrategy = ptr(kubevirtv1.RunStrategyHalted)
			err := c.Client.Create(ctx, vm)
			if len(tc.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, kerrors.IsInvalid(err), "virt-api refuses with 422: %v", err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestAnInstancetypedVMRunsItsRecordedTypeAndMovesToAnotherLive: the VM
// controller records the type in a revision the VM names, the VMI gets
// the type's CPU and memory and keeps them when the type is edited, and
// naming another type under LiveUpdate hot-plugs its sockets and memory
// into the same VMI.
func TestAnInstancetypedVMRunsItsRecordedTypeAndMovesToAnotherLive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	ctx := context.Background()
	small, large := instancetypeOf("small", 1, 4, "1Gi", "4Gi"), instancetypeOf("large", 2, 4, "2Gi", "4Gi")
	require.NoError(t, c.Client.Create(ctx, small))
	require.NoError(t, c.Client.Create(ctx, large))
	nn := types.NamespacedName{Namespace: DefaultNamespace, Name: "typed"}
	require.NoError(t, c.Client.Create(ctx, claim(nn.Name+"-root", corev1.ReadWriteMany)))
	require.NoError(t, c.Client.Create(ctx, typedVM(nn.Name, "small")))

	first := runningVMI(t, c, nn, "")
	assert.Equal(t, &kubevirtv1.CPU{Sockets: 1, Cores: 1, Threads: 1, MaxSockets: 4}, first.Spec.Domain.CPU)
	assert.Equal(t, "1Gi", first.Spec.Domain.Memory.Guest.String())
	assert.Equal(t, "4Gi", first.Spec.Domain.Memory.MaxGuest.String())
	vm := &kubevirtv1.VirtualMachine{}
	require.NoError(t, c.Client.Get(ctx, nn, vm))
	revision := vm.Spec.Instancetype.RevisionName
	require.NotEmpty(t, revision, "the VM controller names the revision it recorded")
	cr := &appsv1.ControllerRevision{}
	require.NoError(t, c.Client.Get(ctx, types.NamespacedName{Namespace: nn.Namespace, Name: revision}, cr))
	assert.Equal(t, "small", cr.Labels[labelObjectName])
	require.Eventually(t, func() bool {
		require.NoError(t, c.Client.Get(ctx, nn, vm))
		r := vm.Status.InstancetypeRef
		return r != nil && r.ControllerRevisionRef != nil && r.ControllerRevisionRef.Name == revision
	}, 10*time.Second, 20*time.Millisecond)

	// Editing the type reshapes no VM that recorded it.
	require.NoError(t, c.Client.Get(ctx, client.ObjectKeyFromObject(small), small))
	small.Spec.CPU.Guest = 3
	require.NoError(t, c.Client.Update(ctx, small))

	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		require.NoError(t, c.Client.Get(ctx, nn, vm))
		vm.Spec.Instancetype.Name, vm.Spec.Instancetype.RevisionName = "large", ""
		return c.Client.Update(ctx, vm)
	}))
	vmi := &kubevirtv1.VirtualMachineInstance{}
	require.Eventually(t, func() bool {
		require.NoError(t, c.Client.Get(ctx, nn, vmi))
		return vmi.Status.CurrentCPUTopology.Sockets == 2 && vmi.Status.Memory.GuestCurrent.String() == "2Gi"
	}, 20*time.Second, 20*time.Millisecond, "the new type's shape is hot-plugged")
	assert.Equal(t, first.UID, vmi.UID, "without a restart")
	require.NoError(t, c.Client.Get(ctx, nn, vm))
	assert.Nil(t, findCondition(vm.Status.Conditions, kubevirtv1.VirtualMachineRestartRequired))
	assert.NotEqual(t, revision, vm.Spec.Instancetype.RevisionName, "a new revision for the new type")
	assert.True(t, kerrors.IsNotFound(c.Client.Get(ctx, types.NamespacedName{Namespace: nn.Namespace, Name: revision}, &appsv1.ControllerRevision{})), "the old revision goes")
}
