package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// template is an instance type or preference of kind (namespaced in
// default unless cluster) with spec.
func template(kind, name string, cluster bool, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(computev1alpha1.SchemeGroupVersion.String())
	u.SetKind(kind)
	u.SetName(name)
	if !cluster {
		u.SetNamespace("default")
	}
	return u
}

// size is an instance type's spec.
func size(vcpu any, memory any) map[string]any {
	return map[string]any{"cpu": map[string]any{"guest": vcpu}, "memory": map[string]any{"guest": memory}}
}

// maxed is an instance type's spec with maxima.
func maxed(vcpu, maxVcpu any, memory, maxMemory any) map[string]any {
	return map[string]any{"cpu": map[string]any{"guest": vcpu, "maxGuest": maxVcpu}, "memory": map[string]any{"guest": memory, "maxGuest": maxMemory}}
}

// TestInstancetypeCRDs pins what users see of instance types and
// preferences: a VM names a type or gives vcpu and memory, never both and
// never neither; the types' bounds and enums; kubectl's columns and short
// names.
func TestInstancetypeCRDs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	ctx := context.Background()

	set := func(k string, v any) func(map[string]any) { return func(fp map[string]any) { fp[k] = v } }
	unset := func(k string) func(map[string]any) { return func(fp map[string]any) { delete(fp, k) } }
	typed := func(fp map[string]any) {
		delete(fp, "vcpu")
		delete(fp, "memory")
		fp["instancetype"] = map[string]any{"name": "small"}
	}
	both := "instancetype sets vcpu and memory: name an instancetype or set vcpu and memory, not both"

	t.Run("InvalidVirtualMachinesAreRejectedNamingTheField", func(t *testing.T) {
		for _, tc := range []invalidCase{
			{"instancetype and vcpu", func(fp map[string]any) { typed(fp); fp["vcpu"] = 2 }, []string{"spec.forProvider.vcpu", both}},
			{"instancetype and memory", func(fp map[string]any) { typed(fp); fp["memory"] = "1Gi" }, []string{"spec.forProvider.memory", both}},
			{"instancetype and maxVcpu", func(fp map[string]any) { typed(fp); fp["maxVcpu"] = 8 }, []string{"spec.forProvider.maxVcpu", "instancetype sets the maximum vcpu (cpu.maxGuest)"}},
			{"instancetype and maxMemory", func(fp map[string]any) { typed(fp); fp["maxMemory"] = "8Gi" }, []string{"spec.forProvider.maxMemory", "instancetype sets the maximum memory (memory.maxGuest)"}},
			{"neither instancetype nor vcpu", unset("vcpu"), []string{"spec.forProvider.vcpu: Required value", "vcpu is required unless the VM names an instancetype"}},
			{"neither instancetype nor memory", unset("memory"), []string{"spec.forProvider.memory: Required value", "memory is required unless the VM names an instancetype"}},
			{"instancetype of an unknown kind", func(fp map[string]any) {
				typed(fp)
				fp["instancetype"] = map[string]any{"kind": "VirtualMachineInstancetypo", "name": "small"}
			}, []string{"spec.forProvider.instancetype.kind", "Unsupported value"}},
			{"instancetype without a name", set("instancetype", map[string]any{}), []string{"spec.forProvider.instancetype.name", "Required value"}},
			{"preference of an instance type's kind", set("preference", map[string]any{"kind": "VirtualMachineInstancetype", "name": "efi"}), []string{"spec.forProvider.preference.kind", "Unsupported value"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				u := validVM("it-" + strings.ToLower(strings.ReplaceAll(tc.name, " ", "-")))
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

	t.Run("AVMNamingATypeReadsBackWithTheClusterKind", func(t *testing.T) {
		u := validVM("typed")
		typed(forProvider(u))
		forProvider(u)["preference"] = map[string]any{"name": "efi"}
		require.NoError(t, cp.Client.Create(ctx, u))
		vm := &computev1alpha1.VirtualMachine{}
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(u), vm))
		fp := vm.Spec.ForProvider
		require.NotNil(t, fp.Instancetype)
		assert.Equal(t, computev1alpha1.VirtualMachineClusterInstancetypeKind, fp.Instancetype.Kind, "the kind defaults to the cluster-wide one, as in KubeVirt")
		require.NotNil(t, fp.Preference)
		assert.Equal(t, computev1alpha1.VirtualMachineClusterPreferenceKind, fp.Preference.Kind)
		assert.Zero(t, fp.Vcpu)
		assert.True(t, fp.Memory.IsZero())
		_, _, ok := vm.Shape()
		assert.False(t, ok, "no shape until the hub records the type's")

		// A typed client writes the VM back without vcpu and memory
		// (omitted when zero), or the API server would refuse it.
		vm.Spec.ForProvider.UserData = "#cloud-config\n"
		require.NoError(t, cp.Client.Update(ctx, vm))
	})

	t.Run("AVMWithMaximaReadsBackWithThem", func(t *testing.T) {
		u := validVM("maxed")
		fp := forProvider(u)
		fp["vcpu"], fp["maxVcpu"], fp["memory"], fp["maxMemory"] = 2, 2, "1Gi", "1024Mi"
		require.NoError(t, cp.Client.Create(ctx, u), "maxima equal to the shape are allowed, in any unit")
		vm := &computev1alpha1.VirtualMachine{}
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(u), vm))
		vcpu, memory := vm.MaxShape()
		assert.Equal(t, int32(2), vcpu)
		require.NotNil(t, memory)
		assert.Equal(t, int64(1<<30), memory.Value())
	})

	t.Run("AVMOfATypeTakesTheTypesMaxima", func(t *testing.T) {
		require.NoError(t, cp.Client.Create(ctx, template("VirtualMachineClusterInstancetype", "growable", true, maxed(2, 8, "1Gi", "4Gi"))))
		it := &computev1alpha1.VirtualMachineClusterInstancetype{}
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKey{Name: "growable"}, it))
		vm := &computev1alpha1.VirtualMachine{}
		vm.Spec.ForProvider.Instancetype = &computev1alpha1.InstancetypeRef{Name: "growable"}
		vcpu, memory := vm.MaxShape()
		assert.Zero(t, vcpu, "nothing before the hub records the type")
		assert.Nil(t, memory)
		vm.Status.InstancetypeRef = &computev1alpha1.InstancetypeRevision{Name: "growable", Spec: it.Spec}
		vcpu, memory = vm.MaxShape()
		assert.Equal(t, int32(8), vcpu)
		require.NotNil(t, memory)
		assert.Equal(t, "4Gi", memory.String())
	})

	t.Run("InvalidTemplatesAreRejectedNamingTheField", func(t *testing.T) {
		for _, tc := range []invalidObject{
			{"no vcpu", template("VirtualMachineClusterInstancetype", "novcpu", true, size(0, "1Gi")), []string{"spec.cpu.guest", "greater than or equal to 1"}},
			{"too many vcpus", template("VirtualMachineInstancetype", "many", false, size(2048, "1Gi")), []string{"spec.cpu.guest", "less than or equal to 1024"}},
			{"no memory", template("VirtualMachineInstancetype", "nomem", false, size(1, "0")), []string{"spec.memory.guest", "memory.guest must be greater than 0, got 0"}},
			{"memory past 16Ti", template("VirtualMachineClusterInstancetype", "hugemem", true, size(1, "17Ti")), []string{"spec.memory.guest", "memory.guest must be at most 16Ti"}},
			{"memory missing", template("VirtualMachineClusterInstancetype", "nomemory", true, map[string]any{"cpu": map[string]any{"guest": 1}}), []string{"spec.memory", "Required value"}},
			{"unknown firmware", template("VirtualMachineClusterPreference", "efi", true, map[string]any{"preferredFirmware": "efi"}), []string{"spec.preferredFirmware", "Unsupported value"}},
			{"cpu.maxGuest below cpu.guest", template("VirtualMachineClusterInstancetype", "fewer", true, maxed(4, 2, "1Gi", "1Gi")), []string{"spec.cpu.maxGuest", "cpu.maxGuest must be at least cpu.guest"}},
			{"memory.maxGuest below memory.guest", template("VirtualMachineInstancetype", "less", false, maxed(1, 1, "2Gi", "1Gi")), []string{"spec.memory.maxGuest", "memory.maxGuest must be at least memory.guest"}},
			{"memory.maxGuest past 16Ti", template("VirtualMachineInstancetype", "huge", false, maxed(1, 1, "1Gi", "17Ti")), []string{"spec.memory.maxGuest", "memory.maxGuest must be at most 16Ti"}},
		} {
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

	t.Run("KubectlShowsTheShape", func(t *testing.T) {
		require.NoError(t, cp.Client.Create(ctx, template("VirtualMachineClusterInstancetype", "medium", true, size(2, "4Gi"))))
		require.NoError(t, cp.Client.Create(ctx, template("VirtualMachineInstancetype", "mine", false, size(3, "512Mi"))))
		require.NoError(t, cp.Client.Create(ctx, template("VirtualMachineClusterPreference", "uefi", true, map[string]any{"preferredFirmware": "uefi"})))
		for _, tc := range []struct {
			args   []string
			header []string
			row    []string
		}{
			{[]string{"get", "vmcit", "medium"}, []string{"NAME", "VCPU", "MEMORY", "AGE"}, []string{"medium", "2", "4Gi"}},
			{[]string{"get", "virtualmachineclusterinstancetypes", "medium"}, []string{"NAME", "VCPU", "MEMORY", "AGE"}, []string{"medium", "2", "4Gi"}},
			{[]string{"get", "vmit", "-n", "default"}, []string{"NAME", "VCPU", "MEMORY", "AGE"}, []string{"mine", "3", "512Mi"}},
			{[]string{"get", "vmcpf", "uefi"}, []string{"NAME", "FIRMWARE", "AGE"}, []string{"uefi", "uefi"}},
		} {
			header, row := kubectl(t, cp, tc.args...)
			assert.Equal(t, tc.header, strings.Fields(header), "kubectl %v", tc.args)
			assert.Equal(t, tc.row, strings.Fields(row)[:len(tc.row)], "kubectl %v", tc.args)
		}
	})
}
