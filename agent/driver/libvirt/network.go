package libvirt

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// ensureNetwork makes the named network exist and be active, creating it from
// its CIDR and mode when it is missing; an imported one is only checked.
func ensureNetwork(api API, n driver.Network) error {
	if n.Imported {
		return checkImported(api, n)
	}
	nw, err := api.NetworkLookupByName(n.Name)
	if isCode(err, golibvirt.ErrNoNetwork) {
		x, err := networkXML(n)
		if err != nil {
			return err
		}
		nw, err = api.NetworkDefineXML(x)
		if isCode(err, golibvirt.ErrXMLError, golibvirt.ErrConfigUnsupported, golibvirt.ErrInvalidArg) {
			return driver.Terminal(errors.Wrapf(err, "cannot create network %q", n.Name))
		}
		if err != nil {
			return errors.Wrapf(err, "cannot define network %s", n.Name)
		}
	} else if err != nil {
		return errors.Wrapf(err, "cannot look up network %s", n.Name)
	}
	active, err := api.NetworkIsActive(nw)
	if err != nil {
		return errors.Wrapf(err, "cannot read network %s", n.Name)
	}
	if active == 1 {
		return nil
	}
	return errors.Wrapf(api.NetworkCreate(nw), "cannot start network %s", n.Name)
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
	x, err := api.NetworkGetXMLDesc(nw, 0)
	if err != nil {
		return errors.Wrapf(err, "cannot read network %s", n.Name)
	}
	def := &libvirtxml.Network{}
	if err := def.Unmarshal(x); err != nil {
		return errors.Wrapf(err, "cannot parse the definition of network %s", n.Name)
	}
	if err := sameNetwork(def, n); err != nil {
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

// networkXML builds a network definition: the host takes the subnet's first
// address and DHCP serves the rest.
func networkXML(n driver.Network) (string, error) {
	def := &libvirtxml.Network{Name: n.Name}
	switch n.Mode {
	case driver.NetworkModeBridge:
		if n.Bridge == "" {
			return "", driver.Terminalf("network %q does not exist on this node and bridge mode needs a host bridge to create it", n.Name)
		}
		def.Forward = &libvirtxml.NetworkForward{Mode: "bridge"}
		def.Bridge = &libvirtxml.NetworkBridge{Name: n.Bridge}
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
	prefix, err := netip.ParsePrefix(n.CIDR)
	if err != nil || !prefix.Addr().Is4() || prefix.Bits() > 30 {
		return "", driver.Terminalf("network %q: cidr %q is not an IPv4 subnet of at least 4 addresses", n.Name, n.CIDR)
	}
	prefix = prefix.Masked()
	base := binary.BigEndian.Uint32(prefix.Addr().AsSlice())
	size := uint32(1) << (32 - prefix.Bits())
	ip := func(off uint32) string {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], base+off)
		return netip.AddrFrom4(b).String()
	}
	def.IPs = []libvirtxml.NetworkIP{{
		Address: ip(1),
		Netmask: net.IP(net.CIDRMask(prefix.Bits(), 32)).String(),
		DHCP:    &libvirtxml.NetworkDHCP{Ranges: []libvirtxml.NetworkDHCPRange{{Start: ip(2), End: ip(size - 2)}}},
	}}
	return marshalNetwork(def)
}

func marshalNetwork(def *libvirtxml.Network) (string, error) {
	x, err := def.Marshal()
	return x, errors.Wrap(err, "cannot marshal network XML")
}
