package libvirt

import (
	"cmp"
	"crypto/sha256"
	"encoding/xml"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// NetworkNamespace marks virtfleet's element in the <metadata> of a
// network the driver made. Only such a network is ever destroyed; one
// without it (the host's, an imported one, one an agent older than the mark
// made) is used as it is, and of its DHCP reservations only those of
// virtfleet's own guests are ever removed.
const NetworkNamespace = "https://virtfleet.io/xmlns/network/v1"

// networkMark is virtfleet's element in a network's <metadata>.
type networkMark struct {
	XMLName xml.Name `xml:"https://virtfleet.io/xmlns/network/v1 network"`
	// UID is the VirtualNetwork's uid.
	UID string `xml:"uid,omitempty"`
	// VNI is the overlay the network's bridge is joined to, so its VXLAN
	// device is found again when the network goes.
	VNI int32 `xml:"vni,omitempty"`
	// VLAN is the tag of a bridge-mode network on its host bridge, and
	// VLANDevice and VLANBridge the links the driver made for it (vlan.go),
	// so they are made again under the same names and go with the network.
	VLAN       int32  `xml:"vlan,omitempty"`
	VLANDevice string `xml:"vlanDevice,omitempty"`
	VLANBridge string `xml:"vlanBridge,omitempty"`
}

// vlanLinks are the links the mark says the driver made for the network.
func (m *networkMark) vlanLinks() vlanLinks {
	return vlanLinks{Device: m.VLANDevice, Bridge: m.VLANBridge}
}

var networkMarkName = xml.Name{Space: NetworkNamespace, Local: "network"}

// network is a libvirt network as the driver reads it.
type network struct {
	ref golibvirt.Network
	def *libvirtxml.Network
	// mark is nil on a network the driver did not make.
	mark *networkMark
	// active is set when the network is known to run, so a DHCP
	// reservation changes its dnsmasq too without asking libvirt first.
	active bool
}

// readNetwork reads a network's definition: the running one of an active
// network, else the persistent one.
func readNetwork(api API, ref golibvirt.Network) (network, error) {
	x, err := api.NetworkGetXMLDesc(ref, 0)
	if err != nil {
		return network{}, errors.Wrapf(err, "cannot read network %s", ref.Name)
	}
	n := network{ref: ref, def: &libvirtxml.Network{}}
	if err := n.def.Unmarshal(x); err != nil {
		return network{}, errors.Wrapf(err, "cannot parse the definition of network %s", ref.Name)
	}
	if n.def.Metadata != nil {
		mark := &networkMark{}
		found, err := findElement(n.def.Metadata.XML, networkMarkName, mark)
		if err != nil {
			return network{}, errors.Wrapf(err, "cannot parse the metadata of network %s", ref.Name)
		}
		if found {
			n.mark = mark
		}
	}
	return n, nil
}

// checkNetwork refuses, before anything is made for the guest, a network
// no node could give it: an address outside the network's subnet, or a
// VNI where there can be no overlay (an imported or bridge-mode network, or
// a node without a tunnel address), a VLAN where there can be none.
func (d *Driver) checkNetwork(n driver.Network) error {
	if err := checkVLAN(n); err != nil {
		return err
	}
	if n.VNI != 0 {
		switch {
		case n.VNI < 0 || n.VNI >= 1<<24:
			return driver.Terminalf("network %q: vni %d is not a VXLAN network identifier (1 to 16777215)", n.Name, n.VNI)
		case n.Imported || n.Mode == driver.NetworkModeBridge:
			return driver.Terminalf("network %q has vni %d, and only a nat or isolated network virtfleet makes can span nodes", n.Name, n.VNI)
		case !d.tunnel.IsValid():
			return driver.Terminalf("network %q spans nodes (vni %d), and node %s has no tunnel address to reach the others (the agent's --tunnel-address)", n.Name, n.VNI, d.node)
		}
	}
	if !n.Address.IsValid() || n.CIDR == "" || n.Imported || n.Mode == driver.NetworkModeBridge {
		return nil
	}
	_, err := n.Subnet()
	return err
}

// ensureNetwork makes n's network exist and be active for the guest's
// interface with MAC mac: created from n when missing, its DHCP serving
// n.Address to mac, its bridge joined to the overlay when n has a VNI, the
// links of its VLAN there when it has one. An imported network is only
// checked. The network as it is then is handed to nets (which may be nil),
// so the guest's observation does not read it again. The caller holds
// d.networkMu.
func (d *Driver) ensureNetwork(api API, n driver.Network, mac string, nets *networkView) error {
	if n.Imported {
		return checkImported(api, n)
	}
	ref, err := api.NetworkLookupByName(n.Name)
	if isCode(err, golibvirt.ErrNoNetwork) {
		if err := d.checkRoutes(n); err != nil {
			return err
		}
		if ref, err = d.defineNetwork(api, n, mac); err != nil {
			return err
		}
	} else if err != nil {
		return errors.Wrapf(err, "cannot look up network %s", n.Name)
	} else if err := d.ensureMarkedVLAN(api, ref, n); err != nil {
		return err
	}
	active, err := api.NetworkIsActive(ref)
	if err != nil {
		return errors.Wrapf(err, "cannot read network %s", n.Name)
	}
	if active != 1 {
		if err := d.checkRoutes(n); err != nil {
			return err
		}
		if err := api.NetworkCreate(ref); err != nil {
			return errors.Wrapf(err, "cannot start network %s", n.Name)
		}
	}
	if !n.Address.IsValid() && n.VNI == 0 {
		return nil
	}
	cur, err := readNetwork(api, ref)
	if err != nil {
		return err
	}
	cur.active = true
	if err := d.reserve(api, cur, n, mac); err != nil {
		return err
	}
	nets.know(cur)
	if n.VNI == 0 {
		return nil
	}
	if cur.mark == nil {
		// Made by an agent older than overlays, with a dynamic DHCP range:
		// joined to the other nodes, its dnsmasq would hand their guests
		// addresses of its own. It stays the node's alone.
		return nil
	}
	if cur.def.Bridge == nil || cur.def.Bridge.Name == "" {
		return errors.Errorf("network %s is active and has no bridge to join to the overlay", n.Name)
	}
	return d.joinOverlay(cur.def.Bridge.Name, n.VNI)
}

// checkRoutes refuses, as Terminal, to make or start n's network when its
// cidr overlaps a route the node has where libvirtd makes its bridges
// (Config.Netns), in any routing table: the underlay's, the one to NATS,
// the cluster's pod and service ranges, the node's own addresses, another
// network's bridge. libvirt itself refuses only a route to exactly the same
// subnet, so a more specific cidr would take the node's traffic for those
// addresses, and a wider one would hide them from its guests. The default
// route claims no addresses of its own and counts for none. The network's
// own bridge has no route yet: it is checked only while not running. The
// test driver makes no bridge, so its networks route nothing.
func (d *Driver) checkRoutes(n driver.Network) error {
	if d.testDriver || n.Imported || n.Mode == driver.NetworkModeBridge || n.CIDR == "" {
		return nil
	}
	cidr, err := n.Subnet()
	if err != nil {
		return err
	}
	h, err := d.linkHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return errors.Wrapf(err, "cannot list the node's routes to check network %s against them", n.Name)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		addr, ok := netip.AddrFromSlice(r.Dst.IP)
		bits, _ := r.Dst.Mask.Size()
		dst := netip.PrefixFrom(addr.Unmap(), bits)
		if !ok || bits == 0 || !dst.Overlaps(cidr) {
			continue
		}
		via := ""
		if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
			via = " on " + l.Attrs().Name
		}
		return driver.Terminalf("network %q: cidr %s overlaps the node's route to %s%s; a network there would take the node's traffic to those addresses: choose a cidr the node does not route", n.Name, cidr, dst, via)
	}
	return nil
}

