package libvirt

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// The underlay of TestNetworksOnARealHost: one end of a veth pair in the
// host's namespace (this kernel has no dummy links) holding the tunnel
// address. The peers are on its subnet, so what the overlay floods to them
// goes to the pair's other end, in the namespace too, and nowhere else.
// The addresses are of TEST-NET-1, which nothing routes.
var (
	tunnelAddress = netip.MustParseAddr("192.0.2.1")
	peerA         = netip.MustParseAddr("192.0.2.2")
	peerB         = netip.MustParseAddr("192.0.2.3")
)

const (
	underlayName = "vfunder"
	underlayMTU  = 1400
)

// TestNetworksOnARealHost runs the driver's networks on a real libvirtd
// (internal/harness/guesthost), whose bridges, dnsmasq and VXLAN devices
// live in a network namespace of the test's own.
func TestNetworksOnARealHost(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, err := guesthost.Start(ctx, "vfnet", os.Stderr)
	require.NoError(t, err)
	h.StopWith(t)
	links := linksIn(t, h.Netns)
	underlay := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: underlayName, MTU: underlayMTU}, PeerName: underlayName + "-end"}
	require.NoError(t, links.LinkAdd(underlay))
	require.NoError(t, links.AddrAdd(underlay, &netlink.Addr{IPNet: &net.IPNet{IP: tunnelAddress.AsSlice(), Mask: net.CIDRMask(24, 32)}}))
	require.NoError(t, links.LinkSetUp(underlay))

	openOn := func(t *testing.T, tunnel netip.Addr) *Driver {
		t.Helper()
		d, err := Open(ctx, Config{
			Node: "real", Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType,
			ShutdownGrace: time.Second, TunnelAddress: tunnel, Netns: filepath.Join("/run/netns", h.Netns),
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	l, err := h.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Disconnect() })
	host := realHost{Host: h, l: l, links: links}

	t.Run("AddressesComeFromTheHubOnly", func(t *testing.T) { testHubAddresses(ctx, t, host, openOn(t, netip.Addr{})) })
	t.Run("AnOverlayJoinsTheBridgeToThePeers", func(t *testing.T) { testOverlay(ctx, t, host, openOn(t, tunnelAddress)) })
	t.Run("AnOlderAgentsNetworkKeepsWorking", func(t *testing.T) { testOlderAgentsNetwork(ctx, t, host, openOn(t, tunnelAddress)) })
	t.Run("AVLANOfASiteBridgeGetsABridgeOfItsOwn", func(t *testing.T) { testVLAN(ctx, t, host, openOn(t, netip.Addr{})) })
	t.Run("ANetworkNoNodeCouldServeIsTerminal", func(t *testing.T) { testRefusedNetworks(ctx, t, host, openOn(t, netip.Addr{})) })
	t.Run("ANetworkTakesNoRouteOfTheNode", func(t *testing.T) { testNodeRoutes(ctx, t, host, openOn(t, tunnelAddress)) })
}

// realHost is the host with the connections the checks look through.
type realHost struct {
	*guesthost.Host
	l     *golibvirt.Libvirt
	links *netlink.Handle
}

func linksIn(t *testing.T, name string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromName(name)
	require.NoError(t, err)
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h
}

// addressed is a guest, stopped (no QEMU needed), with an interface on
// network name of subnet 10.77.0.0/24 at address a.
func addressed(name, network, uid string, a string) driver.Machine {
	m := machine(name)
	m.Running = false
	m.SwapBytes = 0
	m.Networks = []driver.Network{{Name: network, CIDR: "10.77.0.0/24", UID: uid, Address: netip.MustParsePrefix(a)}}
	return m
}

// network reads a network's running definition behind the driver's back.
func (h realHost) network(t *testing.T, name string) *libvirtxml.Network {
	t.Helper()
	ref, err := h.l.NetworkLookupByName(name)
	require.NoError(t, err)
	x, err := h.l.NetworkGetXMLDesc(ref, 0)
	require.NoError(t, err)
	def := &libvirtxml.Network{}
	require.NoError(t, def.Unmarshal(x))
	return def
}

// dnsmasqFile reads one of the files libvirt writes for a network's
// dnsmasq (conf, hostsfile) under the host's state directory.
func (h realHost) dnsmasqFile(t *testing.T, network, ext string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.Dir, "lib", "dnsmasq", network+"."+ext))
	require.NoError(t, err)
	return string(b)
}

