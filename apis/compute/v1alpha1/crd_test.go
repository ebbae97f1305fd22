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
	pcv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
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
		require.NotNil(t, vm.Spec.ForProvider.Availability)
		assert.Equal(t, computev1alpha1.AvailabilityNone, *vm.Spec.ForProvider.Availability, "a lost node's VMs wait for it unless asked otherwise")
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

	t.Run("AVolumesStoragePoolCannotChange", func(t *testing.T) {
		for name, fp := range map[string]map[string]any{
			"pool-set":  {"size": "1Gi", "storagePool": "ceph"},
			"pool-none": {"size": "1Gi"},
		} {
			require.NoError(t, cp.Client.Create(ctx, object("Volume", name, fp)), name)
		}
		for _, tc := range []struct{ name, pool string }{{"pool-set", "nfs"}, {"pool-set", ""}, {"pool-none", "ceph"}} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(computev1alpha1.VolumeGroupVersionKind)
			require.NoError(t, cp.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: tc.name}, u))
			if tc.pool == "" {
				delete(forProvider(u), "storagePool")
			} else {
				forProvider(u)["storagePool"] = tc.pool
			}
			err := cp.Client.Update(ctx, u)
			require.Error(t, err, "%s: storagePool changed to %q", tc.name, tc.pool)
			assert.Contains(t, err.Error(), "storagePool is immutable")
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(computev1alpha1.VolumeGroupVersionKind)
		require.NoError(t, cp.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "pool-set"}, u))
		forProvider(u)["size"] = "2Gi"
		require.NoError(t, cp.Client.Update(ctx, u), "the rest of a Volume in a pool may change")
	})

	t.Run("AVolumeGrowsButNeverShrinks", func(t *testing.T) {
		require.NoError(t, cp.Client.Create(ctx, object("Volume", "growing", map[string]any{"size": "2Gi"})))
		for _, tc := range []struct {
			name, size string
			refused    bool
		}{
			{"shrinking is refused naming both sizes", "1Gi", true},
			{"shrinking by one byte is refused", "2147483647", true},
			{"the same size in other units is no change", "2048Mi", false},
			{"growing is accepted", "3Gi", false},
			{"shrinking after a grow is refused", "2Gi", true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(computev1alpha1.VolumeGroupVersionKind)
				require.NoError(t, cp.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "growing"}, u))
				old := forProvider(u)["size"]
				forProvider(u)["size"] = tc.size
				err := cp.Client.Update(ctx, u)
				if !tc.refused {
					require.NoError(t, err)
					return
				}
				require.Error(t, err, "size changed from %v to %s", old, tc.size)
				assert.Contains(t, err.Error(), "spec.forProvider.size")
				assert.Contains(t, err.Error(), fmt.Sprintf("size can only grow: %s is smaller than %v", tc.size, old))
			})
		}
	})

	t.Run("BoundsAreEnforcedAndEveryAcceptedValueDecodesInTheHub", func(t *testing.T) {
		for i, tc := range boundCases() {
			t.Run(tc.name, func(t *testing.T) {
				u := tc.object(fmt.Sprintf("bound-%d", i))
				err := cp.Client.Create(ctx, u)
				if !tc.accepted {
					require.Error(t, err, "the API server accepted %s", tc.name)
					t.Logf("rejected: %v", err)
					for _, want := range tc.want {
						assert.Contains(t, err.Error(), want)
					}
					return
				}
				require.NoError(t, err)
				// Read back as the hub does, into Go types: a value the
				// schema accepts but Go cannot decode fails here, and would
				// fail the hub's list of the whole kind.
				got := hubConversions(t, ctx, cp.Client, u)
				if tc.field != "" {
					assert.Equal(t, tc.hub, got[tc.field], "the hub's conversion of %s", tc.field)
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
		{"vcpu missing", unset("vcpu"), []string{"spec.forProvider.vcpu: Required value", "vcpu is required unless the VM names an instancetype"}},
		{"memory negative", set("memory", "-1Gi"), []string{"spec.forProvider.memory", "memory must be greater than 0, got -1Gi"}},
		{"memory zero", set("memory", "0"), []string{"spec.forProvider.memory", "memory must be greater than 0"}},
		{"memory not a quantity", set("memory", "lots"), []string{"spec.forProvider.memory"}},
		{"memory wrong type", set("memory", true), []string{"spec.forProvider.memory"}},
		{"memory missing", unset("memory"), []string{"spec.forProvider.memory: Required value", "memory is required unless the VM names an instancetype"}},
		{"swap negative", set("swap", "-512Mi"), []string{"spec.forProvider.swap", "swap must not be negative"}},
		{"maxVcpu below vcpu", func(fp map[string]any) { fp["vcpu"], fp["maxVcpu"] = 4, 2 }, []string{"spec.forProvider.maxVcpu", "maxVcpu must be at least vcpu"}},
		{"maxVcpu past 1024", set("maxVcpu", 1025), []string{"spec.forProvider.maxVcpu", "less than or equal to 1024"}},
		{"maxMemory below memory", func(fp map[string]any) { fp["memory"], fp["maxMemory"] = "2Gi", "1Gi" }, []string{"spec.forProvider.maxMemory", "maxMemory must be at least memory"}},
		{"maxMemory zero", set("maxMemory", "0"), []string{"spec.forProvider.maxMemory", "maxMemory must be greater than 0, got 0"}},
		{"maxMemory past 16Ti", set("maxMemory", "17Ti"), []string{"spec.forProvider.maxMemory", "maxMemory must be at most 16Ti"}},
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
		{"unknown availability", set("availability", "Always"), []string{"spec.forProvider.availability", "Unsupported value"}},
		{"public key not OpenSSH", set("publicKey", "-----BEGIN RSA PRIVATE KEY-----"), []string{"spec.forProvider.publicKey", "OpenSSH public key"}},
	}
}

type invalidObject struct {
	name string
	obj  *unstructured.Unstructured
	want []string
}

func invalidOthers() []invalidObject {
	obj := object
	return []invalidObject{
		{"volume of size zero", obj("Volume", "zero", map[string]any{"size": "0"}), []string{"spec.forProvider.size", "size must be greater than 0"}},
		{"volume of unknown format", obj("Volume", "vhd", map[string]any{"size": "1Gi", "format": "vhd"}), []string{"spec.forProvider.format", "Unsupported value"}},
		{"network with a bad cidr", obj("VirtualNetwork", "badcidr", map[string]any{"cidr": "10.10.300.0/24"}), []string{"spec.forProvider.cidr", "IPv4 subnet"}},
		{"nat network without cidr", obj("VirtualNetwork", "nocidr", map[string]any{"mode": "nat"}), []string{"spec.forProvider", "cidr is required"}},
		{"bridge network without bridge", obj("VirtualNetwork", "nobridge", map[string]any{"mode": "bridge"}), []string{"spec.forProvider", "bridge is required"}},
		{"vlan on a nat network", obj("VirtualNetwork", "natvlan", map[string]any{"cidr": "10.10.120.0/24", "vlan": 100}), []string{"spec.forProvider", "vlan is allowed only when mode is bridge"}},
		{"image with url and volume", obj("DiskImage", "both", map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2", "volumeRef": map[string]any{"name": "v"}}}), []string{"spec.forProvider.source", "set one of url, volumeRef or backup, not more"}},
		{"image of a snapshot without its volume", obj("DiskImage", "snapshot-alone", map[string]any{"source": map[string]any{"snapshotRef": map[string]any{"name": "nightly"}}}), []string{"spec.forProvider.source", "snapshotRef names the VirtualMachineSnapshot of volumeRef to copy and goes with volumeRef"}},
		{"image of a snapshot of a download", obj("DiskImage", "snapshot-url", map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2", "snapshotRef": map[string]any{"name": "nightly"}}}), []string{"spec.forProvider.source", "goes with volumeRef"}},
		{"image from a backup and a url", obj("DiskImage", "both-backup", map[string]any{"format": "raw", "source": map[string]any{"url": "https://images.example.com/a.qcow2", "backup": map[string]any{"location": "offsite", "id": "b1"}}}), []string{"spec.forProvider.source", "set one of url, volumeRef or backup, not more"}},
		{"image from a backup as qcow2", obj("DiskImage", "backup-qcow2", map[string]any{"source": map[string]any{"backup": map[string]any{"location": "offsite", "id": "b1"}}}), []string{"spec.forProvider", "an image made from a backup is raw: set format: raw"}},
		{"image from a backup of a path", obj("DiskImage", "backup-path", map[string]any{"format": "raw", "source": map[string]any{"backup": map[string]any{"location": "offsite", "id": "../b1"}}}), []string{"spec.forProvider.source.backup.id"}},
		{"image from ftp", obj("DiskImage", "ftp", map[string]any{"source": map[string]any{"url": "ftp://images.example.com/a.qcow2"}}), []string{"spec.forProvider.source.url", "http or https"}},
		{"image with a short sha256", obj("DiskImage", "sha", map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2", "sha256": "abc"}}), []string{"spec.forProvider.source.sha256"}},
		{"image prune after nonsense", obj("DiskImage", "prune", map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2"}, "pruneAfter": "tomorrow"}), []string{"pruneAfter"}},
		{"backup location with a scheme", location("scheme", map[string]any{"endpoint": "https://s3.example.com"}), []string{"spec.endpoint", "host:port, without a scheme"}},
		{"backup location with a bucket of capitals", location("caps", map[string]any{"bucket": "Backups"}), []string{"spec.bucket"}},
		{"backup location with a prefix not ending in a slash", location("prefix", map[string]any{"prefix": "team"}), []string{"spec.prefix"}},
		{"backup without a location", backup("noloc", map[string]any{"location": ""}), []string{"spec.location"}},
		{"backup that deletes on a whim", backup("policy", map[string]any{"deletionPolicy": "Sometimes"}), []string{"spec.deletionPolicy", "Unsupported value"}},
		{"verification of no backup", namespaced(computev1alpha1.VirtualMachineBackupVerificationKind, "none", map[string]any{}), []string{"spec", "set one of backupName or backup"}},
		{"verification of two backups", namespaced(computev1alpha1.VirtualMachineBackupVerificationKind, "two", map[string]any{"backupName": "web-1", "backup": map[string]any{"location": "offsite", "id": "b1"}}), []string{"spec", "set one of backupName or backup"}},
		{"verification of a backup id that is a path", namespaced(computev1alpha1.VirtualMachineBackupVerificationKind, "path", map[string]any{"backup": map[string]any{"location": "offsite", "id": "../b1"}}), []string{"spec.backup.id"}},
		{"backup location collecting every second", location("gc-second", map[string]any{"garbageCollectionInterval": "1s"}), []string{"spec.garbageCollectionInterval", "0s (never) or from 1m to 8760h"}},
		{"backup location collecting on a whim", location("gc-whim", map[string]any{"garbageCollectionInterval": "weekly"}), []string{"spec.garbageCollectionInterval", "a duration such as 24h"}},
		{"schedule without a schedule", schedule("nocron", map[string]any{"schedule": ""}), []string{"spec.schedule"}},
		{"schedule with its time zone inside", schedule("tz", map[string]any{"schedule": "TZ=UTC 0 3 * * *"}), []string{"spec.schedule", "set spec.timeZone instead"}},
		{"schedule keeping minus one", schedule("minus", map[string]any{"retention": map[string]any{"daily": -1}}), []string{"spec.retention.daily", "greater than or equal to 0"}},
		{"schedule that deletes on a whim", schedule("policy", map[string]any{"deletionPolicy": "Sometimes"}), []string{"spec.deletionPolicy", "Unsupported value"}},
		{"schedule of a bad VM name", schedule("vm", map[string]any{"vmName": "Web_1"}), []string{"spec.vmName", "is not a valid name"}},
		{"schedule with a long name", schedule(strings.Repeat("s", 64), nil), []string{"metadata.name must be at most 63 characters"}},
		{"quota of negative storage", tenantQuota("neg-storage", map[string]any{"storage": "-1Gi"}), []string{"spec.hard.storage", "storage must not be negative, got -1Gi"}},
		{"quota of negative volumes", tenantQuota("neg-volumes", map[string]any{"volumes": -1}), []string{"spec.hard.volumes", "greater than or equal to 0"}},
		{"quota of negative snapshots", tenantQuota("neg-snapshots", map[string]any{"snapshots": -1}), []string{"spec.hard.snapshots", "greater than or equal to 0"}},
		{"quota of negative addresses", tenantQuota("neg-addresses", map[string]any{"addresses": -1}), []string{"spec.hard.addresses", "greater than or equal to 0"}},
		{"quota of storage that is no quantity", tenantQuota("word-storage", map[string]any{"storage": "lots"}), []string{"spec.hard.storage"}},
	}
}

// tenantQuota is a TenantQuota of namespace t1 with hard.
func tenantQuota(name string, hard map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"namespace": "t1", "hard": hard}}}
	u.SetAPIVersion(pcv1alpha1.SchemeGroupVersion.String())
	u.SetKind(pcv1alpha1.TenantQuotaKind)
	u.SetName(name)
	return u
}

// location is a valid BackupLocation with spec fields set as edit says.
func location(name string, edit map[string]any) *unstructured.Unstructured {
	spec := map[string]any{"endpoint": "s3.example.com:443", "bucket": "backups", "credentialsSecretRef": map[string]any{"namespace": "virtfleet-system", "name": "s3"}}
	for k, v := range edit {
		spec[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(computev1alpha1.SchemeGroupVersion.String())
	u.SetKind(computev1alpha1.BackupLocationKind)
	u.SetName(name)
	return u
}

// backup is a valid VirtualMachineBackup with spec fields set as edit says.
func backup(name string, edit map[string]any) *unstructured.Unstructured {
	spec := map[string]any{"vmName": "web", "location": "offsite"}
	for k, v := range edit {
		spec[k] = v
	}
	return namespaced(computev1alpha1.VirtualMachineBackupKind, name, spec)
}

// schedule is a valid VirtualMachineBackupSchedule with spec fields set as
// edit says.
func schedule(name string, edit map[string]any) *unstructured.Unstructured {
	spec := map[string]any{"vmName": "web", "location": "offsite", "schedule": "0 3 * * *"}
	for k, v := range edit {
		spec[k] = v
	}
	return namespaced(computev1alpha1.VirtualMachineBackupScheduleKind, name, spec)
}

// namespaced is an object of kind in namespace default with spec.
func namespaced(kind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(computev1alpha1.SchemeGroupVersion.String())
	u.SetKind(kind)
	u.SetNamespace("default")
	u.SetName(name)
	return u
}

// boundCase sets one field of a valid object at or just past its bound.
type boundCase struct {
	name     string
	object   func(name string) *unstructured.Unstructured
	accepted bool
	// want are substrings of the API server's error when refused: the
	// field, and why.
	want []string
	// field, when set, names the hub's conversion (see hubConversions)
	// whose result must be hub.
	field string
	hub   int64
}

const (
	ti          = int64(1) << 40
	yearSeconds = int64(8760 * 3600)
)

// boundCases are the schema's bounds on sizes, durations and counts, each
// at the bound (accepted) and just past it (refused).
func boundCases() []boundCase {
	vm := func(k string, v any) func(string) *unstructured.Unstructured {
		return func(name string) *unstructured.Unstructured {
			u := validVM(name)
			forProvider(u)[k] = v
			return u
		}
	}
	volume := func(size any) func(string) *unstructured.Unstructured {
		return func(name string) *unstructured.Unstructured {
			return object("Volume", name, map[string]any{"size": size})
		}
	}
	image := func(pruneAfter string) func(string) *unstructured.Unstructured {
		return func(name string) *unstructured.Unstructured {
			return object("DiskImage", name, map[string]any{"source": map[string]any{"url": "https://images.example.com/a.qcow2"}, "pruneAfter": pruneAfter})
		}
	}
	providerConfig := func(selector map[string]any) func(string) *unstructured.Unstructured {
		return func(name string) *unstructured.Unstructured {
			u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
				"natsURL":      "nats://nats.virtfleet-system:4222",
				"credentials":  map[string]any{"source": "None"},
				"nodeSelector": selector,
			}}}
			u.SetAPIVersion(pcv1alpha1.SchemeGroupVersion.String())
			u.SetKind("ProviderConfig")
			u.SetNamespace("default")
			u.SetName(name)
			return u
		}
	}
	labels := func(n int, key func(i int) string, value string) map[string]any {
		out := map[string]any{}
		for i := range n {
			out[key(i)] = value
		}
		return out
	}
	numbered := func(i int) string { return fmt.Sprintf("virtfleet.io/label-%d", i) }
	longKey := func(int) string { return strings.Repeat("d", 253) + "/" + strings.Repeat("n", 63) }
	tooLongKey := func(int) string { return strings.Repeat("d", 254) + "/" + strings.Repeat("n", 63) }
	names := func(n int) []any {
		out := make([]any, 0, n)
		for i := range n {
			out = append(out, fmt.Sprintf("net-%d", i))
		}
		return out
	}
	vlan := func(tag any) func(string) *unstructured.Unstructured {
		return func(name string) *unstructured.Unstructured {
			return object("VirtualNetwork", name, map[string]any{"mode": "bridge", "bridge": "br-site", "vlan": tag})
		}
	}
	sshKey := func(length int) string { return "ssh-ed25519 " + strings.Repeat("A", length-len("ssh-ed25519 ")) }

	return []boundCase{
		{name: "vcpu 1024", object: vm("vcpu", 1024), accepted: true, field: "vcpu", hub: 1024},
		{name: "vcpu 1025", object: vm("vcpu", 1025), want: []string{"spec.forProvider.vcpu", "less than or equal to 1024"}},
		{name: "memory 16Ti", object: vm("memory", "16Ti"), accepted: true, field: "memory", hub: 16 * ti},
		{name: "memory 16Ti in bytes", object: vm("memory", 16*ti), accepted: true, field: "memory", hub: 16 * ti},
		{name: "memory one byte", object: vm("memory", "1"), accepted: true, field: "memory", hub: 1},
		{name: "memory 16Ti and a byte", object: vm("memory", fmt.Sprint(16*ti+1)), want: []string{"spec.forProvider.memory", "memory must be at most 16Ti, got 17592186044417"}},
		{name: "memory 1E", object: vm("memory", "1E"), want: []string{"spec.forProvider.memory", "memory must be at most 16Ti, got 1E"}},
		{name: "memory past int64", object: vm("memory", "10E"), want: []string{"spec.forProvider.memory", "memory must be at most 16Ti"}},
		{name: "memory 1e400", object: vm("memory", "1e400"), want: []string{"spec.forProvider.memory"}},
		{name: "swap 64Ti", object: vm("swap", "64Ti"), accepted: true, field: "swap", hub: 64 * ti},
		{name: "swap 0", object: vm("swap", "0"), accepted: true, field: "swap", hub: 0},
		{name: "swap 64Ti and a byte", object: vm("swap", fmt.Sprint(64*ti+1)), want: []string{"spec.forProvider.swap", "swap must be at most 64Ti"}},
		{name: "swap 100Ei", object: vm("swap", "100Ei"), want: []string{"spec.forProvider.swap", "swap must be at most 64Ti"}},
		{name: "vlan 1", object: vlan(1), accepted: true, field: "vlan", hub: 1},
		{name: "vlan 0", object: vlan(0), want: []string{"spec.forProvider.vlan", "greater than or equal to 1"}},
		{name: "vlan 4094", object: vlan(4094), accepted: true, field: "vlan", hub: 4094},
		{name: "vlan 4095", object: vlan(4095), want: []string{"spec.forProvider.vlan", "less than or equal to 4094"}},
		{name: "16 networks", object: vm("virtualNetworks", names(16)), accepted: true},
		{name: "17 networks", object: vm("virtualNetworks", names(17)), want: []string{"spec.forProvider.virtualNetworks", "must have at most 16 items"}},
		{name: "userData of 64Ki characters", object: vm("userData", strings.Repeat("u", 65536)), accepted: true},
		{name: "userData past 64Ki characters", object: vm("userData", strings.Repeat("u", 65537)), want: []string{"spec.forProvider.userData", "may not be more than 65536"}},
		{name: "publicKey of 16Ki characters", object: vm("publicKey", sshKey(16384)), accepted: true},
		{name: "publicKey past 16Ki characters", object: vm("publicKey", sshKey(16385)), want: []string{"spec.forProvider.publicKey", "may not be more than 16384"}},
		{name: "nodeSelector of 32 labels", object: vm("nodeSelector", labels(32, numbered, "yes")), accepted: true, field: "nodeSelector", hub: 32},
		{name: "nodeSelector of 33 labels", object: vm("nodeSelector", labels(33, numbered, "yes")), want: []string{"spec.forProvider.nodeSelector", "must have at most 32 items"}},
		{name: "nodeSelector longest key and value", object: vm("nodeSelector", labels(1, longKey, strings.Repeat("v", 63))), accepted: true, field: "nodeSelector", hub: 1},
		{name: "nodeSelector key too long", object: vm("nodeSelector", labels(1, tooLongKey, "v")), want: []string{"spec.forProvider.nodeSelector", "keys must be at most 317 characters"}},
		{name: "nodeSelector value too long", object: vm("nodeSelector", labels(1, numbered, strings.Repeat("v", 64))), want: []string{"spec.forProvider.nodeSelector", "values at most 63"}},
		{name: "volume 64Ti", object: volume("64Ti"), accepted: true, field: "size", hub: 64 * ti},
		{name: "volume 64Ti in bytes", object: volume(64 * ti), accepted: true, field: "size", hub: 64 * ti},
		{name: "volume 64Ti and a byte", object: volume(fmt.Sprint(64*ti + 1)), want: []string{"spec.forProvider.size", "size must be at most 64Ti, got 70368744177665"}},
		{name: "volume 1Pi", object: volume("1Pi"), want: []string{"spec.forProvider.size", "size must be at most 64Ti, got 1Pi"}},
		{name: "volume past int64", object: volume("9Ei"), want: []string{"spec.forProvider.size", "size must be at most 64Ti"}},
		{name: "pruneAfter 8760h", object: image("8760h"), accepted: true, field: "pruneAfter", hub: yearSeconds},
		{name: "pruneAfter 525600m", object: image("525600m"), accepted: true, field: "pruneAfter", hub: yearSeconds},
		{name: "pruneAfter 1h30m", object: image("1h30m"), accepted: true, field: "pruneAfter", hub: 5400},
		{name: "pruneAfter 0s", object: image("0s"), accepted: true, field: "pruneAfter", hub: 0},
		{name: "pruneAfter 8760h and a nanosecond", object: image("8760h1ns"), want: []string{"spec.forProvider.pruneAfter", "at most 8760h"}},
		{name: "pruneAfter 8761h", object: image("8761h"), want: []string{"spec.forProvider.pruneAfter", "at most 8760h"}},
		// Go's time.Duration ends at 2562047h47m16.854775807s; CEL's
		// duration() cannot parse what lies past it, which fails the rule.
		{name: "pruneAfter past Go's durations", object: image("2562048h"), want: []string{"spec.forProvider.pruneAfter", "at most 8760h"}},
		{name: "pruneAfter 9999999999h", object: image("9999999999h"), want: []string{"spec.forProvider.pruneAfter", "at most 8760h"}},
		{name: "pruneAfter overflowing in a sum", object: image("2562047h2562047h"), want: []string{"spec.forProvider.pruneAfter", "at most 8760h"}},
		{name: "ProviderConfig nodeSelector of 32 labels", object: providerConfig(labels(32, numbered, "yes")), accepted: true, field: "nodeSelector", hub: 32},
		{name: "ProviderConfig nodeSelector of 33 labels", object: providerConfig(labels(33, numbered, "yes")), want: []string{"spec.nodeSelector", "must have at most 32 items"}},
		{name: "ProviderConfig nodeSelector value too long", object: providerConfig(labels(1, numbered, strings.Repeat("v", 64))), want: []string{"spec.nodeSelector", "values at most 63"}},
	}
}

// hubConversions reads u back through the typed client, as the hub's
// informers do, and returns what the hub derives from it, by field: the
// byte counts and vcpus it sends to a node
// (hub/internal/controller/virtualmachine/intent.go: Quantity.Value), the
// seconds of pruneAfter (intent.go's imageRef: int64(Duration.Seconds())),
// and how many labels a selector holds.
func hubConversions(t *testing.T, ctx context.Context, kube client.Client, u *unstructured.Unstructured) map[string]int64 {
	t.Helper()
	key := client.ObjectKeyFromObject(u)
	switch u.GetKind() {
	case "VirtualMachine":
		vm := &computev1alpha1.VirtualMachine{}
		require.NoError(t, kube.Get(ctx, key, vm), "the typed client cannot decode what the API server accepted")
		fp := vm.Spec.ForProvider
		require.NotNil(t, fp.Swap, "swap is defaulted")
		return map[string]int64{"vcpu": int64(fp.Vcpu), "memory": fp.Memory.Value(), "swap": fp.Swap.Value(), "nodeSelector": int64(len(fp.NodeSelector))}
	case "Volume":
		v := &computev1alpha1.Volume{}
		require.NoError(t, kube.Get(ctx, key, v), "the typed client cannot decode what the API server accepted")
		return map[string]int64{"size": v.Spec.ForProvider.Size.Value()}
	case "DiskImage":
		img := &computev1alpha1.DiskImage{}
		require.NoError(t, kube.Get(ctx, key, img), "the typed client cannot decode what the API server accepted")
		require.NotNil(t, img.Spec.ForProvider.PruneAfter, "pruneAfter is defaulted")
		return map[string]int64{"pruneAfter": int64(img.Spec.ForProvider.PruneAfter.Seconds())}
	case "VirtualNetwork":
		n := &computev1alpha1.VirtualNetwork{}
		require.NoError(t, kube.Get(ctx, key, n), "the typed client cannot decode what the API server accepted")
		require.NotNil(t, n.Spec.ForProvider.VLAN, "vlan is kept")
		return map[string]int64{"vlan": int64(*n.Spec.ForProvider.VLAN)}
	case "ProviderConfig":
		pc := &pcv1alpha1.ProviderConfig{}
		require.NoError(t, kube.Get(ctx, key, pc), "the typed client cannot decode what the API server accepted")
		return map[string]int64{"nodeSelector": int64(len(pc.Spec.NodeSelector))}
	}
	t.Fatalf("no conversions for kind %s", u.GetKind())
	return nil
}

// object is a managed resource of kind with the given forProvider.
func object(kind, name string, forProvider map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"forProvider": forProvider}}}
	u.SetAPIVersion(computev1alpha1.SchemeGroupVersion.String())
	u.SetKind(kind)
	u.SetNamespace("default")
	u.SetName(name)
	return u
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
