package v1alpha1

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxCorruptListed bounds the ranges a VirtualMachineBackupVerification
// lists in status.corrupt, so that a badly damaged backup cannot make its
// status too large to write; the counts are whole.
const MaxCorruptListed = 100

// BackupInLocation names a backup by where it is, for one whose
// VirtualMachineBackup is gone.
type BackupInLocation struct {
	// Location is the BackupLocation the backup is in; the namespace must
	// be granted it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Location string `json:"location"`
	// ID is the backup's: the metadata.uid of the VirtualMachineBackup
	// that took it, in this namespace. Only this namespace's backups are
	// found by it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_-]+$`
	ID string `json:"id"`
}

// VirtualMachineBackupVerificationSpec names the backup to read back.
// +kubebuilder:validation:XValidation:rule="has(self.backupName) != has(self.backup)",message="set one of backupName or backup"
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: create another verification"
type VirtualMachineBackupVerificationSpec struct {
	// BackupName is the VirtualMachineBackup to verify, in this
	// namespace; it is verified once it has Succeeded.
	// +optional
	BackupName LocalName `json:"backupName,omitempty"`
	// Backup names a backup by its location and ID, for one whose
	// VirtualMachineBackup was deleted with deletionPolicy Retain.
	// +optional
	Backup *BackupInLocation `json:"backup,omitempty"`
}

// VerificationPhase is how far a VirtualMachineBackupVerification got.
type VerificationPhase string

// Verification phases.
const (
	// VerificationPending: waiting for the backup to succeed, for the
	// location or its grant, or for a free verification slot.
	VerificationPending VerificationPhase = "Pending"
	// VerificationInProgress: the hub is reading the backup's chunks.
	VerificationInProgress VerificationPhase = "InProgress"
	// VerificationSucceeded: every chunk of the backup was read back and
	// matches its name.
	VerificationSucceeded VerificationPhase = "Succeeded"
	// VerificationFailed: a chunk is missing or does not match (listed in
	// corrupt), or the backup could not be read at all; Message says
	// which.
	VerificationFailed VerificationPhase = "Failed"
)

// CorruptRange is a range of a backed-up disk whose data is lost: the
// chunk that holds it is missing from the store or does not match its
// name.
type CorruptRange struct {
	// Disk is the disk of the backup: root for the disk the VM booted
	// from, else the attached Volume's name.
	Disk string `json:"disk"`
	// Offset and Length bound the range, in bytes of the disk.
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
	// Chunk is the chunk's ID, its object's name in the store.
	Chunk string `json:"chunk"`
	// Reason says what is wrong with the chunk.
	Reason string `json:"reason"`
}

// VirtualMachineBackupVerificationStatus is what the hub read.
type VirtualMachineBackupVerificationStatus struct {
	// Phase is how far the verification got.
	// +optional
	Phase VerificationPhase `json:"phase,omitempty"`
	// Location and BackupID are the backup verified.
	// +optional
	Location string `json:"location,omitempty"`
	// +optional
	BackupID string `json:"backupID,omitempty"`
	// StartTime and CompletionTime bound the reading.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// ChunksTotal is how many distinct chunks the backup references;
	// ChunksChecked how many of them were read so far.
	// +optional
	ChunksTotal int64 `json:"chunksTotal,omitempty"`
	// +optional
	ChunksChecked int64 `json:"chunksChecked,omitempty"`
	// BytesChecked is what was read of the chunks, as stored.
	// +optional
	BytesChecked int64 `json:"bytesChecked,omitempty"`
	// CorruptChunks is how many of the chunks are missing or do not
	// match; CorruptRanges how many ranges of the disks they hold (a
	// chunk may hold several).
	// +optional
	CorruptChunks int64 `json:"corruptChunks,omitempty"`
	// +optional
	CorruptRanges int64 `json:"corruptRanges,omitempty"`
	// Corrupt lists the first ranges of corruptRanges, in disk and
	// offset order.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	// +listType=atomic
	Corrupt []CorruptRange `json:"corrupt,omitempty"`
	// Message says what the verification waits for, what it found, or
	// why it could not read the backup.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A VirtualMachineBackupVerification reads a backup back from its
// BackupLocation, once, and reports every range of its disks whose chunk
// is missing from the store or does not match its name (checksum, and the
// seal of an encrypted backup). The hub reads it, with the location's
// credentials; a namespace verifies only its own backups. The verified
// VirtualMachineBackup shows the outcome in status.lastVerification.
// +kubebuilder:printcolumn:name="BACKUP",type="string",JSONPath=".spec.backupName"
// +kubebuilder:printcolumn:name="PHASE",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="CHECKED",type="integer",JSONPath=".status.chunksChecked"
// +kubebuilder:printcolumn:name="CORRUPT",type="integer",JSONPath=".status.corruptChunks"
// +kubebuilder:printcolumn:name="LOCATION",type="string",JSONPath=".status.location",priority=1
// +kubebuilder:printcolumn:name="ID",type="string",JSONPath=".status.backupID",priority=1
// +kubebuilder:printcolumn:name="BYTES",type="integer",JSONPath=".status.bytesChecked",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmbackupverify,vmbackupverifies},categories={virtfleet}
type VirtualMachineBackupVerification struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineBackupVerificationSpec   `json:"spec"`
	Status VirtualMachineBackupVerificationStatus `json:"status,omitempty"`
}

// Done is whether the verification is over, succeeded or failed.
func (v *VirtualMachineBackupVerification) Done() bool {
	return v.Status.Phase == VerificationSucceeded || v.Status.Phase == VerificationFailed
}

// +kubebuilder:object:root=true

// VirtualMachineBackupVerificationList contains a list of
// VirtualMachineBackupVerification.
type VirtualMachineBackupVerificationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineBackupVerification `json:"items"`
}

// BackupVerificationResult is what a verification found of a backup.
type BackupVerificationResult string

// Verification results.
const (
	// BackupIntact: every chunk read back as named.
	BackupIntact BackupVerificationResult = "Intact"
	// BackupCorrupt: some chunk is missing or does not match.
	BackupCorrupt BackupVerificationResult = "Corrupt"
)

// LastVerification is the latest verification of a backup that read it
// whole.
type LastVerification struct {
	// Name is the VirtualMachineBackupVerification's.
	Name string `json:"name"`
	// Time is when it ended.
	Time metav1.Time `json:"time"`
	// Result is Intact or Corrupt.
	Result BackupVerificationResult `json:"result"`
	// CorruptChunks is how many chunks were missing or did not match.
	// +optional
	CorruptChunks int64 `json:"corruptChunks,omitempty"`
}

// VirtualMachineBackupVerification type metadata.
var (
	VirtualMachineBackupVerificationKind             = reflect.TypeOf(VirtualMachineBackupVerification{}).Name()
	VirtualMachineBackupVerificationGroupVersionKind = SchemeGroupVersion.WithKind(VirtualMachineBackupVerificationKind)
)

func init() {
	SchemeBuilder.Register(&VirtualMachineBackupVerification{}, &VirtualMachineBackupVerificationList{})
}