// dnsmasqPid is the pid of a network's dnsmasq, from its pid file.
func (h realHost) dnsmasqPid(t *testing.T, network string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.Dir, "run", "network", network+".pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return pid
}

// assertRefused checks that d refuses m as Terminal, saying says, before
// it made anything: neither m's network nor its domain.
func (h realHost) assertRefused(ctx context.Context, t *testing.T, d *Driver, m driver.Machine, says string) {
	t.Helper()
	_, err := d.Ensure(ctx, m)
	require.Error(t, err)
	assert.True(t, driver.IsTerminal(err), "terminal: %v", err)
	assert.Contains(t, err.Error(), says)
	_, err = h.l.NetworkLookupByName(m.Networks[0].Name)
	assert.True(t, isCode(err, golibvirt.ErrNoNetwork), "nothing was made: %v", err)
	_, err = h.l.DomainLookupByName(domainName(m))
	assert.Error(t, err, "no domain was defined")
}

// assertGone checks that nothing of network is left: no libvirt network,
// no bridge, no dnsmasq, no VXLAN device.
func (h realHost) assertGone(t *testing.T, network, bridge string, dnsmasq int, vni int32) {
	t.Helper()
	_, err := h.l.NetworkLookupByName(network)
	assert.True(t, isCode(err, golibvirt.ErrNoNetwork), "network %s is undefined: %v", network, err)
	_, err = h.links.LinkByName(bridge)
	assert.ErrorAs(t, err, &netlink.LinkNotFoundError{}, "bridge %s is gone", bridge)
	_, err = h.links.LinkByName(vxlanName(vni))
	assert.ErrorAs(t, err, &netlink.LinkNotFoundError{}, "VXLAN device %s is gone", vxlanName(vni))
	// libvirt leaves the pid file, which dnsmasq, no longer root, cannot
	// remove: the process is what must be gone.
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(dnsmasq) + "/cmdline")
	assert.False(t, err == nil && strings.Contains(string(cmdline), network+".conf"), "dnsmasq %d of %s still runs", dnsmasq, network)
}

func testHubAddresses(ctx context.Context, t *testing.T, h realHost, d *Driver) {
	const network = "vf-hub-addresses"
	uid := "9a3f1c2e-5b7d-4e8a-b1c2-d3e4f5a6b7c8"
	web := addressed("web", network, uid, "10.77.0.9/24")
	db := addressed("db", network, uid, "10.77.0.10/24")
	// A reservation as dnsmasq's hosts file has it.
	reservation := func(m driver.Machine) string { return macFor(m.UID, 0) + "," + m.Networks[0].Address.Addr().String() }

	for _, step := range []struct {
		name string
		do   func(t *testing.T) error
		want []*driver.Machine
	}{
		{"AGuestGetsItsAddressReserved", func(*testing.T) error { _, err := d.Ensure(ctx, web); return err }, []*driver.Machine{&web}},
		{"EnsuringItAgainChangesNothing", func(*testing.T) error { _, err := d.Ensure(ctx, web); return err }, []*driver.Machine{&web}},
		{"ANewAddressReplacesItsReservation", func(*testing.T) error {
			web.Networks[0].Address = netip.MustParsePrefix("10.77.0.11/24")
			_, err := d.Ensure(ctx, web)
			return err
		}, []*driver.Machine{&web}},
		{"AnotherGuestGetsItsOwn", func(*testing.T) error { _, err := d.Ensure(ctx, db); return err }, []*driver.Machine{&web, &db}},
		{"ADeletedGuestsReservationGoes", func(*testing.T) error { return d.Delete(ctx, db.UID) }, []*driver.Machine{&web}},
	} {
		t.Run(step.name, func(t *testing.T) {
			require.NoError(t, step.do(t))
			def := h.network(t, network)
			require.Len(t, def.IPs, 1)
			ip := def.IPs[0]
			assert.Equal(t, "10.77.0.1", ip.Address, "the gateway is the subnet's first address")
			require.NotNil(t, ip.DHCP)
			assert.Empty(t, ip.DHCP.Ranges, "no dynamic range: the hub gives the addresses")
			var want, have []string
			for _, m := range step.want {
				want = append(want, reservation(*m))
			}
			for _, r := range ip.DHCP.Hosts {
				have = append(have, r.MAC+","+r.IP)
			}
			assert.ElementsMatch(t, want, have, "the network's reservations")

			conf := h.dnsmasqFile(t, network, "conf")
			assert.Contains(t, conf, "dhcp-range=10.77.0.1,static\n", "dnsmasq serves reservations only")
			assert.Equal(t, 1, strings.Count(conf, "dhcp-range="), conf)
			assert.ElementsMatch(t, want, strings.Fields(h.dnsmasqFile(t, network, "hostsfile")), "dnsmasq's reservations")
		})
	}

	t.Run("MovingTheLastGuestElsewhereRemovesTheNetwork", func(t *testing.T) {
		bridge := h.network(t, network).Bridge.Name
		dnsmasq := h.dnsmasqPid(t, network)
		// Another subnet: libvirt starts no network on a subnet another
		// active one routes.
		web.Networks[0].Name, web.Networks[0].CIDR = network+"-2", "10.78.0.0/24"
		web.Networks[0].Address = netip.MustParsePrefix("10.78.0.11/24")
		_, err := d.Ensure(ctx, web)
		require.NoError(t, err)
		h.assertGone(t, network, bridge, dnsmasq, 0)
		assert.Equal(t, reservation(web)+"\n", h.dnsmasqFile(t, web.Networks[0].Name, "hostsfile"))
	})
	t.Run("DeletingTheLastGuestRemovesTheNetwork", func(t *testing.T) {
		moved := web.Networks[0].Name
		bridge := h.network(t, moved).Bridge.Name
		dnsmasq := h.dnsmasqPid(t, moved)
		require.NoError(t, d.Delete(ctx, web.UID))
		h.assertGone(t, moved, bridge, dnsmasq, 0)
	})
}

