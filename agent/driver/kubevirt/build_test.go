package kubevirt

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

const testKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx5ZHQgZmxlZXQgdGVzdCBrZXkgZm9yIHZpcnRmbGVldA== test@virtfleet"

func testMachine(uid string) driver.Machine {
	return driver.Machine{
		UID: uid, Namespace: "team-a", Name: "db", VCPU: 2, MemoryBytes: 1 << 30, PublicKey: testKey, Running: true,
		Disks:    []driver.Disk{{Name: "team-a_db-root", SizeBytes: 1 << 30}},
		Networks: []driver.Network{{Name: "team-a_net-db", CIDR: "10.10.120.0/24"}},
	}
}

func TestObjectNamesMapBothWays(t *testing.T) {
	cases := map[string]struct{ node, object string }{
		"NamespaceAndName":           {"team-a_db-root", "team-a.db-root"},
		"OnlyTheFirstSeparator":      {"team-a_db_root", "team-a.db_root"},
		"DotsInTheNameStayInTheName": {"team-a_db.root", "team-a.db.root"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.object, ObjectName(tc.node))
			assert.Equal(t, tc.node, NodeNameOf(ObjectName(tc.node)))
		})
	}
}

func TestValidateRefusesWhatKubeVirtCannotRun(t *testing.T) {
	uid := "0e6e5d3c-7f6b-4f59-9d53-4d8f1c1d2a11"
	cases := map[string]struct {
		mutate func(*driver.Machine)
		want   string
	}{
		"NoVCPU":              {func(m *driver.Machine) { m.VCPU = 0 }, "vcpu"},
		"NoDisk":              {func(m *driver.Machine) { m.Disks = nil }, "at least one disk"},
		"UIDNotAName":         {func(m *driver.Machine) { m.UID = "Not_A_UID" }, "cannot name"},
		"DiskNotAName":        {func(m *driver.Machine) { m.Disks[0].Name = "team-a_DB" }, "cannot name a PVC"},
		"NetworkNotAName":     {func(m *driver.Machine) { m.Networks[0].Name = "team-a_net db" }, "NetworkAttachmentDefinition"},
		"ImportedNetwork":     {func(m *driver.Machine) { m.Networks[0].Imported = true }, "imported by external name, which the kubevirt backend does not support yet"},
		"UnknownFirmware":     {func(m *driver.Machine) { m.Firmware = "coreboot" }, "firmware"},
		"UserDataTooLong":     {func(m *driver.Machine) { m.UserData = "#cloud-config\nbootcmd: [" + strings.Repeat("x", 3000) + "]" }, "at most 2048"},
		"UserDataUnsupported": {func(m *driver.Machine) { m.UserData = "#include http://example.com/x" }, "#include"},

		// The hub's address must fit the network it is on.
		"AddressOutsideItsSubnet": {func(m *driver.Machine) { m.Networks[0].Address = netip.MustParsePrefix("10.10.121.5/24") }, "not in its subnet 10.10.120.0/24"},
		"AddressIsTheGateway":     {func(m *driver.Machine) { m.Networks[0].Address = netip.MustParsePrefix("10.10.120.1/24") }, "the gateway's"},
		"AddressIsTheBroadcast":   {func(m *driver.Machine) { m.Networks[0].Address = netip.MustParsePrefix("10.10.120.255/24") }, "broadcast"},
		"AddressOfAnotherLength":  {func(m *driver.Machine) { m.Networks[0].Address = netip.MustParsePrefix("10.10.120.5/16") }, "prefix length"},
		"AddressNotIPv4":          {func(m *driver.Machine) { m.Networks[0].Address = netip.MustParsePrefix("fd00::5/64") }, "not IPv4"},
		"CIDRNotASubnet": {func(m *driver.Machine) {
			m.Networks[0].CIDR, m.Networks[0].Address = "10.10.120.0", netip.MustParsePrefix("10.10.120.5/24")
		}, "not an IPv4 subnet"},
		"NetworkDataTooLong": {func(m *driver.Machine) {
			m.Networks = nil
			for i := range 32 {
				m.Networks = append(m.Networks, driver.Network{Name: fmt.Sprintf("team-a_net-%d", i), CIDR: fmt.Sprintf("10.10.%d.0/24", i), Address: netip.MustParsePrefix(fmt.Sprintf("10.10.%d.5/24", i))})
			}
		}, "network data for 32 interfaces"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := testMachine(uid)
			tc.mutate(&m)
			err := validate(m)
			if err == nil {
				_, err = newVM(m, "ns", nil)
			}
			require.Error(t, err)
			assert.True(t, driver.IsTerminal(err), "terminal: %v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	assert.NoError(t, validate(testMachine(uid)), "the test machine itself is valid")
	withImage := testMachine(uid)
	withImage.Disks[0].Image = &driver.Image{UID: "i", Name: "debian", URL: "http://x"}
	assert.NoError(t, validate(withImage), "a disk from an image is a DataVolume's")
}

func TestNewVMMapsTheMachine(t *testing.T) {
	m := testMachine("0e6e5d3c-7f6b-4f59-9d53-4d8f1c1d2a11")
	m.Firmware = driver.FirmwareUEFI
	m.Disks = append(m.Disks, driver.Disk{Name: "team-a_db-data", SizeBytes: 2 << 30},
		driver.Disk{Name: "team-a_db-os", SizeBytes: 4 << 30, Image: &driver.Image{UID: "3f1c", Name: "debian", URL: "https://images.example/debian.qcow2"}})
	m.Networks = append(m.Networks, driver.Network{Name: "team-a_net-backend"})
	vm, err := newVM(m, "vms", nil)
	require.NoError(t, err)

	assert.Equal(t, "vf-"+m.UID, vm.Name)
	assert.Equal(t, "vms", vm.Namespace)
	assert.Equal(t, m.UID, vm.Labels[LabelUID])
	assert.Equal(t, m.UID, vm.Spec.Template.ObjectMeta.Labels[LabelUID], "VMIs carry the label too")
	assert.Equal(t, kubevirtv1.RunStrategyAlways, *vm.Spec.RunStrategy)
	spec := vm.Spec.Template.Spec
	assert.Equal(t, kubevirtv1.CPU{Sockets: 2, Cores: 1, Threads: 1, MaxSockets: 2 * driver.DefaultMaxRatio}, *spec.Domain.CPU,
		"vCPUs are sockets, which KubeVirt hot-plugs up to maxSockets")
	assert.Equal(t, int64(1<<30), spec.Domain.Memory.Guest.Value())
	assert.Equal(t, int64(driver.DefaultMaxRatio<<30), spec.Domain.Memory.MaxGuest.Value())
	assert.Empty(t, spec.Domain.Resources.Requests, "a request would make a memory change a restart")
	assert.NotNil(t, spec.Domain.Firmware.Bootloader.EFI)
	claims, dataVolumes := []string{}, []string{}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims = append(claims, v.PersistentVolumeClaim.ClaimName)
		}
		if v.DataVolume != nil {
			dataVolumes = append(dataVolumes, v.DataVolume.Name)
		}
	}
	assert.Equal(t, []string{"team-a.db-root", "team-a.db-data"}, claims, "one PVC per disk, in order")
	assert.Equal(t, []string{"team-a.db-os"}, dataVolumes, "a disk from an image is its DataVolume")
	assert.Equal(t, uint(1), *spec.Domain.Devices.Disks[0].BootOrder, "the first disk boots")
	require.Len(t, spec.Networks, 2)
	assert.Equal(t, "team-a.net-db", spec.Networks[0].Multus.NetworkName)
	assert.True(t, spec.Networks[0].Multus.Default, "the first network is the default one")
	assert.False(t, spec.Networks[1].Multus.Default)
	assert.Len(t, spec.Domain.Devices.Interfaces, 2)

	m.Running = false
	stopped, err := newVM(m, "vms", nil)
	require.NoError(t, err)
	assert.Equal(t, kubevirtv1.RunStrategyHalted, *stopped.Spec.RunStrategy)
	assert.Equal(t, vm.Spec.Template.ObjectMeta.Annotations[AnnotationShape], stopped.Spec.Template.ObjectMeta.Annotations[AnnotationShape], "power state is not shape")
	shape := func(vm *kubevirtv1.VirtualMachine) string {
		return vm.Spec.Template.ObjectMeta.Annotations[AnnotationShape]
	}
	m.VCPU, m.MemoryBytes = 4, 2<<30
	bigger, err := newVM(m, "vms", vm.Spec.Template)
	require.NoError(t, err)
	assert.Equal(t, shape(vm), shape(bigger), "vcpu and memory within the maxima are live updates, not shape")
	m.VCPU = 9
	beyond, err := newVM(m, "vms", vm.Spec.Template)
	require.NoError(t, err)
	assert.NotEqual(t, shape(vm), shape(beyond), "a maximum that grows is shape")
	assert.Equal(t, uint32(9*driver.DefaultMaxRatio), beyond.Spec.Template.Spec.Domain.CPU.MaxSockets)
}

// TestMaximaAreTheMachinesOrKeptOrTheRatio pins the maxSockets and
// maxGuest of a VM's template: KubeVirt's webhook refuses a maxGuest it
// cannot hot-plug, and a maximum that moves with every live change would
// make each one a restart.
func TestMaximaAreTheMachinesOrKeptOrTheRatio(t *testing.T) {
	prev := func(sockets uint32, guest string) *kubevirtv1.VirtualMachineInstanceTemplateSpec {
		q := resource.MustParse(guest)
		return &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{
			CPU: &kubevirtv1.CPU{MaxSockets: sockets}, Memory: &kubevirtv1.Memory{MaxGuest: &q},
		}}}
	}
	cases := map[string]struct {
		vcpu, maxVCPU  int32
		memory, maxMem int64
		prev           *kubevirtv1.VirtualMachineInstanceTemplateSpec
		sockets        uint32
		guest          int64 // 0: no maxGuest
	}{
		"TheRatioForANewVM":                   {vcpu: 2, memory: 1 << 30, sockets: 8, guest: 4 << 30},
		"TheMachinesOwn":                      {vcpu: 2, maxVCPU: 3, memory: 1 << 30, maxMem: 3 << 30, prev: prev(8, "4Gi"), sockets: 3, guest: 3 << 30},
		"KeptWhileTheyHoldTheShape":           {vcpu: 5, memory: 2 << 30, prev: prev(8, "4Gi"), sockets: 8, guest: 4 << 30},
		"TheRatioOnceTheShapeOutgrowsThem":    {vcpu: 9, memory: 5 << 30, prev: prev(8, "4Gi"), sockets: 36, guest: 20 << 30},
		"AtMost512VCPUsByRatio":               {vcpu: 200, memory: 1 << 30, sockets: 512, guest: 4 << 30},
		"MaxGuestRoundedDownToKubeVirtsBlock": {vcpu: 1, memory: 1 << 30, maxMem: 1<<30 + 3<<20, sockets: 4, guest: 1<<30 + 2<<20},
		"NoMaxGuestBelow1Gi":                  {vcpu: 1, memory: 512 << 20, sockets: 4},
		"NoMaxGuestForUnalignedMemory":        {vcpu: 1, memory: 1<<30 + 1<<20, sockets: 4},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := driver.Machine{VCPU: tc.vcpu, MaxVCPU: tc.maxVCPU, MemoryBytes: tc.memory, MaxMemoryBytes: tc.maxMem}
			sockets, guest := maxima(m, tc.prev)
			assert.Equal(t, tc.sockets, sockets)
			if tc.guest == 0 {
				assert.Nil(t, guest)
				return
			}
			require.NotNil(t, guest)
			assert.Equal(t, tc.guest, guest.Value())
		})
	}
}

