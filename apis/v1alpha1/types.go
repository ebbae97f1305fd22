package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// NATSCredentials are the hub's credentials for the NATS server.
// +kubebuilder:validation:XValidation:rule="self.source != 'Secret' || has(self.secretRef)",message="secretRef is required when source is Secret"
type NATSCredentials struct {
	// Source of the credentials: Secret (a NATS .creds file or user JWT and
	// seed, in the referenced key) or None (a NATS server without auth, for
	// development only).
	// +kubebuilder:validation:Enum=None;Secret
	Source xpv2.CredentialsSource `json:"source"`

	xpv2.CommonCredentialSelectors `json:",inline"`
}

// ProviderConfigSpec configures how the hub reaches the fleet.
type ProviderConfigSpec struct {
	// NATSURL is the NATS server (JetStream enabled) hub and agents share,
	// for example nats://nats.virtfleet-system:4222. Several URLs may be
	// given, comma separated.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^(nats|tls|ws|wss)://[^,[:space:]]+([[:space:]]*,[[:space:]]*(nats|tls|ws|wss)://[^,[:space:]]+)*$')",message="natsURL must be one or more nats://, tls://, ws:// or wss:// URLs, comma separated"
	NATSURL string `json:"natsURL"`

	// Credentials the hub uses with NATS.
	Credentials NATSCredentials `json:"credentials"`

	// NodeSelector is added to every VirtualMachine's own nodeSelector.
	// At most 32 labels, each a Kubernetes label: a key of at most 317
	// characters (a 253-character DNS prefix, "/" and a 63-character name)
	// and a value of at most 63.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && size(self[k]) <= 63)",message="nodeSelector keys must be at most 317 characters and values at most 63, as Kubernetes labels"
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Replicas is how many NATS servers hold each of virtfleet's JetStream
	// buckets: 1 for a single server, 3 for a NATS cluster, so that losing
	// a server loses nothing. The hub creates the buckets with it as soon
	// as the ProviderConfig exists, and brings existing ones to it.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	// +kubebuilder:default=1
	// +optional
	Replicas int `json:"replicas,omitempty"`
}

// ClusterProviderConfigSpec is a ProviderConfigSpec plus what only a
// cluster administrator may say: which namespaces may reach beyond what they
// own. A namespace's grants are the union of the grants naming it in every
// ClusterProviderConfig, whichever config its resources use; a namespaced
// ProviderConfig grants nothing, since its namespace's tenant may write it.
type ClusterProviderConfigSpec struct {
	ProviderConfigSpec `json:",inline"`

	// Grants allow namespaces what a tenant may not do by default: import
	// what virtfleet did not make for them, choose a node, join a host
	// bridge, fetch images from addresses outside the public internet.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Grants []TenantGrant `json:"grants,omitempty"`
}

// TenantGrant allows the namespaces it names to reach past what they own.
// Everything it does not say is refused.
type TenantGrant struct {
	// Namespaces the grant applies to; "*" means every namespace.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	// +listType=set
	Namespaces []string `json:"namespaces"`

	// Import lets these namespaces take over what virtfleet did not make
	// for them: an existing guest, volume or network of a node, named by
	// crossplane.io/external-name on a VirtualMachine, Volume or
	// VirtualNetwork, and then changed or deleted as the resource says.
	// +optional
	Import bool `json:"import,omitempty"`

	// ChooseNode lets these namespaces place a VirtualMachine or Volume on
	// a node of their choosing with the compute.virtfleet.io/node
	// annotation, which skips placement: capacity, node selectors and the
	// backend are not checked.
	// +optional
	ChooseNode bool `json:"chooseNode,omitempty"`

	// HostBridges are the host bridges these namespaces' bridge-mode
	// VirtualNetworks may join; "*" means any.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=15
	// +listType=set
	// +optional
	HostBridges []string `json:"hostBridges,omitempty"`

	// ImageSources are address blocks outside the public internet
	// (loopback, link-local, private, shared and unique-local ranges) that
	// these namespaces' DiskImages may be downloaded from, as CIDRs such as
	// 10.20.0.0/16. The node's agent checks every address it connects to,
	// after every redirect.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="imageSources must be CIDRs such as 10.20.0.0/16"
	// +listType=set
	// +optional
	ImageSources []string `json:"imageSources,omitempty"`

	// NetworkCIDRs are the address blocks, as CIDRs such as 10.20.0.0/16,
	// that the cidr of these namespaces' nat and isolated VirtualNetworks
	// must lie in. A namespace no grant gives networkCIDRs may use any
	// cidr no other VirtualNetwork overlaps; once a grant naming it (or
	// "*") gives some, it may use only theirs, so an administrator
	// confines every namespace with one grant to "*" and widens single
	// namespaces with grants of their own. Whatever the grants, a
	// network's cidr overlaps no other VirtualNetwork's, and a node
	// refuses to make one that overlaps a route it has.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="networkCIDRs must be CIDRs such as 10.20.0.0/16"
	// +listType=set
	// +optional
	NetworkCIDRs []string `json:"networkCIDRs,omitempty"`

	// BackupLocations are the BackupLocations these namespaces may back
	// their VMs up to and restore from; "*" means any. Each namespace
	// reads and deletes only its own backups there.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	BackupLocations []string `json:"backupLocations,omitempty"`

	// NATSServers are NATS servers, as host:port, that these namespaces'
	// ProviderConfigs may name besides those of ClusterProviderConfigs;
	// "*" means any. Each is a connection the hub holds open for them.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^(\*|[^\s,/]+:[0-9]{1,5})$`
	// +listType=set
	// +optional
	NATSServers []string `json:"natsServers,omitempty"`

	// RestoreFrom are other namespaces whose backups, in BackupLocations
	// these namespaces are granted, these namespaces may make DiskImages
	// of (a DiskImage's source.backup.namespace); "*" means any. It is how
	// the backups of a namespace that is gone come back in another.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	// +listType=set
	// +optional
	RestoreFrom []string `json:"restoreFrom,omitempty"`
}

// ProviderConfigStatus is the status of a ProviderConfig.
type ProviderConfigStatus struct {
	xpv2.ProviderConfigStatus `json:",inline"`
}

// +kubebuilder:object:root=true
// +kubebuilder:storageversion

// A ProviderConfig configures how virtfleet's hub reaches the fleet for
// managed resources in its namespace.
// +kubebuilder:printcolumn:name="NATS",type="string",JSONPath=".spec.natsURL"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="SECRET-NAME",type="string",JSONPath=".spec.credentials.secretRef.name",priority=1
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,provider,virtfleet}
type ProviderConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProviderConfigSpec   `json:"spec"`
	Status ProviderConfigStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ProviderConfigList contains a list of ProviderConfig.
type ProviderConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderConfig `json:"items"`
}

// +kubebuilder:object:root=true

// A ClusterProviderConfig configures how virtfleet's hub reaches the fleet
// for managed resources in any namespace. Resources without a
// providerConfigRef use the one named "default".
// +kubebuilder:printcolumn:name="NATS",type="string",JSONPath=".spec.natsURL"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="SECRET-NAME",type="string",JSONPath=".spec.credentials.secretRef.name",priority=1
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories={crossplane,provider,virtfleet}
type ClusterProviderConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterProviderConfigSpec `json:"spec"`
	Status ProviderConfigStatus      `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ClusterProviderConfigList contains a list of ClusterProviderConfig.
type ClusterProviderConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterProviderConfig `json:"items"`
}