// An agent older than the hub's addresses made networks with a dynamic
// DHCP range and no mark: guests on one get their reservations, and the
// network is left as it is, range and all, even once unused.
func testOlderAgentsNetwork(ctx context.Context, t *testing.T, h realHost, d *Driver) {
	const network = "vf-older-agents"
	x, err := (&libvirtxml.Network{
		Name:    network,
		Forward: &libvirtxml.NetworkForward{Mode: "nat"},
		IPs: []libvirtxml.NetworkIP{{
			Address: "10.77.0.1", Netmask: "255.255.255.0",
			DHCP: &libvirtxml.NetworkDHCP{
				Ranges: []libvirtxml.NetworkDHCPRange{{Start: "10.77.0.2", End: "10.77.0.254"}},
				// Left by a guest deleted with its reservation still there.
				Hosts: []libvirtxml.NetworkDHCPHost{{MAC: "52:54:00:0d:0d:0d", IP: "10.77.0.40"}},
			},
		}},
	}).Marshal()
	require.NoError(t, err)
	ref, err := h.l.NetworkDefineXML(x)
	require.NoError(t, err)
	require.NoError(t, h.l.NetworkCreate(ref))
	t.Cleanup(func() { _ = h.l.NetworkDestroy(ref); _ = h.l.NetworkUndefine(ref) })

	m := addressed("old", network, "", "10.77.0.40/24")
	m.Networks[0].VNI = 9 // not joined: its range would serve the other nodes' guests
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	ip := h.network(t, network).IPs[0]
	assert.Len(t, ip.DHCP.Ranges, 1, "the range stays")
	require.Len(t, ip.DHCP.Hosts, 1, "the stale reservation of the address gave way")
	assert.Equal(t, macFor(m.UID, 0)+",10.77.0.40", ip.DHCP.Hosts[0].MAC+","+ip.DHCP.Hosts[0].IP)
	_, err = h.links.LinkByName(vxlanName(9))
	assert.ErrorAs(t, err, &netlink.LinkNotFoundError{}, "no overlay for a network with a range")

	require.NoError(t, d.Delete(ctx, m.UID))
	ip = h.network(t, network).IPs[0]
	assert.Empty(t, ip.DHCP.Hosts, "the deleted guest's reservation goes")
	assert.Len(t, ip.DHCP.Ranges, 1, "the network stays as it was")
}