// ensureMarkedVLAN makes again, under the names its mark records, the
// links of an existing network the driver made with a VLAN: a host restart
// or the site's remaking its host bridge takes them away, and libvirt
// cannot start a bridge-mode network without its bridge.
func (d *Driver) ensureMarkedVLAN(api API, ref golibvirt.Network, n driver.Network) error {
	if n.VLAN == 0 {
		return nil
	}
	cur, err := readNetwork(api, ref)
	if err != nil {
		return err
	}
	if cur.mark == nil || cur.mark.VLANBridge == "" {
		return nil
	}
	_, err = d.ensureVLANLinks(n.Bridge, cur.mark.VLAN, cur.mark.vlanLinks())
	return err
}

// defineNetwork defines n's network, marked as the driver's, with the
// guest's reservation in it already, and makes the links of its VLAN
// first when it has one.
func (d *Driver) defineNetwork(api API, n driver.Network, mac string) (golibvirt.Network, error) {
	spec := networkSpec{network: n}
	if n.Address.IsValid() {
		spec.reservation = &libvirtxml.NetworkDHCPHost{MAC: mac, IP: n.Address.Addr().String()}
	}
	if n.VNI != 0 {
		var err error
		if spec.mtu, err = d.overlayMTU(); err != nil {
			return golibvirt.Network{}, err
		}
	}
	var ref golibvirt.Network
	var err error
	if n.VLAN != 0 && n.Mode == driver.NetworkModeBridge {
		spec.vlan, err = d.ensureVLANLinks(n.Bridge, n.VLAN, vlanLinks{})
	}
	if err == nil {
		ref, err = d.defineNetworkXML(api, spec)
	}
	if err != nil && spec.vlan != (vlanLinks{}) {
		// No mark records the links yet: they would stay unless removed
		// here. What a failure here leaves, the next define reuses.
		_ = d.removeVLANLinks(api, n.Name, spec.vlan)
	}
	return ref, err
}

