package kubevirttest

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// CPU and memory hot-plug as KubeVirt does it under its LiveUpdate VM
// rollout strategy, the stand-in's only one. virt-api's VMI defaults give
// a VMI whose template sets no maximum maxSockets and maxGuest
// (MaxHotplugRatio times its sockets and guest memory; memory only where
// ValidateLiveUpdateMemory allows it), and its status the topology and
// memory it boots with. When a VM's spec.template.spec.domain.cpu.sockets
// or memory.guest changes while its VMI runs, virt-controller's VM
// controller copies it into the VMI's spec (handleCPUChangeRequest,
// handleMemoryHotplugRequest), which shows HotVCPUChange or
// HotMemoryChange until the guest has it; a change it cannot apply live
// (beyond the VMI's maximum, fewer sockets or less memory than it booted
// with, memory of a VMI that is not LiveMigratable or has no maxGuest)
// sets the VM's RestartRequired condition instead, which holds until the
// VM's next VMI and stops any further live change meanwhile. KubeVirt
// moves the VMI into a larger pod by a live migration of its workload
// updater (workloadupdate.go), which only a LiveMigratable VMI gets, and
// the target's virt-handler completes the change (finishHotplug).
// virt-controller also sets RestartRequired for any other field of the
// template that changed since the VMI started, against the VM revision
// the VMI started from (addRestartRequiredIfNeeded); the stand-in
// compares only the CPU, memory and resources that way.

// MaxHotplugRatio is KubeVirt's default liveUpdateConfiguration
// maxHotplugRatio: the maximum a VMI gets when its template sets none.
const MaxHotplugRatio = 4

// cpuAllocationRatio is KubeVirt's default developerConfiguration
// cpuAllocationRatio: a vCPU hot-plugged adds a tenth of a CPU to the
// VMI's CPU request and limit.
const cpuAllocationRatio = 10

// maxVCPUs bounds a computed maxSockets, as KubeVirt's setupCPUHotplug
// does: machine types differ in how many vCPUs they hold.
const maxVCPUs = 512

// Memory hot-plug needs guest memory and its maximum in blocks of this
// (KubeVirt's HotplugBlockAlignmentBytes; 1Gi with 1Gi hugepages), and at
// least minHotplugMemory of guest memory.
const (
	hotplugBlock     = 2 << 20
	hugeHotplugBlock = 1 << 30
	minHotplugMemory = 1 << 30
)

// defaultHotplug applies to a new VMI what KubeVirt's VMI defaults
// (SetDefaultVirtualMachineInstance) give it for hot-plug: its status's
// current topology and memory, and the maxima its template left unset.
func defaultHotplug(vmi *kubevirtv1.VirtualMachineInstance) {
	dom := &vmi.Spec.Domain
	if cpu := dom.CPU; cpu != nil {
		vmi.Status.CurrentCPUTopology = &kubevirtv1.CPUTopology{Sockets: cpu.Sockets, Cores: cpu.Cores, Threads: cpu.Threads}
		if cpu.MaxSockets == 0 && !arm(&vmi.Spec) {
			cpu.MaxSockets = cpu.Sockets * MaxHotplugRatio
			if total := cpu.MaxSockets * max(cpu.Cores, 1) * max(cpu.Threads, 1); total > maxVCPUs {
				cpu.MaxSockets = max(maxVCPUs/(max(cpu.Cores, 1)*max(cpu.Threads, 1)), cpu.Sockets)
			}
		}
	}
	if mem := dom.Memory; mem != nil && mem.Guest != nil {
		guest := mem.Guest.DeepCopy()
		vmi.Status.Memory = &kubevirtv1.MemoryStatus{GuestAtBoot: ptr(guest.DeepCopy()), GuestCurrent: ptr(guest.DeepCopy()), GuestRequested: ptr(guest.DeepCopy())}
		if mem.MaxGuest == nil && !arm(&vmi.Spec) {
			maxGuest := resource.NewQuantity(guest.Value()*MaxHotplugRatio, resource.BinarySI)
			if liveUpdateMemory(&vmi.Spec, maxGuest) == nil {
				mem.MaxGuest = maxGuest
			}
		}
	}
}

// arm is whether the spec is for arm64, where KubeVirt hot-plugs nothing.
// An empty architecture is the cluster's default, amd64 here.
func arm(spec *kubevirtv1.VirtualMachineInstanceSpec) bool {
	return spec.Architecture == "arm64"
}