// TestAVMOfAnAgentBeforeLiveResizeKeepsItsShape pins legacyShape against
// a VM the agent made before live resize (testdata, written by that
// agent's newVM): for the same Machine it is no new shape.
func TestAVMOfAnAgentBeforeLiveResizeKeepsItsShape(t *testing.T) {
	old := legacyVM(t)
	m := testMachine(old.Labels[LabelUID])
	want, err := newVM(m, old.Namespace, old.Spec.Template)
	require.NoError(t, err)
	reshaped, err := reshapedFor(m, old, want)
	require.NoError(t, err)
	assert.False(t, reshaped, "the same Machine")
	m.VCPU++
	want, err = newVM(m, old.Namespace, old.Spec.Template)
	require.NoError(t, err)
	reshaped, err = reshapedFor(m, old, want)
	require.NoError(t, err)
	assert.True(t, reshaped, "its vCPUs are cores, which KubeVirt does not hot-plug")
}

// legacyVM is the VM an agent from before live resize made for
// testMachine.
func legacyVM(t *testing.T) *kubevirtv1.VirtualMachine {
	t.Helper()
	raw, err := os.ReadFile("testdata/vm-before-live-resize.json")
	require.NoError(t, err)
	vm := &kubevirtv1.VirtualMachine{}
	require.NoError(t, json.Unmarshal(raw, vm))
	return vm
}

