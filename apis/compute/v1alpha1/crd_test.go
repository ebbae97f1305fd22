package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/testing/controlplane"
	"github.com/virtfleet/virtfleet/internal/testing/manifests"
)

// TestCRDs installs the generated CRDs into a real kube-apiserver and pins
// what users see: defaults, validation messages, printer columns and field
// documentation. One control plane serves all subtests.
func TestCRDs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	ctx := context.Background()

	examples := filepath.Join(controlplane.RepoRoot(), "examples")
	_, err := cp.Apply(ctx, examples)
	require.NoError(t, err, "every example must be accepted by the API server")

	t.Run("SeedExampleReadsBackWithDefaults", func(t *testing.T) {
		vm := &computev1alpha1.VirtualMachine{}
		require.NoError(t, cp.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "sample-vm"}, vm))
		fp := vm.Spec.ForProvider
		assert.True(t, fp.IsRunning())
		assert.Equal(t, int32(3), fp.Vcpu)
		assert.Equal(t, "500Mi", fp.Memory.String())
		require.NotNil(t, fp.Swap)
		assert.Equal(t, "1Gi", fp.Swap.String())
		assert.Equal(t, []computev1alpha1.LocalName{"net-db", "net-backend", "net-frontend"}, fp.VirtualNetworks)
		assert.Len(t, fp.DiskAttachments, 3)
		require.NotNil(t, vm.Spec.ProviderConfigReference, "providerConfigRef defaults to the ClusterProviderConfig named default")
		assert.Equal(t, "ClusterProviderConfig", vm.Spec.ProviderConfigReference.Kind)
		assert.Equal(t, "default", vm.Spec.ProviderConfigReference.Name)
	})

	t.Run("MinimalVirtualMachineGetsDefaults", func(t *testing.T) {
		u := validVM("minimal")
		delete(forProvider(u), "running")
		delete(forProvider(u), "swap")
		require.NoError(t, cp.Client.Create(ctx, u))

		vm := &computev1alpha1.VirtualMachine{}
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(u), vm))
		require.NotNil(t, vm.Spec.ForProvider.Running, "running is defaulted by the schema, not only by IsRunning")
		assert.True(t, *vm.Spec.ForProvider.Running)
		require.NotNil(t, vm.Spec.ForProvider.Swap)
		assert.True(t, vm.Spec.ForProvider.Swap.IsZero(), "swap defaults to 0, got %s", vm.Spec.ForProvider.Swap)
		assert.Equal(t, []string{"*"}, managementPolicies(vm))
	})

	t.Run("InvalidVirtualMachinesAreRejectedNamingTheField", func(t *testing.T) {
		for _, tc := range invalidVMs() {
			t.Run(tc.name, func(t *testing.T) {
				u := validVM("bad-" + strings.ToLower(strings.ReplaceAll(tc.name, " ", "-")))
				tc.mutate(forProvider(u))
				err := cp.Client.Create(ctx, u)
				require.Error(t, err, "the API server accepted %v", forProvider(u))
				t.Logf("rejected: %v", err)
				for _, want := range tc.want {
					assert.Contains(t, err.Error(), want)
				}
			})
		}
	})

	t.Run("InvalidOtherKindsAreRejectedNamingTheField", func(t *testing.T) {
		for _, tc := range invalidOthers() {
			t.Run(tc.name, func(t *testing.T) {
				err := cp.Client.Create(ctx, tc.obj)
				require.Error(t, err)
				t.Logf("rejected: %v", err)
				for _, want := range tc.want {
					assert.Contains(t, err.Error(), want)
				}
			})
		}
	})

	t.Run("TableColumns", func(t *testing.T) {
		cols := tableColumns(t, cp.Config, "/apis/compute.virtfleet.io/v1alpha1/namespaces/default/virtualmachines")
		var all, normal []string
		for _, c := range cols {
			name := strings.ToUpper(c.Name)
			all = append(all, name)
			if c.Priority == 0 {
				normal = append(normal, name)
			}
		}
		assert.Equal(t, []string{"NAME", "STATUS", "RESTARTS", "AGE"}, normal, "kubectl get vm")
		assert.Equal(t, []string{"NAME", "STATUS", "RESTARTS", "AGE", "NODE", "NETWORKS(IP)", "READY", "SYNCED"}, all, "kubectl get vm -o wide")
	})

	t.Run("KubectlShowsStatusInTheSeedColumns", func(t *testing.T) {
		vm := &computev1alpha1.VirtualMachine{}
		require.NoError(t, cp.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "sample-vm"}, vm))
		vm.Status.AtProvider = computev1alpha1.VirtualMachineObservation{
			Phase: computev1alpha1.PhaseRunning,
			Node:  "node2",
			IP:    "net-db(10.10.120.21), net-backend(10.10.150.12)",
		}
		require.NoError(t, cp.Client.Status().Update(ctx, vm))

		header, row := kubectl(t, cp, "get", "vm", "sample-vm", "-n", "default")
		assert.Equal(t, []string{"NAME", "STATUS", "RESTARTS", "AGE"}, strings.Fields(header))
		assert.Equal(t, []string{"sample-vm", "Running", "0"}, strings.Fields(row)[:3])

		header, row = kubectl(t, cp, "get", "vms", "sample-vm", "-n", "default", "-o", "wide")
		assert.Equal(t, []string{"NAME", "STATUS", "RESTARTS", "AGE", "NODE", "NETWORKS(IP)", "READY", "SYNCED"}, strings.Fields(header))
		assert.Contains(t, row, "node2")
		assert.Contains(t, row, "net-db(10.10.120.21), net-backend(10.10.150.12)")
	})

	t.Run("KubectlExplainDocumentsFields", func(t *testing.T) {
		out, err := exec.Command(cp.Kubectl, "--kubeconfig", cp.Kubeconfig, "explain", "vm.spec.forProvider").CombinedOutput()
		require.NoError(t, err, string(out))
		for _, want := range []string{"vcpu", "Vcpu is the number of virtual CPUs", "diskAttachments", "The first is the", "running"} {
			assert.Contains(t, string(out), want)
		}
	})

	t.Run("ShortNamesAndCategories", func(t *testing.T) {
		for _, args := range [][]string{{"get", "vm", "-A"}, {"get", "vms", "-A"}, {"get", "virtfleet", "-A"}, {"get", "managed", "-A"}} {
			out, err := exec.Command(cp.Kubectl, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...).CombinedOutput()
			require.NoError(t, err, string(out))
			assert.Contains(t, string(out), "sample-vm", "kubectl %v", args)
		}
	})
}

