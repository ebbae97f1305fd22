package kubevirttest

// KubeVirt ships no CRD files: virt-operator builds its CRDs in Go
// (pkg/virt-operator/resource/generate/components/crds.go) around validation
// schemas that KubeVirt's hack/generate.sh makes with controller-gen from
// kubevirt.io/api (`controller-gen crd:allowDangerousTypes=true
// paths=.../api/core/v1/`). We run the same generator on the kubevirt.io/api
// in go.mod and keep the three CRDs the driver uses; CRDs adds what the
// operator adds around the schema (short names, the status subresources).
// Descriptions are dropped to keep the files small.

//go:generate rm -rf testdata/crds
//go:generate go tool -modfile=../../../hack/tools/go.mod controller-gen crd:crdVersions=v1,allowDangerousTypes=true,maxDescLen=0 paths=kubevirt.io/api/core/v1 output:crd:dir=testdata/crds
//go:generate find testdata/crds -type f ! -name kubevirt.io_virtualmachines.yaml ! -name kubevirt.io_virtualmachineinstances.yaml ! -name kubevirt.io_virtualmachineinstancemigrations.yaml -delete
