package kubevirt

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// instancetypes are the KubeVirt instance types of the test's namespace.
func (e *env) instancetypes() []instancetypev1beta1.VirtualMachineInstancetype {
	e.t.Helper()
	list := &instancetypev1beta1.VirtualMachineInstancetypeList{}
	require.NoError(e.t, e.kube.List(context.Background(), list, client.InNamespace(e.ns)))
	return list.Items
}

// recordedRevision waits for KubeVirt to record the VM's instance type
// and returns the revision's name.
func (e *env) recordedRevision(uid string) string {
	e.t.Helper()
	var vm *kubevirtv1.VirtualMachine
	require.Eventually(e.t, func() bool {
		vm = e.vm(uid)
		return vm.Spec.Instancetype != nil && vm.Spec.Instancetype.RevisionName != ""
	}, 10*time.Second, 20*time.Millisecond, "KubeVirt records the instance type")
	return vm.Spec.Instancetype.RevisionName
}

// TestATypedMachineRunsThroughAKubeVirtInstancetype: a Machine whose shape
// came from an instance type makes a KubeVirt instance type of that shape
// and a VM that names it, with no CPU or memory of its own, which KubeVirt
// accepts, records and runs with the type's shape; the next revision of
// the type is another KubeVirt type, hot-plugged into the same guest, and
// the old one goes, as the last one does with the VM.
func TestATypedMachineRunsThroughAKubeVirtInstancetype(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.VCPU, m.MemoryBytes = 1, 1<<30
	m.Instancetype = &driver.Instancetype{Cluster: true, Name: "u1.small", Revision: 1}
	e.sharedRoot(m)
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Equal(t, [4]int64{1, driver.DefaultMaxRatio, 1 << 30, driver.DefaultMaxRatio << 30}, [4]int64{int64(o.VCPU), int64(o.MaxVCPU), o.MemoryBytes, o.MaxMemoryBytes})
	assert.False(t, o.RestartRequired)

	vm := e.vm(m.UID)
	require.NotNil(t, vm.Spec.Instancetype)
	first := vm.Spec.Instancetype.Name
	assert.Equal(t, "VirtualMachineInstancetype", vm.Spec.Instancetype.Kind)
	assert.True(t, strings.HasPrefix(first, "vfc.u1.small.r1-"), "named from the type's kind, name and revision: %s", first)
	assert.Nil(t, vm.Spec.Template.Spec.Domain.CPU, "the type provides it")
	assert.Nil(t, vm.Spec.Template.Spec.Domain.Memory, "the type provides it")
	e.recordedRevision(m.UID)
	its := e.instancetypes()
	require.Len(t, its, 1)
	assert.Equal(t, first, its[0].Name)
	assert.Equal(t, instancetypev1beta1.CPUInstancetype{Guest: 1, MaxSockets: ptr(uint32(driver.DefaultMaxRatio))}, its[0].Spec.CPU)
	assert.Equal(t, int64(1<<30), its[0].Spec.Memory.Guest.Value())
	assert.Equal(t, int64(driver.DefaultMaxRatio<<30), its[0].Spec.Memory.MaxGuest.Value())
	vmi := e.vmi(m.UID)
	assert.Equal(t, kubevirtv1.CPU{Sockets: 1, Cores: 1, Threads: 1, MaxSockets: driver.DefaultMaxRatio}, *vmi.Spec.Domain.CPU, "the VMI has the type's shape")
	assert.Equal(t, int64(1<<30), vmi.Spec.Domain.Memory.Guest.Value())

	seen, err := e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, o.VCPU, seen.VCPU)

	m.VCPU, m.MemoryBytes, m.Instancetype.Revision = 2, 2<<30, 2
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.VCPU == 2 && o.MemoryBytes == 2<<30 })
	assert.False(t, o.RestartRequired, "the new revision is hot-plugged")
	assert.Empty(t, o.Message)
	assert.Equal(t, vmi.UID, e.vmi(m.UID).UID, "the same VMI")
	assert.Zero(t, o.RestartCount)
	second := e.vm(m.UID).Spec.Instancetype.Name
	assert.True(t, strings.HasPrefix(second, "vfc.u1.small.r2-"), second)
	assert.Nil(t, e.vm(m.UID).Spec.Template.Spec.Domain.CPU)
	its = e.instancetypes()
	require.Len(t, its, 1, "the revision no VM names went")
	assert.Equal(t, second, its[0].Name)
	assert.Equal(t, kubevirtv1.CPU{Sockets: 2, Cores: 1, Threads: 1, MaxSockets: driver.DefaultMaxRatio}, *e.vmi(m.UID).Spec.Domain.CPU)

	// A revision beyond the maxima the guest runs with waits for its
	// restart, as a change of the template's would.
	m.VCPU, m.Instancetype.Revision = 5, 3
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.RestartRequired })
	assert.Equal(t, int32(2), o.VCPU, "the guest runs as it was")
	assert.Contains(t, o.Message, "vcpu 5 is more than the 4 the running guest can have")
	m.RestartNonce = "grow"
	o = e.ensureUntil(m, func(o driver.Observation) bool {
		return o.Phase == driver.PhaseRunning && !o.RestartRequired && o.RestartCount == 1
	})
	assert.Equal(t, [2]int32{5, 5 * driver.DefaultMaxRatio}, [2]int32{o.VCPU, o.MaxVCPU})
	third := e.vm(m.UID).Spec.Instancetype.Name
	assert.True(t, strings.HasPrefix(third, "vfc.u1.small.r3-"), third)
	assert.Len(t, e.instancetypes(), 1)

	require.Eventually(t, func() bool { return e.d.Delete(context.Background(), m.UID) == nil }, 20*time.Second, 50*time.Millisecond)
	assert.Empty(t, e.instancetypes(), "the type goes with its last VM")
}

// TestAGuestRunningInlineTakesItsTypeAtItsNextStart: a guest made before
// the agent knew of instance types (or of this one) runs on untouched
// when its Machine names its type, neither rewritten nor
// RestartRequired, and runs through the type once it starts again; a
// Machine without a type makes a VM as before.
func TestAGuestRunningInlineTakesItsTypeAtItsNextStart(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.VCPU, m.MemoryBytes = 1, 1<<30
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	before := e.vm(m.UID)
	assert.Nil(t, before.Spec.Instancetype, "a Machine without a type names none")
	assert.Equal(t, uint32(1), before.Spec.Template.Spec.Domain.CPU.Sockets)
	assert.Empty(t, e.instancetypes())

	m.Instancetype = &driver.Instancetype{Name: "small", Revision: 1}
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.False(t, o.RestartRequired)
	assert.Equal(t, before.Generation, e.vm(m.UID).Generation, "not rewritten")

	m.Running = false
	e.ensureUntil(m, phaseIs(driver.PhaseStopped))
	m.Running = true
	o = e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.False(t, o.RestartRequired)
	vm := e.vm(m.UID)
	require.NotNil(t, vm.Spec.Instancetype)
	assert.True(t, strings.HasPrefix(vm.Spec.Instancetype.Name, "vfn."+m.Namespace+".small.r1-"), vm.Spec.Instancetype.Name)
	assert.Nil(t, vm.Spec.Template.Spec.Domain.CPU)
	assert.Equal(t, uint32(1), e.vmi(m.UID).Spec.Domain.CPU.Sockets)
	e.recordedRevision(m.UID)
	_, err := e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.False(t, kerrors.IsNotFound(e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: vm.Spec.Instancetype.Name}, &instancetypev1beta1.VirtualMachineInstancetype{})))
}