type invalidCase struct {
	name   string
	mutate func(forProvider map[string]any)
	want   []string // substrings of the API server's error: the field, and why
}

func invalidVMs() []invalidCase {
	disks := func(names ...string) []any {
		out := make([]any, 0, len(names))
		for _, n := range names {
			out = append(out, map[string]any{"name": n})
		}
		return out
	}
	set := func(k string, v any) func(map[string]any) { return func(fp map[string]any) { fp[k] = v } }
	unset := func(k string) func(map[string]any) { return func(fp map[string]any) { delete(fp, k) } }
	return []invalidCase{
		{"vcpu zero", set("vcpu", 0), []string{"spec.forProvider.vcpu", "greater than or equal to 1"}},
		{"vcpu negative", set("vcpu", -2), []string{"spec.forProvider.vcpu", "greater than or equal to 1"}},
		{"vcpu wrong type", set("vcpu", "three"), []string{"spec.forProvider.vcpu", "must be of type integer"}},
		{"vcpu missing", unset("vcpu"), []string{"spec.forProvider.vcpu", "Required value"}},
		{"memory negative", set("memory", "-1Gi"), []string{"spec.forProvider.memory", "memory must be greater than 0, got -1Gi"}},
		{"memory zero", set("memory", "0"), []string{"spec.forProvider.memory", "memory must be greater than 0"}},
		{"memory not a quantity", set("memory", "lots"), []string{"spec.forProvider.memory"}},
		{"memory wrong type", set("memory", true), []string{"spec.forProvider.memory"}},
		{"memory missing", unset("memory"), []string{"spec.forProvider.memory", "Required value"}},
		{"swap negative", set("swap", "-512Mi"), []string{"spec.forProvider.swap", "swap must not be negative"}},
		{"running wrong type", set("running", "yes"), []string{"spec.forProvider.running", "must be of type boolean"}},
		{"no disks", set("diskAttachments", []any{}), []string{"spec.forProvider.diskAttachments", "at least 1 items"}},
		{"disks missing", unset("diskAttachments"), []string{"spec.forProvider.diskAttachments", "Required value"}},
		{"duplicate disk names", set("diskAttachments", disks("root", "data", "root")), []string{"spec.forProvider.diskAttachments[2]", "Duplicate value"}},
		{"bad disk name", set("diskAttachments", disks("Root_Disk")), []string{"spec.forProvider.diskAttachments[0].name", `"Root_Disk" is not a valid name`}},
		{"bad network name", set("virtualNetworks", []any{"net-db", "Net.Backend"}), []string{"spec.forProvider.virtualNetworks[1]", `"Net.Backend" is not a valid name`}},
		{"network name too long", set("virtualNetworks", []any{strings.Repeat("n", 64)}), []string{"spec.forProvider.virtualNetworks[0]", "may not be more than 63"}},
		{"duplicate network names", set("virtualNetworks", []any{"net-db", "net-db"}), []string{"spec.forProvider.virtualNetworks[1]", "Duplicate value"}},
		{"unknown backend", set("backend", "vmware"), []string{"spec.forProvider.backend", "Unsupported value"}},
		{"unknown firmware", set("firmware", "efi"), []string{"spec.forProvider.firmware", "Unsupported value"}},
		{"public key not OpenSSH", set("publicKey", "-----BEGIN RSA PRIVATE KEY-----"), []string{"spec.forProvider.publicKey", "OpenSSH public key"}},
	}
}

