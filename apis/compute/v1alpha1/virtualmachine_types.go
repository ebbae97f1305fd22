package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// Backend names the kind of hypervisor an agent fronts.
// +kubebuilder:validation:Enum=libvirt;nova;kubevirt
type Backend string

// Backends.
const (
	BackendLibvirt  Backend = "libvirt"
	BackendNova     Backend = "nova"
	BackendKubeVirt Backend = "kubevirt"
)

// Firmware the guest boots with.
// +kubebuilder:validation:Enum=bios;uefi
type Firmware string

// Firmwares.
const (
	FirmwareBIOS Firmware = "bios"
	FirmwareUEFI Firmware = "uefi"
)

// EvictionStrategy is what a drain does with a VirtualMachine.
// +kubebuilder:validation:Enum=LiveMigrate;None
type EvictionStrategy string

// Eviction strategies.
const (
	EvictionLiveMigrate EvictionStrategy = "LiveMigrate"
	EvictionNone        EvictionStrategy = "None"
)

// Availability is what the hub does with a VirtualMachine whose node is
// lost.
// +kubebuilder:validation:Enum=None;Restart
type Availability string

// Availabilities.
const (
	// AvailabilityNone waits for the lost node to come back.
	AvailabilityNone Availability = "None"
	// AvailabilityRestart starts the VM on another node once the lost one
	// has fenced itself.
	AvailabilityRestart Availability = "Restart"
)

// DiskAttachment attaches a Volume to a VirtualMachine.
type DiskAttachment struct {
	// Name of a Volume in the VirtualMachine's namespace.
	Name LocalName `json:"name"`
}

