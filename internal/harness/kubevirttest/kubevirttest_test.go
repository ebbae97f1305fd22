package kubevirttest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

func TestCRDsAreKubeVirtsVMVMIMigrationSnapshotsAndInstancetypesAndCDIsDataVolume(t *testing.T) {
	crds, err := CRDs()
	require.NoError(t, err)
	type crd struct {
		group      string
		status     bool
		cluster    bool
		shortNames []string
	}
	byKind := map[string]crd{}
	for _, c := range crds {
		v := c.Spec.Versions[0]
		byKind[c.Spec.Names.Kind] = crd{group: c.Spec.Group, status: v.Subresources != nil && v.Subresources.Status != nil, cluster: c.Spec.Scope == apiextensionsv1.ClusterScoped, shortNames: c.Spec.Names.ShortNames}
	}
	assert.Equal(t, map[string]crd{
		"VirtualMachine":                  {group: "kubevirt.io", status: true, shortNames: []string{"vm", "vms"}},
		"VirtualMachineInstance":          {group: "kubevirt.io", status: false, shortNames: []string{"vmi", "vmis"}},
		"VirtualMachineInstanceMigration": {group: "kubevirt.io", status: true, shortNames: []string{"vmim", "vmims"}},
		"VirtualMachineSnapshot":          {group: "snapshot.kubevirt.io", status: true, shortNames: []string{"vmsnapshot", "vmsnapshots"}},
		"VirtualMachineSnapshotContent":   {group: "snapshot.kubevirt.io", status: true, shortNames: []string{"vmsnapshotcontent", "vmsnapshotcontents"}},
		"VirtualMachineRestore":           {group: "snapshot.kubevirt.io", status: true, shortNames: []string{"vmrestore", "vmrestores"}},
		"DataVolume":                      {group: "cdi.kubevirt.io", status: true, shortNames: []string{"dv", "dvs"}},
		"VirtualMachineInstancetype":      {group: "instancetype.kubevirt.io", shortNames: []string{"vminstancetype", "vminstancetypes", "vmf", "vmfs"}},
		"VirtualMachineClusterInstancetype": {
			group: "instancetype.kubevirt.io", cluster: true, shortNames: []string{"vmclusterinstancetype", "vmclusterinstancetypes", "vmcf", "vmcfs"},
		},
	}, byKind, "a status subresource on all but the VMI and the instance types, as virt-operator installs them; CDI's DataVolume as generated")
}

