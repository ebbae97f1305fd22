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
// its CIDR and mode when it is missing.
func ensureNetwork(api API, n driver.Network) error {
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