// VirtualMachineParameters are the fields a user sets on a VirtualMachine.
// +kubebuilder:validation:XValidation:rule="!has(self.instancetype) || !has(self.vcpu)",fieldPath=".vcpu",message="instancetype sets vcpu and memory: name an instancetype or set vcpu and memory, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.instancetype) || !has(self.memory)",fieldPath=".memory",message="instancetype sets vcpu and memory: name an instancetype or set vcpu and memory, not both"
// +kubebuilder:validation:XValidation:rule="has(self.instancetype) || has(self.vcpu)",fieldPath=".vcpu",reason="FieldValueRequired",message="vcpu is required unless the VM names an instancetype"
// +kubebuilder:validation:XValidation:rule="has(self.instancetype) || has(self.memory)",fieldPath=".memory",reason="FieldValueRequired",message="memory is required unless the VM names an instancetype"
// +kubebuilder:validation:XValidation:rule="!has(self.instancetype) || !has(self.maxVcpu)",fieldPath=".maxVcpu",message="instancetype sets the maximum vcpu (cpu.maxGuest): name an instancetype or set maxVcpu, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.instancetype) || !has(self.maxMemory)",fieldPath=".maxMemory",message="instancetype sets the maximum memory (memory.maxGuest): name an instancetype or set maxMemory, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.maxVcpu) || !has(self.vcpu) || self.maxVcpu >= self.vcpu",fieldPath=".maxVcpu",message="maxVcpu must be at least vcpu"
// +kubebuilder:validation:XValidation:rule="!has(self.maxMemory) || !has(self.memory) || !quantity(string(self.maxMemory)).isLessThan(quantity(string(self.memory)))",fieldPath=".maxMemory",message="maxMemory must be at least memory"
type VirtualMachineParameters struct {
	// Running is the desired power state. true starts the guest; false shuts
	// it down (ACPI first, forced off after a grace period).
	// +kubebuilder:default=true
	// +optional
	Running *bool `json:"running,omitempty"`

	// Instancetype names the instance type the VM takes its vCPUs and
	// memory from, instead of setting vcpu and memory itself. The hub
	// records the type's spec when it places the VM
	// (status.instancetypeRef); later edits of the type leave the VM as it
	// is until it is asked to move (the annotation
	// compute.virtfleet.io/instancetype-update-requested-at).
	// +optional
	Instancetype *InstancetypeRef `json:"instancetype,omitempty"`

	// Preference names the preference the VM takes what it does not set
	// itself from (firmware), recorded as instancetype is.
	// +optional
	Preference *PreferenceRef `json:"preference,omitempty"`

	// Vcpu is the number of virtual CPUs; required unless the VM names an
	// instancetype.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	Vcpu int32 `json:"vcpu,omitempty"`

	// Memory is the guest's RAM, as a Kubernetes quantity (for example 500Mi
	// or 4Gi). It must be greater than zero and at most 16Ti: more RAM than
	// one host gives a single guest, so the bound refuses only typos and
	// abuse, and it keeps the byte count the hub sends to the node (an
	// int64) exact.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",messageExpression="'memory must be greater than 0, got ' + string(self)"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isGreaterThan(quantity('16Ti'))",messageExpression="'memory must be at most 16Ti, got ' + string(self)"
	// +optional
	Memory resource.Quantity `json:"memory,omitzero"`

	// MaxVcpu is the most vCPUs the running guest can be given without a
	// restart: vcpu changes live up to it (and down), where the backend
	// can (libvirt; KubeVirt up only). It is set when the guest starts:
	// changing it, or raising vcpu above the maximum the guest started
	// with, applies at the next start (RestartRequired). Unset means 4 times vcpu, within
	// the node's CPUs (KubeVirt's MaxHotplugRatio). At least vcpu.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	MaxVcpu *int32 `json:"maxVcpu,omitempty"`

	// MaxMemory is the most memory the running guest can be given without
	// a restart, as maxVcpu is for vcpu; the guest's balloon gives memory
	// back as far as the guest allows. Unset means 4 times memory, within
	// the node's. At least memory, at most 16Ti.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",messageExpression="'maxMemory must be greater than 0, got ' + string(self)"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isGreaterThan(quantity('16Ti'))",messageExpression="'maxMemory must be at most 16Ti, got ' + string(self)"
	// +optional
	MaxMemory *resource.Quantity `json:"maxMemory,omitempty"`

	// Swap is the size of a swap disk added to the guest and enabled by
	// cloud-init; 0 means no swap. It is at most 64Ti, the largest Volume
	// (see Volume's size), since the swap disk is a volume on the same node.
	// +kubebuilder:default="0"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",messageExpression="'swap must not be negative, got ' + string(self)"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isGreaterThan(quantity('64Ti'))",messageExpression="'swap must be at most 64Ti, got ' + string(self)"
	// +optional
	Swap *resource.Quantity `json:"swap,omitempty"`

	// PublicKey is an OpenSSH public key (for example "ssh-ed25519 AAAA…")
	// injected into the guest: a cloud-init NoCloud seed on libvirt, a
	// keypair on Nova, cloudInitNoCloud on KubeVirt.
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:XValidation:rule="self.matches('^(ssh-(rsa|dss|ed25519)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh.com) [A-Za-z0-9+/=]+( .*)?$')",message="publicKey must be one OpenSSH public key line: type, base64 key and an optional comment (ssh-ed25519 AAAA… user@host)"
	// +optional
	PublicKey string `json:"publicKey,omitempty"`

	// VirtualNetworks are the names of VirtualNetworks in this namespace, one
	// interface each, in this order.
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	VirtualNetworks []LocalName `json:"virtualNetworks,omitempty"`

	// Addresses fixes the IPv4 address of the interface on a network; an
	// interface not listed gets a free address of its network. The hub
	// allocates every address in the network's cidr, unique across the
	// fleet, keeps it while the VM exists and releases it when the VM is
	// deleted. An address outside the cidr, the network's own (its first
	// and last) or held by another VM is refused.
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=network
	// +optional
	Addresses []InterfaceAddress `json:"addresses,omitempty"`

	// DiskAttachments are the Volumes attached to the guest. The first is the
	// boot disk.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	DiskAttachments []DiskAttachment `json:"diskAttachments"`

	// NodeSelector restricts placement to nodes whose agent carries all of
	// these labels. It is added to the ProviderConfig's default selector.
	// At most 32 labels, each a Kubernetes label: a key of at most 317
	// characters (a 253-character DNS prefix, "/" and a 63-character name)
	// and a value of at most 63.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && size(self[k]) <= 63)",message="nodeSelector keys must be at most 317 characters and values at most 63, as Kubernetes labels"
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Backend restricts placement to nodes whose agent fronts this kind of
	// hypervisor. Unset means any.
	// +optional
	Backend *Backend `json:"backend,omitempty"`

	// PlacementGroup names a PlacementGroup of the VM's namespace: the
	// hub keeps the VMs that name it apart (anti-affinity) or together
	// (affinity), as the group says, when it places them, moves them live
	// and restarts them after a node loss.
	// +optional
	PlacementGroup *LocalName `json:"placementGroup,omitempty"`

	// EvictionStrategy is what a drain of the VM's node does with it:
	// LiveMigrate (the default) moves it live to another node; None keeps
	// it where it is, and the drain waits for it (shown on the node).
	// +optional
	EvictionStrategy *EvictionStrategy `json:"evictionStrategy,omitempty"`

	// Availability is what the hub does when the VM's node is lost (its
	// heartbeats stop). None, the default, waits for the node to come
	// back; the VM shows Unknown meanwhile. Restart starts the VM on
	// another node, with the same addresses, once the lost node has fenced
	// itself: its agent destroys the guest when it cannot renew its lease,
	// and the hub restarts the VM only after that lease and a margin have
	// run out since the node's last heartbeat, so two copies never run.
	// Restart needs every attached Volume in a shared storage pool (a
	// Volume's storagePool) that the other node reaches, and nodes whose
	// agents fence themselves; a VM on a node that does not, or with a
	// Volume on its node's own storage, waits for its node as with None,
	// and its events say why.
	// +kubebuilder:default=None
	// +optional
	Availability *Availability `json:"availability,omitempty"`

	// UserData is extra cloud-init user data, merged after virtfleet's own
	// (SSH key, hostname, swap).
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	UserData string `json:"userData,omitempty"`

	// Firmware the guest boots with. Unset means bios.
	// +optional
	Firmware *Firmware `json:"firmware,omitempty"`
}

