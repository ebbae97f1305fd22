package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// Keys of a BackupLocation's credentials Secret.
const (
	// BackupAccessKeyID holds the S3 access key id.
	BackupAccessKeyID = "accessKeyID"
	// BackupSecretAccessKey holds the S3 secret access key.
	BackupSecretAccessKey = "secretAccessKey"
	// BackupEncryptionKey, when present, holds 32 bytes: chunks are
	// encrypted with a key derived from it on the node, before they leave
	// it, and named so that the store learns nothing of their content.
	BackupEncryptionKey = "encryptionKey"
)

// BackupLocationSpec is an S3-compatible bucket backups are kept in.
type BackupLocationSpec struct {
	// Endpoint is the S3 server's host:port, reached by the hub and by
	// every node that backs up or restores.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="!self.contains('/')",message="endpoint is host:port, without a scheme or path"
	Endpoint string `json:"endpoint"`
	// Insecure reaches the endpoint over plain HTTP instead of HTTPS.
	// +optional
	Insecure bool `json:"insecure,omitempty"`
	// Region of the bucket.
	// +optional
	// +kubebuilder:default="us-east-1"
	Region string `json:"region,omitempty"`
	// Bucket holds the backups; it must exist.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9.-]*[a-z0-9]$`
	Bucket string `json:"bucket"`
	// Prefix is where in the bucket the backups start, so several
	// locations can share a bucket.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^([a-zA-Z0-9._-]+/)*$`
	Prefix string `json:"prefix,omitempty"`
	// CredentialsSecretRef is the Secret with the location's S3
	// credentials (accessKeyID, secretAccessKey) and, optionally, the
	// encryptionKey of its chunks.
	CredentialsSecretRef xpv2.SecretReference `json:"credentialsSecretRef"`
	// GarbageCollectionInterval is how often the hub deletes the chunks
	// no backup in the location references any longer, e.g. 24h (the
	// default) or 30m; 0s never. A backup deleted with deletionPolicy
	// Delete frees its space only then; the hub also collects soon after
	// such a deletion.
	// +optional
	// +kubebuilder:default="24h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",message="garbageCollectionInterval must be a duration such as 24h, 90m or 0s"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') || duration(self) == duration('0s') || (duration(self) >= duration('1m') && duration(self) <= duration('8760h'))",message="garbageCollectionInterval must be 0s (never) or from 1m to 8760h"
	GarbageCollectionInterval *metav1.Duration `json:"garbageCollectionInterval,omitempty"`
}

// GarbageCollection is what the hub's last garbage collection of a
// location did.
type GarbageCollection struct {
	// Time the collection ended, or failed.
	Time metav1.Time `json:"time"`
	// Backups is how many backups, of every namespace, it kept the data
	// of.
	// +optional
	Backups int64 `json:"backups,omitempty"`
	// ChunksDeleted and BytesFreed are what it deleted; ChunksKept what
	// it left (referenced, or too young to tell).
	// +optional
	ChunksDeleted int64 `json:"chunksDeleted,omitempty"`
	// +optional
	BytesFreed int64 `json:"bytesFreed,omitempty"`
	// +optional
	ChunksKept int64 `json:"chunksKept,omitempty"`
	// Message says why it failed or was put off; empty when it ran.
	// +optional
	Message string `json:"message,omitempty"`
}

