package kubevirt

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// failures are the printable statuses KubeVirt shows for a VM that cannot
// start: the guest is reported Failed with KubeVirt's message. They may pass
// (a node frees up, an image becomes pullable), and KubeVirt keeps trying.
var failures = map[kubevirtv1.VirtualMachinePrintableStatus]bool{
	kubevirtv1.VirtualMachineStatusUnschedulable:    true,
	kubevirtv1.VirtualMachineStatusCrashLoopBackOff: true,
	kubevirtv1.VirtualMachineStatusErrImagePull:     true,
	kubevirtv1.VirtualMachineStatusImagePullBackOff: true,
	kubevirtv1.VirtualMachineStatusPvcNotFound:      true,
	kubevirtv1.VirtualMachineStatusDataVolumeError:  true,
	kubevirtv1.VirtualMachineStatusUnknown:          true,
}

// failureMessage explains a failed printable status with the message of
// the condition KubeVirt explains it with.
func failureMessage(vm *kubevirtv1.VirtualMachine) string {
	status := vm.Status.PrintableStatus
	for _, c := range vm.Status.Conditions {
		explains := (c.Type == kubevirtv1.VirtualMachineFailure && c.Status == corev1.ConditionTrue) ||
			(c.Status == corev1.ConditionFalse && (c.Type == kubevirtv1.VirtualMachineConditionType(corev1.PodScheduled) ||
				c.Type == kubevirtv1.VirtualMachineConditionType(kubevirtv1.VirtualMachineInstanceDataVolumesReady) ||
				c.Type == kubevirtv1.VirtualMachineReady))
		if explains && c.Message != "" {
			return fmt.Sprintf("KubeVirt: %s: %s", status, c.Message)
		}
	}
	return fmt.Sprintf("KubeVirt reports %s", status)
}