type invalidObject struct {
	name string
	obj  *unstructured.Unstructured
	want []string
}

func invalidOthers() []invalidObject {
	obj := func(kind, name string, forProvider map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"forProvider": forProvider}}}
		u.SetAPIVersion(computev1alpha1.SchemeGroupVersion.String())
		u.SetKind(kind)
		u.SetNamespace("default")
		u.SetName(name)
		return u
	}
	return []invalidObject{
		{"volume of size zero", obj("Volume", "zero", map[string]any{"size": "0"}), []string{"spec.forProvider.size", "size must be greater than 0"}},
		{"volume of unknown format", obj("Volume", "vhd", map[string]any{"size": "1Gi", "format": "vhd"}), []string{"spec.forProvider.format", "Unsupported value"}},
		{"network with a bad cidr", obj("VirtualNetwork", "badcidr", map[string]any{"cidr": "10.10.300.0/24"}), []string{"spec.forProvider.cidr", "IPv4 subnet"}},
		{"nat network without cidr", obj("VirtualNetwork", "nocidr", map[string]any{"mode": "nat"}), []string{"spec.forProvider", "cidr is required"}},
		{"bridge network without bridge", obj("VirtualNetwork", "nobridge", map[string]any{"mode": "bridge"}), []string{"spec.forProvider", "bridge is required"}},
		{"image with url and volume", obj("DiskImage", "both", map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2", "volumeRef": map[string]any{"name": "v"}}}), []string{"spec.forProvider.source", "exactly one of url or volumeRef"}},
		{"image from ftp", obj("DiskImage", "ftp", map[string]any{"source": map[string]any{"url": "ftp://images.example.com/a.qcow2"}}), []string{"spec.forProvider.source.url", "http or https"}},
		{"image with a short sha256", obj("DiskImage", "sha", map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2", "sha256": "abc"}}), []string{"spec.forProvider.source.sha256"}},
		{"image prune after nonsense", obj("DiskImage", "prune", map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2"}, "pruneAfter": "tomorrow"}), []string{"pruneAfter"}},
	}
}

// validVM is seed 000's example under another name; each invalid case breaks
// exactly one thing in it.
func validVM(name string) *unstructured.Unstructured {
	objs, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "examples", "virtualmachine", "sample-vm.yaml"))
	if err != nil || len(objs) != 1 {
		panic(fmt.Sprintf("cannot load the seed example: %v", err))
	}
	u := objs[0]
	u.SetName(name)
	return u
}

func forProvider(u *unstructured.Unstructured) map[string]any {
	return u.Object["spec"].(map[string]any)["forProvider"].(map[string]any)
}

func managementPolicies(vm *computev1alpha1.VirtualMachine) []string {
	out := make([]string, 0, len(vm.Spec.ManagementPolicies))
	for _, p := range vm.Spec.ManagementPolicies {
		out = append(out, string(p))
	}
	return out
}

// tableColumns asks the API server for the Table form kubectl uses.
func tableColumns(t *testing.T, cfg *rest.Config, path string) []metav1.TableColumnDefinition {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	body, err := cs.RESTClient().Get().AbsPath(path).
		SetHeader("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1").
		DoRaw(context.Background())
	require.NoError(t, err, string(body))
	table := &metav1.Table{}
	require.NoError(t, json.Unmarshal(body, table))
	require.Equal(t, "Table", table.Kind)
	return table.ColumnDefinitions
}

// kubectl runs the built kubectl and returns the header and first row.
func kubectl(t *testing.T, cp *controlplane.ControlPlane, args ...string) (header, row string) {
	t.Helper()
	out, err := exec.Command(cp.Kubectl, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...).CombinedOutput()
	require.NoError(t, err, string(out))
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 2, string(out))
	return lines[0], lines[1]
}