// BackupLocationStatus is what the hub observed of the location.
type BackupLocationStatus struct {
	xpv2.ConditionedStatus `json:",inline"`
	// LastGarbageCollection is the last collection that ran to its end.
	// +optional
	LastGarbageCollection *GarbageCollection `json:"lastGarbageCollection,omitempty"`
	// LastGarbageCollectionAttempt is the last that failed or was put
	// off, while that is newer than LastGarbageCollection.
	// +optional
	LastGarbageCollectionAttempt *GarbageCollection `json:"lastGarbageCollectionAttempt,omitempty"`
	// BytesFreed counts what every collection the hub made deleted.
	// +optional
	BytesFreed int64 `json:"bytesFreed,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A BackupLocation is an S3-compatible bucket, declared by a cluster
// administrator, that VirtualMachineBackups are written to. Only the
// namespaces a ClusterProviderConfig's grant names in backupLocations may
// use it, and each reads and deletes only its own backups there. Backups
// in it outlive their VM, its node and its namespace: a namespace made
// again under the same name can restore them.
// +kubebuilder:printcolumn:name="ENDPOINT",type="string",JSONPath=".spec.endpoint"
// +kubebuilder:printcolumn:name="BUCKET",type="string",JSONPath=".spec.bucket"
// +kubebuilder:printcolumn:name="PREFIX",type="string",JSONPath=".spec.prefix"
// +kubebuilder:printcolumn:name="LAST-GC",type="date",JSONPath=".status.lastGarbageCollection.time"
// +kubebuilder:printcolumn:name="FREED",type="integer",JSONPath=".status.bytesFreed",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Cluster,shortName={backuplocation,bkloc},categories={virtfleet}
type BackupLocation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupLocationSpec   `json:"spec"`
	Status BackupLocationStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// BackupLocationList contains a list of BackupLocation.
type BackupLocationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupLocation `json:"items"`
}

// BackupDeletionPolicy says what becomes of a backup's data in its
// location when the VirtualMachineBackup is deleted.
// +kubebuilder:validation:Enum=Retain;Delete
type BackupDeletionPolicy string

// Backup deletion policies.
const (
	// BackupRetain keeps the backup in its location, where it can be
	// restored from after its object, VM and namespace are gone.
	BackupRetain BackupDeletionPolicy = "Retain"
	// BackupDelete deletes the backup from its location with its object;
	// data no other backup shares is freed by the location's next
	// garbage collection.
	BackupDelete BackupDeletionPolicy = "Delete"
)

// VirtualMachineBackupSpec names the VirtualMachine to back up and where.
type VirtualMachineBackupSpec struct {
	// VMName is the VirtualMachine to back up, in the backup's namespace.
	// It keeps running while it is backed up.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="vmName is immutable: create another backup"
	VMName LocalName `json:"vmName"`
	// Location is the BackupLocation written to; the namespace must be
	// granted it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="location is immutable: create another backup"
	Location string `json:"location"`
	// Full reads every disk whole instead of only what changed since the
	// VM's last backup.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="full is immutable: create another backup"
	Full bool `json:"full,omitempty"`
	// DeletionPolicy is what becomes of the backup's data when this
	// object is deleted: Retain (the default) keeps it in the location,
	// Delete deletes it.
	// +optional
	// +kubebuilder:default=Retain
	DeletionPolicy BackupDeletionPolicy `json:"deletionPolicy,omitempty"`
}

// BackupPhase is how far a VirtualMachineBackup got.
type BackupPhase string

// Backup phases.
const (
	// BackupPending: waiting for the VM, its node or its location.
	BackupPending BackupPhase = "Pending"
	// BackupInProgress: the VM's node is copying its disks to the
	// location.
	BackupInProgress BackupPhase = "InProgress"
	// BackupSucceeded: the backup is whole in its location and can be
	// restored.
	BackupSucceeded BackupPhase = "Succeeded"
	// BackupFailed: nothing of this backup can be restored; Message says
	// why. The VM ran on, and the next backup still holds every change.
	BackupFailed BackupPhase = "Failed"
)

// VirtualMachineBackupStatus is what the hub and the VM's node observed.
type VirtualMachineBackupStatus struct {
	// Phase is how far the backup got.
	// +optional
	Phase BackupPhase `json:"phase,omitempty"`
	// SourceUID is the uid of the VirtualMachine backed up.
	// +optional
	SourceUID string `json:"sourceUID,omitempty"`
	// Node is the node that read the VM's disks.
	// +optional
	Node string `json:"node,omitempty"`
	// Parent is the backup (its uid) this one read only the changes
	// since; empty for a full backup. The backup does not need it: each
	// is whole in its location.
	// +optional
	Parent string `json:"parent,omitempty"`
	// Full is whether the disks were read whole.
	// +optional
	Full bool `json:"full,omitempty"`
	// Frozen is whether the guest agent froze the guest's filesystems
	// for the moment the disks were read.
	// +optional
	Frozen bool `json:"frozen,omitempty"`
	// StartTime and CompletionTime bound the backup on its node.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// DurationMilliseconds is how long the node took.
	// +optional
	DurationMilliseconds int64 `json:"durationMilliseconds,omitempty"`
	// Size is the size of the disks the backup holds, as the guest sees
	// them.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// BytesRead is what the node read of the disks; BytesWritten what it
	// wrote to the location (new chunks only).
	// +optional
	BytesRead int64 `json:"bytesRead,omitempty"`
	// +optional
	BytesWritten int64 `json:"bytesWritten,omitempty"`
	// ChunksWritten were new to the location; ChunksReused were there
	// already (an unchanged block, another VM's identical data).
	// +optional
	ChunksWritten int64 `json:"chunksWritten,omitempty"`
	// +optional
	ChunksReused int64 `json:"chunksReused,omitempty"`
	// Message says what the backup waits for, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
	// LastVerification is what the latest VirtualMachineBackupVerification
	// of the backup that read it whole found.
	// +optional
	LastVerification *LastVerification `json:"lastVerification,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A VirtualMachineBackup copies a VirtualMachine's disks and spec, at one
// moment, to a BackupLocation off the node, while the VM runs on. The
// VM's first backup reads its disks whole; later ones read only the
// blocks written since the last (changed-block tracking on the node), yet
// each is whole in the location: its data is content-addressed chunks,
// shared with every other backup that holds the same data, so deleting
// one backup never breaks another.
// +kubebuilder:printcolumn:name="VM",type="string",JSONPath=".spec.vmName"
// +kubebuilder:printcolumn:name="LOCATION",type="string",JSONPath=".spec.location"
// +kubebuilder:printcolumn:name="PHASE",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="FULL",type="boolean",JSONPath=".status.full"
// +kubebuilder:printcolumn:name="WRITTEN",type="integer",JSONPath=".status.bytesWritten"
// +kubebuilder:printcolumn:name="VERIFIED",type="string",JSONPath=".status.lastVerification.result",priority=1
// +kubebuilder:printcolumn:name="NODE",type="string",JSONPath=".status.node",priority=1
// +kubebuilder:printcolumn:name="READ",type="integer",JSONPath=".status.bytesRead",priority=1
// +kubebuilder:printcolumn:name="ID",type="string",JSONPath=".metadata.uid",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmbackup,vmbackups},categories={virtfleet}
type VirtualMachineBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineBackupSpec   `json:"spec"`
	Status VirtualMachineBackupStatus `json:"status,omitempty"`
}

