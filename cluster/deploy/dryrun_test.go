package deploy_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
)

// crossplaneModule holds Crossplane's CRDs in cluster/crds; it is the version
// package/configuration is written for (apiextensions.crossplane.io/v2
// XRDs, pkg.crossplane.io/v1beta1 Functions).
const crossplaneModule = "github.com/crossplane/crossplane/v2@v2.4.0"

const dryRunOwner = "virtfleet-dryrun"

// TestManifestsPassServerSideDryRun server-side applies, with dryRun=All,
// every manifest a user applies: cluster/deploy and package/api as `kubectl
// apply -k` renders them, examples/, package/examples/, package/install.yaml
// and sizes.yaml. The
// API server validates each object
// against its built-in or CRD schema (including CEL rules) and runs
// admission, but stores nothing. Kinds whose CRDs are not served here are
// skipped with a log line naming them.
func TestManifestsPassServerSideDryRun(t *testing.T) {
	ctx := context.Background()
	cp := controlplane.StartForTest(t)
	root := controlplane.RepoRoot()

	if dir, err := crossplaneCRDs(t); err != nil {
		t.Logf("SKIPPING Crossplane's kinds: cannot obtain Crossplane's CRDs from %s: %v", crossplaneModule, err)
	} else {
		crds, err := envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{Paths: []string{dir}, ErrorIfPathMissing: true})
		require.NoError(t, err, "installing Crossplane's CRDs from %s", dir)
		t.Logf("installed %d Crossplane CRDs from %s", len(crds), crossplaneModule)
	}

	deploy := kustomize(t, cp.Kubectl, filepath.Join(root, "cluster", "deploy"))
	pkgAPI := kustomize(t, cp.Kubectl, filepath.Join(root, "package", "api"))
	examples, err := manifests.Load(filepath.Join(root, "examples"))
	require.NoError(t, err)
	pkgExamples, err := manifests.Load(filepath.Join(root, "package", "examples"))
	require.NoError(t, err)
	pkgConfiguration, err := manifests.Load(filepath.Join(root, "package", "configuration"))
	require.NoError(t, err)
	pkgInstall, err := manifests.Load(filepath.Join(root, "package", "install.yaml"), filepath.Join(root, "package", "sizes.yaml"))
	require.NoError(t, err)
	sets := map[string][]*unstructured.Unstructured{
		"cluster/deploy":        deploy,
		"examples":              examples,
		"package/examples":      pkgExamples,
		"package/configuration": pkgConfiguration,
		"package/install":       pkgInstall,
		"package/api":           pkgAPI,
	}
	for name, objs := range sets {
		require.NotEmpty(t, objs, "%s has no manifests", name)
	}

	// The namespaces are created for real: a dry-run of a namespaced object
	// in a namespace that does not exist is refused.
	for _, objs := range sets {
		for _, o := range objs {
			if ns := o.GetNamespace(); ns != "" {
				err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
				if !kerrors.IsAlreadyExists(err) {
					require.NoError(t, err, "creating namespace %s", ns)
				}
			}
		}
	}

	var applied, skipped int
	for _, name := range []string{"cluster/deploy", "examples", "package/configuration", "package/examples", "package/install", "package/api"} {
		t.Run(name, func(t *testing.T) {
			for _, o := range sets[name] {
				id := o.GetAPIVersion() + " " + o.GetKind() + " " + strings.TrimPrefix(o.GetNamespace()+"/"+o.GetName(), "/")
				if _, err := cp.Client.RESTMapper().RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version); err != nil {
					require.True(t, meta.IsNoMatchError(err), "%s: %v", id, err)
					t.Logf("SKIPPED %s: the API server does not serve this kind (%s)", id, whyNotServed(o))
					skipped++
					continue
				}
				err := cp.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner(dryRunOwner), client.ForceOwnership, client.DryRunAll)
				assert.NoError(t, err, "server-side dry-run apply of %s", id)
				applied++
			}
		})
	}
	t.Logf("dry-run applied %d objects, skipped %d", applied, skipped)

	// The dry-run stored nothing: none of the objects exists afterwards
	// (the namespaces created above aside).
	t.Run("NothingPersisted", func(t *testing.T) {
		for _, objs := range sets {
			for _, o := range objs {
				if o.GetKind() == "Namespace" && o.GetAPIVersion() == "v1" {
					continue
				}
				if _, err := cp.Client.RESTMapper().RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version); err != nil {
					continue
				}
				got := &unstructured.Unstructured{}
				got.SetGroupVersionKind(o.GroupVersionKind())
				err := cp.Client.Get(ctx, client.ObjectKeyFromObject(o), got)
				assert.True(t, kerrors.IsNotFound(err), "%s %s/%s exists after a dry-run: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		}
	})

	// The dry-run is not vacuous: the same call refuses an invalid
	// VirtualMachine, naming the field.
	t.Run("RefusesInvalidVirtualMachine", func(t *testing.T) {
		var vm *unstructured.Unstructured
		for _, o := range examples {
			if o.GetKind() == "VirtualMachine" {
				vm = o.DeepCopy()
				break
			}
		}
		require.NotNil(t, vm)
		require.NoError(t, unstructured.SetNestedField(vm.Object, int64(0), "spec", "forProvider", "vcpu"))
		err := cp.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(vm), client.FieldOwner(dryRunOwner), client.ForceOwnership, client.DryRunAll)
		require.Error(t, err)
		assert.True(t, kerrors.IsInvalid(err), "want Invalid, got %v", err)
		assert.Contains(t, err.Error(), "spec.forProvider.vcpu")
	})
}

// whyNotServed explains a kind skipped by the dry-run.
func whyNotServed(o *unstructured.Unstructured) string {
	switch {
	case o.GroupVersionKind().Group == "kustomize.config.k8s.io":
		return "a kustomize file, not an API object"
	case o.GroupVersionKind().Group == "platform.virtfleet.io":
		return "its CRD is rendered from package/configuration's XRDs by Crossplane's XRD controller, which does not run here"
	case strings.HasSuffix(o.GroupVersionKind().Group, "crossplane.io"):
		return "Crossplane's CRDs are not installed"
	default:
		return "no CRD installed for it"
	}
}

// crossplaneCRDs returns the cluster/crds directory of crossplaneModule in
// the module cache, downloading the module (through GOPROXY, checked against
// GOSUMDB) outside this module so go.mod and go.sum stay untouched.
func crossplaneCRDs(t *testing.T) (string, error) {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", crossplaneModule)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); jerr != nil {
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				return "", &downloadError{string(ee.Stderr)}
			}
			return "", err
		}
		return "", jerr
	}
	if m.Error != "" {
		return "", &downloadError{m.Error}
	}
	dir := filepath.Join(m.Dir, "cluster", "crds")
	if _, err := os.Stat(dir); err != nil {
		return "", err
	}
	return dir, nil
}

type downloadError struct{ msg string }

func (e *downloadError) Error() string { return strings.TrimSpace(e.msg) }

// kustomize renders dir with the kubectl built for the control plane, as
// `kubectl apply -k dir` would.
func kustomize(t *testing.T, kubectl, dir string) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.Command(kubectl, "kustomize", dir)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		require.NoError(t, err, string(ee.Stderr))
	}
	require.NoError(t, err)
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(out)), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			require.ErrorIs(t, err, io.EOF)
			return objs
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}