// defineNetworkXML defines the network spec describes.
func (d *Driver) defineNetworkXML(api API, spec networkSpec) (golibvirt.Network, error) {
	n := spec.network
	x, err := networkXML(spec)
	if err != nil {
		return golibvirt.Network{}, err
	}
	ref, err := api.NetworkDefineXML(x)
	if isCode(err, golibvirt.ErrXMLError, golibvirt.ErrConfigUnsupported, golibvirt.ErrInvalidArg) {
		return ref, driver.Terminal(errors.Wrapf(err, "cannot create network %q", n.Name))
	}
	return ref, errors.Wrapf(err, "cannot define network %s", n.Name)
}

// reserve makes the network's DHCP serve n.Address to mac, and nothing
// else to it. A reservation of the address for another MAC that no domain
// has on the network (its guest was deleted while its reservation stayed)
// is removed first.
func (d *Driver) reserve(api API, cur network, n driver.Network, mac string) error {
	if !n.Address.IsValid() || n.Mode == driver.NetworkModeBridge {
		return nil
	}
	a := n.Address.Addr()
	index := -1
	for i, ip := range cur.def.IPs {
		if p, ok := ipPrefix(ip); ok && p.Contains(a) {
			index = i
			break
		}
	}
	if index < 0 {
		return driver.Terminalf("network %q: address %s is in none of its subnets", n.Name, a)
	}
	want := libvirtxml.NetworkDHCPHost{MAC: mac, IP: a.String()}
	command := golibvirt.NetworkUpdateCommandAddLast
	for _, h := range dhcpHosts(cur.def.IPs[index]) {
		switch {
		case strings.EqualFold(h.MAC, mac) && h.IP == want.IP:
			return nil
		case strings.EqualFold(h.MAC, mac):
			command = golibvirt.NetworkUpdateCommandModify
		case h.IP == want.IP:
			used, err := d.interfacesInUse(api)
			if err != nil {
				return err
			}
			if used[nic{network: n.Name, mac: strings.ToLower(h.MAC)}] {
				return driver.Failingf("network %q serves address %s to interface %s of another guest of the node", n.Name, a, h.MAC)
			}
			if err := updateHost(api, cur, golibvirt.NetworkUpdateCommandDelete, index, h); err != nil {
				return err
			}
		}
	}
	return updateHost(api, cur, command, index, want)
}