// restarts is the VM's restart count and the uid of its current VMI, to be
// remembered in AnnotationVMI. A VMI that replaced the one last seen, and
// that the driver did not delete for a restart, is a recreation by KubeVirt
// (a guest crash or shutdown under runStrategy Always) and counts as a
// restart.
func restarts(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (int32, string) {
	a := vm.GetAnnotations()
	n, _ := strconv.ParseInt(a[AnnotationRestarts], 10, 32)
	count := int32(n)
	last := a[AnnotationVMI]
	if vmi == nil || vmi.DeletionTimestamp != nil || !wantsRunning(vm, vmi) {
		return count, last
	}
	cur := string(vmi.UID)
	if last != "" && cur != last && last != a[AnnotationRestartVMI] {
		count++
	}
	return count, cur
}

// runStrategyOf is the VM's runStrategy, or the one its deprecated
// spec.running stands for (an imported VM may use it).
func runStrategyOf(vm *kubevirtv1.VirtualMachine) kubevirtv1.VirtualMachineRunStrategy {
	switch {
	case vm.Spec.RunStrategy != nil:
		return *vm.Spec.RunStrategy
	case vm.Spec.Running != nil && *vm.Spec.Running: //nolint:staticcheck // see above
		return kubevirtv1.RunStrategyAlways
	default:
		return kubevirtv1.RunStrategyHalted
	}
}

// wantsRunning is whether KubeVirt keeps the guest running: under Always
// and RerunOnFailure (the driver's own guests use Always and Halted), and
// under Manual or Once while it has a VMI that has not finished.
func wantsRunning(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
	switch runStrategyOf(vm) {
	case kubevirtv1.RunStrategyAlways, kubevirtv1.RunStrategyRerunOnFailure:
		return true
	case kubevirtv1.RunStrategyHalted:
		return false
	default:
		return vmi != nil && vmi.DeletionTimestamp == nil && !vmi.IsFinal()
	}
}

// size is the vCPUs and memory a VMI spec gives its guest, as KubeVirt
// reads it: the CPU topology, else the CPU request or limit rounded up,
// else one; the guest memory, else the memory request, else the limit.
func size(spec *kubevirtv1.VirtualMachineInstanceSpec) (int32, int64) {
	dom := spec.Domain
	res := dom.Resources
	vcpu := int32(1)
	switch {
	case dom.CPU != nil:
		vcpu = int32(max(dom.CPU.Cores, 1) * max(dom.CPU.Sockets, 1) * max(dom.CPU.Threads, 1)) //nolint:gosec // a few hundred at most
	case !res.Requests.Cpu().IsZero():
		vcpu = int32((res.Requests.Cpu().MilliValue() + 999) / 1000) //nolint:gosec // as above
	case !res.Limits.Cpu().IsZero():
		vcpu = int32((res.Limits.Cpu().MilliValue() + 999) / 1000) //nolint:gosec // as above
	}
	var memory int64
	switch {
	case dom.Memory != nil && dom.Memory.Guest != nil:
		memory = dom.Memory.Guest.Value()
	case !res.Requests.Memory().IsZero():
		memory = res.Requests.Memory().Value()
	default:
		memory = res.Limits.Memory().Value()
	}
	return vcpu, memory
}

// observe maps a VM and its VMI (nil if none) to an Observation. Its shape
// is the VMI's, the one running, or else the template's.
func observe(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, now time.Time) driver.Observation {
	o := driver.Observation{UID: vm.Labels[LabelUID], ID: string(vm.UID)}
	o.RestartCount, _ = restarts(vm, vmi)
	running := wantsRunning(vm, vmi)
	switch {
	case vmi != nil:
		o.Node = vmi.Status.NodeName
		o.VCPU, o.MemoryBytes = runningSize(vmi)
		o.MaxVCPU, o.MaxMemoryBytes = maxSize(vm, &vmi.Spec)
		o.Disks = attached(vmi)
	case vm.Spec.Template != nil:
		t := template(vm)
		o.VCPU, o.MemoryBytes = size(&t.Spec)
		o.MaxVCPU, o.MaxMemoryBytes = maxSize(vm, &t.Spec)
		o.Disks = nodeNames(claimsOf(vm.Spec.Template.Spec.Volumes))
	}
	switch {
	case vm.DeletionTimestamp != nil:
		o.Phase, o.Message = driver.PhaseStopping, "KubeVirt is deleting the VirtualMachine"
	case failures[vm.Status.PrintableStatus] && running:
		o.Phase, o.Message = driver.PhaseFailed, failureMessage(vm)
	case !running && vmi != nil && !vmi.IsFinal():
		o.Phase, o.Message = driver.PhaseStopping, "waiting for KubeVirt to stop the VMI"
	case !running:
		o.Phase = driver.PhaseStopped
	case (vmi == nil || (vmi.DeletionTimestamp == nil && vmi.IsUnprocessed())) &&
		(vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusProvisioning || vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusWaitingForVolumeBinding):
		// KubeVirt makes the VMI of a VM whose DataVolumes are still
		// being filled, and holds it Pending until they are.
		o.Phase, o.Message = driver.PhaseProvisioning, fmt.Sprintf("KubeVirt reports %s", vm.Status.PrintableStatus)
	case vmi == nil:
		o.Phase = driver.PhaseStarting
	case vmi.DeletionTimestamp != nil || vmi.IsFinal():
		o.Phase, o.Message = driver.PhaseStarting, "KubeVirt is replacing the VMI"
	case vmi.Status.Phase == kubevirtv1.Running && pausedVMI(vmi):
		// The VMI's condition, not the VM's printable status Paused, which
		// virt-controller derives from it a moment later.
		o.Phase = driver.PhasePaused
	case vmi.Status.Phase == kubevirtv1.Running:
		o.Phase = driver.PhaseRunning
	case vmi.Status.Phase == kubevirtv1.Unknown:
		o.Phase, o.Message = driver.PhaseFailed, "KubeVirt lost contact with the VMI's node"
	default: // Pending, Scheduling, Scheduled
		o.Phase = driver.PhaseStarting
	}
	if vmi != nil && (o.Phase == driver.PhaseRunning || o.Phase == driver.PhaseStarting || o.Phase == driver.PhasePaused) {
		o.RestartRequired = restartRequired(vm, vmi)
		note := resizeNote(vm, vmi, o.RestartRequired)
		if o.RestartRequired {
			note = strings.Trim(note+"; "+volumeNote(vm, vmi), "; ")
		}
		if note != "" {
			o.Message = strings.TrimPrefix(o.Message+"; "+note, "; ")
		}
	}
	if vmi != nil && (o.Phase == driver.PhaseRunning || o.Phase == driver.PhasePaused) {
		// A paused guest keeps its addresses; virt-handler keeps them on
		// the VMI.
		o.Interfaces = interfaces(vmi, now)
	}
	return o
}

// runningSize is the vCPUs and memory the VMI's guest has: KubeVirt's
// status.currentCPUTopology and status.memory.guestCurrent, which a
// hot-plug changes once the guest has it, else its spec's.
func runningSize(vmi *kubevirtv1.VirtualMachineInstance) (int32, int64) {
	vcpu, memory := size(&vmi.Spec)
	if t := vmi.Status.CurrentCPUTopology; t != nil {
		vcpu = int32(max(t.Sockets, 1) * max(t.Cores, 1) * max(t.Threads, 1)) //nolint:gosec // a few hundred at most
	}
	if s := vmi.Status.Memory; s != nil && s.GuestCurrent != nil {
		memory = s.GuestCurrent.Value()
	}
	return vcpu, memory
}

// maxSize is the most vCPUs and memory KubeVirt hot-plugs into the guest
// of spec, a VMI's or the template's; each 0 where the template made
// without a maximum (an older agent's, an imported VM) cannot be resized
// live by the driver.
func maxSize(vm *kubevirtv1.VirtualMachine, spec *kubevirtv1.VirtualMachineInstanceSpec) (vcpu int32, memory int64) {
	t := template(vm)
	if t == nil {
		return 0, 0
	}
	if cpu := spec.Domain.CPU; cpu != nil && cpu.MaxSockets != 0 && t.Spec.Domain.CPU != nil && t.Spec.Domain.CPU.MaxSockets != 0 {
		vcpu = int32(cpu.MaxSockets * max(cpu.Cores, 1) * max(cpu.Threads, 1)) //nolint:gosec // as in runningSize
	}
	if mem := spec.Domain.Memory; mem != nil && mem.MaxGuest != nil && t.Spec.Domain.Memory != nil && t.Spec.Domain.Memory.MaxGuest != nil {
		memory = mem.MaxGuest.Value()
	}
	return vcpu, memory
}

// resizeNote says how the vCPUs and memory the template asks for differ
// from the running VMI's: for a guest that needs a restart (restart), the
// field beyond the maximum the guest runs with and KubeVirt's reason;
// otherwise a hot-plug the guest has not finished yet.
func resizeNote(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, restart bool) string {
	if vm.Spec.Template == nil {
		return ""
	}
	wantVCPU, wantMemory := size(&template(vm).Spec)
	vcpu, memory := runningSize(vmi)
	maxVCPU, maxMemory := maxSize(vm, &vmi.Spec)
	var notes []string
	if restart {
		if maxVCPU != 0 && wantVCPU > maxVCPU {
			notes = append(notes, fmt.Sprintf("vcpu %d is more than the %d the running guest can have (its maximum); it applies at the next start", wantVCPU, maxVCPU))
		}
		if maxMemory != 0 && wantMemory > maxMemory {
			notes = append(notes, fmt.Sprintf("memory of %d bytes is more than the %d bytes the running guest can have (its maximum); it applies at the next start", wantMemory, maxMemory))
		}
		if c := findVMCondition(vm, kubevirtv1.VirtualMachineRestartRequired); c != nil && c.Status == corev1.ConditionTrue && c.Message != "" {
			notes = append(notes, "KubeVirt: "+c.Message)
		}
		if stuck := stuckHotplug(vmi); stuck != "" {
			notes = append(notes, stuck)
		}
		return strings.Join(notes, "; ")
	}
	if vcpu != wantVCPU {
		notes = append(notes, fmt.Sprintf("the guest runs %d vCPUs of the %d asked; KubeVirt is hot-plugging them", vcpu, wantVCPU))
	}
	if memory != wantMemory {
		notes = append(notes, fmt.Sprintf("the guest runs %d bytes of memory of the %d asked; KubeVirt is hot-plugging it", memory, wantMemory))
	}
	return strings.Join(notes, "; ")
}

func findVMCondition(vm *kubevirtv1.VirtualMachine, t kubevirtv1.VirtualMachineConditionType) *kubevirtv1.VirtualMachineCondition {
	for i := range vm.Status.Conditions {
		if vm.Status.Conditions[i].Type == t {
			return &vm.Status.Conditions[i]
		}
	}
	return nil
}

// volumeNote names the volumes (their claims) the VM's template and its
// running VMI differ by, which wait for the next start, and why.
func volumeNote(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) string {
	if vm.Spec.Template == nil {
		return ""
	}
	want, have := claimsOf(vm.Spec.Template.Spec.Volumes), claimsOf(vmi.Spec.Volumes)
	var notes []string
	if added := without(want, have); len(added) > 0 {
		notes = append(notes, fmt.Sprintf("volume %s is attached at the next start", strings.Join(added, ", ")))
	}
	if removed := without(have, want); len(removed) > 0 {
		notes = append(notes, fmt.Sprintf("volume %s is detached at the next start", strings.Join(removed, ", ")))
	}
	if len(notes) == 0 {
		return ""
	}
	return strings.Join(notes, "; ")
}

// attached are the disks of the VMI, under their node-side names, in its
// order: each volume of its spec but a hotpluggable one virt-handler has
// not reported Ready yet, then those that left its spec and that
// virt-handler still reports (it has not detached them yet).
func attached(vmi *kubevirtv1.VirtualMachineInstance) []string {
	status := map[string]kubevirtv1.VolumeStatus{}
	for _, s := range vmi.Status.VolumeStatus {
		status[s.Name] = s
	}
	var claims []string
	for _, v := range vmi.Spec.Volumes {
		if s, ok := status[v.Name]; hotpluggable(v) && (!ok || s.Phase != kubevirtv1.VolumeReady) {
			continue
		}
		if claim := claimOf(v); claim != "" {
			claims = append(claims, claim)
		}
	}
	for _, s := range vmi.Status.VolumeStatus {
		if s.PersistentVolumeClaimInfo != nil && !slices.ContainsFunc(vmi.Spec.Volumes, func(v kubevirtv1.Volume) bool { return v.Name == s.Name }) {
			claims = append(claims, s.PersistentVolumeClaimInfo.ClaimName)
		}
	}
	return nodeNames(claims)
}

func nodeNames(claims []string) []string {
	out := make([]string, 0, len(claims))
	for _, c := range claims {
		out = append(out, NodeNameOf(c))
	}
	return out
}

// claimsOf are the PVCs and DataVolumes of volumes, in their order.
func claimsOf(volumes []kubevirtv1.Volume) []string {
	var out []string
	for _, v := range volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		case v.DataVolume != nil:
			out = append(out, v.DataVolume.Name)
		}
	}
	return out
}

