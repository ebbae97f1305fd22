package v1alpha1

import (
	xpresource "github.com/crossplane/crossplane-runtime/v2/pkg/resource"
)

// The method sets angryjet generates make these crossplane-runtime provider
// configs. The checks live in a test file so that angryjet can
// load the package before those methods exist.
var (
	_ xpresource.ProviderConfig = &ProviderConfig{}
	_ xpresource.ProviderConfig = &ClusterProviderConfig{}
)