// dhcpHosts are the DHCP reservations of one of a network's subnets.
func dhcpHosts(ip libvirtxml.NetworkIP) []libvirtxml.NetworkDHCPHost {
	if ip.DHCP == nil {
		return nil
	}
	return ip.DHCP.Hosts
}

// updateHost adds, modifies or deletes a DHCP reservation in the subnet
// cur.def.IPs[index], in the network's definition and, when it runs, in its
// dnsmasq; once libvirt took it, cur.def shows it as well.
func updateHost(api API, cur network, command golibvirt.NetworkUpdateCommand, index int, h libvirtxml.NetworkDHCPHost) error {
	x, err := h.Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot marshal a DHCP reservation")
	}
	live := cur.active
	if !live {
		active, err := api.NetworkIsActive(cur.ref)
		if err != nil {
			return errors.Wrapf(err, "cannot read network %s", cur.ref.Name)
		}
		live = active == 1
	}
	flags := golibvirt.NetworkUpdateAffectConfig
	if live {
		flags |= golibvirt.NetworkUpdateAffectLive
	}
	err = api.NetworkUpdateCompat(cur.ref, command, golibvirt.NetworkSectionIPDhcpHost, int32(index), x, flags) //nolint:gosec // a network has a handful of subnets
	if err != nil {
		return errors.Wrapf(err, "cannot update the DHCP reservation of %s for %s in network %s", h.IP, h.MAC, cur.ref.Name)
	}
	applyHost(&cur.def.IPs[index], command, h)
	return nil
}

// applyHost makes ip's reservations what libvirt's NetworkUpdate of them
// with command and h leaves: h added last, or the reservation of h's MAC
// replaced by h or removed. The reservations are a new slice: callers
// range over the old one while they update.
func applyHost(ip *libvirtxml.NetworkIP, command golibvirt.NetworkUpdateCommand, h libvirtxml.NetworkDHCPHost) {
	if ip.DHCP == nil {
		ip.DHCP = &libvirtxml.NetworkDHCP{}
	}
	hosts := slices.Clone(ip.DHCP.Hosts)
	i := slices.IndexFunc(hosts, func(o libvirtxml.NetworkDHCPHost) bool { return strings.EqualFold(o.MAC, h.MAC) })
	switch {
	case command == golibvirt.NetworkUpdateCommandAddLast:
		hosts = append(hosts, h)
	case i < 0:
	case command == golibvirt.NetworkUpdateCommandModify:
		hosts[i] = h
	case command == golibvirt.NetworkUpdateCommandDelete:
		hosts = slices.Delete(hosts, i, i+1)
	}
	ip.DHCP.Hosts = hosts
}

// checkImported says whether the network a VirtualNetwork imports can take
// the guest's interface as it is: it exists, is active, and is what the
// VirtualNetwork says (mode, and the subnet or host bridge where given).
// A network made outside virtfleet is never defined, started or changed.
func checkImported(api API, n driver.Network) error {
	nw, err := api.NetworkLookupByName(n.Name)
	if isCode(err, golibvirt.ErrNoNetwork) {
		return errors.Errorf("network %q, which the VirtualNetwork imports, does not exist on this node", n.Name)
	}
	if err != nil {
		return errors.Wrapf(err, "cannot look up network %s", n.Name)
	}
	cur, err := readNetwork(api, nw)
	if err != nil {
		return err
	}
	if err := sameNetwork(cur.def, n); err != nil {
		return driver.Terminal(err)
	}
	active, err := api.NetworkIsActive(nw)
	if err != nil {
		return errors.Wrapf(err, "cannot read network %s", n.Name)
	}
	if active != 1 {
		return errors.Errorf("network %q, which the VirtualNetwork imports, is not active; virtfleet never starts a network it did not make (virsh net-start %s)", n.Name, n.Name)
	}
	return nil
}

