package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// DiskFormat is the on-disk format of a volume or image.
// +kubebuilder:validation:Enum=qcow2;raw
type DiskFormat string

// Disk formats.
const (
	DiskFormatQCOW2 DiskFormat = "qcow2"
	DiskFormatRaw   DiskFormat = "raw"
)

// VolumeSource says what a new volume is filled with.
type VolumeSource struct {
	// DiskImageRef names a DiskImage in this namespace. The image is ensured
	// on the volume's node before the volume is created from it.
	// +optional
	DiskImageRef *LocalReference `json:"diskImageRef,omitempty"`
}

// VolumeParameters are the fields a user sets on a Volume.
// +kubebuilder:validation:XValidation:rule="has(self.storagePool) == has(oldSelf.storagePool) && (!has(self.storagePool) || self.storagePool == oldSelf.storagePool)",message="storagePool is immutable: it cannot be set, changed or removed once the Volume exists"
type VolumeParameters struct {
	// Size of the volume, as a Kubernetes quantity (for example 10Gi). It
	// must be greater than zero and at most 64Ti: more than a node's
	// storage pool, a Cinder quota or a PVC gives one disk, so the bound
	// refuses only typos and abuse, and it keeps the byte count the hub
	// sends to the node (an int64) exact. It may grow, which the node
	// applies to the volume in place (to a running guest's disk live),
	// but never shrink: no backend shrinks a disk without losing what the
	// guest wrote past the new end.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",messageExpression="'size must be greater than 0, got ' + string(self)"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(oldSelf)).isGreaterThan(quantity(string(self)))",messageExpression="'size can only grow: ' + string(self) + ' is smaller than ' + string(oldSelf)"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isGreaterThan(quantity('64Ti'))",messageExpression="'size must be at most 64Ti, got ' + string(self)"
	Size resource.Quantity `json:"size"`

	// Format of the volume on libvirt.
	// +kubebuilder:default=qcow2
	// +optional
	Format *DiskFormat `json:"format,omitempty"`

	// Source fills the volume when it is created. Unset means an empty volume.
	// +optional
	Source *VolumeSource `json:"source,omitempty"`

	// StoragePool names a shared storage pool to hold the volume: one the
	// cluster administrator set up on shared storage, and that the nodes
	// reaching it announce by the same name. Any of those nodes can open
	// the volume, so a VirtualMachine using it is placed only on nodes that
	// reach every shared pool of its Volumes, and, with availability
	// Restart, is restarted on another of them when its node is lost.
	// Unset means the node's own storage: the volume lives on the one node
	// it is bound to. It cannot be changed once the Volume exists.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +optional
	StoragePool string `json:"storagePool,omitempty"`
}

// VolumeObservation is what the node's agent observed.
type VolumeObservation struct {
	// ID is the backend's identifier: the libvirt volume key, the Cinder
	// volume ID or the DataVolume's UID.
	// +optional
	ID string `json:"id,omitempty"`

	// Phase is Pending, Provisioning, Ready (reported as Running) or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Node is where a node-local volume lives. It is bound to the node of
	// the first VirtualMachine that uses it.
	// +optional
	Node string `json:"node,omitempty"`

	// Capacity is the size the backend reports.
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`

	// AttachedTo are the VirtualMachines using the volume: those attaching
	// it, and those whose guest still holds it after it was removed from
	// their diskAttachments. The Volume cannot be deleted while any does.
	// +optional
	AttachedTo []string `json:"attachedTo,omitempty"`
}

// VolumeSpec defines the desired state of a Volume.
type VolumeSpec struct {
	xpv2.ManagedResourceSpec `json:",inline"`
	ForProvider              VolumeParameters `json:"forProvider"`
}

// VolumeStatus represents the observed state of a Volume.
type VolumeStatus struct {
	xpv2.ManagedResourceStatus `json:",inline"`
	AtProvider                 VolumeObservation `json:"atProvider,omitempty"`
}

// +kubebuilder:object:root=true

// A Volume is a disk for VirtualMachines: a libvirt storage volume, a Cinder
// volume or a KubeVirt DataVolume. Deleting a VirtualMachine never deletes
// its Volumes, and a Volume in use cannot be deleted.
// +kubebuilder:printcolumn:name="STATUS",type="string",JSONPath=".status.atProvider.phase"
// +kubebuilder:printcolumn:name="SIZE",type="string",JSONPath=".spec.forProvider.size"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="NODE",type="string",JSONPath=".status.atProvider.node",priority=1
// +kubebuilder:printcolumn:name="READY",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status",priority=1
// +kubebuilder:printcolumn:name="SYNCED",type="string",JSONPath=".status.conditions[?(@.type=='Synced')].status",priority=1
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName={vol},categories={crossplane,managed,virtfleet}
type Volume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VolumeSpec   `json:"spec"`
	Status VolumeStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// VolumeList contains a list of Volume.
type VolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Volume `json:"items"`
}

// Volume type metadata.
var (
	VolumeKind             = reflect.TypeOf(Volume{}).Name()
	VolumeGroupKind        = schema.GroupKind{Group: Group, Kind: VolumeKind}.String()
	VolumeKindAPIVersion   = VolumeKind + "." + SchemeGroupVersion.String()
	VolumeGroupVersionKind = SchemeGroupVersion.WithKind(VolumeKind)
)

func init() {
	SchemeBuilder.Register(&Volume{}, &VolumeList{})
}
