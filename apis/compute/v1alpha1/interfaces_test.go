package v1alpha1

import (
	xpresource "github.com/crossplane/crossplane-runtime/v2/pkg/resource"
)

// The method sets angryjet generates make every kind a crossplane-runtime
// managed resource. The checks live in a test file so that angryjet can load
// the package before those methods exist.
var (
	_ xpresource.ModernManaged = &VirtualMachine{}
	_ xpresource.ManagedList   = &VirtualMachineList{}
	_ xpresource.ModernManaged = &Volume{}
	_ xpresource.ManagedList   = &VolumeList{}
	_ xpresource.ModernManaged = &VirtualNetwork{}
	_ xpresource.ManagedList   = &VirtualNetworkList{}
	_ xpresource.ModernManaged = &DiskImage{}
	_ xpresource.ManagedList   = &DiskImageList{}
)