// TestNewVMConfiguresTheHubsAddresses checks the MACs and the cloud-init
// network data a guest gets for the addresses the hub allocated, decoded
// as the guest's cloud-init reads them.
func TestNewVMConfiguresTheHubsAddresses(t *testing.T) {
	const uid = "0e6e5d3c-7f6b-4f59-9d53-4d8f1c1d2a11"
	db := driver.Network{Name: "team-a_net-db", CIDR: "10.10.120.0/24"}
	backend := driver.Network{Name: "team-a_net-backend", CIDR: "10.10.121.0/26"}
	with := func(n driver.Network, address string) driver.Network {
		n.Address = netip.MustParsePrefix(address)
		return n
	}
	match := func(i int) map[string]any { return map[string]any{"macaddress": macFor(uid, i)} }
	cases := map[string]struct {
		networks []driver.Network
		// want is the decoded network data; nil means none, and no MACs.
		want map[string]any
	}{
		"NoAddressesNoNetworkDataNoMACs": {networks: []driver.Network{db, backend}},
		"EveryInterfaceAddressed": {
			networks: []driver.Network{with(db, "10.10.120.7/24"), with(backend, "10.10.121.9/26")},
			want: map[string]any{"version": float64(2), "ethernets": map[string]any{
				"eth0": map[string]any{"match": match(0), "set-name": "eth0", "addresses": []any{"10.10.120.7/24"},
					"routes": []any{map[string]any{"to": "0.0.0.0/0", "via": "10.10.120.1"}}},
				"eth1": map[string]any{"match": match(1), "set-name": "eth1", "addresses": []any{"10.10.121.9/26"}},
			}},
		},
		"UnaddressedInterfacesAskDHCP": {
			networks: []driver.Network{db, with(backend, "10.10.121.9/26")},
			want: map[string]any{"version": float64(2), "ethernets": map[string]any{
				"eth0": map[string]any{"match": match(0), "set-name": "eth0", "dhcp4": true},
				"eth1": map[string]any{"match": match(1), "set-name": "eth1", "addresses": []any{"10.10.121.9/26"}},
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := testMachine(uid)
			m.Networks = tc.networks
			require.NoError(t, validate(m))
			vm, err := newVM(m, "vms", nil)
			require.NoError(t, err)
			spec := vm.Spec.Template.Spec
			var noCloud *kubevirtv1.CloudInitNoCloudSource
			for _, v := range spec.Volumes {
				if v.CloudInitNoCloud != nil {
					noCloud = v.CloudInitNoCloud
				}
			}
			require.NotNil(t, noCloud)
			require.Len(t, spec.Domain.Devices.Interfaces, len(m.Networks))

			if tc.want == nil {
				assert.Empty(t, noCloud.NetworkData, "the site's network configures the guest, as before")
				for _, i := range spec.Domain.Devices.Interfaces {
					assert.Empty(t, i.MacAddress, "KubeVirt picks the MAC, as before")
				}
				return
			}
			var got map[string]any
			require.NoError(t, yaml.Unmarshal([]byte(noCloud.NetworkData), &got), "%s", noCloud.NetworkData)
			assert.Equal(t, tc.want, got)
			for i, iface := range spec.Domain.Devices.Interfaces {
				assert.Equal(t, macFor(uid, i), iface.MacAddress, "the MAC the network data finds interface %d by", i)
				hw, err := net.ParseMAC(iface.MacAddress)
				require.NoError(t, err)
				assert.Equal(t, byte(0x02), hw[0]&0x03, "locally administered unicast: %s", hw)
			}
			again, err := newVM(m, "vms", nil)
			require.NoError(t, err)
			assert.Equal(t, vm.Spec.Template, again.Spec.Template, "the same Machine makes the same template")
		})
	}
}

func TestAddressesAreShape(t *testing.T) {
	const uid = "0e6e5d3c-7f6b-4f59-9d53-4d8f1c1d2a11"
	hash := func(address string) string {
		t.Helper()
		m := testMachine(uid)
		if address != "" {
			m.Networks[0].Address = netip.MustParsePrefix(address)
		}
		vm, err := newVM(m, "vms", nil)
		require.NoError(t, err)
		return vm.Spec.Template.ObjectMeta.Annotations[AnnotationShape]
	}
	assert.Equal(t, hash("10.10.120.7/24"), hash("10.10.120.7/24"))
	assert.NotEqual(t, hash("10.10.120.7/24"), hash("10.10.120.8/24"), "a changed address needs a restart")
	assert.NotEqual(t, hash(""), hash("10.10.120.7/24"), "so does a new one")
	assert.NotEqual(t, macFor(uid, 0), macFor(uid, 1), "each interface has its own MAC")
	assert.NotEqual(t, macFor(uid, 0), macFor("7c1f0c8e-2b0a-4d52-8f0e-0a4f7a1b9c33", 0), "each guest has its own MACs")
}

func TestUserData(t *testing.T) {
	cases := map[string]struct {
		mutate func(*driver.Machine)
		want   map[string]any
	}{
		"KeyAndHostname": {
			mutate: func(*driver.Machine) {},
			want:   map[string]any{"hostname": "db", "ssh_authorized_keys": []any{testKey}},
		},
		"SwapAsAFile": {
			mutate: func(m *driver.Machine) { m.SwapBytes = 512 << 20 },
			want:   map[string]any{"hostname": "db", "ssh_authorized_keys": []any{testKey}, "swap": map[string]any{"filename": "/swap.img", "size": float64(512 << 20)}},
		},
		"UserCloudConfigMergedListsAppendedOursKept": {
			mutate: func(m *driver.Machine) {
				m.UserData = "#cloud-config\nhostname: theirs\nssh_authorized_keys: [ssh-ed25519 BBBB user]\npackages: [nginx]\n"
			},
			want: map[string]any{"hostname": "db", "ssh_authorized_keys": []any{testKey, "ssh-ed25519 BBBB user"}, "packages": []any{"nginx"}},
		},
		"AddressesReappliedOnEveryBoot": {
			mutate: func(m *driver.Machine) { m.Networks[0].Address = netip.MustParsePrefix("10.10.120.7/24") },
			want: map[string]any{"hostname": "db", "ssh_authorized_keys": []any{testKey},
				"updates": map[string]any{"network": map[string]any{"when": []any{"boot-new-instance", "boot"}}}},
		},
		"UserScriptWrittenAndRun": {
			mutate: func(m *driver.Machine) { m.PublicKey, m.UserData = "", "#!/bin/sh\necho hi\n" },
			want: map[string]any{"hostname": "db",
				"write_files": []any{map[string]any{"path": userScript, "permissions": "0755", "content": "#!/bin/sh\necho hi\n"}},
				"runcmd":      []any{[]any{userScript}}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := testMachine("0e6e5d3c-7f6b-4f59-9d53-4d8f1c1d2a11")
			tc.mutate(&m)
			b, err := userData(m)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(string(b), "#cloud-config\n"), "%s", b)
			var got map[string]any
			require.NoError(t, yaml.Unmarshal(b, &got))
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestObserveMapsKubeVirtStatus pins the phase, message, node and restart
// count reported for each state a VM and its VMI can be in.
func TestObserveMapsKubeVirtStatus(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	vm := func(strategy kubevirtv1.VirtualMachineRunStrategy, printable kubevirtv1.VirtualMachinePrintableStatus, conds ...kubevirtv1.VirtualMachineCondition) *kubevirtv1.VirtualMachine {
		return &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: "vf-u", UID: "vm-uid", Labels: map[string]string{LabelUID: "u"}, Annotations: map[string]string{AnnotationRestarts: "2", AnnotationVMI: "vmi-1"}},
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &strategy, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationShape: "s1"}},
			}},
			Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: printable, Conditions: conds},
		}
	}
	vmi := func(uid string, phase kubevirtv1.VirtualMachineInstancePhase, shape string) *kubevirtv1.VirtualMachineInstance {
		return &kubevirtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Annotations: map[string]string{AnnotationShape: shape}},
			Spec:       kubevirtv1.VirtualMachineInstanceSpec{Networks: []kubevirtv1.Network{{Name: "net0", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "team-a.net-db"}}}}},
			Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: phase, NodeName: "kv1", Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{
				// The guest's link-local address is no address to reach it at.
				{Name: "net0", MAC: "02:AA:bb:cc:dd:ee", IP: "10.0.0.5", IPs: []string{"10.0.0.5", "fe80::aa:bbff:fecc:ddee"}, InfoSource: "domain, guest-agent"},
			}},
		}
	}
	unschedulable := kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineConditionType(corev1.PodScheduled), Status: corev1.ConditionFalse, Message: "0/3 nodes are available: insufficient memory"}
	dvError := kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineConditionType(kubevirtv1.VirtualMachineInstanceDataVolumesReady), Status: corev1.ConditionFalse, Message: "DataVolume root failed to import"}
	restartRequired := kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineRestartRequired, Status: corev1.ConditionTrue}
	// paused gives v the condition virt-handler gives a VMI the user paused.
	paused := func(v *kubevirtv1.VirtualMachineInstance) *kubevirtv1.VirtualMachineInstance {
		v.Status.Conditions = append(v.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstancePaused, Status: corev1.ConditionTrue, Reason: "PausedByUser"})
		return v
	}
	terminating := vmi("vmi-1", kubevirtv1.Running, "s1")
	terminating.DeletionTimestamp = &metav1.Time{Time: now}

	cases := map[string]struct {
		vm              *kubevirtv1.VirtualMachine
		vmi             *kubevirtv1.VirtualMachineInstance
		phase           driver.Phase
		message         string
		node            string
		restarts        int32
		restartRequired bool
		interfaces      bool
	}{
		"RunningVMIIsRunning":                   {vm: vm(kubevirtv1.RunStrategyAlways, "Running"), vmi: vmi("vmi-1", kubevirtv1.Running, "s1"), phase: driver.PhaseRunning, node: "kv1", restarts: 2, interfaces: true},
		"NoVMIYetIsStarting":                    {vm: vm(kubevirtv1.RunStrategyAlways, "Starting"), phase: driver.PhaseStarting, restarts: 2},
		"ProvisioningVolumesIsProvisioning":     {vm: vm(kubevirtv1.RunStrategyAlways, "Provisioning"), phase: driver.PhaseProvisioning, message: "Provisioning", restarts: 2},
		"ScheduledVMIIsStarting":                {vm: vm(kubevirtv1.RunStrategyAlways, "Starting"), vmi: vmi("vmi-1", kubevirtv1.Scheduled, "s1"), phase: driver.PhaseStarting, node: "kv1", restarts: 2},
		"HaltedWithVMIIsStopping":               {vm: vm(kubevirtv1.RunStrategyHalted, "Stopping"), vmi: vmi("vmi-1", kubevirtv1.Running, "s1"), phase: driver.PhaseStopping, message: "stop the VMI", node: "kv1", restarts: 2},
		"HaltedWithoutVMIIsStopped":             {vm: vm(kubevirtv1.RunStrategyHalted, "Stopped"), phase: driver.PhaseStopped, restarts: 2},
		"APausedVMIIsPausedWithItsAddresses":    {vm: vm(kubevirtv1.RunStrategyAlways, "Paused"), vmi: paused(vmi("vmi-1", kubevirtv1.Running, "s1")), phase: driver.PhasePaused, node: "kv1", restarts: 2, interfaces: true},
		"APausedVMIOfAnOlderShapeNeedsARestart": {vm: vm(kubevirtv1.RunStrategyAlways, "Paused"), vmi: paused(vmi("vmi-1", kubevirtv1.Running, "s0")), phase: driver.PhasePaused, node: "kv1", restarts: 2, restartRequired: true, interfaces: true},
		// virt-controller derives the VM's status from the VMI's condition,
		// a moment later: a VM still shown Paused after an unpause runs.
		"TheVMsPausedStatusAloneIsNoPause":    {vm: vm(kubevirtv1.RunStrategyAlways, "Paused"), vmi: vmi("vmi-1", kubevirtv1.Running, "s1"), phase: driver.PhaseRunning, node: "kv1", restarts: 2, interfaces: true},
		"TerminatingVMIOfARunningVMRestarts":  {vm: vm(kubevirtv1.RunStrategyAlways, "Running"), vmi: terminating, phase: driver.PhaseStarting, message: "replacing", node: "kv1", restarts: 2},
		"UnschedulableIsFailedWithMessage":    {vm: vm(kubevirtv1.RunStrategyAlways, "ErrorUnschedulable", unschedulable), vmi: vmi("vmi-1", kubevirtv1.Scheduling, "s1"), phase: driver.PhaseFailed, message: "ErrorUnschedulable: 0/3 nodes are available: insufficient memory", node: "kv1", restarts: 2},
		"DataVolumeErrorIsFailedWithMessage":  {vm: vm(kubevirtv1.RunStrategyAlways, "DataVolumeError", dvError), phase: driver.PhaseFailed, message: "DataVolume root failed to import", restarts: 2},
		"CrashLoopIsFailedEvenWithoutMessage": {vm: vm(kubevirtv1.RunStrategyAlways, "CrashLoopBackOff"), phase: driver.PhaseFailed, message: "KubeVirt reports CrashLoopBackOff", restarts: 2},
		"UnknownVMIPhaseIsFailed":             {vm: vm(kubevirtv1.RunStrategyAlways, "Running"), vmi: vmi("vmi-1", kubevirtv1.Unknown, "s1"), phase: driver.PhaseFailed, message: "lost contact", node: "kv1", restarts: 2},
		"RecreatedVMICountsAsARestart":        {vm: vm(kubevirtv1.RunStrategyAlways, "Running"), vmi: vmi("vmi-2", kubevirtv1.Running, "s1"), phase: driver.PhaseRunning, node: "kv1", restarts: 3, interfaces: true},
		"OlderShapeNeedsARestart":             {vm: vm(kubevirtv1.RunStrategyAlways, "Running"), vmi: vmi("vmi-1", kubevirtv1.Running, "s0"), phase: driver.PhaseRunning, node: "kv1", restarts: 2, restartRequired: true, interfaces: true},
		"KubeVirtsRestartRequiredCounts":      {vm: vm(kubevirtv1.RunStrategyAlways, "Running", restartRequired), vmi: vmi("vmi-1", kubevirtv1.Running, "s1"), phase: driver.PhaseRunning, node: "kv1", restarts: 2, restartRequired: true, interfaces: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := observe(tc.vm, tc.vmi, now)
			assert.Equal(t, "u", o.UID)
			assert.Equal(t, "vm-uid", o.ID, "the KubeVirt VM's uid")
			assert.Equal(t, tc.phase, o.Phase)
			assert.Contains(t, o.Message, tc.message)
			if tc.message == "" {
				assert.Empty(t, o.Message)
			}
			assert.Equal(t, tc.node, o.Node)
			assert.Equal(t, tc.restarts, o.RestartCount)
			assert.Equal(t, tc.restartRequired, o.RestartRequired)
			if !tc.interfaces {
				assert.Empty(t, o.Interfaces)
				return
			}
			assert.Equal(t, []driver.Interface{{Network: "team-a_net-db", MAC: "02:aa:bb:cc:dd:ee", IPs: []string{"10.0.0.5"}, Source: driver.AddressSourceGuestAgent, LastSeen: now}}, o.Interfaces)
		})
	}
}

