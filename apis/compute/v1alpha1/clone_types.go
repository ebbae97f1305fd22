package v1alpha1

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CloneSourceKind is the kind of thing a VirtualMachineClone copies.
// +kubebuilder:validation:Enum=VirtualMachine;VirtualMachineSnapshot
type CloneSourceKind string

// Clone source kinds, as KubeVirt's VirtualMachineClone names them.
const (
	CloneFromVirtualMachine         CloneSourceKind = "VirtualMachine"
	CloneFromVirtualMachineSnapshot CloneSourceKind = "VirtualMachineSnapshot"
)

// CloneSource names what a clone copies, in the clone's namespace.
type CloneSource struct {
	// Kind is VirtualMachine (the default) or VirtualMachineSnapshot.
	// +optional
	// +kubebuilder:default=VirtualMachine
	Kind CloneSourceKind `json:"kind,omitempty"`
	// Name of the source, in the clone's namespace.
	Name LocalName `json:"name"`
}

// CloneTarget names the VirtualMachine a clone makes.
type CloneTarget struct {
	// Name of the new VirtualMachine, in the clone's namespace. Neither it
	// nor the Volumes and DiskImages named after it (<name>-<source
	// volume>) may exist already: a clone never overwrites.
	Name LocalName `json:"name"`
}

// VirtualMachineCloneSpec says what to copy and into what.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a clone's spec is immutable: create another clone"
// +kubebuilder:validation:XValidation:rule="!has(self.backupLocation) || !has(self.source.kind) || self.source.kind == 'VirtualMachine'",message="backupLocation copies a VirtualMachine: a snapshot lives in its VM's disks, on their node, and no backup reads it"
type VirtualMachineCloneSpec struct {
	// Source is the VirtualMachine (or snapshot) to copy.
	Source CloneSource `json:"source"`
	// Target is the VirtualMachine to make.
	Target CloneTarget `json:"target"`
	// LabelFilters select the source's labels the new VM gets, as
	// KubeVirt's labelFilters do: "*" is every label, a pattern (path.Match,
	// such as "app.kubernetes.io/*") the labels it matches, and a pattern
	// after "!" removes what it matches again; later entries win. Empty
	// copies no label. Annotations are never copied: the source's carry
	// its node, its backend id and its seals, which are its own.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=320
	LabelFilters []string `json:"labelFilters,omitempty"`
	// BackupLocation, when set, copies the source's disks through a full
	// VirtualMachineBackup into this BackupLocation (the namespace must be
	// granted it) instead of on the source's node: any node can make a
	// disk of a backup, so the new VM runs wherever placement puts it, and
	// a source on shared storage can be cloned. The backup is the
	// clone's, named after it, and stays (deletionPolicy Retain) for the
	// user to keep or delete.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	BackupLocation string `json:"backupLocation,omitempty"`
}

// ClonePhase is how far a VirtualMachineClone got.
type ClonePhase string

// Clone phases.
const (
	// ClonePending: waiting for the source to exist and be on a node.
	ClonePending ClonePhase = "Pending"
	// CloneInProgress: the new VM, its Volumes and their DiskImages are
	// made; the source's node copies the disks and starts the new VM.
	CloneInProgress ClonePhase = "InProgress"
	// CloneSucceeded: the new VM's disks are made and it is Running (or
	// Stopped, as its source was).
	CloneSucceeded ClonePhase = "Succeeded"
	// CloneFailed: Message says why. The source is untouched; what the
	// clone made so far stays, for the user to inspect or delete.
	CloneFailed ClonePhase = "Failed"
)

// CloneDisk is one disk of the source and what the clone made of it. The
// names are plain strings: the hub wrote them, and a CEL rule per name of
// a list is more than the API server's validation budget allows.
type CloneDisk struct {
	// Source is the source VM's Volume.
	// +kubebuilder:validation:MaxLength=63
	Source string `json:"source"`
	// Image is the DiskImage copying it: on the source's node, or from
	// the clone's backup.
	// +kubebuilder:validation:MaxLength=63
	Image string `json:"image"`
	// Volume is the new VM's Volume made from the image.
	// +kubebuilder:validation:MaxLength=63
	Volume string `json:"volume"`
}

