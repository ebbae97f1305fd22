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

// +kubebuilder:object:root=true

// A PlacementGroup keeps the VirtualMachines of its namespace that name it
// (spec.forProvider.placementGroup) apart or together, as Nova's server
// groups and vSphere's DRS rules do: the replicas of an application on
// different nodes, racks or zones, or chatty VMs on one node. The hub
// honours it when it places a VM, chooses a live migration's target and
// restarts a VM after its node is lost.
// +kubebuilder:printcolumn:name="POLICY",type="string",JSONPath=".spec.policy"
// +kubebuilder:printcolumn:name="REQUIRED",type="boolean",JSONPath=".spec.required"
// +kubebuilder:printcolumn:name="TOPOLOGY",type="string",JSONPath=".spec.topologyKey"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={pg,pgs},categories={virtfleet}
type PlacementGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PlacementGroupSpec `json:"spec"`
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
