package kubevirttest

// KubeVirt ships no CRD files: virt-operator builds its CRDs in Go
// (pkg/virt-operator/resource/generate/components/crds.go) around validation
// schemas that KubeVirt's hack/generate.sh makes with controller-gen from
// kubevirt.io/api (`controller-gen crd:allowDangerousTypes=true
// paths=.../api/core/v1/`, and likewise for .../api/snapshot/v1beta1/ and
// .../api/instancetype/v1beta1/). We run the same generator on the
// kubevirt.io/api in go.mod and keep the eight CRDs the driver uses; CRDs adds what the operator adds around the schema
// (short names, the status subresources).
//
// CDI's operator installs the CRDs its hack/update-codegen.sh makes with
// controller-gen from the containerized-data-importer-api module
// (`controller-gen crd:crdVersions=v1 paths=./pkg/apis/core/...`) as they
// are. We run it on the module in go.mod and keep the DataVolume CRD alone.
//
// Descriptions are dropped to keep the files small.

//go:generate rm -rf testdata/crds
//go:generate go tool -modfile=../../../hack/tools/go.mod controller-gen crd:crdVersions=v1,allowDangerousTypes=true,maxDescLen=0 paths=kubevirt.io/api/core/v1 output:crd:dir=testdata/crds
//go:generate go tool -modfile=../../../hack/tools/go.mod controller-gen crd:crdVersions=v1,allowDangerousTypes=true,maxDescLen=0 paths=kubevirt.io/api/snapshot/v1beta1 output:crd:dir=testdata/crds
//go:generate go tool -modfile=../../../hack/tools/go.mod controller-gen crd:crdVersions=v1,allowDangerousTypes=true,maxDescLen=0 paths=kubevirt.io/api/instancetype/v1beta1 output:crd:dir=testdata/crds
//go:generate go tool -modfile=../../../hack/tools/go.mod controller-gen crd:crdVersions=v1,maxDescLen=0 paths=kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1 output:crd:dir=testdata/crds
//go:generate find testdata/crds -type f ! -name kubevirt.io_virtualmachines.yaml ! -name kubevirt.io_virtualmachineinstances.yaml ! -name kubevirt.io_virtualmachineinstancemigrations.yaml ! -name snapshot.kubevirt.io_virtualmachinesnapshots.yaml ! -name snapshot.kubevirt.io_virtualmachinesnapshotcontents.yaml ! -name snapshot.kubevirt.io_virtualmachinerestores.yaml ! -name cdi.kubevirt.io_datavolumes.yaml ! -name instancetype.kubevirt.io_virtualmachineinstancetypes.yaml ! -name instancetype.kubevirt.io_virtualmachineclusterinstancetypes.yaml -delete