func TestSizeReadsTheShapeAsKubeVirtDoes(t *testing.T) {
	resources := func(cpu, memory string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
	}
	guest := resource.MustParse("2Gi")
	cases := map[string]struct {
		domain kubevirtv1.DomainSpec
		vcpu   int32
		memory int64
	}{
		"Topology":          {kubevirtv1.DomainSpec{CPU: &kubevirtv1.CPU{Cores: 2, Sockets: 2, Threads: 2}, Memory: &kubevirtv1.Memory{Guest: &guest}, Resources: kubevirtv1.ResourceRequirements{Requests: resources("1", "1Gi")}}, 8, 2 << 30},
		"CoresAlone":        {kubevirtv1.DomainSpec{CPU: &kubevirtv1.CPU{Cores: 3}}, 3, 0},
		"RequestsRoundedUp": {kubevirtv1.DomainSpec{Resources: kubevirtv1.ResourceRequirements{Requests: resources("1500m", "512Mi")}}, 2, 512 << 20},
		"Limits":            {kubevirtv1.DomainSpec{Resources: kubevirtv1.ResourceRequirements{Limits: resources("2", "1Gi")}}, 2, 1 << 30},
		"NothingSaid":       {kubevirtv1.DomainSpec{}, 1, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vcpu, memory := size(&kubevirtv1.VirtualMachineInstanceSpec{Domain: tc.domain})
			assert.Equal(t, tc.vcpu, vcpu)
			assert.Equal(t, tc.memory, memory)
		})
	}
}