// Done is whether the backup is over, succeeded or failed.
func (b *VirtualMachineBackup) Done() bool {
	return b.Status.Phase == BackupSucceeded || b.Status.Phase == BackupFailed
}

// +kubebuilder:object:root=true

// VirtualMachineBackupList contains a list of VirtualMachineBackup.
type VirtualMachineBackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineBackup `json:"items"`
}

// BackupLocation and VirtualMachineBackup type metadata.
var (
	BackupLocationKind                   = reflect.TypeOf(BackupLocation{}).Name()
	BackupLocationGroupVersionKind       = SchemeGroupVersion.WithKind(BackupLocationKind)
	VirtualMachineBackupKind             = reflect.TypeOf(VirtualMachineBackup{}).Name()
	VirtualMachineBackupGroupVersionKind = SchemeGroupVersion.WithKind(VirtualMachineBackupKind)
)

func init() {
	SchemeBuilder.Register(&BackupLocation{}, &BackupLocationList{})
	SchemeBuilder.Register(&VirtualMachineBackup{}, &VirtualMachineBackupList{})
}

// BackupRootDisk is what a backup calls the disk its VM boots from, the
// first of its diskAttachments; the others go by their Volumes' names.
const BackupRootDisk = "root"

// BackupDiskName is what a backup of a VM calls the disk attached at index
// i of its diskAttachments, the Volume volume.
func BackupDiskName(i int, volume LocalName) string {
	if i == 0 {
		return BackupRootDisk
	}
	return string(volume)
}
