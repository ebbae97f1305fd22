package libvirt

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

func TestDomainXMLRoundTrip(t *testing.T) {
	m := machine("round")
	owner := ownership{UID: m.UID, Namespace: m.Namespace, Name: m.Name, Generation: 3, SpecHash: specHash(m), LastNonce: "n", Restarts: 2}
	x, err := domainXML(domainSpec{machine: m, owner: owner, domainType: "kvm", pool: "default", maxVCPU: 8, maxMemory: 2 << 30})
	require.NoError(t, err)

	info, err := parseDomain(x)
	require.NoError(t, err)
	assert.Equal(t, &owner, info.owner, "the metadata carries ownership")
	assert.Equal(t, int64(2), info.vcpu)
	assert.Equal(t, int64(8), info.maxVCPU)
	assert.Equal(t, int64(512<<20), info.memory)
	assert.Equal(t, int64(2<<30), info.maxMemory)
	assert.Equal(t, []nic{{network: "net-db", mac: macFor(m.UID, 0)}}, info.nics)

	var d libvirtxml.Domain
	require.NoError(t, d.Unmarshal(x))
	var disks []string
	for _, disk := range d.Devices.Disks {
		disks = append(disks, disk.Target.Dev+"="+disk.Source.Volume.Volume)
	}
	assert.Equal(t, []string{"vda=round-root", "vdb=" + swapVolume(m.UID), "vdc=" + seedVolume(m.UID)}, disks, "boot disk first, then swap, then the seed")
	assert.Equal(t, uint(1), d.Devices.Disks[0].Boot.Order)
	seed := d.Devices.Disks[2]
	assert.Equal(t, "virtio", seed.Target.Bus, "a stock cloud kernel without AHCI sees the seed")
	assert.NotNil(t, seed.ReadOnly, "the guest cannot write its seed")
	require.NotNil(t, d.Features, "ACPI and APIC, or QEMU runs with -no-acpi and ignores shutdown and reboot requests")
	assert.NotNil(t, d.Features.ACPI)
	assert.NotNil(t, d.Features.APIC)
	assert.Equal(t, "kvm", d.Type)
	require.NotNil(t, d.Devices.MemBalloon, "memory changes live through the balloon")
	assert.Equal(t, "virtio", d.Devices.MemBalloon.Model)
}

// TestMaxima pins the most a guest can grow to live: its own maxima, else
// DefaultMaxRatio times its shape within the host's, and a maximum beyond
// the host's is refused naming the field.
func TestMaxima(t *testing.T) {
	const hostCPUs, hostMemory = 16, 8 << 30
	cases := map[string]struct {
		vcpu, maxVCPU     int32
		memory, maxMemory int64
		wantVCPU          int64
		wantMemory        int64
		wantErr           string
	}{
		"OwnMaximaAreKept":                  {vcpu: 2, maxVCPU: 3, memory: 1 << 30, maxMemory: 3 << 30, wantVCPU: 3, wantMemory: 3 << 30},
		"DefaultIsFourTimesTheShape":        {vcpu: 2, memory: 1 << 30, wantVCPU: 8, wantMemory: 4 << 30},
		"DefaultStopsAtTheHost":             {vcpu: 6, memory: 3 << 30, wantVCPU: 16, wantMemory: 8 << 30},
		"DefaultIsNeverBelowTheShape":       {vcpu: 16, memory: 8 << 30, wantVCPU: 16, wantMemory: 8 << 30},
		"MaxVCPUBeyondTheHostIsRefused":     {vcpu: 2, maxVCPU: 17, memory: 1 << 30, wantErr: "maxVcpu 17 is more than the 16 CPUs of node n"},
		"MaxMemoryBeyondTheHostIsRefused":   {vcpu: 2, memory: 1 << 30, maxMemory: 9 << 30, wantErr: "maxMemory of 9663676416 bytes is more than the 8589934592 bytes of node n"},
		"OneMaximumLeavesTheOtherToDefault": {vcpu: 1, maxVCPU: 1, memory: 1 << 30, wantVCPU: 1, wantMemory: 4 << 30},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := driver.Machine{VCPU: tc.vcpu, MaxVCPU: tc.maxVCPU, MemoryBytes: tc.memory, MaxMemoryBytes: tc.maxMemory}
			vcpu, memory, err := maxima(m, hostCPUs, hostMemory, "n")
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.True(t, driver.IsTerminal(err))
				assert.Equal(t, tc.wantErr, err.Error())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantVCPU, vcpu)
			assert.Equal(t, tc.wantMemory, memory)
		})
	}
}

