package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Instance types and preferences follow KubeVirt's instancetype.kubevirt.io
// split: an instance type is what a VM gets (vCPUs and memory), a
// preference is what it would rather have where it says nothing itself
// (firmware). Each comes namespaced, for a tenant's own, and cluster-wide,
// for the administrator's catalogue. A VM names one of each instead of
// setting vcpu and memory itself, and the hub records what it took
// (status.instancetypeRef and status.preferenceRef), so editing a type
// never reshapes a VM behind its back.
//
// A preference carries only what virtfleet's drivers honour today: the
// firmware. KubeVirt's preferred disk bus and machine type are left out
// until a driver can use them: the libvirt driver attaches every disk on
// virtio and leaves the machine type to libvirt.

// AnnotationInstancetypeUpdateRequestedAt moves a VirtualMachine to the
// current revisions of its instance type and preference. Each new value
// does it once (kubectl annotate vm NAME
// compute.virtfleet.io/instancetype-update-requested-at="$(date -Is)"):
// the hub records the types' specs as they are now, as KubeVirt does when
// a VM's revisionName is cleared, and a running VM whose shape changed
// shows RestartRequired until its next start.
const AnnotationInstancetypeUpdateRequestedAt = Group + "/instancetype-update-requested-at"

// InstancetypeKind is the kind of instance type a VirtualMachine names.
// +kubebuilder:validation:Enum=VirtualMachineInstancetype;VirtualMachineClusterInstancetype
type InstancetypeKind string

// PreferenceKind is the kind of preference a VirtualMachine names.
// +kubebuilder:validation:Enum=VirtualMachinePreference;VirtualMachineClusterPreference
type PreferenceKind string