// liveUpdateMemory is KubeVirt's ValidateLiveUpdateMemory: why spec's
// memory cannot be hot-plugged up to maxGuest, or nil.
func liveUpdateMemory(spec *kubevirtv1.VirtualMachineInstanceSpec, maxGuest *resource.Quantity) error {
	dom := &spec.Domain
	block := int64(hotplugBlock)
	switch {
	case dom.CPU != nil && dom.CPU.Realtime != nil:
		return errors.New("Memory hotplug is not compatible with realtime VMs")
	case dom.CPU != nil && dom.CPU.NUMA != nil && dom.CPU.NUMA.GuestMappingPassthrough != nil:
		return errors.New("Memory hotplug is not compatible with guest mapping passthrough")
	case dom.LaunchSecurity != nil:
		return errors.New("Memory hotplug is not compatible with encrypted VMs")
	}
	if dom.Memory != nil && dom.Memory.Hugepages != nil && dom.Memory.Hugepages.PageSize == "1Gi" {
		block = hugeHotplugBlock
	}
	alignment := resource.NewQuantity(block, resource.BinarySI)
	switch {
	case dom.Memory == nil || dom.Memory.Guest == nil:
		return errors.New("Guest memory must be configured when memory hotplug is enabled")
	case maxGuest == nil:
		return errors.New("Max guest memory must be configured when memory hotplug is enabled")
	case dom.Memory.Guest.Cmp(*maxGuest) > 0:
		return errors.New("Guest memory is greater than the configured maxGuest memory")
	case dom.Memory.Guest.Value()%block != 0:
		return errors.Errorf("Guest memory must be %s aligned", alignment)
	case maxGuest.Value()%block != 0:
		return errors.Errorf("MaxGuest must be %s aligned", alignment)
	case spec.Architecture != "" && spec.Architecture != "amd64":
		return errors.New("Memory hotplug is only available for x86_64 VMs")
	case dom.Memory.Guest.Value() < minHotplugMemory:
		return errors.New("Memory hotplug is only available for VMs with at least 1Gi of guest memory")
	}
	return nil
}

// startedShape is the CPU, memory and resources of the template the VM's
// running VMI started from, as its VM revision keeps them; nil when the
// VMI names no revision.
func (c *FakeVirtController) startedShape(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (*kubevirtv1.DomainSpec, error) {
	if vmi.Status.VirtualMachineRevisionName == "" {
		return nil, nil
	}
	cr := &appsv1.ControllerRevision{}
	if err := c.live.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Status.VirtualMachineRevisionName}, cr); err != nil {
		return nil, errors.Wrapf(err, "cannot get vm revision %q", vmi.Status.VirtualMachineRevisionName)
	}
	started := &kubevirtv1.VirtualMachine{}
	if err := json.Unmarshal(cr.Data.Raw, started); err != nil {
		return nil, errors.Wrap(err, "cannot decode the VM's revision")
	}
	if started.Spec.Template == nil {
		return nil, nil
	}
	return &kubevirtv1.DomainSpec{CPU: started.Spec.Template.Spec.Domain.CPU, Memory: started.Spec.Template.Spec.Domain.Memory, Resources: started.Spec.Template.Spec.Domain.Resources}, nil
}

// shapeChanged is addRestartRequiredIfNeeded for CPU, memory and
// resources: whether the template's differ from those the VMI started
// with (started), but for the sockets and guest memory, which are live
// updates.
func shapeChanged(started *kubevirtv1.DomainSpec, vm *kubevirtv1.VirtualMachine) bool {
	if started == nil || vm.Spec.Template == nil {
		return false
	}
	was, now := started.DeepCopy(), &vm.Spec.Template.Spec.Domain
	if was.CPU != nil && now.CPU != nil {
		was.CPU.Sockets = now.CPU.Sockets
	}
	if now.Memory != nil && now.Memory.Guest != nil {
		if was.Memory == nil {
			was.Memory = &kubevirtv1.Memory{}
		}
		was.Memory.Guest = now.Memory.Guest
	}
	return !equality.Semantic.DeepEqual(was.CPU, now.CPU) || !equality.Semantic.DeepEqual(was.Memory, now.Memory) ||
		!equality.Semantic.DeepEqual(was.Resources, now.Resources)
}

// errHotplugBusy is virt-controller's answer while a hot-plug or a
// migration of the VMI runs: it tries again later.
var errHotplugBusy = errors.New("a CPU or memory hotplug or a migration of the VMI is in progress")