func TestDomainTypeComesFromTheHostsCapabilities(t *testing.T) {
	guest := func(arch string, types ...string) libvirtxml.CapsGuest {
		g := libvirtxml.CapsGuest{OSType: "hvm", Arch: libvirtxml.CapsGuestArch{Name: arch}}
		for _, typ := range types {
			g.Arch.Domains = append(g.Arch.Domains, libvirtxml.CapsGuestDomain{Type: typ})
		}
		return g
	}
	caps := func(guests ...libvirtxml.CapsGuest) libvirtxml.Caps {
		return libvirtxml.Caps{Host: libvirtxml.CapsHost{CPU: &libvirtxml.CapsHostCPU{Arch: "x86_64"}}, Guests: guests}
	}
	cases := map[string]struct {
		caps       libvirtxml.Caps
		configured string
		want       string
		wantErr    bool
	}{
		"KVMWhereOffered":             {caps: caps(guest("x86_64", "qemu", "kvm")), want: "kvm"},
		"QEMUWithoutKVM":              {caps: caps(guest("i686", "qemu", "kvm"), guest("x86_64", "qemu")), want: "qemu"},
		"OtherArchitecturesDontCount": {caps: caps(guest("aarch64", "kvm")), wantErr: true},
		"NoGuestsAtAll":               {caps: caps(), wantErr: true},
		"EmulationForcedBesideKVM":    {caps: caps(guest("x86_64", "qemu", "kvm")), configured: "qemu", want: "qemu"},
		"KVMAskedForAndNotOffered":    {caps: caps(guest("x86_64", "qemu")), configured: "kvm", wantErr: true},
		"UnknownTypeAskedFor":         {caps: caps(guest("x86_64", "qemu", "kvm")), configured: "xen", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := domainTypeOf(tc.caps, tc.configured)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestSpecHash(t *testing.T) {
	base := machine("h")
	cases := map[string]struct {
		change func(m *driver.Machine)
		same   bool
	}{
		"PowerStateDoesNotChangeTheDefinition":   {change: func(m *driver.Machine) { m.Running = false }, same: true},
		"RestartNonceDoesNotChangeTheDefinition": {change: func(m *driver.Machine) { m.RestartNonce = "x" }, same: true},
		"GenerationDoesNotChangeTheDefinition":   {change: func(m *driver.Machine) { m.Generation++ }, same: true},
		"PausedDoesNotChangeTheDefinition":       {change: func(m *driver.Machine) { m.Paused = true }, same: true},
		"ResetNonceDoesNotChangeTheDefinition":   {change: func(m *driver.Machine) { m.ResetNonce = "x" }, same: true},
		"VCPUDoesNotChangeTheDefinition":         {change: func(m *driver.Machine) { m.VCPU++ }, same: true},
		"MemoryDoesNotChangeTheDefinition":       {change: func(m *driver.Machine) { m.MemoryBytes *= 2 }, same: true},
		"MaxVCPUChangesTheDefinition":            {change: func(m *driver.Machine) { m.MaxVCPU = 8 }},
		"MaxMemoryChangesTheDefinition":          {change: func(m *driver.Machine) { m.MaxMemoryBytes = 2 << 30 }},
		"SwapChangesTheDefinition":               {change: func(m *driver.Machine) { m.SwapBytes *= 2 }},
		"PublicKeyChangesTheDefinition":          {change: func(m *driver.Machine) { m.PublicKey = "ssh-ed25519 BBBB" }},
		"DiskSizeDoesNotChangeTheDefinition":     {change: func(m *driver.Machine) { m.Disks[0].SizeBytes *= 2 }, same: true},
		"DataDisksDoNotChangeTheDefinition":      {change: func(m *driver.Machine) { m.Disks = append(m.Disks, driver.Disk{Name: "data"}) }, same: true},
		"TheBootDiskChangesTheDefinition":        {change: func(m *driver.Machine) { m.Disks[0].Name = "other" }},
		// A guest defined before Machine had an instance type, or whose
		// type only got a new revision, is not redefined for it.
		"AnInstancetypeDoesNotChangeTheDefinition": {change: func(m *driver.Machine) {
			m.Instancetype = &driver.Instancetype{Cluster: true, Name: "u1.small", Revision: 1}
		}, same: true},
		"AnInstancetypeRevisionDoesNotChangeTheDefinition": {change: func(m *driver.Machine) {
			m.Instancetype = &driver.Instancetype{Name: "u1.small", Revision: 7}
		}, same: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := base
			m.Disks = append([]driver.Disk(nil), base.Disks...)
			tc.change(&m)
			assert.Equal(t, tc.same, specHash(m) == specHash(base))
		})
	}
}

func TestSeedISO(t *testing.T) {
	cases := map[string]struct {
		userData string
		want     []string
	}{
		"OwnCloudConfigCarriesKeyHostnameAndSwap": {
			want: []string{"#cloud-config\n", `"hostname":"seed"`, `"ssh_authorized_keys":["ssh-ed25519 AAAAC3`, "mkswap /dev/disk/by-id/virtio-vf-swap"},
		},
		"UserDataIsMergedAfterOursAsMultipart": {
			userData: "#!/bin/sh\necho hi\n",
			want:     []string{"multipart/mixed", "Content-Type: text/cloud-config", "Content-Type: text/x-shellscript", "echo hi", "Merge-Type: list(append)"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := machine("seed")
			m.UserData = tc.userData
			iso, err := seedISO(m)
			require.NoError(t, err)

			img, err := iso9660.OpenImage(bytes.NewReader(iso))
			require.NoError(t, err)
			label, err := img.Label()
			require.NoError(t, err)
			assert.Equal(t, "cidata", label, "NoCloud finds its seed by this label")
			files := readAll(t, img)
			assert.Contains(t, files["meta-data"], `"instance-id":"`+m.UID+`"`)
			for _, w := range tc.want {
				assert.Contains(t, files["user-data"], w)
			}
		})
	}
}

func readAll(t *testing.T, img *iso9660.Image) map[string]string {
	t.Helper()
	root, err := img.RootDir()
	require.NoError(t, err)
	children, err := root.GetChildren()
	require.NoError(t, err)
	out := map[string]string{}
	for _, c := range children {
		b, err := io.ReadAll(c.Reader())
		require.NoError(t, err)
		out[strings.TrimSuffix(c.Name(), ";1")] = string(b)
	}
	return out
}

func TestNetworkXML(t *testing.T) {
	const uid = "5d0c8a5e-2f4b-4c1e-9d7a-3b6e8f1a2c4d"
	cases := map[string]struct {
		spec     networkSpec
		want     []string
		not      []string
		terminal string
	}{
		"NATServesOnlyReservationsAfterTheHostAddress": {
			spec: networkSpec{network: driver.Network{Name: "n", CIDR: "10.10.120.0/24"}},
			want: []string{`<forward mode="nat"></forward>`, `<ip address="10.10.120.1" netmask="255.255.255.0"><dhcp></dhcp></ip>`},
			not:  []string{"<range", "<mtu"},
		},
		"TheFirstGuestsReservationIsInTheDefinition": {
			spec: networkSpec{network: driver.Network{Name: "n", CIDR: "10.10.120.0/24"}, reservation: &libvirtxml.NetworkDHCPHost{MAC: "52:54:00:01:02:03", IP: "10.10.120.7"}},
			want: []string{`<dhcp><host mac="52:54:00:01:02:03" ip="10.10.120.7"></host></dhcp>`},
			not:  []string{"<range"},
		},
		"IsolatedHasNoForward": {
			spec: networkSpec{network: driver.Network{Name: "n", CIDR: "192.168.7.0/28", Mode: driver.NetworkModeIsolated}},
			want: []string{`<ip address="192.168.7.1" netmask="255.255.255.240">`},
			not:  []string{"<forward"},
		},
		"TheDriverMarksWhatItMakes": {
			spec: networkSpec{network: driver.Network{Name: "n", CIDR: "10.0.0.0/24", UID: uid, VNI: 42}},
			want: []string{`<metadata><network xmlns="https://virtfleet.io/xmlns/network/v1"><uid>` + uid + `</uid><vni>42</vni></network></metadata>`},
		},
		"TheBridgeMACIsTheUIDsOnEveryNode": {
			spec: networkSpec{network: driver.Network{Name: "on-any-node", CIDR: "10.0.0.0/24", UID: uid}},
			want: []string{`<mac address="` + gatewayMAC(uid) + `"></mac>`},
		},
		"TheOverlaysMTUIsGiven": {
			spec: networkSpec{network: driver.Network{Name: "n", CIDR: "10.0.0.0/24", VNI: 7}, mtu: 1450},
			want: []string{`<mtu size="1450"></mtu>`},
		},
		"BridgeJoinsTheHostBridge": {
			spec: networkSpec{network: driver.Network{Name: "n", Mode: driver.NetworkModeBridge, Bridge: "br0"}},
			want: []string{`<forward mode="bridge"></forward><bridge name="br0"></bridge>`},
		},
		"ABridgesVLANForwardsOnTheBridgeMadeForIt": {
			spec: networkSpec{network: driver.Network{Name: "n", Mode: driver.NetworkModeBridge, Bridge: "br-site", UID: uid, VLAN: 100}, vlan: vlanLinks{Device: "vfv7.100", Bridge: "vfb7.100"}},
			want: []string{
				`<forward mode="bridge"></forward><bridge name="vfb7.100"></bridge>`,
				`<uid>` + uid + `</uid><vlan>100</vlan><vlanDevice>vfv7.100</vlanDevice><vlanBridge>vfb7.100</vlanBridge></network></metadata>`,
			},
			not: []string{"br-site", "<ip"},
		},
		"BridgeWithoutVLANMarksNoLinks": {
			spec: networkSpec{network: driver.Network{Name: "n", Mode: driver.NetworkModeBridge, Bridge: "br0", UID: uid}},
			not:  []string{"<vlan"},
		},
		"BridgeWithoutBridgeIsTerminal": {
			spec: networkSpec{network: driver.Network{Name: "n", Mode: driver.NetworkModeBridge}}, terminal: "bridge mode needs a host bridge",
		},
		"IPv6IsTerminal": {
			spec: networkSpec{network: driver.Network{Name: "n", CIDR: "fd00::/64"}}, terminal: "is not an IPv4 subnet",
		},
		"UnknownModeIsTerminal": {
			spec: networkSpec{network: driver.Network{Name: "n", CIDR: "10.0.0.0/24", Mode: "vxlan"}}, terminal: `unknown mode "vxlan"`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			x, err := networkXML(tc.spec)
			if tc.terminal != "" {
				require.Error(t, err)
				assert.True(t, driver.IsTerminal(err))
				assert.Contains(t, err.Error(), tc.terminal)
				return
			}
			require.NoError(t, err)
			flat := strings.NewReplacer("\n", "", "  ", "").Replace(x)
			for _, w := range tc.want {
				assert.Contains(t, flat, w)
			}
			for _, n := range tc.not {
				assert.NotContains(t, flat, n)
			}
		})
	}
}

// The links of a VLAN are named from the host bridge's index and the tag,
// within a link name's 15 characters whatever the host bridge's name.
func TestVLANLinkNames(t *testing.T) {
	for _, tc := range []struct {
		parent int
		id     int32
		want   vlanLinks
		err    bool
	}{
		{parent: 7, id: 100, want: vlanLinks{Device: "vfv7.100", Bridge: "vfb7.100"}},
		{parent: 9999999, id: 4094, want: vlanLinks{Device: "vfv9999999.4094", Bridge: "vfb9999999.4094"}},
		{parent: 10000000, id: 4094, err: true},
	} {
		got, err := vlanLinkNames(tc.parent, tc.id)
		if tc.err {
			assert.Error(t, err, "%d.%d", tc.parent, tc.id)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.want, got)
		assert.LessOrEqual(t, len(got.Device), maxLinkName)
	}
}

// TestCheckVLAN: a VLAN tag is refused for good where no network could
// carry it.
func TestCheckVLAN(t *testing.T) {
	bridged := driver.Network{Name: "n", Mode: driver.NetworkModeBridge, Bridge: "br-site"}
	for name, tc := range map[string]struct {
		change func(n *driver.Network)
		want   string
	}{
		"NoVLAN":            {func(*driver.Network) {}, ""},
		"VLAN1":             {func(n *driver.Network) { n.VLAN = 1 }, ""},
		"VLAN4094":          {func(n *driver.Network) { n.VLAN = 4094 }, ""},
		"VLAN4095":          {func(n *driver.Network) { n.VLAN = 4095 }, "is not a VLAN id"},
		"OnANATNetwork":     {func(n *driver.Network) { n.VLAN, n.Mode = 10, driver.NetworkModeNAT }, "only a bridge-mode network"},
		"OnAnImportedOne":   {func(n *driver.Network) { n.VLAN, n.Imported = 10, true }, "used as it is"},
		"WithoutHostBridge": {func(n *driver.Network) { n.VLAN, n.Bridge = 10, "" }, "no host bridge"},
	} {
		t.Run(name, func(t *testing.T) {
			n := bridged
			tc.change(&n)
			err := checkVLAN(n)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, driver.IsTerminal(err), "terminal: %v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The bridge's MAC is a locally administered unicast one, the same for
// one uid and different for another.
func TestGatewayMAC(t *testing.T) {
	a, b := gatewayMAC("uid-a"), gatewayMAC("uid-b")
	assert.Equal(t, a, gatewayMAC("uid-a"))
	assert.NotEqual(t, a, b)
	for _, mac := range []string{a, b} {
		hw, err := net.ParseMAC(mac)
		require.NoError(t, err)
		assert.Equal(t, byte(0x02), hw[0]&0x03, "%s is locally administered and unicast", mac)
	}
}

// TestOpenRefusesWhereItCannotWrite pins that a driver that could not stage
// a seed or download an image says so when it opens, naming the directory,
// instead of failing every define later (a container whose read-only root
// filesystem has no volume at /tmp).
func TestOpenRefusesWhereItCannotWrite(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	for _, tc := range []struct {
		name     string
		tmpdir   string
		imageDir string
		want     string
	}{
		{"no temporary directory", file, t.TempDir(), "cannot stage cloud-init seeds in the temporary directory " + file},
		{"no image download directory", t.TempDir(), filepath.Join(file, "images"), "cannot create the image download directory " + filepath.Join(file, "images")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TMPDIR", tc.tmpdir)
			_, err := Open(context.Background(), Config{Node: "n", Socket: "/nonexistent", URI: "test:///default", Images: imageimport.Config{Dir: tc.imageDir}})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "libvirtd", "refused before it dials")
		})
	}
}