func testOverlay(ctx context.Context, t *testing.T, h realHost, d *Driver) {
	const network, vni = "vf-overlay", int32(4242)
	uid := "2c4e6a8b-1d3f-4a5b-8c7d-9e0f1a2b3c4d"
	m := addressed("spans", network, uid, "10.77.0.20/24")
	m.Networks[0].VNI = vni

	// Before the first Ensure, as the agent does.
	require.NoError(t, d.SetPeers(ctx, []netip.Addr{peerA, peerB, tunnelAddress}))
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, tunnelAddress, d.TunnelAddress())

	def := h.network(t, network)
	bridge, err := h.links.LinkByName(def.Bridge.Name)
	require.NoError(t, err)
	link, err := h.links.LinkByName(vxlanName(vni))
	require.NoError(t, err)
	vx, ok := link.(*netlink.Vxlan)
	require.True(t, ok, "%s is a %s, not a vxlan", vxlanName(vni), link.Type())

	t.Run("TheVXLANDeviceIsTheOverlays", func(t *testing.T) {
		assert.Equal(t, int(vni), vx.VxlanId)
		assert.Equal(t, vxlanPort, vx.Port)
		assert.True(t, vx.Learning, "learning")
		assert.True(t, vx.SrcAddr.Equal(tunnelAddress.AsSlice()), "local %s", vx.SrcAddr)
		assert.Equal(t, underlayMTU, vx.MTU, "the underlay's MTU")
		assert.Equal(t, bridge.Attrs().Index, vx.MasterIndex, "a port of the network's bridge %s", bridge.Attrs().Name)
		assert.NotZero(t, vx.Flags&net.FlagUp, "up")
	})
	t.Run("TheBridgeIsTheSameGatewayOnEveryNode", func(t *testing.T) {
		assert.Equal(t, gatewayMAC(uid), bridge.Attrs().HardwareAddr.String())
	})
	t.Run("GuestsGetTheUnderlaysMTULessVXLANs", func(t *testing.T) {
		require.NotNil(t, def.MTU)
		assert.Equal(t, uint(underlayMTU-50), def.MTU.Size)
		// libvirt 9.0 hands the network's MTU to the guests by DHCP.
		assert.Contains(t, h.dnsmasqFile(t, network, "conf"), "dhcp-option=option:mtu,1350\n")
		// and virtio tells the guest's driver, whatever its DHCP client.
		dom := definition(t, h.l, m)
		require.Len(t, dom.Devices.Interfaces, 1)
		require.NotNil(t, dom.Devices.Interfaces[0].MTU)
		assert.Equal(t, uint(underlayMTU-50), dom.Devices.Interfaces[0].MTU.Size)
	})

	t.Run("DHCPNeverCrossesTheOverlay", func(t *testing.T) { testDHCPStaysOnItsNode(t, h, bridge) })

	for _, step := range []struct {
		name  string
		peers []netip.Addr // nil: SetPeers is not called
		want  []netip.Addr
	}{
		{"ItFloodsToThePeersSetBeforeButItself", nil, []netip.Addr{peerA, peerB}},
		{"APeerLeft", []netip.Addr{peerB}, []netip.Addr{peerB}},
		{"OneCameAndTheOtherLeft", []netip.Addr{peerA, peerA}, []netip.Addr{peerA}},
		{"NoPeersNoFloods", []netip.Addr{}, nil},
	} {
		t.Run(step.name, func(t *testing.T) {
			if step.peers != nil {
				require.NoError(t, d.SetPeers(ctx, step.peers))
			}
			assert.Equal(t, step.want, floods(t, h.links, vx))
		})
	}

	t.Run("DeletingTheLastGuestRemovesTheOverlay", func(t *testing.T) {
		dnsmasq := h.dnsmasqPid(t, network)
		require.NoError(t, d.Delete(ctx, m.UID))
		h.assertGone(t, network, bridge.Attrs().Name, dnsmasq, vni)
	})
}

