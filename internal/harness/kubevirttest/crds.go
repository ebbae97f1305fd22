// Package kubevirttest runs a simulated KubeVirt cluster for tests and the
// test stack: a real kube-apiserver (internal/harness/controlplane) with KubeVirt's
// VirtualMachine, VirtualMachineInstance and VirtualMachineInstanceMigration
// CRDs, its snapshot.kubevirt.io and instancetype.kubevirt.io CRDs and
// CDI's DataVolume CRD, schedulable
// Nodes, FakeVirtController, an in-process stand-in for virt-controller
// (its snapshot and restore controllers included) and virt-handler, a
// stand-in for
// virt-api's subresource API (pause and unpause), aggregated by the API
// server as KubeVirt's is, with virt-api's VM admission as far as
// instance types go (instancetype.go), and FakeCDI, a stand-in for CDI's DataVolume
// controller and importer. No KubeVirt or CDI component runs: no pod, no
// QEMU.
package kubevirttest

import (
	"os"
	"path/filepath"
	"runtime"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	snapshotv1 "kubevirt.io/api/snapshot/v1beta1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// CRDDir holds the CRDs `go generate` makes from kubevirt.io/api and CDI's
// API.
func CRDDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", "crds")
}

// CRDs are KubeVirt's VirtualMachine, VirtualMachineInstance,
// VirtualMachineInstanceMigration, VirtualMachineSnapshot,
// VirtualMachineSnapshotContent, VirtualMachineRestore,
// VirtualMachineInstancetype and VirtualMachineClusterInstancetype CRDs as
// virt-operator installs them: the generated schemas plus the operator's
// short names, and the status subresource on all but the VMI and the
// instance types — KubeVirt serves the VMI without one, so its status is
// written with the object, and an instance type has no status —
// and CDI's DataVolume CRD as CDI's operator installs it, as generated (its
// markers give its short names, categories and status subresource).
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	shortNames := map[string][]string{
		"virtualmachines.kubevirt.io":                                 {"vm", "vms"},
		"virtualmachineinstances.kubevirt.io":                         {"vmi", "vmis"},
		"virtualmachineinstancemigrations.kubevirt.io":                {"vmim", "vmims"},
		"virtualmachinesnapshots.snapshot.kubevirt.io":                {"vmsnapshot", "vmsnapshots"},
		"virtualmachinesnapshotcontents.snapshot.kubevirt.io":         {"vmsnapshotcontent", "vmsnapshotcontents"},
		"virtualmachinerestores.snapshot.kubevirt.io":                 {"vmrestore", "vmrestores"},
		"virtualmachineinstancetypes.instancetype.kubevirt.io":        {"vminstancetype", "vminstancetypes", "vmf", "vmfs"},
		"virtualmachineclusterinstancetypes.instancetype.kubevirt.io": {"vmclusterinstancetype", "vmclusterinstancetypes", "vmcf", "vmcfs"},
	}
	files, err := filepath.Glob(filepath.Join(CRDDir(), "*.yaml"))
	if err != nil {
		return nil, errors.Wrap(err, "cannot list the KubeVirt and CDI CRDs")
	}
	crds := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f) //nolint:gosec // our own testdata
		if err != nil {
			return nil, errors.Wrap(err, "cannot read a CRD")
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(b, crd); err != nil {
			return nil, errors.Wrapf(err, "cannot decode %s", f)
		}
		if crd.Spec.Group == cdiv1.SchemeGroupVersion.Group {
			crds = append(crds, crd)
			continue
		}
		crd.Spec.Names.ShortNames = shortNames[crd.Name]
		if crd.Spec.Names.Kind == kindClusterInstancetype {
			// Its +genclient:nonNamespaced marker is client-gen's, which
			// controller-gen does not read; virt-operator sets the scope.
			crd.Spec.Scope = apiextensionsv1.ClusterScoped
		}
		crd.Spec.Names.Categories = []string{"all"}
		if crd.Spec.Names.Kind != "VirtualMachineInstance" && crd.Spec.Group != instancetypev1beta1.SchemeGroupVersion.Group {
			for i := range crd.Spec.Versions {
				crd.Spec.Versions[i].Subresources = &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}
			}
		}
		crds = append(crds, crd)
	}
	if len(crds) != len(shortNames)+1 {
		return nil, errors.Errorf("found %d CRDs in %s, want %d: run make generate", len(crds), CRDDir(), len(shortNames)+1)
	}
	return crds, nil
}

// AddToScheme registers the Kubernetes, KubeVirt (snapshots included) and
// CDI types, and the
// APIService the subresource API is registered with.
func AddToScheme(s *k8sruntime.Scheme) error {
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot register Kubernetes types")
	}
	if err := apiregistrationv1.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot register the APIService type")
	}
	if err := kubevirtv1.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot register KubeVirt types")
	}
	if err := snapshotv1.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot register KubeVirt's snapshot types")
	}
	if err := instancetypev1beta1.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot register KubeVirt's instance types")
	}
	return errors.Wrap(cdiv1.AddToScheme(s), "cannot register CDI types")
}
