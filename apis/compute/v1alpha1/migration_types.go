package v1alpha1

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VirtualMachineMigrationSpec names the VirtualMachine to move.
type VirtualMachineMigrationSpec struct {
	// VMName is the VirtualMachine to migrate, in the migration's
	// namespace. It must be Running.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="vmName is immutable: create another migration"
	VMName LocalName `json:"vmName"`
	// TargetNode is the node to move the VM to. Placement's rules apply
	// to it as to any node: its backend, the VM's nodeSelector, free
	// capacity, not cordoned. Naming one is allowed only where a cluster
	// administrator let the namespace choose nodes (TenantGrant
	// chooseNode). Empty lets the hub choose.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="targetNode is immutable: create another migration"
	TargetNode string `json:"targetNode,omitempty"`
}

// MigrationPhase is how far a VirtualMachineMigration got.
type MigrationPhase string

// Migration phases, in the order a successful migration walks through them.
const (
	// MigrationPending: waiting for a target, for the VM, or for a free
	// slot under the migration limits.
	MigrationPending MigrationPhase = "Pending"
	// MigrationScheduled: the target is chosen and gets ready for the VM.
	MigrationScheduled MigrationPhase = "Scheduled"
	// MigrationRunning: the guest's memory and disks are being copied.
	MigrationRunning MigrationPhase = "Running"
	// MigrationSucceeded: the guest runs on the target, and nothing of it
	// is left on the source.
	MigrationSucceeded MigrationPhase = "Succeeded"
	// MigrationFailed: the VM runs where it ran; Message says why.
	MigrationFailed MigrationPhase = "Failed"
)

// VirtualMachineMigrationStatus is what the hub and the nodes observed.
// MigrationNoTarget begins the message of a Pending migration that waits
// because no node can take its VM (capacity, selectors, a placement
// group's rule); a drain that needs the migration is Blocked meanwhile.
const MigrationNoTarget = "no node can take the VM"

type VirtualMachineMigrationStatus struct {
	// Phase is how far the migration got.
	// +optional
	Phase MigrationPhase `json:"phase,omitempty"`
	// SourceNode is where the VM ran when the migration started.
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// TargetNode is where the VM goes.
	// +optional
	TargetNode string `json:"targetNode,omitempty"`
	// StartTime is when the source node started copying the guest;
	// EndTime when the migration succeeded or failed.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	EndTime *metav1.Time `json:"endTime,omitempty"`
	// TotalBytes is what is to be transferred, memory and disks, as the
	// hypervisor knows it; TransferredBytes what was.
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`
	// +optional
	TransferredBytes int64 `json:"transferredBytes,omitempty"`
	// DowntimeMilliseconds is how long the guest was paused to switch
	// over, as the hypervisor reports it.
	// +optional
	DowntimeMilliseconds int64 `json:"downtimeMilliseconds,omitempty"`
	// Message says what the migration waits for, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A VirtualMachineMigration moves a running VirtualMachine live to another
// node, as KubeVirt's VirtualMachineInstanceMigration does: its memory and
// its node-local disks are copied while it runs, and it keeps its
// addresses. The VM's node changes only once the guest runs on the target;
// a migration that fails leaves it running where it was. A drain of a
// HypervisorNode creates one per VM of the node.
// +kubebuilder:printcolumn:name="VM",type="string",JSONPath=".spec.vmName"
// +kubebuilder:printcolumn:name="PHASE",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="SOURCE",type="string",JSONPath=".status.sourceNode"
// +kubebuilder:printcolumn:name="TARGET",type="string",JSONPath=".status.targetNode"
// +kubebuilder:printcolumn:name="DOWNTIME(MS)",type="integer",JSONPath=".status.downtimeMilliseconds",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmim,vmims},categories={virtfleet}
type VirtualMachineMigration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineMigrationSpec   `json:"spec"`
	Status VirtualMachineMigrationStatus `json:"status,omitempty"`
}

// Done is whether the migration is over, succeeded or failed.
func (m *VirtualMachineMigration) Done() bool {
	return m.Status.Phase == MigrationSucceeded || m.Status.Phase == MigrationFailed
}

// +kubebuilder:object:root=true

// VirtualMachineMigrationList contains a list of VirtualMachineMigration.
type VirtualMachineMigrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineMigration `json:"items"`
}

// VirtualMachineMigration type metadata.
var (
	VirtualMachineMigrationKind             = reflect.TypeOf(VirtualMachineMigration{}).Name()
	VirtualMachineMigrationGroupVersionKind = SchemeGroupVersion.WithKind(VirtualMachineMigrationKind)
)

func init() {
	SchemeBuilder.Register(&VirtualMachineMigration{}, &VirtualMachineMigrationList{})
}
