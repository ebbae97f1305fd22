// Code generation for the API types, run by `make generate`. The generators
// live in their own module (hack/tools/go.mod) so their dependencies never
// move the project's Kubernetes libraries.

// Remove the CRDs so renamed or deleted types leave nothing behind.
//go:generate rm -rf ../package/crds

// Deepcopy methods and CRD manifests.
//go:generate go tool -modfile=../hack/tools/go.mod controller-gen object:headerFile=../hack/boilerplate.go.txt paths=./... crd:crdVersions=v1 output:artifacts:config=../package/crds

// crossplane-runtime method sets (resource.ModernManaged, ProviderConfig …).
//go:generate go tool -modfile=../hack/tools/go.mod angryjet generate-methodsets --header-file=../hack/boilerplate.go.txt ./...

package apis