// hotplugShape applies the VM's template CPU sockets and guest memory to
// its running VMI as virt-controller does (see above): it changes vmi in
// memory and reports whether it did; a change that needs a restart sets
// RestartRequired on vm's status in memory, for setStatus to write.
// errHotplugBusy means: come back later.
func hotplugShape(started *kubevirtv1.DomainSpec, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (bool, error) {
	if vm.Spec.Template == nil {
		return false, nil
	}
	if shapeChanged(started, vm) {
		setRestartRequired(vm, "a non-live-updatable field was changed in the template spec")
	}
	if findCondition(vm.Status.Conditions, kubevirtv1.VirtualMachineRestartRequired) != nil {
		return false, nil
	}
	cpu, errCPU := hotplugCPU(vm, vmi)
	memory, errMemory := hotplugMemory(vm, vmi)
	return cpu || memory, errors.Join(errCPU, errMemory)
}

// hotplugCPU is handleCPUChangeRequest and VMICPUsPatch, and the VMI
// controller's HotVCPUChange that follows.
func hotplugCPU(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (bool, error) {
	want, have := vm.Spec.Template.Spec.Domain.CPU, vmi.Spec.Domain.CPU
	if want == nil || have == nil || want.Sockets == have.Sockets {
		return false, nil
	}
	if vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange) == corev1.ConditionTrue || migrating(vmi) {
		return false, errHotplugBusy
	}
	switch {
	case want.Sockets > have.MaxSockets:
		setRestartRequired(vm, "CPU sockets updated in template spec to a value higher than what's available")
		return false, nil
	case want.Sockets < have.Sockets:
		setRestartRequired(vm, "Reduction of CPU socket count requires a restart")
		return false, nil
	case arm(&vm.Spec.Template.Spec):
		setRestartRequired(vm, "ARM doesn't support CPU hotplug")
		return false, nil
	}
	vcpus := (int64(want.Sockets) - int64(have.Sockets)) * int64(max(have.Cores, 1)*max(have.Threads, 1))
	delta := *resource.NewMilliQuantity(vcpus*1000/cpuAllocationRatio, resource.DecimalSI)
	have.Sockets = want.Sockets
	if cpu := vm.Spec.Template.Spec.Domain.Resources.Requests.Cpu(); !cpu.IsZero() {
		grow(vmi.Spec.Domain.Resources.Requests, corev1.ResourceCPU, delta)
	}
	if cpu := vm.Spec.Template.Spec.Domain.Resources.Limits.Cpu(); !cpu.IsZero() {
		grow(vmi.Spec.Domain.Resources.Limits, corev1.ResourceCPU, delta)
	}
	setVMICondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange)
	return true, nil
}

// hotplugMemory is handleMemoryHotplugRequest, and the VMI controller's
// HotMemoryChange that follows.
func hotplugMemory(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (bool, error) {
	tspec := &vm.Spec.Template.Spec
	want, have := tspec.Domain.Memory, vmi.Spec.Domain.Memory
	if want == nil || want.Guest == nil || have == nil || have.Guest == nil || vmi.Status.Memory == nil || vmi.Status.Memory.GuestCurrent == nil {
		return false, nil
	}
	if vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceMemoryChange) == corev1.ConditionFalse {
		setRestartRequired(vm, "memory updated in template spec. Memory-hotplug failed and is not available for this VM configuration")
		return false, nil
	}
	if want.Guest.Equal(*have.Guest) {
		return false, nil
	}
	switch {
	case vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceIsMigratable) != corev1.ConditionTrue:
		setRestartRequired(vm, "memory updated in template spec. Memory-hotplug is only available for migratable VMs")
		return false, nil
	case have.MaxGuest == nil:
		setRestartRequired(vm, "memory updated in template spec. Memory-hotplug is not available for this VM configuration")
		return false, nil
	case vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceMemoryChange) == corev1.ConditionTrue || migrating(vmi):
		return false, errHotplugBusy
	}
	if err := liveUpdateMemory(tspec, have.MaxGuest); err != nil {
		setRestartRequired(vm, fmt.Sprintf("memory hotplug not supported, %s", err))
		return false, nil
	}
	switch {
	case vmi.Status.Memory.GuestAtBoot != nil && want.Guest.Cmp(*vmi.Status.Memory.GuestAtBoot) < 0:
		setRestartRequired(vm, "memory updated in template spec to a value lower than what the VM started with")
		return false, nil
	case want.Guest.Cmp(*have.MaxGuest) > 0:
		setRestartRequired(vm, "memory updated in template spec to a value higher than what's available")
		return false, nil
	}
	delta := want.Guest.Value() - vmi.Status.Memory.GuestCurrent.Value()
	have.Guest = ptr(want.Guest.DeepCopy())
	if req := vmi.Spec.Domain.Resources.Requests.Memory(); !req.IsZero() {
		// Never below the guest memory: a guest that did not give back
		// all it was asked to after an unplug holds more than requested.
		next := resource.NewQuantity(max(req.Value()+delta, want.Guest.Value()), resource.BinarySI)
		delta = next.Value() - req.Value()
		vmi.Spec.Domain.Resources.Requests[corev1.ResourceMemory] = *next
	}
	if limit := tspec.Domain.Resources.Limits.Memory(); !limit.IsZero() {
		grow(vmi.Spec.Domain.Resources.Limits, corev1.ResourceMemory, *resource.NewQuantity(delta, resource.BinarySI))
	}
	setVMICondition(vmi, kubevirtv1.VirtualMachineInstanceMemoryChange)
	return true, nil
}