func TestWantsRunningFollowsTheRunStrategy(t *testing.T) {
	live := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}}
	done := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Succeeded}}
	strategy := func(s kubevirtv1.VirtualMachineRunStrategy) kubevirtv1.VirtualMachineSpec {
		return kubevirtv1.VirtualMachineSpec{RunStrategy: &s}
	}
	cases := map[string]struct {
		spec kubevirtv1.VirtualMachineSpec
		vmi  *kubevirtv1.VirtualMachineInstance
		want bool
	}{
		"Always":                 {strategy(kubevirtv1.RunStrategyAlways), nil, true},
		"RerunOnFailure":         {strategy(kubevirtv1.RunStrategyRerunOnFailure), nil, true},
		"Halted":                 {strategy(kubevirtv1.RunStrategyHalted), live, false},
		"ManualWithAVMI":         {strategy(kubevirtv1.RunStrategyManual), live, true},
		"ManualWithoutAVMI":      {strategy(kubevirtv1.RunStrategyManual), nil, false},
		"OnceFinished":           {strategy(kubevirtv1.RunStrategyOnce), done, false},
		"DeprecatedRunningTrue":  {kubevirtv1.VirtualMachineSpec{Running: ptr(true)}, nil, true},    //nolint:staticcheck // what older manifests say
		"DeprecatedRunningFalse": {kubevirtv1.VirtualMachineSpec{Running: ptr(false)}, live, false}, //nolint:staticcheck // as above
		"NeitherSet":             {kubevirtv1.VirtualMachineSpec{}, nil, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, wantsRunning(&kubevirtv1.VirtualMachine{Spec: tc.spec}, tc.vmi))
		})
	}
}