// InterfaceAddress is the address a VM's interface on a network must have.
type InterfaceAddress struct {
	// Network is one of the VM's virtualNetworks.
	Network LocalName `json:"network"`
	// Address is an IPv4 address in the network's cidr.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4",message="address must be an IPv4 address such as 10.10.120.10"
	Address string `json:"address"`
}

// RestartsElsewhere is whether the VM is to be restarted on another node
// when its node is lost (availability Restart).
func (p *VirtualMachineParameters) RestartsElsewhere() bool {
	return p.Availability != nil && *p.Availability == AvailabilityRestart
}

// IsRunning reports the desired power state; an unset field means running,
// as the schema's default does.
func (p *VirtualMachineParameters) IsRunning() bool {
	return p.Running == nil || *p.Running
}

// Phase is the lifecycle phase of a VirtualMachine as its node reports it.
// +kubebuilder:validation:Enum=Pending;Scheduled;Provisioning;Starting;Running;Paused;Stopping;Stopped;Failed;Unknown;Deleting
type Phase string

// Phases, in the order a VirtualMachine usually passes them. Paused is a
// running guest whose vCPUs are stopped, as AnnotationPaused asks.
const (
	PhasePending      Phase = "Pending"
	PhaseScheduled    Phase = "Scheduled"
	PhaseProvisioning Phase = "Provisioning"
	PhaseStarting     Phase = "Starting"
	PhaseRunning      Phase = "Running"
	PhasePaused       Phase = "Paused"
	PhaseStopping     Phase = "Stopping"
	PhaseStopped      Phase = "Stopped"
	PhaseFailed       Phase = "Failed"
	PhaseUnknown      Phase = "Unknown"
	PhaseDeleting     Phase = "Deleting"
)

