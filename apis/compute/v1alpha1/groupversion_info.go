// Package v1alpha1 holds the compute.virtfleet.io managed resources:
// VirtualMachine, Volume, VirtualNetwork and DiskImage. All are namespaced
// Crossplane v2 managed resources: spec.forProvider is what the user wants,
// status.atProvider is what the node's agent observed.
// +kubebuilder:object:generate=true
// +groupName=compute.virtfleet.io
// +versionName=v1alpha1
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// Package type metadata.
const (
	Group   = "compute.virtfleet.io"
	Version = "v1alpha1"
)

var (
	// SchemeGroupVersion is the group version used to register these objects.
	SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

	// SchemeBuilder is used to add Go types to the GroupVersionKind scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: SchemeGroupVersion}

	// AddToScheme adds the types of this group to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
