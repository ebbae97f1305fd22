package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// QuotaAmounts are amounts of what a namespace holds of the fleet. In a
// TenantQuota's spec an amount left out is not limited.
type QuotaAmounts struct {
	// VMs is the number of VirtualMachines bound to a node, and of guests
	// orphaned from the namespace's VMs that still run.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VMs *int64 `json:"vms,omitempty"`

	// VCPU is their virtual CPUs, as they run: a VM of an instance type
	// counts the type's.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VCPU *int64 `json:"vcpu,omitempty"`

	// Memory is their memory, as they run.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",messageExpression="'memory must not be negative, got ' + string(self)"
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// Storage is the size of the namespace's Volumes on a node or shared
	// pool plus what its snapshots hold there: a snapshot taken counts its
	// reported size, one being taken the size of its VM's disks (and
	// memory, with includeMemory), which it may grow to. Backups are not
	// counted: they leave the fleet for an object store.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",messageExpression="'storage must not be negative, got ' + string(self)"
	// +optional
	Storage *resource.Quantity `json:"storage,omitempty"`

	// Volumes is the number of Volumes bound to a node (made there, or
	// imported).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Volumes *int64 `json:"volumes,omitempty"`

	// Snapshots is the number of VirtualMachineSnapshots a node was asked
	// to take and that did not fail.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Snapshots *int64 `json:"snapshots,omitempty"`

	// Addresses is the number of addresses the hub gave the namespace's
	// VMs on its VirtualNetworks (NetworkAddresses).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Addresses *int64 `json:"addresses,omitempty"`
}

// TenantQuotaSpec is what an administrator allows one namespace.
type TenantQuotaSpec struct {
	// Namespace the limits apply to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// Hard are the limits. A VirtualMachine whose placement would take
	// the namespace past one (with the Volumes and addresses it would be
	// given) stays Pending, saying which, and is placed once the namespace
	// holds less or the limit is raised. A snapshot that would pass one
	// fails before any node is asked for it.
	Hard QuotaAmounts `json:"hard"`
}

// TenantQuotaStatus is what the namespace holds.
type TenantQuotaStatus struct {
	// Used is what the namespace holds now, whether limited or not.
	// +optional
	Used QuotaAmounts `json:"used,omitempty"`

	// Summary is used against hard for each limit, as kubectl shows a
	// ResourceQuota: "vms: 2/4, vcpu: 6/8, memory: 4Gi/8Gi".
	// +optional
	Summary string `json:"summary,omitempty"`
}

// +kubebuilder:object:root=true

// A TenantQuota limits what one namespace may hold of the fleet: VMs, vCPU,
// memory, storage, Volumes, snapshots and addresses. It is cluster-scoped, so a tenant with edit rights in its
// namespace cannot raise its own limits. Several TenantQuotas of one
// namespace all apply.
// +kubebuilder:printcolumn:name="NAMESPACE",type="string",JSONPath=".spec.namespace"
// +kubebuilder:printcolumn:name="USED",type="string",JSONPath=".status.summary"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tquota,categories={virtfleet}
type TenantQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantQuotaSpec   `json:"spec"`
	Status TenantQuotaStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// TenantQuotaList contains a list of TenantQuota.
type TenantQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantQuota `json:"items"`
}
