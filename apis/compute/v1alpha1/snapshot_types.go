package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SnapshotVMDeletionPolicy says what becomes of a snapshot when its VM is
// deleted.
// +kubebuilder:validation:Enum=Retain;Delete
type SnapshotVMDeletionPolicy string

// Snapshot VM deletion policies.
const (
	// SnapshotRetain keeps the snapshot when its VM is deleted, as the VM's
	// Volumes are kept: the snapshot lives in them.
	SnapshotRetain SnapshotVMDeletionPolicy = "Retain"
	// SnapshotDelete deletes the snapshot with its VM.
	SnapshotDelete SnapshotVMDeletionPolicy = "Delete"
)

// VirtualMachineSnapshotSpec names the VirtualMachine to snapshot and how.
type VirtualMachineSnapshotSpec struct {
	// VMName is the VirtualMachine to snapshot, in the snapshot's
	// namespace. It may be running or stopped.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="vmName is immutable: create another snapshot"
	VMName LocalName `json:"vmName"`
	// IncludeMemory keeps the running guest's memory and device state
	// with its disks, so a restore resumes it where it was, not booted
	// again. Only a backend that can keep memory takes it (libvirt);
	// others fail the snapshot with the reason. A stopped VM has no
	// memory to keep: its snapshot is of its disks alone.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="includeMemory is immutable: create another snapshot"
	IncludeMemory bool `json:"includeMemory,omitempty"`
	// VMDeletionPolicy is what becomes of the snapshot when its VM is
	// deleted: Retain (the default) keeps it, Delete deletes it with the
	// VM.
	// +optional
	// +kubebuilder:default=Retain
	VMDeletionPolicy SnapshotVMDeletionPolicy `json:"vmDeletionPolicy,omitempty"`
}

// SnapshotPhase is how far a VirtualMachineSnapshot got.
type SnapshotPhase string

// Snapshot phases.
const (
	// SnapshotPending: waiting for the VM to be placed and its node to
	// answer.
	SnapshotPending SnapshotPhase = "Pending"
	// SnapshotInProgress: the node is taking the snapshot.
	SnapshotInProgress SnapshotPhase = "InProgress"
	// SnapshotSucceeded: the snapshot is taken and can be restored
	// (ReadyToUse).
	SnapshotSucceeded SnapshotPhase = "Succeeded"
	// SnapshotFailed: no snapshot was kept; Message says why. The VM is as
	// it was.
	SnapshotFailed SnapshotPhase = "Failed"
	// SnapshotLost: the snapshot was taken, but its node no longer has
	// it, or no longer runs the VM (the node was lost, its disks went,
	// or the VM was restarted elsewhere). A node that returns with the
	// snapshot makes it Succeeded again.
	SnapshotLost SnapshotPhase = "Lost"
)

// Snapshot indications, as KubeVirt's VirtualMachineSnapshot lists them.
const (
	// IndicationOnline: the guest ran while its snapshot was taken.
	IndicationOnline = "Online"
	// IndicationMemory: the snapshot holds the guest's memory.
	IndicationMemory = "Memory"
	// IndicationGuestAgent: the guest agent froze the guest's
	// filesystems for the snapshot (application-consistent).
	IndicationGuestAgent = "GuestAgent"
	// IndicationNoGuestAgent: the guest ran without an agent that could
	// freeze its filesystems: the disks are crash-consistent.
	IndicationNoGuestAgent = "NoGuestAgent"
)

