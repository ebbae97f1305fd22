package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// DiskImageSource says where an image comes from: one of url, volumeRef or
// backup.
// With neither, the DiskImage imports the image of the node's backend its
// crossplane.io/external-name annotation names (a Glance image's name or id
// on nova), which virtfleet uses as it is and never deletes; the namespace
// needs the import grant for that, as for any import.
// +kubebuilder:validation:XValidation:rule="[has(self.url), has(self.volumeRef), has(self.backup)].filter(x, x).size() <= 1",message="set one of url, volumeRef or backup, not more"
// +kubebuilder:validation:XValidation:rule="!has(self.sha256) || has(self.url)",message="sha256 verifies a download and goes with url"
// +kubebuilder:validation:XValidation:rule="!has(self.snapshotRef) || has(self.volumeRef)",message="snapshotRef names the VirtualMachineSnapshot of volumeRef to copy and goes with volumeRef"
type DiskImageSource struct {
	// URL is an http or https address the image is downloaded from.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https']",message="url must be an http or https URL"
	// +optional
	URL string `json:"url,omitempty"`

	// SHA256 is the expected hex digest of the downloaded file. A mismatch
	// fails the import and nothing is kept.
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	// +optional
	SHA256 string `json:"sha256,omitempty"`

	// VolumeRef clones an existing Volume in this namespace into the image.
	// +optional
	VolumeRef *LocalReference `json:"volumeRef,omitempty"`

	// SnapshotRef, with volumeRef, copies that Volume as it was in this
	// VirtualMachineSnapshot of its VM, in this namespace, rather than as
	// it is now: the snapshot lives inside the Volume, on its node, and
	// the copy is made there while the VM runs on. The snapshot must be
	// ReadyToUse and hold the Volume; a backend that cannot read a disk's
	// snapshot fails the image, naming why.
	// +optional
	SnapshotRef *LocalReference `json:"snapshotRef,omitempty"`

	// Backup makes the image from one disk of a VirtualMachineBackup, as
	// it was backed up: a raw image (format raw), from
	// which Volumes, and so a VM, are made again on any node, after the
	// backed-up VM, its node or its namespace are gone.
	// +optional
	Backup *DiskImageBackupSource `json:"backup,omitempty"`
}

// DiskImageBackupSource is one disk of a backup in a BackupLocation.
type DiskImageBackupSource struct {
	// Location is the BackupLocation the backup is in; the namespace must
	// be granted it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Location string `json:"location"`
	// Namespace is the namespace the backup was taken in; this
	// DiskImage's own when empty. Another namespace's backups, such as
	// those of a namespace that is gone, are restored only where a
	// cluster administrator granted it (a grant's restoreFrom).
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// ID is the backup's: the metadata.uid of the VirtualMachineBackup
	// that took it, in the backup's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_-]+$`
	ID string `json:"id"`
	// Disk is the disk of the backup: root (the default) for the disk the
	// VM booted from, or an attached Volume's name.
	// +optional
	// +kubebuilder:default=root
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_-]+$`
	Disk string `json:"disk,omitempty"`
}

// DiskImageParameters are the fields a user sets on a DiskImage.
// +kubebuilder:validation:XValidation:rule="!has(self.source) || !has(self.source.backup) || (has(self.format) && self.format == 'raw')",message="an image made from a backup is raw: set format: raw"
type DiskImageParameters struct {
	// Source of the image; empty when the DiskImage imports an existing
	// image by its crossplane.io/external-name annotation.
	// +optional
	Source DiskImageSource `json:"source,omitempty"`

	// Format of the image file.
	// +kubebuilder:default=qcow2
	// +optional
	Format *DiskFormat `json:"format,omitempty"`

	// The bound on pruneAfter is what keeps every stored DiskImage decodable:
	// the pattern alone accepts durations Go cannot represent (9999999999h
	// overflows an int64 of nanoseconds), and one such object fails the
	// hub's list of all DiskImages. CEL's duration() parses as Go does, so
	// a value it cannot parse fails the rule and is refused too.

	// PruneAfter is how long an image stays on a node once no volume there
	// uses it, for example 24h or 30m; at most 8760h (a year).
	// +kubebuilder:default="24h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",message="pruneAfter must be a duration such as 24h, 90m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') || duration(self) <= duration('8760h')",message="pruneAfter must be at most 8760h (a year)"
	// +optional
	PruneAfter *metav1.Duration `json:"pruneAfter,omitempty"`
}

// ImagePhase is the lifecycle phase of a DiskImage.
// +kubebuilder:validation:Enum=Pending;Importing;Ready;Failed
type ImagePhase string

// Image phases.
const (
	ImagePhasePending   ImagePhase = "Pending"
	ImagePhaseImporting ImagePhase = "Importing"
	ImagePhaseReady     ImagePhase = "Ready"
	ImagePhaseFailed    ImagePhase = "Failed"
)

// DiskImageObservation is what the nodes' agents observed.
type DiskImageObservation struct {
	// Phase of the image.
	// +optional
	Phase ImagePhase `json:"phase,omitempty"`

	// Size of the image file.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// Nodes where the image is present.
	// +optional
	Nodes []string `json:"nodes,omitempty"`

	// Users counts the Volumes made from the image.
	// +optional
	Users int32 `json:"users,omitempty"`

	// Message explains a Failed phase.
	// +optional
	Message string `json:"message,omitempty"`
}

// DiskImageSpec defines the desired state of a DiskImage.
type DiskImageSpec struct {
	xpv2.ManagedResourceSpec `json:",inline"`
	ForProvider              DiskImageParameters `json:"forProvider"`
}

// DiskImageStatus represents the observed state of a DiskImage.
type DiskImageStatus struct {
	xpv2.ManagedResourceStatus `json:",inline"`
	AtProvider                 DiskImageObservation `json:"atProvider,omitempty"`
}

// +kubebuilder:object:root=true

// A DiskImage is a bootable image that Volumes are made from. It is imported
// once into each node that needs it, counted by its users, and pruned from a
// node after pruneAfter without users. An image in use cannot be deleted.
// +kubebuilder:printcolumn:name="STATUS",type="string",JSONPath=".status.atProvider.phase"
// +kubebuilder:printcolumn:name="USERS",type="integer",JSONPath=".status.atProvider.users"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="SIZE",type="string",JSONPath=".status.atProvider.size",priority=1
// +kubebuilder:printcolumn:name="NODES",type="string",JSONPath=".status.atProvider.nodes",priority=1
// +kubebuilder:printcolumn:name="READY",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status",priority=1
// +kubebuilder:printcolumn:name="SYNCED",type="string",JSONPath=".status.conditions[?(@.type=='Synced')].status",priority=1
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName={img},categories={crossplane,managed,virtfleet}
type DiskImage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DiskImageSpec   `json:"spec"`
	Status DiskImageStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// DiskImageList contains a list of DiskImage.
type DiskImageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DiskImage `json:"items"`
}

// DiskImage type metadata.
var (
	DiskImageKind             = reflect.TypeOf(DiskImage{}).Name()
	DiskImageGroupKind        = schema.GroupKind{Group: Group, Kind: DiskImageKind}.String()
	DiskImageKindAPIVersion   = DiskImageKind + "." + SchemeGroupVersion.String()
	DiskImageGroupVersionKind = SchemeGroupVersion.WithKind(DiskImageKind)
)

func init() {
	SchemeBuilder.Register(&DiskImage{}, &DiskImageList{})
}