// Phases are the phases the CRD accepts, in the order above.
var Phases = []Phase{PhasePending, PhaseScheduled, PhaseProvisioning, PhaseStarting, PhaseRunning, PhasePaused, PhaseStopping, PhaseStopped, PhaseFailed, PhaseUnknown, PhaseDeleting}

// AddressSource says how an interface's address was learned.
// +kubebuilder:validation:Enum=lease;guest-agent;arp;backend
type AddressSource string

// Address sources, from most to least authoritative on libvirt.
const (
	AddressSourceLease      AddressSource = "lease"
	AddressSourceGuestAgent AddressSource = "guest-agent"
	AddressSourceARP        AddressSource = "arp"
	AddressSourceBackend    AddressSource = "backend"
)

// InterfaceStatus is one observed network interface of a guest.
type InterfaceStatus struct {
	// Network is the VirtualNetwork the interface is attached to.
	Network string `json:"network"`
	// MAC is the interface's hardware address.
	// +optional
	MAC string `json:"mac,omitempty"`
	// IPs are the interface's addresses.
	// +optional
	IPs []string `json:"ips,omitempty"`
	// Source says how the addresses were learned.
	// +optional
	Source AddressSource `json:"source,omitempty"`
	// LastSeen is when a source last confirmed the addresses.
	// +optional
	LastSeen *metav1.Time `json:"lastSeen,omitempty"`
}

// VirtualMachineObservation is what the node's agent observed.
type VirtualMachineObservation struct {
	// ID is the backend's identifier: the libvirt domain UUID (equal to the
	// VirtualMachine's metadata.uid), the Nova server ID or the KubeVirt
	// VirtualMachine's UID.
	// +optional
	ID string `json:"id,omitempty"`

	// Phase is the guest's lifecycle phase.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Node is the hypervisor host the guest runs on, also for Nova and
	// KubeVirt, where it is the compute host or Kubernetes node.
	// +optional
	Node string `json:"node,omitempty"`

	// IP summarises the addresses per network in the order of
	// spec.forProvider.virtualNetworks, for example
	// "net-db(10.10.120.21), net-backend(10.10.150.12)".
	// +optional
	IP string `json:"ip,omitempty"`

	// Interfaces are the guest's observed network interfaces.
	// +optional
	Interfaces []InterfaceStatus `json:"interfaces,omitempty"`

	// RestartCount counts restarts: those virtfleet performed and the guest
	// reboots and crashes the backend reported.
	RestartCount int32 `json:"restartCount"`

	// ObservedGeneration is the metadata.generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// RestartRequired is true when the spec changed in a way that takes
	// effect only at the next start (swap, disks, networks, the maxima, a
	// vcpu or memory beyond the maximum the guest runs with, any vcpu
	// or memory on a backend without live resize, and what the backend's
	// own rules refuse live, as KubeVirt's RestartRequired says); the
	// Ready condition's message names what waits.
	// +optional
	RestartRequired bool `json:"restartRequired,omitempty"`

	// Vcpu and Memory are the guest's real shape as it runs (as its
	// backend defines it when it is off); an imported or only observed
	// guest may differ from the spec.
	// +optional
	Vcpu int32 `json:"vcpu,omitempty"`
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// MaxVcpu and MaxMemory are the most the running guest can be given
	// without a restart; unset where the backend cannot resize it live.
	// +optional
	MaxVcpu int32 `json:"maxVcpu,omitempty"`
	// +optional
	MaxMemory *resource.Quantity `json:"maxMemory,omitempty"`

	// Disks are the Volumes attached to the guest as it runs (as it is
	// defined when it is off), the boot disk first: a Volume added to
	// diskAttachments shows here once it is attached, and a removed one
	// stays until the guest has released it. Unset where the backend
	// does not tell.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Disks []string `json:"disks,omitempty"`

	// Declared is the shape the VM asks for: its own, or its instance
	// type's as recorded. Beside vcpu and memory, what the guest runs, it
	// shows whether the guest runs what it asks.
	// +optional
	Declared *Shape `json:"declared,omitempty"`

	// Binding is the newest sealed binding the hub recorded for the VM,
	// shown for users. A binding sealed for an earlier epoch is a replay
	// (its annotations copied back by hand) and is refused: the hub
	// restores the newest. The hub keeps its own record of it, which
	// tenants cannot write, and never reads this field back.
	// +optional
	Binding *Binding `json:"binding,omitempty"`
}