// sameNetwork says how def differs from what n declares, if it does.
func sameNetwork(def *libvirtxml.Network, n driver.Network) error {
	mode := driver.NetworkModeIsolated
	if def.Forward != nil {
		mode = driver.NetworkMode(def.Forward.Mode)
		if mode == "" { // <forward/> is libvirt's nat
			mode = driver.NetworkModeNAT
		}
	}
	want := n.Mode
	if want == "" {
		want = driver.NetworkModeNAT
	}
	if mode != want {
		return errors.Errorf("network %q forwards in mode %q, the VirtualNetwork that imports it says %q", n.Name, mode, want)
	}
	if want == driver.NetworkModeBridge {
		if n.Bridge != "" && (def.Bridge == nil || def.Bridge.Name != n.Bridge) {
			return errors.Errorf("network %q does not join host bridge %q, the VirtualNetwork that imports it says it does", n.Name, n.Bridge)
		}
		return nil
	}
	if n.CIDR == "" {
		return nil
	}
	wantPrefix, err := netip.ParsePrefix(n.CIDR)
	if err != nil {
		return errors.Errorf("network %q: cidr %q is not a subnet", n.Name, n.CIDR)
	}
	var have []string
	for _, ip := range def.IPs {
		p, ok := ipPrefix(ip)
		if !ok {
			continue
		}
		if p == wantPrefix.Masked() {
			return nil
		}
		have = append(have, p.String())
	}
	return errors.Errorf("network %q serves %v, the VirtualNetwork that imports it says %s", n.Name, have, wantPrefix.Masked())
}

// ipPrefix is the subnet of one of a network's addresses, given by netmask
// or prefix length.
func ipPrefix(ip libvirtxml.NetworkIP) (netip.Prefix, bool) {
	a, err := netip.ParseAddr(ip.Address)
	if err != nil {
		return netip.Prefix{}, false
	}
	bits := int(ip.Prefix)
	if ip.Netmask != "" {
		m := net.ParseIP(ip.Netmask).To4()
		if m == nil {
			return netip.Prefix{}, false
		}
		bits, _ = net.IPMask(m).Size()
	}
	p, err := a.Prefix(bits)
	return p, err == nil
}

// networkSpec is what a network definition is built from.
type networkSpec struct {
	network driver.Network
	// reservation is the first guest's DHCP reservation, if it has one.
	reservation *libvirtxml.NetworkDHCPHost
	// mtu is the guests' MTU; 0 leaves it to libvirt (the host's default).
	mtu int
	// vlan are the links made for a bridge-mode network's VLAN: the
	// network forwards on vlan.Bridge instead of the host bridge.
	vlan vlanLinks
}

// networkXML builds a network definition, marked as the driver's. A nat or
// isolated network's host takes the subnet's first address, and its DHCP
// serves only its reservations (libvirt then has dnsmasq serve the subnet
// statically): addresses are the hub's to give. Its bridge's MAC is derived
// from the VirtualNetwork's uid, the same on every node, so that on an
// overlay each guest finds its own node's gateway at one address and MAC.
func networkXML(s networkSpec) (string, error) {
	n := s.network
	m := networkMark{UID: n.UID, VNI: n.VNI}
	if s.vlan != (vlanLinks{}) {
		m.VLAN, m.VLANDevice, m.VLANBridge = n.VLAN, s.vlan.Device, s.vlan.Bridge
	}
	mark, err := xml.Marshal(m)
	if err != nil {
		return "", errors.Wrap(err, "cannot marshal virtfleet's network metadata")
	}
	def := &libvirtxml.Network{Name: n.Name, Metadata: &libvirtxml.NetworkMetadata{XML: string(mark)}}
	switch n.Mode {
	case driver.NetworkModeBridge:
		if n.Bridge == "" {
			return "", driver.Terminalf("network %q does not exist on this node and bridge mode needs a host bridge to create it", n.Name)
		}
		def.Forward = &libvirtxml.NetworkForward{Mode: "bridge"}
		def.Bridge = &libvirtxml.NetworkBridge{Name: cmp.Or(s.vlan.Bridge, n.Bridge)}
		return marshalNetwork(def)
	case driver.NetworkModeNAT, "":
		def.Forward = &libvirtxml.NetworkForward{Mode: "nat"}
	case driver.NetworkModeIsolated:
	default:
		return "", driver.Terminalf("network %q has unknown mode %q; want nat, bridge or isolated", n.Name, n.Mode)
	}
	if n.CIDR == "" {
		return "", driver.Terminalf("network %q does not exist on this node and has no cidr to create it from", n.Name)
	}
	subnet, err := n.Subnet()
	if err != nil {
		return "", err
	}
	if id := cmp.Or(n.UID, n.Name); id != "" {
		def.MAC = &libvirtxml.NetworkMAC{Address: gatewayMAC(id)}
	}
	if s.mtu > 0 {
		def.MTU = &libvirtxml.NetworkMTU{Size: uint(s.mtu)}
	}
	dhcp := &libvirtxml.NetworkDHCP{}
	if s.reservation != nil {
		dhcp.Hosts = []libvirtxml.NetworkDHCPHost{*s.reservation}
	}
	def.IPs = []libvirtxml.NetworkIP{{
		Address: driver.Gateway(subnet).String(),
		Netmask: net.IP(net.CIDRMask(subnet.Bits(), 32)).String(),
		DHCP:    dhcp,
	}}
	return marshalNetwork(def)
}