// VirtualMachineSnapshotStatus is what the hub and the VM's node observed.
type VirtualMachineSnapshotStatus struct {
	// Phase is how far the snapshot got.
	// +optional
	Phase SnapshotPhase `json:"phase,omitempty"`
	// ReadyToUse is set once the snapshot can be restored, and only then.
	// +optional
	ReadyToUse bool `json:"readyToUse,omitempty"`
	// SourceUID is the uid of the VirtualMachine snapshotted: a VM of the
	// same name made later is another VM.
	// +optional
	SourceUID string `json:"sourceUID,omitempty"`
	// Node is the node the snapshot lives on, with the VM's disks.
	// +optional
	Node string `json:"node,omitempty"`
	// CreationTime is the moment the snapshot holds.
	// +optional
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	// DurationMilliseconds is how long taking the snapshot took on the
	// node.
	// +optional
	DurationMilliseconds int64 `json:"durationMilliseconds,omitempty"`
	// Size is what the snapshot holds on the node (its memory image, and
	// its disks where the backend tells).
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// Memory is whether the snapshot holds the guest's memory.
	// +optional
	Memory bool `json:"memory,omitempty"`
	// Frozen is whether the guest agent froze the guest's filesystems
	// for it; a snapshot of a running guest without is crash-consistent.
	// +optional
	Frozen bool `json:"frozen,omitempty"`
	// Indications name what the snapshot is: Online, Memory, GuestAgent
	// or NoGuestAgent.
	// +optional
	// +listType=set
	Indications []string `json:"indications,omitempty"`
	// VM is the VirtualMachine's spec.forProvider as it was when the
	// snapshot was taken.
	// +optional
	VM *VirtualMachineParameters `json:"vm,omitempty"`
	// Message says what the snapshot waits for, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A VirtualMachineSnapshot keeps a VirtualMachine's disks (and, with
// includeMemory, its running memory) at one moment, on the VM's node, as
// KubeVirt's VirtualMachineSnapshot does. It is restored with a
// VirtualMachineRestore. A VM with snapshots is not migrated or drained to
// another node where its snapshots could not follow: the move is refused,
// naming them. A VM restarted elsewhere after its node was lost (HA) comes
// back without them: they are Lost, and become usable again only if their
// node returns with them. With vmDeletionPolicy Delete the snapshot is
// owned by its VM, so the garbage collector deletes it where the hub may
// not.
// +kubebuilder:printcolumn:name="VM",type="string",JSONPath=".spec.vmName"
// +kubebuilder:printcolumn:name="PHASE",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="READY",type="boolean",JSONPath=".status.readyToUse"
// +kubebuilder:printcolumn:name="MEMORY",type="boolean",JSONPath=".status.memory"
// +kubebuilder:printcolumn:name="NODE",type="string",JSONPath=".status.node",priority=1
// +kubebuilder:printcolumn:name="SIZE",type="string",JSONPath=".status.size",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmsnapshot,vmsnapshots,vmsnap},categories={virtfleet}
type VirtualMachineSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineSnapshotSpec   `json:"spec"`
	Status VirtualMachineSnapshotStatus `json:"status,omitempty"`
}

// Done is whether taking the snapshot is over, succeeded or failed.
func (s *VirtualMachineSnapshot) Done() bool {
	return s.Status.Phase == SnapshotSucceeded || s.Status.Phase == SnapshotFailed || s.Status.Phase == SnapshotLost
}

// Serves says whether s still serves o, a clone or a DiskImage that reads
// it: always while s is not being deleted; once it is, only o made before
// its deletion was asked for. The deletion waits for those to finish
// reading it, as Kubernetes keeps a PersistentVolumeClaim a pod uses; one
// made after would hold a snapshot already on its way out.
func (s *VirtualMachineSnapshot) Serves(o metav1.Object) bool {
	return s.DeletionTimestamp == nil || !o.GetCreationTimestamp().After(s.DeletionTimestamp.Time)
}

// +kubebuilder:object:root=true

// VirtualMachineSnapshotList contains a list of VirtualMachineSnapshot.
type VirtualMachineSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineSnapshot `json:"items"`
}

// VirtualMachineRestoreSpec names the snapshot to restore and where.
type VirtualMachineRestoreSpec struct {
	// SnapshotName is the VirtualMachineSnapshot to restore, in the
	// restore's namespace. It must be ReadyToUse.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="snapshotName is immutable: create another restore"
	SnapshotName LocalName `json:"snapshotName"`
	// VMName is the VirtualMachine restored into: the snapshot's own VM,
	// which is its default. The snapshot must be of this very VM (its
	// uid), so a VM made again under the same name is not overwritten
	// with another's disks.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="vmName is immutable: create another restore"
	VMName LocalName `json:"vmName,omitempty"`
}