// InstancetypeRef names the instance type a VirtualMachine takes its vCPUs
// and memory from.
type InstancetypeRef struct {
	// Kind is VirtualMachineClusterInstancetype (the default, as in
	// KubeVirt) or VirtualMachineInstancetype, which is looked up in the
	// VM's own namespace: a VM cannot name another namespace's.
	// +kubebuilder:default=VirtualMachineClusterInstancetype
	// +optional
	Kind InstancetypeKind `json:"kind,omitempty"`
	// Name of the instance type.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// PreferenceRef names the preference a VirtualMachine takes what it does
// not set itself from.
type PreferenceRef struct {
	// Kind is VirtualMachineClusterPreference (the default, as in
	// KubeVirt) or VirtualMachinePreference, which is looked up in the
	// VM's own namespace.
	// +kubebuilder:default=VirtualMachineClusterPreference
	// +optional
	Kind PreferenceKind `json:"kind,omitempty"`
	// Name of the preference.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// InstancetypeCPU is an instance type's processors.
// +kubebuilder:validation:XValidation:rule="!has(self.maxGuest) || self.maxGuest >= self.guest",fieldPath=".maxGuest",message="cpu.maxGuest must be at least cpu.guest"
type InstancetypeCPU struct {
	// Guest is the number of virtual CPUs.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	Guest int32 `json:"guest"`
	// MaxGuest is the most vCPUs a running VM of the type can be given
	// without a restart, as a VirtualMachine's maxVcpu.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	MaxGuest *int32 `json:"maxGuest,omitempty"`
}

// InstancetypeMemory is an instance type's memory.
// +kubebuilder:validation:XValidation:rule="!has(self.maxGuest) || !quantity(string(self.maxGuest)).isLessThan(quantity(string(self.guest)))",fieldPath=".maxGuest",message="memory.maxGuest must be at least memory.guest"
type InstancetypeMemory struct {
	// Guest is the guest's RAM, bounded as a VirtualMachine's memory is.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",messageExpression="'memory.guest must be greater than 0, got ' + string(self)"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isGreaterThan(quantity('16Ti'))",messageExpression="'memory.guest must be at most 16Ti, got ' + string(self)"
	Guest resource.Quantity `json:"guest"`
	// MaxGuest is the most memory a running VM of the type can be given
	// without a restart, as a VirtualMachine's maxMemory.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isGreaterThan(quantity('16Ti'))",messageExpression="'memory.maxGuest must be at most 16Ti, got ' + string(self)"
	// +optional
	MaxGuest *resource.Quantity `json:"maxGuest,omitempty"`
}

// InstancetypeSpec is what a VM of the type gets. Hugepages and dedicated
// CPUs belong here once a driver places them.
type InstancetypeSpec struct {
	// CPU is the VM's processors.
	CPU InstancetypeCPU `json:"cpu"`
	// Memory is the VM's RAM.
	Memory InstancetypeMemory `json:"memory"`
}

// PreferenceSpec is what a VM of the preference gets where its own spec
// says nothing.
type PreferenceSpec struct {
	// PreferredFirmware is the firmware the guest boots with unless the
	// VM sets firmware itself.
	// +optional
	PreferredFirmware *Firmware `json:"preferredFirmware,omitempty"`
}

// InstancetypeRevision is the instance type a VirtualMachine took its
// shape from, as it was then. The hub records it once, when it first
// places the VM, and again only when the VM names another type or asks for
// the current one (AnnotationInstancetypeUpdateRequestedAt): edits of the
// type reach no VM by themselves.
type InstancetypeRevision struct {
	// Kind and Name are the instance type's.
	Kind InstancetypeKind `json:"kind"`
	Name string           `json:"name"`
	// Revision is the type's metadata.generation the spec was recorded at.
	Revision int64 `json:"revision"`
	// Spec is the type's spec at that revision: the VM's shape.
	Spec InstancetypeSpec `json:"spec"`
	// UpdateRequestedAt is the value of
	// AnnotationInstancetypeUpdateRequestedAt this record answered.
	// +optional
	UpdateRequestedAt string `json:"updateRequestedAt,omitempty"`
}

// PreferenceRevision is the preference a VirtualMachine took its defaults
// from, as it was then; recorded as InstancetypeRevision is.
type PreferenceRevision struct {
	// Kind and Name are the preference's.
	Kind PreferenceKind `json:"kind"`
	Name string         `json:"name"`
	// Revision is the preference's metadata.generation the spec was
	// recorded at.
	Revision int64 `json:"revision"`
	// Spec is the preference's spec at that revision.
	Spec PreferenceSpec `json:"spec"`
	// UpdateRequestedAt is the value of
	// AnnotationInstancetypeUpdateRequestedAt this record answered.
	// +optional
	UpdateRequestedAt string `json:"updateRequestedAt,omitempty"`
}

// Shape is the vCPUs and memory vm is to run with: its own, or those
// recorded from its instance type. ok is false for a VM that names an
// instance type the hub has not recorded yet: it has no shape to place or
// run.
func (vm *VirtualMachine) Shape() (vcpu int32, memory resource.Quantity, ok bool) {
	fp := &vm.Spec.ForProvider
	if fp.Instancetype == nil {
		return fp.Vcpu, fp.Memory, true
	}
	r := vm.Status.InstancetypeRef
	if r == nil {
		return 0, resource.Quantity{}, false
	}
	return r.Spec.CPU.Guest, r.Spec.Memory.Guest, true
}

// MaxShape is the most vCPUs and memory vm may grow to while it runs: its
// own maxVcpu and maxMemory, or those recorded from its instance type; 0
// and nil where it leaves them to the node.
func (vm *VirtualMachine) MaxShape() (vcpu int32, memory *resource.Quantity) {
	fp := &vm.Spec.ForProvider
	if fp.Instancetype == nil {
		if fp.MaxVcpu != nil {
			vcpu = *fp.MaxVcpu
		}
		return vcpu, fp.MaxMemory
	}
	r := vm.Status.InstancetypeRef
	if r == nil {
		return 0, nil
	}
	if r.Spec.CPU.MaxGuest != nil {
		vcpu = *r.Spec.CPU.MaxGuest
	}
	return vcpu, r.Spec.Memory.MaxGuest
}

// BootFirmware is the firmware vm boots with: its own, else its recorded
// preference's; nil means the backend's default (bios).
func (vm *VirtualMachine) BootFirmware() *Firmware {
	if f := vm.Spec.ForProvider.Firmware; f != nil {
		return f
	}
	if p := vm.Status.PreferenceRef; p != nil && vm.Spec.ForProvider.Preference != nil {
		return p.Spec.PreferredFirmware
	}
	return nil
}

// +kubebuilder:object:root=true

// A VirtualMachineInstancetype is a namespace's own size of VM: the vCPUs
// and memory a VirtualMachine of its namespace gets by naming it
// (spec.forProvider.instancetype with kind VirtualMachineInstancetype).
// +kubebuilder:printcolumn:name="VCPU",type="integer",JSONPath=".spec.cpu.guest"
// +kubebuilder:printcolumn:name="MEMORY",type="string",JSONPath=".spec.memory.guest"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmit,vmits},categories={virtfleet}
type VirtualMachineInstancetype struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec InstancetypeSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// VirtualMachineInstancetypeList contains a list of
// VirtualMachineInstancetype.
type VirtualMachineInstancetypeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstancetype `json:"items"`
}

// +kubebuilder:object:root=true

// A VirtualMachineClusterInstancetype is a size of VM every namespace may
// name (spec.forProvider.instancetype; its kind is the default).
// +kubebuilder:printcolumn:name="VCPU",type="integer",JSONPath=".spec.cpu.guest"
// +kubebuilder:printcolumn:name="MEMORY",type="string",JSONPath=".spec.memory.guest"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Cluster,shortName={vmcit,vmcits},categories={virtfleet}
type VirtualMachineClusterInstancetype struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec InstancetypeSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// VirtualMachineClusterInstancetypeList contains a list of
// VirtualMachineClusterInstancetype.
type VirtualMachineClusterInstancetypeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineClusterInstancetype `json:"items"`
}

