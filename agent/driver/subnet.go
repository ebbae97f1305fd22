package driver

import (
	"encoding/binary"
	"net/netip"
)

// Subnet is the IPv4 subnet of n: its CIDR, or, when it names none, the
// prefix of its Address. It is refused unless it has room for a gateway and
// a guest, and an Address is refused unless the subnet can give it to a
// guest: in the subnet, with its prefix length, and not its network,
// broadcast or gateway address. Each refusal is Terminal: the hub sent a
// network no node could serve.
func (n Network) Subnet() (netip.Prefix, error) {
	var subnet netip.Prefix
	switch {
	case n.CIDR != "":
		p, err := netip.ParsePrefix(n.CIDR)
		if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
			return netip.Prefix{}, Terminalf("network %q: cidr %q is not an IPv4 subnet of at least 4 addresses", n.Name, n.CIDR)
		}
		subnet = p.Masked()
	case n.Address.IsValid():
		subnet = n.Address.Masked()
		if !subnet.Addr().Is4() || subnet.Bits() > 30 {
			return netip.Prefix{}, Terminalf("network %q: address %s is not IPv4 in a subnet of at least 4 addresses", n.Name, n.Address)
		}
	default:
		return netip.Prefix{}, Terminalf("network %q has no cidr", n.Name)
	}
	if !n.Address.IsValid() {
		return subnet, nil
	}
	a := n.Address.Addr()
	switch {
	case !a.Is4():
		return netip.Prefix{}, Terminalf("network %q: address %s is not IPv4", n.Name, n.Address)
	case !subnet.Contains(a):
		return netip.Prefix{}, Terminalf("network %q: address %s is not in its subnet %s", n.Name, a, subnet)
	case n.Address.Bits() != subnet.Bits():
		return netip.Prefix{}, Terminalf("network %q: address %s does not have its subnet %s's prefix length", n.Name, n.Address, subnet)
	case a == subnet.Addr() || a == HostAddr(subnet, HostCount(subnet)+1):
		return netip.Prefix{}, Terminalf("network %q: address %s is the subnet's network or broadcast address", n.Name, a)
	case a == Gateway(subnet):
		return netip.Prefix{}, Terminalf("network %q: address %s is the gateway's", n.Name, a)
	}
	return subnet, nil
}

// HostCount is how many host addresses an IPv4 subnet has.
func HostCount(subnet netip.Prefix) uint32 { return 1<<(32-subnet.Bits()) - 2 }

// HostAddr is the i-th address of an IPv4 subnet, 0 being its network
// address and HostCount+1 its broadcast address.
func HostAddr(subnet netip.Prefix, i uint32) netip.Addr {
	b := subnet.Masked().Addr().As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+i)
	return netip.AddrFrom4(b)
}

// Gateway is a subnet's first host address, where the networks virtfleet
// makes put their gateway on every backend.
func Gateway(subnet netip.Prefix) netip.Addr { return HostAddr(subnet, 1) }