// RestorePhase is how far a VirtualMachineRestore got.
type RestorePhase string

// Restore phases.
const (
	// RestorePending: waiting for the snapshot to be ready, or for the VM
	// and its node.
	RestorePending RestorePhase = "Pending"
	// RestoreInProgress: the node is bringing the VM back to the
	// snapshot.
	RestoreInProgress RestorePhase = "InProgress"
	// RestoreSucceeded: the VM's disks (and memory) are the snapshot's.
	RestoreSucceeded RestorePhase = "Succeeded"
	// RestoreFailed: Message says why; the VM is as it was before.
	RestoreFailed RestorePhase = "Failed"
)

// VirtualMachineRestoreStatus is what the hub and the VM's node observed.
type VirtualMachineRestoreStatus struct {
	// Phase is how far the restore got.
	// +optional
	Phase RestorePhase `json:"phase,omitempty"`
	// Complete is set once the restore succeeded.
	// +optional
	Complete bool `json:"complete,omitempty"`
	// TargetUID is the uid of the VirtualMachine restored into.
	// +optional
	TargetUID string `json:"targetUID,omitempty"`
	// RestoreTime is when the restore succeeded.
	// +optional
	RestoreTime *metav1.Time `json:"restoreTime,omitempty"`
	// DurationMilliseconds is how long the node took to restore.
	// +optional
	DurationMilliseconds int64 `json:"durationMilliseconds,omitempty"`
	// Message says what the restore waits for, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A VirtualMachineRestore brings a VirtualMachine back to one of its
// VirtualMachineSnapshots, as KubeVirt's VirtualMachineRestore does: the
// guest is stopped, its disks are returned to the snapshot, and it is
// started again as it was — resumed from the snapshot's memory when the
// snapshot has it, booted from its disks otherwise, and left stopped when
// the VM's running is false. Its spec is what it is now: a shape changed
// since the snapshot shows as RestartRequired.
// +kubebuilder:printcolumn:name="SNAPSHOT",type="string",JSONPath=".spec.snapshotName"
// +kubebuilder:printcolumn:name="VM",type="string",JSONPath=".spec.vmName"
// +kubebuilder:printcolumn:name="PHASE",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="COMPLETE",type="boolean",JSONPath=".status.complete"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmrestore,vmrestores},categories={virtfleet}
type VirtualMachineRestore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineRestoreSpec   `json:"spec"`
	Status VirtualMachineRestoreStatus `json:"status,omitempty"`
}

// Done is whether the restore is over, succeeded or failed.
func (r *VirtualMachineRestore) Done() bool {
	return r.Status.Phase == RestoreSucceeded || r.Status.Phase == RestoreFailed
}

// Target is the name of the VM the restore writes into: spec.vmName, or
// the snapshot's own VM's when that is empty.
func (r *VirtualMachineRestore) Target(s *VirtualMachineSnapshot) LocalName {
	if r.Spec.VMName != "" {
		return r.Spec.VMName
	}
	return s.Spec.VMName
}

// +kubebuilder:object:root=true

// VirtualMachineRestoreList contains a list of VirtualMachineRestore.
type VirtualMachineRestoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineRestore `json:"items"`
}

// VirtualMachineSnapshot and VirtualMachineRestore type metadata.
var (
	VirtualMachineSnapshotKind             = reflect.TypeOf(VirtualMachineSnapshot{}).Name()
	VirtualMachineSnapshotGroupVersionKind = SchemeGroupVersion.WithKind(VirtualMachineSnapshotKind)
	VirtualMachineRestoreKind              = reflect.TypeOf(VirtualMachineRestore{}).Name()
	VirtualMachineRestoreGroupVersionKind  = SchemeGroupVersion.WithKind(VirtualMachineRestoreKind)
)

func init() {
	SchemeBuilder.Register(&VirtualMachineSnapshot{}, &VirtualMachineSnapshotList{})
	SchemeBuilder.Register(&VirtualMachineRestore{}, &VirtualMachineRestoreList{})
}