// floods are the peers a VXLAN device floods to: its all-zero FDB
// entries' destinations, sorted.
func floods(t *testing.T, links *netlink.Handle, l netlink.Link) []netip.Addr {
	t.Helper()
	entries, err := links.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
	require.NoError(t, err)
	var out []netip.Addr
	for _, e := range entries {
		if dst, ok := netip.AddrFromSlice(e.IP); ok && slices.Equal(e.HardwareAddr, floodMAC) {
			out = append(out, dst.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func testRefusedNetworks(ctx context.Context, t *testing.T, h realHost, d *Driver) {
	const network = "vf-refused"
	for name, tc := range map[string]struct {
		change func(n *driver.Network)
		want   string
	}{
		"AVNIOnANodeWithoutTunnelAddress": {func(n *driver.Network) { n.VNI = 7 }, "has no tunnel address"},
		"AVNIOnABridgeNetwork": {func(n *driver.Network) {
			n.VNI, n.Mode, n.Bridge, n.CIDR, n.Address = 7, driver.NetworkModeBridge, "br0", "", netip.Prefix{}
		}, "only a nat or isolated network"},
		"AnAddressOutsideTheSubnet": {func(n *driver.Network) { n.Address = netip.MustParsePrefix("10.78.0.9/24") }, "is not in its subnet"},
		"TheGatewaysAddress":        {func(n *driver.Network) { n.Address = netip.MustParsePrefix("10.77.0.1/24") }, "is the gateway's"},
	} {
		t.Run(name, func(t *testing.T) {
			m := addressed("refused", network, "", "10.77.0.30/24")
			tc.change(&m.Networks[0])
			h.assertRefused(ctx, t, d, m, tc.want)
		})
	}
}

// testNodeRoutes plays a hub that lets any cidr through (one from before
// the hub checked, or an administrator's grant wider than meant) and a
// tenant who wants a node's traffic. The node routes the cluster's pods,
// 10.80.0.0/16, over its underlay (192.0.2.0/24, where its tunnel address
// is). The attacker's steps: a VirtualNetwork with a cidr more specific
// than the pods' route (10.80.5.0/24), so that the node would send its
// traffic for those pods to the guests' bridge; one inside the underlay's
// subnet (192.0.2.128/25, the peers' addresses among them); one wider than
// the pods' route (10.0.0.0/8); and a VM on each, which the hub places and
// publishes. The node refuses each as Terminal before anything is made,
// and its routes are as they were. A cidr the node does not route is made
// as ever.
func testNodeRoutes(ctx context.Context, t *testing.T, h realHost, d *Driver) {
	const network = "vf-routes"
	under, err := h.links.LinkByName(underlayName)
	require.NoError(t, err)
	pods := &netlink.Route{LinkIndex: under.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 80, 0, 0).To4(), Mask: net.CIDRMask(16, 32)}, Gw: peerA.AsSlice()}
	require.NoError(t, h.links.RouteAdd(pods))
	t.Cleanup(func() { _ = h.links.RouteDel(pods) })
	routes := func() []string {
		l, err := h.links.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		require.NoError(t, err)
		out := make([]string, 0, len(l))
		for _, r := range l {
			out = append(out, r.String())
		}
		slices.Sort(out)
		return out
	}
	before := routes()
	for name, tc := range map[string]struct {
		cidr, address, says string
	}{
		"MoreSpecificThanThePodsRoute": {"10.80.5.0/24", "10.80.5.30/24", "cidr 10.80.5.0/24 overlaps the node's route to 10.80.0.0/16 on " + underlayName},
		"InsideTheUnderlay":            {"192.0.2.128/25", "192.0.2.130/25", "overlaps the node's route to 192.0.2.0/24 on " + underlayName},
		"WiderThanThePodsRoute":        {"10.0.0.0/8", "10.1.0.30/8", "cidr 10.0.0.0/8 overlaps the node's route to 10.80.0.0/16"},
	} {
		t.Run(name, func(t *testing.T) {
			m := addressed("route-thief", network, "", tc.address)
			m.Networks[0].CIDR = tc.cidr
			h.assertRefused(ctx, t, d, m, tc.says)
			assert.Equal(t, before, routes(), "the node's routes are as they were")
		})
	}
	t.Run("ACIDRTheNodeDoesNotRoute", func(t *testing.T) {
		m := addressed("route-keeper", network, "", "10.81.0.30/24")
		m.Networks[0].CIDR = "10.81.0.0/24"
		_, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		bridge := h.network(t, network).Bridge.Name
		dnsmasq := h.dnsmasqPid(t, network)
		br, err := h.links.LinkByName(bridge)
		require.NoError(t, err)
		own, err := h.links.RouteList(br, netlink.FAMILY_V4)
		require.NoError(t, err)
		require.NotEmpty(t, own)
		assert.Equal(t, "10.81.0.0/24", own[0].Dst.String(), "the network's bridge routes its own cidr")
		require.NoError(t, d.Delete(ctx, m.UID))
		h.assertGone(t, network, bridge, dnsmasq, 0)
	})
}

// The site's trunk is a host bridge virtfleet did not make; a VLAN of it
// gets a VLAN device and a bridge of the driver's own, which go with the
// network, the trunk staying.
func testVLAN(ctx context.Context, t *testing.T, h realHost, d *Driver) {
	const network, trunkName, vlan = "vf-vlan", "br-site", int32(100)
	trunk := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: trunkName}}
	require.NoError(t, h.links.LinkAdd(trunk))
	t.Cleanup(func() { _ = h.links.LinkDel(trunk) })
	require.NoError(t, h.links.LinkSetUp(trunk))
	site, err := h.links.LinkByName(trunkName)
	require.NoError(t, err)

	m := machine("tagged")
	m.Running = false
	m.SwapBytes = 0
	m.Networks = []driver.Network{{Name: network, Mode: driver.NetworkModeBridge, Bridge: trunkName, UID: "7e1d2c3b-4a59-4687-9a0b-1c2d3e4f5a6b", VLAN: vlan}}

	t.Run("AMissingHostBridgeIsRetried", func(t *testing.T) {
		gone := m
		gone.UID = "3f2e1d0c-9b8a-4776-8564-5f4e3d2c1b0a"
		gone.Networks = []driver.Network{m.Networks[0]}
		gone.Networks[0].Name, gone.Networks[0].Bridge = network+"-gone", "br-nowhere"
		_, err := d.Ensure(ctx, gone)
		require.Error(t, err)
		assert.False(t, driver.IsTerminal(err), "a retry may find it: %v", err)
		assert.Contains(t, err.Error(), "br-nowhere")
	})

	want, err := vlanLinkNames(site.Attrs().Index, vlan)
	require.NoError(t, err)
	if !kernelHasVLANs(t, h.links, site) {
		t.Run("AKernelWithoutVLANsLeavesNothingBehind", func(t *testing.T) {
			_, err := d.Ensure(ctx, m)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "no 802.1Q VLAN devices")
			_, err = h.l.NetworkLookupByName(network)
			assert.True(t, isCode(err, golibvirt.ErrNoNetwork), "no network was defined: %v", err)
			for _, name := range []string{want.Bridge, want.Device} {
				_, err = h.links.LinkByName(name)
				assert.ErrorAs(t, err, &netlink.LinkNotFoundError{}, "%s was removed", name)
			}
		})
		t.Skip("this kernel has no 802.1Q VLAN devices (CONFIG_VLAN_8021Q): the VLAN's links cannot be made here")
	}

	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err, "ensuring it again changes nothing")

	dev, err := h.links.LinkByName(want.Device)
	require.NoError(t, err)
	br, err := h.links.LinkByName(want.Bridge)
	require.NoError(t, err)

	t.Run("TheVLANDeviceTagsOnTheTrunk", func(t *testing.T) {
		v, ok := dev.(*netlink.Vlan)
		require.True(t, ok, "%s is a %s, not a vlan", want.Device, dev.Type())
		assert.Equal(t, int(vlan), v.VlanId)
		assert.Equal(t, site.Attrs().Index, v.ParentIndex, "on %s", trunkName)
		assert.Equal(t, br.Attrs().Index, v.MasterIndex, "a port of %s", want.Bridge)
		assert.NotZero(t, v.Flags&net.FlagUp, "up")
	})
	t.Run("TheNetworkForwardsOnTheBridgeMadeForIt", func(t *testing.T) {
		_, ok := br.(*netlink.Bridge)
		require.True(t, ok, "%s is a %s, not a bridge", want.Bridge, br.Type())
		assert.NotZero(t, br.Attrs().Flags&net.FlagUp, "up")
		def := h.network(t, network)
		require.NotNil(t, def.Forward)
		assert.Equal(t, "bridge", def.Forward.Mode)
		require.NotNil(t, def.Bridge)
		assert.Equal(t, want.Bridge, def.Bridge.Name)
	})
	t.Run("DeletingTheLastGuestRemovesTheNetworkAndItsLinks", func(t *testing.T) {
		require.NoError(t, d.Delete(ctx, m.UID))
		_, err := h.l.NetworkLookupByName(network)
		assert.True(t, isCode(err, golibvirt.ErrNoNetwork), "network %s is undefined: %v", network, err)
		for _, name := range []string{want.Bridge, want.Device} {
			_, err = h.links.LinkByName(name)
			assert.ErrorAs(t, err, &netlink.LinkNotFoundError{}, "%s is gone", name)
		}
		_, err = h.links.LinkByName(trunkName)
		assert.NoError(t, err, "the site's bridge stays")
	})
}

// kernelHasVLANs says whether the kernel makes a VLAN device on trunk, by
// making one and removing it.
func kernelHasVLANs(t *testing.T, links *netlink.Handle, trunk netlink.Link) bool {
	t.Helper()
	probe := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "vfprobe.4093", ParentIndex: trunk.Attrs().Index}, VlanId: 4093}
	err := links.LinkAdd(probe)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return false
	}
	require.NoError(t, err)
	require.NoError(t, links.LinkDel(probe))
	return true
}