// gatewayMAC derives a network's bridge MAC from id: unicast and locally
// administered, so it collides with no vendor's.
func gatewayMAC(id string) string {
	s := sha256.Sum256([]byte("virtfleet-network/" + id))
	s[0] = s[0]&^0x01 | 0x02
	return net.HardwareAddr(s[:6]).String()
}

func marshalNetwork(def *libvirtxml.Network) (string, error) {
	x, err := def.Marshal()
	return x, errors.Wrap(err, "cannot marshal network XML")
}

// ensureNetworks makes the networks of m's interfaces ready for its
// domain's definition (ensureNetwork), and holds their interfaces as in
// use until the returned release is called, once the domain is defined:
// sweepNetworks, which sees only defined domains, would otherwise take a
// new network or reservation away before its domain is there.
func (d *Driver) ensureNetworks(api API, m driver.Machine, nets *networkView) (release func(), err error) {
	held := nicsOf(m)
	d.networkMu.Lock()
	defer d.networkMu.Unlock()
	d.hold(held, 1)
	if err := d.ensureEachNetwork(api, m, nets); err != nil {
		d.hold(held, -1)
		return nil, err
	}
	return func() {
		d.networkMu.Lock()
		defer d.networkMu.Unlock()
		d.hold(held, -1)
	}, nil
}

// ensureEachNetwork makes each of m's networks ready for the interface
// m's domain has on it (ensureNetwork), in m's order, and stops at the
// first that fails. nets, which may be nil, is handed to ensureNetwork.
// The caller holds d.networkMu and holds m's interfaces (hold).
func (d *Driver) ensureEachNetwork(api API, m driver.Machine, nets *networkView) error {
	for i, n := range m.Networks {
		if err := d.ensureNetwork(api, n, macFor(m.UID, i), nets); err != nil {
			return err
		}
	}
	return nil
}

// hold counts interfaces as being defined (by 1), or no longer (by -1).
// The caller holds d.networkMu.
func (d *Driver) hold(nics []nic, by int) {
	for _, k := range nics {
		if d.defining[k] += by; d.defining[k] <= 0 {
			delete(d.defining, k)
		}
	}
}

// nicsOf are the interfaces m's domain is defined with.
func nicsOf(m driver.Machine) []nic {
	out := make([]nic, len(m.Networks))
	for i, n := range m.Networks {
		out[i] = nic{network: n.Name, mac: macFor(m.UID, i)}
	}
	return out
}

// interfacesInUse are the interfaces of every domain of the node, in its
// running and its next definition, whoever made it, and those of domains
// being defined. The caller holds d.networkMu.
func (d *Driver) interfacesInUse(api API) (map[nic]bool, error) {
	doms, infos, err := d.listDomains(api, false)
	if err != nil {
		return nil, err
	}
	used := map[nic]bool{}
	for k := range d.defining {
		used[k] = true
	}
	for i, dom := range doms {
		next, err := d.nextDefinition(api, dom)
		if isCode(err, golibvirt.ErrNoDomain) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, k := range append(infos[i].nics, next.nics...) {
			used[k] = true
		}
	}
	return used, nil
}