// finishHotplug is the target's virt-handler finalizing a migration that
// succeeded (pkg/virt-handler/migration-target.go, hotplugCPU and
// hotplugMemory), whichever made it: the VMI's status takes its spec's
// topology and guest memory, and the conditions go. virt-handler sets
// guestCurrent later, from the memory the guest reports; the stand-in's
// guest takes all of it at once.
func finishHotplug(vmi *kubevirtv1.VirtualMachineInstance) {
	if cpu := vmi.Spec.Domain.CPU; cpu != nil && vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange) != "" {
		vmi.Status.CurrentCPUTopology = &kubevirtv1.CPUTopology{Sockets: cpu.Sockets, Cores: cpu.Cores, Threads: cpu.Threads}
		removeVMICondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange)
	}
	if mem := vmi.Spec.Domain.Memory; mem != nil && mem.Guest != nil && vmi.Status.Memory != nil && vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceMemoryChange) == corev1.ConditionTrue {
		vmi.Status.Memory.GuestRequested = ptr(mem.Guest.DeepCopy())
		vmi.Status.Memory.GuestCurrent = ptr(mem.Guest.DeepCopy())
		removeVMICondition(vmi, kubevirtv1.VirtualMachineInstanceMemoryChange)
	}
}

// grow adds delta to list's name, as virt-controller's patches of a
// VMI's requests and limits do.
func grow(list corev1.ResourceList, name corev1.ResourceName, delta resource.Quantity) {
	if list == nil {
		return
	}
	q := list[name]
	q.Add(delta)
	list[name] = q
}

// setRestartRequired is virt-controller's: the VM's condition with why.
func setRestartRequired(vm *kubevirtv1.VirtualMachine, message string) {
	cond := kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineRestartRequired, Status: corev1.ConditionTrue, Message: message, LastTransitionTime: metav1.Now()}
	if old := findCondition(vm.Status.Conditions, cond.Type); old != nil {
		*old = cond
		return
	}
	vm.Status.Conditions = append(vm.Status.Conditions, cond)
}

// cleanupRestartRequired is virt-controller's, when it starts or stops
// the VM's VMI: the VM's RestartRequired goes, written at once (vm is
// updated), since setStatus keeps the condition while a VMI runs.
func (c *FakeVirtController) cleanupRestartRequired(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	for i, cond := range vm.Status.Conditions {
		if cond.Type == kubevirtv1.VirtualMachineRestartRequired {
			// Written from a copy: the answer is the VM as stored, and vm
			// may be one with its instance type applied (expanded).
			written := vm.DeepCopy()
			written.Status.Conditions = append(vm.Status.Conditions[:i:i], vm.Status.Conditions[i+1:]...)
			if err := c.client.Status().Update(ctx, written); err != nil {
				return errors.Wrap(err, "cannot clear the VM's RestartRequired")
			}
			vm.Status, vm.ResourceVersion = written.Status, written.ResourceVersion
			return nil
		}
	}
	return nil
}

// vmiCondition is the status of the VMI's condition t; empty without one.
func vmiCondition(vmi *kubevirtv1.VirtualMachineInstance, t kubevirtv1.VirtualMachineInstanceConditionType) corev1.ConditionStatus {
	for _, c := range vmi.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// setVMICondition sets the VMI's condition t True: a hot-plug runs.
func setVMICondition(vmi *kubevirtv1.VirtualMachineInstance, t kubevirtv1.VirtualMachineInstanceConditionType) {
	removeVMICondition(vmi, t)
	vmi.Status.Conditions = append(vmi.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
}

func removeVMICondition(vmi *kubevirtv1.VirtualMachineInstance, t kubevirtv1.VirtualMachineInstanceConditionType) {
	out := vmi.Status.Conditions[:0]
	for _, c := range vmi.Status.Conditions {
		if c.Type != t {
			out = append(out, c)
		}
	}
	vmi.Status.Conditions = out
}