// Binding is a sealed placement of a VM: the node, the orphan it adopted
// and the epoch the hub sealed it at (AnnotationBindingEpoch).
type Binding struct {
	Node string `json:"node"`
	// +optional
	Adopted string `json:"adopted,omitempty"`
	// +optional
	Epoch int64 `json:"epoch,omitempty"`
}

// Shape is a VM's vCPUs and memory, and the most it may grow to live.
type Shape struct {
	// +optional
	Vcpu int32 `json:"vcpu,omitempty"`
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// MaxVcpu and MaxMemory are unset when the VM leaves them to the
	// node.
	// +optional
	MaxVcpu int32 `json:"maxVcpu,omitempty"`
	// +optional
	MaxMemory *resource.Quantity `json:"maxMemory,omitempty"`
}

// VirtualMachineSpec defines the desired state of a VirtualMachine.
type VirtualMachineSpec struct {
	xpv2.ManagedResourceSpec `json:",inline"`
	ForProvider              VirtualMachineParameters `json:"forProvider"`
}

// VirtualMachineStatus represents the observed state of a VirtualMachine.
type VirtualMachineStatus struct {
	xpv2.ManagedResourceStatus `json:",inline"`
	AtProvider                 VirtualMachineObservation `json:"atProvider,omitempty"`
	// InstancetypeRef is the instance type the VM's shape was recorded
	// from, with the spec recorded: the shape the hub places and runs.
	// +optional
	InstancetypeRef *InstancetypeRevision `json:"instancetypeRef,omitempty"`
	// PreferenceRef is the preference recorded for the VM, likewise.
	// +optional
	PreferenceRef *PreferenceRevision `json:"preferenceRef,omitempty"`
}

// +kubebuilder:object:root=true

// A VirtualMachine is a guest on one of the fleet's hypervisors: a libvirt
// domain, a Nova server or a KubeVirt VirtualMachine. The hub places it on a
// node; that node's agent runs it and reports its phase, node and addresses.
// +kubebuilder:printcolumn:name="STATUS",type="string",JSONPath=".status.atProvider.phase",description="Lifecycle phase reported by the node"
// +kubebuilder:printcolumn:name="RESTARTS",type="integer",JSONPath=".status.atProvider.restartCount",description="Guest restarts"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="NODE",type="string",JSONPath=".status.atProvider.node",priority=1,description="Hypervisor host"
// +kubebuilder:printcolumn:name="NETWORKS(IP)",type="string",JSONPath=".status.atProvider.ip",priority=1,description="Addresses per network"
// +kubebuilder:printcolumn:name="READY",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status",priority=1
// +kubebuilder:printcolumn:name="SYNCED",type="string",JSONPath=".status.conditions[?(@.type=='Synced')].status",priority=1
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName={vm,vms},categories={crossplane,managed,virtfleet}
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineSpec   `json:"spec"`
	Status VirtualMachineStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// VirtualMachineList contains a list of VirtualMachine.
type VirtualMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachine `json:"items"`
}

// VirtualMachine type metadata.
var (
	VirtualMachineKind             = reflect.TypeOf(VirtualMachine{}).Name()
	VirtualMachineGroupKind        = schema.GroupKind{Group: Group, Kind: VirtualMachineKind}.String()
	VirtualMachineKindAPIVersion   = VirtualMachineKind + "." + SchemeGroupVersion.String()
	VirtualMachineGroupVersionKind = SchemeGroupVersion.WithKind(VirtualMachineKind)
)

func init() {
	SchemeBuilder.Register(&VirtualMachine{}, &VirtualMachineList{})
}
