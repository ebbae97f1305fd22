package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HypervisorNodeSpec is what an administrator says of a node.
type HypervisorNodeSpec struct {
	// Unschedulable keeps new VirtualMachines off the node (kubectl patch
	// ... -p '{"spec":{"unschedulable":true}}', as kubectl cordon does for
	// a Kubernetes node). The VMs already on it stay.
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`
	// Drain moves every VirtualMachine off the node, live, as kubectl
	// drain evicts a Kubernetes node's pods, and keeps new ones away as
	// Unschedulable does: the hub creates a VirtualMachineMigration for
	// each VM of the node, within the migration limits. A VM whose
	// evictionStrategy is None stays, and the drain waits for it.
	// status.drain shows the progress. Setting it back to false stops
	// the drain; migrations already running finish.
	// +optional
	Drain bool `json:"drain,omitempty"`
	// Labels are the node's labels as the administrator sets them. They
	// win over the labels the node's heartbeats claim, and a label under
	// ReservedLabelPrefix counts only from here: a node that claims one
	// is not believed (as a kubelet may not set
	// node-restriction.kubernetes.io/ labels on its own Node).
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Claims bounds what else the node's heartbeats may claim: the shared
	// storage pools it reaches, its overlay tunnel address and the
	// address other nodes migrate guests to. Unset, or a field of it
	// unset, leaves that claim as the node makes it.
	// +optional
	Claims *NodeClaims `json:"claims,omitempty"`
}

// ReservedLabelPrefix starts the labels only a HypervisorNode's
// spec.labels sets: the hub ignores a heartbeat's claim of one. Select on
// such labels to keep VMs on the nodes an administrator chose.
const ReservedLabelPrefix = "node-restriction.virtfleet.io/"

// NodeClaims are what a node may claim in its heartbeats. A list that is
// set, even empty, is the whole of what the node may claim; a claim
// outside it is ignored and shown in the node's ClaimsAllowed condition.
type NodeClaims struct {
	// SharedPools are the shared storage pools the node may claim to
	// reach; VMs whose Volumes live in a pool are placed only on nodes
	// that reach it.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	SharedPools *[]string `json:"sharedPools,omitempty"`
	// TunnelCIDRs are where the node's overlay tunnel address must lie;
	// the other nodes send it their networks' frames.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.0.0.0/24"
	TunnelCIDRs *[]string `json:"tunnelCIDRs,omitempty"`
	// MigrationCIDRs are where the host of the node's migration URI must
	// lie, as an address: a guest's memory and disks are streamed there.
	// A URI whose host is a name is refused once this is set.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.0.0.0/24"
	MigrationCIDRs *[]string `json:"migrationCIDRs,omitempty"`
}

// DrainPhase is how far a drain got.
type DrainPhase string

// Drain phases.
const (
	// DrainDraining: VMs are being moved off the node.
	DrainDraining DrainPhase = "Draining"
	// DrainBlocked: VMs remain that no migration moves (evictionStrategy
	// None, or their migration failed); Message names them.
	DrainBlocked DrainPhase = "Blocked"
	// DrainDrained: no VM is left on the node.
	DrainDrained DrainPhase = "Drained"
)

// DrainStatus is the progress of a drain.
type DrainStatus struct {
	Phase DrainPhase `json:"phase"`
	// Remaining is how many VMs are still on the node, Migrating how many
	// of them are moving now.
	Remaining int32 `json:"remaining"`
	Migrating int32 `json:"migrating"`
	// Message names the VMs the drain waits for, and why.
	// +optional
	Message string `json:"message,omitempty"`
}

// NodeResources are amounts of what guests use on a node.
type NodeResources struct {
	// VCPU is a number of virtual CPUs.
	VCPU int64 `json:"vcpu"`
	// Memory is guest RAM.
	Memory resource.Quantity `json:"memory"`
	// Storage is the node's volume storage; omitted where the node does
	// not say.
	// +optional
	Storage *resource.Quantity `json:"storage,omitempty"`
}

// HypervisorNodeStatus is what the hub knows of a node from its heartbeats.
// It is written when something shown here changes, never per heartbeat.
type HypervisorNodeStatus struct {
	// Backend is the node's backend: libvirt, nova or kubevirt.
	Backend string `json:"backend,omitempty"`
	// Hypervisor is what the backend says it runs, for example "QEMU 7.2.0".
	// +optional
	Hypervisor string `json:"hypervisor,omitempty"`
	// AgentVersion is the version of the node's agent.
	// +optional
	AgentVersion string `json:"agentVersion,omitempty"`
	// Labels are the node's labels, which nodeSelectors match: the
	// administrator's spec.labels and what the heartbeats claim besides.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Capacity is what the node offers to guests.
	Capacity NodeResources `json:"capacity"`
	// Allocated is what the node's guests use, as its agent counts them.
	Allocated NodeResources `json:"allocated"`
	// VirtualMachines is how many VirtualMachines the hub placed on it.
	VirtualMachines int32 `json:"virtualMachines"`
	// Drain is the progress of the drain spec.drain asks for; unset when
	// the node is not being drained.
	// +optional
	Drain *DrainStatus `json:"drain,omitempty"`
	// Summary is "allocated/capacity" of vCPUs and memory, for kubectl get.
	// +optional
	Summary string `json:"summary,omitempty"`
	// Conditions: Ready is True while the node's heartbeats arrive and
	// False, with reason NodeLost and the time it was lost, once they
	// stopped.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition of a HypervisorNode.
const (
	// NodeConditionReady is the Ready condition's type.
	NodeConditionReady = "Ready"
	// NodeReasonHeartbeating: the node's heartbeats arrive.
	NodeReasonHeartbeating = "Heartbeating"
	// NodeReasonLost: the node's heartbeat expired.
	NodeReasonLost = "NodeLost"

	// NodeConditionClaimsAllowed is False while the hub ignores some of
	// what the node's heartbeats claim (spec.labels, spec.claims); its
	// message names each claim refused.
	NodeConditionClaimsAllowed = "ClaimsAllowed"
	// NodeReasonClaimsAllowed: every claim counts.
	NodeReasonClaimsAllowed = "Allowed"
	// NodeReasonClaimsRefused: some claims are ignored.
	NodeReasonClaimsRefused = "ClaimsRefused"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A HypervisorNode is one node of the fleet: a libvirt host, a Nova
// compute service or a KubeVirt cluster's node, as its agent's heartbeats
// describe it. The hub creates one for each node that sends a heartbeat and
// keeps its status; an administrator cordons the node in its spec. Deleting
// it forgets what the hub showed; a node that still sends heartbeats comes
// back.
// +kubebuilder:printcolumn:name="READY",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="CORDONED",type="boolean",JSONPath=".spec.unschedulable"
// +kubebuilder:printcolumn:name="DRAIN",type="string",JSONPath=".status.drain.phase"
// +kubebuilder:printcolumn:name="BACKEND",type="string",JSONPath=".status.backend"
// +kubebuilder:printcolumn:name="VMS",type="integer",JSONPath=".status.virtualMachines"
// +kubebuilder:printcolumn:name="ALLOCATED",type="string",JSONPath=".status.summary"
// +kubebuilder:printcolumn:name="AGENT",type="string",JSONPath=".status.agentVersion",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Cluster,shortName={hvnode,hvnodes},categories={virtfleet}
type HypervisorNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   HypervisorNodeSpec   `json:"spec,omitempty"`
	Status HypervisorNodeStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// HypervisorNodeList contains a list of HypervisorNode.
type HypervisorNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HypervisorNode `json:"items"`
}

// HypervisorNode type metadata.
var (
	HypervisorNodeKind             = reflect.TypeOf(HypervisorNode{}).Name()
	HypervisorNodeGroupVersionKind = SchemeGroupVersion.WithKind(HypervisorNodeKind)
)

func init() {
	SchemeBuilder.Register(&HypervisorNode{}, &HypervisorNodeList{})
}