// VirtualMachineCloneStatus is what the hub observed.
type VirtualMachineCloneStatus struct {
	// Phase is how far the clone got.
	// +optional
	Phase ClonePhase `json:"phase,omitempty"`
	// SourceUID is the uid of the source VM (a snapshot's, that of the VM
	// it was taken of).
	// +optional
	SourceUID string `json:"sourceUID,omitempty"`
	// TargetUID is the uid of the new VM: a new object, so a new identity.
	// +optional
	TargetUID string `json:"targetUID,omitempty"`
	// Node is where the copy is made and the new VM runs: the source's
	// node, which holds its disks; through a backup, the node the new VM
	// was placed on, once it runs.
	// +optional
	Node string `json:"node,omitempty"`
	// Backup is the VirtualMachineBackup the disks are copied through,
	// with spec.backupLocation.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Backup string `json:"backup,omitempty"`
	// Disks are the source's disks and what the clone made of each.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Disks []CloneDisk `json:"disks,omitempty"`
	// Indications name what the copy is: Online when the source ran
	// while its disks were copied (crash-consistent, as after a power
	// cut); from a snapshot, the snapshot's own but Memory (a clone
	// boots).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=32
	Indications []string `json:"indications,omitempty"`
	// CreationTime is when the clone made the new VM.
	// +optional
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	// Message says what the clone waits for, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A VirtualMachineClone makes a new VirtualMachine from an existing one,
// as KubeVirt's VirtualMachineClone does, while the source runs on. The
// new VM is a new object with the source's spec.forProvider, so everything
// virtfleet derives from a VM's uid and name is its own: its MACs (derived
// from the uid; no MAC is copied), its addresses (the hub allocates them
// anew; fixed addresses of the source are dropped), its hostname (its
// name) and its cloud-init instance id (its uid), so cloud-init in the
// guest runs its per-instance configuration again (host keys, hostname,
// network) on the copied disk.
//
// Each disk of the source is copied through a DiskImage made from its
// Volume (source.volumeRef) and a Volume made from that image; the
// images belong to the new Volumes (owner references) and go with them.
// Node-local disks are copied on the node that holds them, so the new VM
// lands on its source's node, and status.node and an event say so. A
// source whose disks are on a shared storage pool is refused: the copy
// reads the node's own pool. With spec.backupLocation the disks are
// copied through a backup instead (the clone takes a full
// VirtualMachineBackup of the source, and each DiskImage is made of one
// of its disks, source.backup), which any node can make a disk of: the
// new VM runs on any node placement allows, its disks on that node's own
// storage. A running source is copied as its disks are at that moment:
// crash-consistent, and shown as Online (through a backup, with its
// filesystems frozen while the backup starts, where its guest agent
// answers).
//
// A VirtualMachineSnapshot as the source makes the new VM from the spec
// the snapshot kept, each disk a copy of its Volume as the snapshot holds
// it (DiskImage source.volumeRef with source.snapshotRef), made on the
// snapshot's node while its VM runs on, or after the VM is gone: the
// snapshot lives in its Volumes. The clone waits for a snapshot that is
// not ReadyToUse and fails on one that Failed or is being deleted. Only
// libvirt nodes read a disk's snapshot; on others the clone fails, naming
// why.
//
// Everything a clone reads and makes is in its own namespace: it never
// names another namespace's VM or snapshot. The new VM is made by the hub,
// so whoever may create VirtualMachineClones in a namespace may make VMs
// there: grant it as you grant VM creation.
// +kubebuilder:printcolumn:name="SOURCE",type="string",JSONPath=".spec.source.name"
// +kubebuilder:printcolumn:name="TARGET",type="string",JSONPath=".spec.target.name"
// +kubebuilder:printcolumn:name="PHASE",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="NODE",type="string",JSONPath=".status.node",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmclone,vmclones},categories={virtfleet}
type VirtualMachineClone struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineCloneSpec   `json:"spec"`
	Status VirtualMachineCloneStatus `json:"status,omitempty"`
}

// Done is whether the clone is over, succeeded or failed.
func (c *VirtualMachineClone) Done() bool {
	return c.Status.Phase == CloneSucceeded || c.Status.Phase == CloneFailed
}

// +kubebuilder:object:root=true

// VirtualMachineCloneList contains a list of VirtualMachineClone.
type VirtualMachineCloneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineClone `json:"items"`
}

// AnnotationClonedBy, on the VirtualMachine, Volumes and DiskImages a
// VirtualMachineClone made, holds the clone's uid: the clone goes on with
// what it made itself and never takes over an object of the same name.
const AnnotationClonedBy = Group + "/cloned-by"

// VirtualMachineClone type metadata.
var (
	VirtualMachineCloneKind             = reflect.TypeOf(VirtualMachineClone{}).Name()
	VirtualMachineCloneGroupVersionKind = SchemeGroupVersion.WithKind(VirtualMachineCloneKind)
)

func init() {
	SchemeBuilder.Register(&VirtualMachineClone{}, &VirtualMachineCloneList{})
}
