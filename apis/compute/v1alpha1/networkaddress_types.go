package v1alpha1

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NetworkAddressSpec says which VM interface holds an address.
type NetworkAddressSpec struct {
	// Network is the VirtualNetwork the address is of.
	Network LocalName `json:"network"`
	// Address is the IPv4 address.
	// +kubebuilder:validation:MaxLength=15
	Address string `json:"address"`
	// VirtualMachine is the name of the VM whose interface holds it.
	VirtualMachine LocalName `json:"virtualMachine"`
	// VirtualMachineUID is that VM's uid: a VM re-created under the same
	// name is another VM and gets its own addresses.
	// +kubebuilder:validation:MaxLength=36
	VirtualMachineUID string `json:"virtualMachineUID"`
}

// +kubebuilder:object:root=true

// A NetworkAddress records that one address of a VirtualNetwork is given to
// one VM interface. The hub writes it before the VM's node learns the
// address, and deletes it when the VM is gone. Its name is the network's
// name and the address, "<network>.<a.b.c.d>", so the API server itself
// refuses a second holder of an address, whichever hub replica asks.
// +kubebuilder:printcolumn:name="NETWORK",type="string",JSONPath=".spec.network"
// +kubebuilder:printcolumn:name="ADDRESS",type="string",JSONPath=".spec.address"
// +kubebuilder:printcolumn:name="VM",type="string",JSONPath=".spec.virtualMachine"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vaddr},categories={virtfleet}
type NetworkAddress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NetworkAddressSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// NetworkAddressList contains a list of NetworkAddress.
type NetworkAddressList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetworkAddress `json:"items"`
}

// NetworkAddress type metadata.
var (
	NetworkAddressKind             = reflect.TypeOf(NetworkAddress{}).Name()
	NetworkAddressGroupVersionKind = SchemeGroupVersion.WithKind(NetworkAddressKind)
)

func init() {
	SchemeBuilder.Register(&NetworkAddress{}, &NetworkAddressList{})
}