// +kubebuilder:object:root=true

// A VirtualMachinePreference is a namespace's own defaults for the
// VirtualMachines of its namespace that name it
// (spec.forProvider.preference with kind VirtualMachinePreference).
// +kubebuilder:printcolumn:name="FIRMWARE",type="string",JSONPath=".spec.preferredFirmware"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmpf,vmpfs},categories={virtfleet}
type VirtualMachinePreference struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PreferenceSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// VirtualMachinePreferenceList contains a list of VirtualMachinePreference.
type VirtualMachinePreferenceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachinePreference `json:"items"`
}

// +kubebuilder:object:root=true

// A VirtualMachineClusterPreference is defaults every namespace may name
// (spec.forProvider.preference; its kind is the default).
// +kubebuilder:printcolumn:name="FIRMWARE",type="string",JSONPath=".spec.preferredFirmware"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Cluster,shortName={vmcpf,vmcpfs},categories={virtfleet}
type VirtualMachineClusterPreference struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PreferenceSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// VirtualMachineClusterPreferenceList contains a list of
// VirtualMachineClusterPreference.
type VirtualMachineClusterPreferenceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineClusterPreference `json:"items"`
}

// Instance type and preference kinds.
var (
	VirtualMachineInstancetypeKind        = InstancetypeKind(reflect.TypeOf(VirtualMachineInstancetype{}).Name())
	VirtualMachineClusterInstancetypeKind = InstancetypeKind(reflect.TypeOf(VirtualMachineClusterInstancetype{}).Name())
	VirtualMachinePreferenceKind          = PreferenceKind(reflect.TypeOf(VirtualMachinePreference{}).Name())
	VirtualMachineClusterPreferenceKind   = PreferenceKind(reflect.TypeOf(VirtualMachineClusterPreference{}).Name())
)

func init() {
	SchemeBuilder.Register(
		&VirtualMachineInstancetype{}, &VirtualMachineInstancetypeList{},
		&VirtualMachineClusterInstancetype{}, &VirtualMachineClusterInstancetypeList{},
		&VirtualMachinePreference{}, &VirtualMachinePreferenceList{},
		&VirtualMachineClusterPreference{}, &VirtualMachineClusterPreferenceList{},
	)
}