// without is a without the elements of b.
func without(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// pausedVMI is whether the VMI has the condition Paused, which
// virt-handler gives a VMI paused through the pause subresource.
func pausedVMI(vmi *kubevirtv1.VirtualMachineInstance) bool {
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstancePaused {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// stuckHotplug says why KubeVirt will not finish the VMI's CPU hot-plug,
// or is empty: its workload updater completes one only by migrating the
// VMI live into a pod of the new shape, which it does not for a VMI that
// is not LiveMigratable; KubeVirt sets no RestartRequired for that (it
// does for memory), and the VMI's HotVCPUChange stays until the next one.
func stuckHotplug(vmi *kubevirtv1.VirtualMachineInstance) string {
	if !slices.ContainsFunc(vmi.Status.Conditions, func(c kubevirtv1.VirtualMachineInstanceCondition) bool {
		return c.Type == kubevirtv1.VirtualMachineInstanceVCPUChange
	}) {
		return ""
	}
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstanceIsMigratable && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("KubeVirt adds vCPUs to a running guest only by migrating it live, and cannot migrate it (%s: %s); they apply at the next start", c.Reason, c.Message)
		}
	}
	return ""
}

// restartRequired is KubeVirt's RestartRequired condition, or a CPU
// hot-plug KubeVirt will not finish (stuckHotplug), or a VMI made from an
// older template than the VM's (the shape hashes differ), or one whose
// volumes that are not hotpluggable differ from the template's.
func restartRequired(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
	for _, c := range vm.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineRestartRequired && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	if stuckHotplug(vmi) != "" {
		return true
	}
	if vm.Spec.Template == nil {
		return false
	}
	// A volume that is not hotpluggable is attached and detached only
	// when KubeVirt makes a VMI.
	unpluggable := func(volumes []kubevirtv1.Volume) []string {
		return claimsOf(slices.DeleteFunc(slices.Clone(volumes), hotpluggable))
	}
	return vmi.Annotations[AnnotationShape] != vm.Spec.Template.ObjectMeta.Annotations[AnnotationShape] ||
		!slices.Equal(unpluggable(vmi.Spec.Volumes), unpluggable(vm.Spec.Template.Spec.Volumes))
}

// interfaces are the VMI's, each under the node-side name of the network
// it is on (from the VMI's own spec: the networks it runs with).
func interfaces(vmi *kubevirtv1.VirtualMachineInstance, now time.Time) []driver.Interface {
	network := map[string]string{}
	for _, n := range vmi.Spec.Networks {
		if n.Multus != nil {
			network[n.Name] = NodeNameOf(n.Multus.NetworkName)
		}
	}
	var out []driver.Interface
	for _, i := range vmi.Status.Interfaces {
		name, ok := network[i.Name]
		if !ok {
			continue // not one of the Machine's networks
		}
		iface := driver.Interface{Network: name, MAC: strings.ToLower(i.MAC), Source: driver.AddressSourceBackend}
		iface.IPs = driver.Reachable(i.IPs)
		if len(i.IPs) == 0 && i.IP != "" {
			iface.IPs = driver.Reachable([]string{i.IP})
		}
		if strings.Contains(i.InfoSource, "guest-agent") {
			iface.Source = driver.AddressSourceGuestAgent
		}
		if len(iface.IPs) > 0 {
			iface.LastSeen = now
		}
		out = append(out, iface)
	}
	return out
}

// Observe implements driver.Driver.
func (d *Driver) Observe(ctx context.Context, uid string) (driver.Observation, error) {
	c, err := d.client()
	if err != nil {
		return driver.Observation{}, err
	}
	vm, vmi, err := d.get(ctx, c, uid)
	if err != nil {
		return driver.Observation{}, err
	}
	return observe(vm, vmi, d.now()), nil
}

// List implements driver.Driver.
func (d *Driver) List(ctx context.Context) ([]driver.Observation, error) {
	c, err := d.client()
	if err != nil {
		return nil, err
	}
	return d.observeAll(ctx, c, false)
}

// observeAll observes the VMs virtfleet manages (released false) or those
// released (true), each under the uid on its label; an orphan gets
// OrphanOf.
func (d *Driver) observeAll(ctx context.Context, c client.Reader, released bool) ([]driver.Observation, error) {
	all, err := d.guests(ctx, c)
	if err != nil {
		return nil, err
	}
	vms := slices.DeleteFunc(all, func(vm *kubevirtv1.VirtualMachine) bool { return orphaned(vm) != released })
	vmis := &kubevirtv1.VirtualMachineInstanceList{}
	if err := c.List(ctx, vmis, client.InNamespace(d.namespace)); err != nil {
		return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachineInstances")
	}
	byName := map[string]*kubevirtv1.VirtualMachineInstance{}
	for i := range vmis.Items {
		byName[vmis.Items[i].Name] = &vmis.Items[i]
	}
	out := make([]driver.Observation, 0, len(vms))
	for _, vm := range vms {
		vmi := byName[vm.Name]
		if vmi != nil && !metav1.IsControlledBy(vmi, vm) {
			vmi = nil
		}
		o := observe(vm, vmi, d.now())
		if orphaned(vm) {
			o.OrphanOf = &driver.VMRef{Namespace: vm.Annotations[AnnotationNamespace], Name: vm.Annotations[AnnotationName], Seal: vm.Annotations[AnnotationSeal]}
		}
		out = append(out, o)
	}
	return out, nil
}

// guests are the VMs labelled with a uid: those managed and those
// released.
func (d *Driver) guests(ctx context.Context, c client.Reader) ([]*kubevirtv1.VirtualMachine, error) {
	vms := &kubevirtv1.VirtualMachineList{}
	if err := c.List(ctx, vms, client.InNamespace(d.namespace), client.HasLabels{LabelUID}); err != nil {
		return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
	}
	out := make([]*kubevirtv1.VirtualMachine, 0, len(vms.Items))
	for i := range vms.Items {
		out = append(out, &vms.Items[i])
	}
	return out, nil
}
