package v1alpha1

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PlacementPolicy is how a PlacementGroup places its VMs.
// +kubebuilder:validation:Enum=AntiAffinity;Affinity
type PlacementPolicy string

// Placement policies.
const (
	// PlacementAntiAffinity spreads the group's VMs: no two in one
	// topology domain.
	PlacementAntiAffinity PlacementPolicy = "AntiAffinity"
	// PlacementAffinity keeps the group's VMs in one topology domain.
	PlacementAffinity PlacementPolicy = "Affinity"
)

// PlacementGroupSpec says how the VMs that name the group are placed.
type PlacementGroupSpec struct {
	// Policy is AntiAffinity (spread the VMs, one per topology domain) or
	// Affinity (keep them in one).
	Policy PlacementPolicy `json:"policy"`
	// Required makes the policy a rule: a VM that cannot be placed by it
	// stays Pending saying so, a live migration that would break it waits,
	// and so does a drain that needs one. Without it the policy is a
	// preference the hub follows where it can.
	// +kubebuilder:default=true
	// +optional
	Required *bool `json:"required,omitempty"`
	// TopologyKey is the node label whose value is a VM's topology domain
	// (a rack, a zone); empty means each node is a domain of its own. A
	// node without the label is a domain of its own too.
	// +kubebuilder:validation:MaxLength=317
	// +optional
	TopologyKey string `json:"topologyKey,omitempty"`
}

// IsRequired is whether the group's policy is a rule rather than a
// preference.
func (s PlacementGroupSpec) IsRequired() bool { return s.Required == nil || *s.Required }

// PlacementGroupVM is one VM of a group, where it is.
type PlacementGroupVM struct {
	// Name is the VirtualMachine's name.
	Name string `json:"name"`
	// Node is the node the VM is on; empty while it is on none (Pending,
	// or refused where it was put).
	// +optional
	Node string `json:"node,omitempty"`
	// Domain is the topology domain of its node: topologyKey=value, or
	// "node NAME" when the group has no topologyKey or the node lacks the
	// label.
	// +optional
	Domain string `json:"domain,omitempty"`
}

// PlacementGroupStatus says which VMs name the group, where they are, and
// whether the group's policy holds for them.
type PlacementGroupStatus struct {
	// VMs are the VMs of the namespace that name the group, by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	VMs []PlacementGroupVM `json:"vms,omitempty"`
	// Placed counts the VMs that are on a node.
	// +optional
	Placed int32 `json:"placed,omitempty"`
	// Domains counts the topology domains the placed VMs are in.
	// +optional
	Domains int32 `json:"domains,omitempty"`
	// Conditions holds Satisfied: True while the placed VMs keep the
	// policy (each in a domain of its own, or all in one), False naming
	// the VMs that break it (placed before the group was made or
	// changed, or by a preferred policy the hub could not follow).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PlacementGroupSatisfied is the condition type saying whether a group's
// placed VMs keep its policy.
const PlacementGroupSatisfied = "Satisfied"

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A PlacementGroup keeps the VirtualMachines of its namespace that name it
// (spec.forProvider.placementGroup) apart or together, as Nova's server
// groups and vSphere's DRS rules do: the replicas of an application on
// different nodes, racks or zones, or chatty VMs on one node. The hub
// honours it when it places a VM, chooses a live migration's target and
// restarts a VM after its node is lost.
// +kubebuilder:printcolumn:name="POLICY",type="string",JSONPath=".spec.policy"
// +kubebuilder:printcolumn:name="REQUIRED",type="boolean",JSONPath=".spec.required"
// +kubebuilder:printcolumn:name="TOPOLOGY",type="string",JSONPath=".spec.topologyKey"
// +kubebuilder:printcolumn:name="PLACED",type="integer",JSONPath=".status.placed"
// +kubebuilder:printcolumn:name="DOMAINS",type="integer",JSONPath=".status.domains"
// +kubebuilder:printcolumn:name="SATISFIED",type="string",JSONPath=".status.conditions[?(@.type=='Satisfied')].status"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={pg,pgs},categories={virtfleet}
type PlacementGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PlacementGroupSpec `json:"spec"`
	// +optional
	Status PlacementGroupStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// PlacementGroupList contains a list of PlacementGroup.
type PlacementGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PlacementGroup `json:"items"`
}

// PlacementGroup type metadata.
var (
	PlacementGroupKind             = reflect.TypeOf(PlacementGroup{}).Name()
	PlacementGroupGroupVersionKind = SchemeGroupVersion.WithKind(PlacementGroupKind)
)

func init() {
	SchemeBuilder.Register(&PlacementGroup{}, &PlacementGroupList{})
}