// sweepNetworks removes what the node's domains no longer need: each
// network the driver made that no domain has an interface on (destroyed
// and undefined, its bridge and dnsmasq with it, and its overlay device),
// and the DHCP reservations of interfaces no domain has: any such one in a
// network the driver made, and in any other network those of released, the
// interfaces of a guest the caller deleted or redefined. It returns the
// failures concerning the networks of released only: another network's
// are not the caller's to fail for, and the next sweep tries again.
func (d *Driver) sweepNetworks(api API, released []nic) error {
	d.networkMu.Lock()
	defer d.networkMu.Unlock()
	used, err := d.interfacesInUse(api)
	if err != nil {
		return err
	}
	inUse := map[string]bool{}
	for k := range used {
		inUse[k.network] = true
	}
	refs, _, err := api.ConnectListAllNetworks(1, 0)
	if err != nil {
		return errors.Wrap(err, "cannot list networks")
	}
	var errs []error
	for _, ref := range refs {
		err := d.sweepNetwork(api, ref, used, inUse[ref.Name], released)
		if err != nil && slices.ContainsFunc(released, func(k nic) bool { return k.network == ref.Name }) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweepNetwork is sweepNetworks' work on one network, inUse when some
// interface in used is on it.
func (d *Driver) sweepNetwork(api API, ref golibvirt.Network, used map[nic]bool, inUse bool, released []nic) error {
	nw, err := readNetwork(api, ref)
	switch {
	case isCode(err, golibvirt.ErrNoNetwork):
		return nil
	case err != nil:
		return err
	case nw.mark != nil && !inUse:
		return d.removeNetwork(api, nw)
	}
	for i, ip := range nw.def.IPs {
		for _, h := range dhcpHosts(ip) {
			k := nic{network: ref.Name, mac: strings.ToLower(h.MAC)}
			if used[k] || (nw.mark == nil && !slices.Contains(released, k)) {
				continue
			}
			if err := updateHost(api, nw, golibvirt.NetworkUpdateCommandDelete, i, h); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeNetwork destroys and undefines a network the driver made, its
// overlay device and VLAN links first: a failure leaves the network, and
// with it what the next sweep needs to find them again.
func (d *Driver) removeNetwork(api API, nw network) error {
	if nw.mark.VNI != 0 {
		if err := d.leaveOverlay(nw.mark.VNI); err != nil {
			return err
		}
	}
	if err := d.removeVLANLinks(api, nw.ref.Name, nw.mark.vlanLinks()); err != nil {
		return err
	}
	if err := api.NetworkDestroy(nw.ref); err != nil && !isCode(err, golibvirt.ErrOperationInvalid, golibvirt.ErrNoNetwork) {
		return errors.Wrapf(err, "cannot stop network %s", nw.ref.Name)
	}
	if err := api.NetworkUndefine(nw.ref); err != nil && !isCode(err, golibvirt.ErrNoNetwork) {
		return errors.Wrapf(err, "cannot undefine network %s", nw.ref.Name)
	}
	return nil
}

// leftNetworks sweeps the networks when a redefinition took interfaces of
// the guest off them. A failure is left to the next periodic sweep: the
// guest's definition is made, and what stays behind harms no guest.
func (d *Driver) leftNetworks(api API, before, after []nic) {
	gone := slices.DeleteFunc(slices.Clone(before), func(k nic) bool { return slices.Contains(after, k) })
	if len(gone) > 0 {
		_ = d.sweepNetworks(api, gone)
	}
}

// networkSweepInterval is how often the networks are swept besides after
// a Delete or a redefinition: a running guest keeps a network its next
// definition dropped until it restarts, and a sweep a failure or a crash
// cut short is finished there.
const networkSweepInterval = time.Minute

// sweepNetworksNow sweeps the networks once, if libvirtd answers; a sweep
// that fails is done again at the next.
func (d *Driver) sweepNetworksNow() {
	if api, _, err := d.api(); err == nil {
		_ = d.sweepNetworks(api, nil)
	}
}