func testVM(name string) *kubevirtv1.VirtualMachine {
	memory := resource.MustParse("1Gi")
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name, Labels: map[string]string{"app": name}},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}, Annotations: map[string]string{"shape": "1"}},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						CPU:       &kubevirtv1.CPU{Cores: 2},
						Memory:    &kubevirtv1.Memory{Guest: &memory},
						Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: memory}},
						Firmware:  &kubevirtv1.Firmware{Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr(false)}}},
						Devices: kubevirtv1.Devices{
							Disks:      []kubevirtv1.Disk{{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}, {Name: "ci", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}},
							Interfaces: []kubevirtv1.Interface{{Name: "net0", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "net0", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "ns.net-db", Default: true}}}},
					Volumes: []kubevirtv1.Volume{
						{Name: "root", VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: name + "-root"}}}},
						{Name: "ci", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: "#cloud-config\nhostname: x\n"}}},
					},
				},
			},
		},
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// TestFakeVirtController starts one cluster and walks a VM through what
// KubeVirt would do with it.
func TestFakeVirtController(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	ctx := context.Background()
	kube := c.Client
	nn := types.NamespacedName{Namespace: DefaultNamespace, Name: "vm1"}
	vmi := func() *kubevirtv1.VirtualMachineInstance {
		v := &kubevirtv1.VirtualMachineInstance{}
		if err := kube.Get(ctx, nn, v); kerrors.IsNotFound(err) {
			return nil
		} else {
			require.NoError(t, err)
		}
		return v
	}
	running := func() *kubevirtv1.VirtualMachineInstance {
		var v *kubevirtv1.VirtualMachineInstance
		require.Eventually(t, func() bool {
			v = vmi()
			return v != nil && v.DeletionTimestamp == nil && v.Status.Phase == kubevirtv1.Running
		}, 10*time.Second, 20*time.Millisecond)
		return v
	}

	vm := testVM("vm1")
	require.NoError(t, kube.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: "vm1-root"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}))
	require.NoError(t, kube.Create(ctx, vm.DeepCopy()))

	t.Run("VMRoundTripsThroughTheAPIServer", func(t *testing.T) {
		got := &kubevirtv1.VirtualMachine{}
		require.NoError(t, kube.Get(ctx, nn, got))
		assert.JSONEq(t, jsonOf(t, vm.Spec), jsonOf(t, got.Spec), "no field is pruned")
	})

	t.Run("AlwaysRunsAVMIOnASchedulableNode", func(t *testing.T) {
		v := running()
		assert.Contains(t, []string{"kv-node-a", "kv-node-b"}, v.Status.NodeName)
		require.Len(t, v.Status.Interfaces, 1)
		assert.Equal(t, "net0", v.Status.Interfaces[0].Name)
		assert.Regexp(t, `^10\.200\.\d+\.\d+$`, v.Status.Interfaces[0].IP)
		assert.Equal(t, InfoSource, v.Status.Interfaces[0].InfoSource)
		assert.Equal(t, "1", v.Annotations["shape"], "the template's metadata is copied")
		assert.Equal(t, "vm1", v.OwnerReferences[0].Name)
		// KubeVirt's VMI defaults give 1Gi of guest memory a maximum.
		defaulted := vm.Spec.Template.Spec.DeepCopy()
		defaulted.Domain.Memory.MaxGuest = ptr(resource.MustParse("4Gi"))
		assert.JSONEq(t, jsonOf(t, defaulted), jsonOf(t, v.Spec), "the VMI round-trips too")
		got := &kubevirtv1.VirtualMachine{}
		require.Eventually(t, func() bool {
			require.NoError(t, kube.Get(ctx, nn, got))
			return got.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusRunning
		}, 5*time.Second, 20*time.Millisecond)
		assert.True(t, got.Status.Ready)
		assert.Contains(t, got.Finalizers, Finalizer)
	})

	// KubeVirt's own client (kubevirt.io/client-go's kubecli) puts the
	// options to the subresource's path on the API server, which proxies
	// it to virt-api.
	subresource := func(name, sub string, opts any) error {
		rc, err := rest.RESTClientFor(subresourceConfig(c))
		require.NoError(t, err)
		return rc.Put().AbsPath("/apis", kubevirtv1.SubresourceGroupName, kubevirtv1.ApiLatestVersion, "namespaces", DefaultNamespace, "virtualmachineinstances", name, sub).
			Body([]byte(jsonOf(t, opts))).Do(ctx).Error()
	}
	printable := func() kubevirtv1.VirtualMachinePrintableStatus {
		got := &kubevirtv1.VirtualMachine{}
		require.NoError(t, kube.Get(ctx, nn, got))
		return got.Status.PrintableStatus
	}

	t.Run("PauseAndUnpauseAreVirtAPIsThroughTheAPIServer", func(t *testing.T) {
		running()
		require.NoError(t, subresource("vm1", "pause", &kubevirtv1.PauseOptions{}))
		v := vmi()
		require.True(t, IsPaused(v), "the VMI has the condition Paused")
		assert.Equal(t, kubevirtv1.Running, v.Status.Phase, "a paused VMI is still Running")
		assert.Contains(t, v.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{
			Type: kubevirtv1.VirtualMachineInstancePaused, Status: corev1.ConditionTrue, Reason: ReasonPausedByUser, Message: "VMI was paused by user",
			LastProbeTime: findVMICondition(v, kubevirtv1.VirtualMachineInstancePaused).LastProbeTime, LastTransitionTime: findVMICondition(v, kubevirtv1.VirtualMachineInstancePaused).LastTransitionTime,
		})
		require.Eventually(t, func() bool { return printable() == kubevirtv1.VirtualMachineStatusPaused }, 5*time.Second, 20*time.Millisecond, "the VM shows Paused")

		err := subresource("vm1", "pause", &kubevirtv1.PauseOptions{})
		assert.True(t, kerrors.IsConflict(err), "got %v", err)
		assert.ErrorContains(t, err, "VMI is already paused")

		require.NoError(t, subresource("vm1", "unpause", &kubevirtv1.UnpauseOptions{DryRun: []string{metav1.DryRunAll}}))
		assert.True(t, IsPaused(vmi()), "a dry run changes nothing")
		require.NoError(t, subresource("vm1", "unpause", &kubevirtv1.UnpauseOptions{}))
		assert.False(t, IsPaused(vmi()))
		require.Eventually(t, func() bool { return printable() == kubevirtv1.VirtualMachineStatusRunning }, 5*time.Second, 20*time.Millisecond, "the VM shows Running again")

		err = subresource("vm1", "unpause", &kubevirtv1.UnpauseOptions{})
		assert.True(t, kerrors.IsConflict(err), "got %v", err)
		assert.ErrorContains(t, err, "VMI is not paused")
		err = subresource("nothing", "pause", &kubevirtv1.PauseOptions{})
		assert.True(t, kerrors.IsNotFound(err), "got %v", err)
	})

	t.Run("ADeletedVMIIsRecreatedWithTheSameAddress", func(t *testing.T) {
		old := running()
		require.NoError(t, kube.Delete(ctx, old))
		require.Eventually(t, func() bool { v := vmi(); return v != nil && v.UID != old.UID && v.Status.Phase == kubevirtv1.Running }, 10*time.Second, 20*time.Millisecond)
		assert.Equal(t, old.Status.Interfaces[0].IP, vmi().Status.Interfaces[0].IP)
	})

	t.Run("SpecMACAndStaticNetworkDataAreReported", func(t *testing.T) {
		// Two interfaces, both with MACs asked for; the network data gives
		// the first a static address, matched by its MAC written another
		// way, and leaves the second to DHCP.
		const networkData = "version: 2\nethernets:\n" +
			"  eth0:\n    match: {macaddress: \"02:aa:bb:cc:dd:01\"}\n    set-name: eth0\n    addresses: [192.0.2.10/24]\n" +
			"    routes: [{to: 0.0.0.0/0, via: 192.0.2.1}]\n" +
			"  eth1:\n    match: {macaddress: \"02:aa:bb:cc:dd:02\"}\n    set-name: eth1\n    dhcp4: true\n"
		cases := map[string]func(v *kubevirtv1.Volume){
			"NoCloudInline": func(v *kubevirtv1.Volume) { v.CloudInitNoCloud.NetworkData = networkData },
			"ConfigDriveBase64": func(v *kubevirtv1.Volume) {
				v.CloudInitConfigDrive = &kubevirtv1.CloudInitConfigDriveSource{UserData: v.CloudInitNoCloud.UserData, NetworkDataBase64: base64.StdEncoding.EncodeToString([]byte(networkData))}
				v.CloudInitNoCloud = nil
			},
		}
		for name, setNetworkData := range cases {
			t.Run(name, func(t *testing.T) {
				vmName := "static-" + strings.ToLower(name)
				require.NoError(t, kube.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: vmName + "-root"}, Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				}}))
				vm := testVM(vmName)
				spec := &vm.Spec.Template.Spec
				spec.Domain.Devices.Interfaces[0].MacAddress = "02:AA:BB:CC:DD:01"
				spec.Domain.Devices.Interfaces = append(spec.Domain.Devices.Interfaces, kubevirtv1.Interface{
					Name: "net1", MacAddress: "02:aa:bb:cc:dd:02", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
				})
				spec.Networks = append(spec.Networks, kubevirtv1.Network{Name: "net1", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "ns.net-backend"}}})
				setNetworkData(&spec.Volumes[1])
				require.NoError(t, kube.Create(ctx, vm))

				got := &kubevirtv1.VirtualMachineInstance{}
				require.Eventually(t, func() bool {
					return kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: vmName}, got) == nil && got.Status.Phase == kubevirtv1.Running
				}, 10*time.Second, 20*time.Millisecond)
				require.Len(t, got.Status.Interfaces, 2)
				first, second := got.Status.Interfaces[0], got.Status.Interfaces[1]
				assert.Equal(t, "02:aa:bb:cc:dd:01", first.MAC, "the MAC the spec asks for, as libvirt writes it")
				assert.Equal(t, "192.0.2.10", first.IP, "the guest's static address, without its prefix length")
				assert.Equal(t, []string{"192.0.2.10"}, first.IPs)
				assert.Equal(t, "eth0", first.InterfaceName)
				assert.Equal(t, "02:aa:bb:cc:dd:02", second.MAC)
				assert.Regexp(t, `^10\.200\.\d+\.\d+$`, second.IP, "no static address: a lease")
			})
		}
	})

	t.Run("ForcedFailureShowsAndRecovers", func(t *testing.T) {
		c.Controller.Fail(nn, Failure{Status: kubevirtv1.VirtualMachineStatusCrashLoopBackOff, Message: "boom"})
		got := &kubevirtv1.VirtualMachine{}
		require.Eventually(t, func() bool {
			require.NoError(t, kube.Get(ctx, nn, got))
			return got.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusCrashLoopBackOff && vmi() == nil
		}, 5*time.Second, 20*time.Millisecond)
		assert.Equal(t, "boom", got.Status.Conditions[len(got.Status.Conditions)-1].Message)
		c.Controller.Recover(nn)
		running()
	})

	t.Run("HaltedStopsAndDeleteWaitsForTheVMI", func(t *testing.T) {
		got := &kubevirtv1.VirtualMachine{}
		require.Eventually(t, func() bool { // the controller writes the VM too: retry on conflicts
			require.NoError(t, kube.Get(ctx, nn, got))
			got.Spec.RunStrategy = ptr(kubevirtv1.RunStrategyHalted)
			return kube.Update(ctx, got) == nil
		}, 5*time.Second, 20*time.Millisecond)
		require.Eventually(t, func() bool {
			require.NoError(t, kube.Get(ctx, nn, got))
			return got.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusStopped && vmi() == nil
		}, 5*time.Second, 20*time.Millisecond)
		require.NoError(t, kube.Delete(ctx, got))
		require.Eventually(t, func() bool { return kerrors.IsNotFound(kube.Get(ctx, nn, got)) }, 5*time.Second, 20*time.Millisecond, "the finalizer goes")
	})

	t.Run("APIServerComesBackOnTheSameAddressWithItsObjects", func(t *testing.T) {
		require.NoError(t, kube.Create(ctx, testVM("vm2")))
		host := c.Config.Host
		require.NoError(t, c.StopAPIServer())
		assert.Error(t, kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "vm2"}, &kubevirtv1.VirtualMachine{}))
		require.NoError(t, c.StartAPIServer())
		assert.Equal(t, host, c.Config.Host)
		require.Eventually(t, func() bool {
			return kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "vm2"}, &kubevirtv1.VirtualMachine{}) == nil
		}, 10*time.Second, 50*time.Millisecond, "the same credentials reach the same objects")
	})
}

// subresourceConfig is c's admin configuration for KubeVirt's subresource
// API, as kubecli makes it.
func subresourceConfig(c *Cluster) *rest.Config {
	rc := rest.CopyConfig(c.Config)
	rc.GroupVersion = &schema.GroupVersion{Group: kubevirtv1.SubresourceGroupName, Version: kubevirtv1.ApiLatestVersion}
	rc.APIPath = "/apis"
	rc.NegotiatedSerializer = serializer.NewCodecFactory(c.Scheme).WithoutConversion()
	return rc
}

func findVMICondition(v *kubevirtv1.VirtualMachineInstance, t kubevirtv1.VirtualMachineInstanceConditionType) kubevirtv1.VirtualMachineInstanceCondition {
	for _, c := range v.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return kubevirtv1.VirtualMachineInstanceCondition{}
}
