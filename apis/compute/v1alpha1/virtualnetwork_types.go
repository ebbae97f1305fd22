package v1alpha1

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// NetworkMode is how a libvirt network reaches the outside.
// +kubebuilder:validation:Enum=nat;bridge;isolated
type NetworkMode string

// Network modes.
const (
	NetworkModeNAT      NetworkMode = "nat"
	NetworkModeBridge   NetworkMode = "bridge"
	NetworkModeIsolated NetworkMode = "isolated"
)

// VirtualNetworkParameters are the fields a user sets on a VirtualNetwork.
// +kubebuilder:validation:XValidation:rule="self.mode != 'bridge' || (has(self.bridge) && size(self.bridge) > 0)",message="bridge is required when mode is bridge"
// +kubebuilder:validation:XValidation:rule="self.mode == 'bridge' || has(self.cidr)",message="cidr is required when mode is nat or isolated"
// +kubebuilder:validation:XValidation:rule="!has(self.vlan) || self.mode == 'bridge'",message="vlan is allowed only when mode is bridge"
type VirtualNetworkParameters struct {
	// Mode is nat (a private subnet with DHCP, NATed to the host), bridge
	// (guests join an existing host bridge) or isolated (no outside access).
	// +kubebuilder:default=nat
	// +optional
	Mode NetworkMode `json:"mode,omitempty"`

	// CIDR is the IPv4 subnet served by DHCP in nat and isolated mode, for
	// example 10.10.120.0/24. The host takes the first address.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4",message="cidr must be an IPv4 subnet such as 10.10.120.0/24"
	// +optional
	CIDR string `json:"cidr,omitempty"`

	// Bridge is the host bridge guests join in bridge mode.
	// +kubebuilder:validation:MaxLength=15
	// +optional
	Bridge string `json:"bridge,omitempty"`

	// VLAN, in bridge mode, is the 802.1Q tag guests join on the host
	// bridge, a trunk the site runs: each node makes a VLAN device with
	// this id on the bridge, and a bridge of its own with that device as
	// its port for the guests. Unset, guests join the host bridge itself.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4094
	// +optional
	VLAN *int32 `json:"vlan,omitempty"`
}

// VirtualNetworkObservation is what the nodes' agents observed.
type VirtualNetworkObservation struct {
	// Phase is Pending, Provisioning, Running (ready) or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Nodes are the first 20 nodes, by name, where the network's
	// VirtualMachines run and so the network exists; NodeCount counts them
	// all.
	// +optional
	Nodes []string `json:"nodes,omitempty"`

	// NodeCount is how many nodes the network's VirtualMachines run on.
	// +optional
	NodeCount int32 `json:"nodeCount,omitempty"`

	// AttachedTo are the first 20 VirtualMachines, by name, with an
	// interface on the network; AttachedCount counts them all.
	// +optional
	AttachedTo []string `json:"attachedTo,omitempty"`

	// AttachedCount is how many VirtualMachines have an interface on the
	// network.
	// +optional
	AttachedCount int32 `json:"attachedCount"`

	// VNI is the VXLAN network identifier that joins the network's bridges
	// on libvirt nodes into one segment, unique in the fleet.
	// +optional
	VNI int32 `json:"vni,omitempty"`

	// AddressesAllocated is how many of the cidr's addresses the hub has
	// given to VM interfaces; AddressesTotal is how many it can give (the
	// cidr less its network, gateway and broadcast addresses).
	// +optional
	AddressesAllocated int32 `json:"addressesAllocated,omitempty"`
	// +optional
	AddressesTotal int32 `json:"addressesTotal,omitempty"`
}

// VirtualNetworkSpec defines the desired state of a VirtualNetwork.
type VirtualNetworkSpec struct {
	xpv2.ManagedResourceSpec `json:",inline"`
	ForProvider              VirtualNetworkParameters `json:"forProvider"`
}

// VirtualNetworkStatus represents the observed state of a VirtualNetwork.
type VirtualNetworkStatus struct {
	xpv2.ManagedResourceStatus `json:",inline"`
	AtProvider                 VirtualNetworkObservation `json:"atProvider,omitempty"`
}

// +kubebuilder:object:root=true

// A VirtualNetwork is a network VirtualMachines attach to: a libvirt network
// on each node that needs it, a Neutron network or a Multus
// NetworkAttachmentDefinition. A network in use cannot be deleted.
// +kubebuilder:printcolumn:name="STATUS",type="string",JSONPath=".status.atProvider.phase"
// +kubebuilder:printcolumn:name="MODE",type="string",JSONPath=".spec.forProvider.mode"
// +kubebuilder:printcolumn:name="CIDR",type="string",JSONPath=".spec.forProvider.cidr"
// +kubebuilder:printcolumn:name="VMS",type="integer",JSONPath=".status.atProvider.attachedCount"
// +kubebuilder:printcolumn:name="ADDRESSES",type="integer",JSONPath=".status.atProvider.addressesAllocated"
// +kubebuilder:printcolumn:name="NODES",type="string",JSONPath=".status.atProvider.nodes",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="READY",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status",priority=1
// +kubebuilder:printcolumn:name="SYNCED",type="string",JSONPath=".status.conditions[?(@.type=='Synced')].status",priority=1
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName={vnet},categories={crossplane,managed,virtfleet}
type VirtualNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualNetworkSpec   `json:"spec"`
	Status VirtualNetworkStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// VirtualNetworkList contains a list of VirtualNetwork.
type VirtualNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualNetwork `json:"items"`
}

// VirtualNetwork type metadata.
var (
	VirtualNetworkKind             = reflect.TypeOf(VirtualNetwork{}).Name()
	VirtualNetworkGroupKind        = schema.GroupKind{Group: Group, Kind: VirtualNetworkKind}.String()
	VirtualNetworkKindAPIVersion   = VirtualNetworkKind + "." + SchemeGroupVersion.String()
	VirtualNetworkGroupVersionKind = SchemeGroupVersion.WithKind(VirtualNetworkKind)
)

func init() {
	SchemeBuilder.Register(&VirtualNetwork{}, &VirtualNetworkList{})
}
