package ipam

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// subnet is a network's cidr and the range of it VMs get: all but its
// network address, its first host address (the gateway, the host's own) and
// its broadcast address.
type subnet struct {
	prefix netip.Prefix
	lo, hi uint32
}

func parseSubnet(n *v1alpha1.VirtualNetwork) (subnet, error) {
	cidr := n.Spec.ForProvider.CIDR
	invalid := func(reason string) error { return &InvalidNetworkError{Network: n.Name, CIDR: cidr, Reason: reason} }
	if cidr == "" {
		return subnet{}, invalid("is empty: the hub gives addresses only on a network with a cidr")
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() {
		return subnet{}, invalid("is not an IPv4 subnet such as 10.10.120.0/24")
	}
	if p.Bits() > 30 {
		return subnet{}, invalid("leaves no address for VMs: besides its network, gateway and broadcast addresses a subnet needs one for a VM, so it is a /30 or larger")
	}
	p = p.Masked()
	base := index(p.Addr())
	size := uint64(1) << (32 - p.Bits())
	return subnet{prefix: p, lo: base + 2, hi: uint32(uint64(base) + size - 2)}, nil
}

// total is how many addresses VMs get.
func (s subnet) total() int { return int(s.hi-s.lo) + 1 }

// contains says whether VMs get addr.
func (s subnet) contains(addr netip.Addr) bool {
	if !addr.Is4() || !s.prefix.Contains(addr) {
		return false
	}
	u := index(addr)
	return u >= s.lo && u <= s.hi
}

// check returns fixed as an address, or why network cannot give it to a VM.
func (s subnet) check(network, fixed string) (netip.Addr, error) {
	invalid := func(format string, args ...any) error {
		reason := fmt.Sprintf(format, args...)
		return &InvalidAddressError{Network: network, CIDR: s.prefix.String(), Address: fixed, Reason: fmt.Sprintf("%s, which gives VMs %s to %s", reason, address(s.lo), address(s.hi))}
	}
	addr, err := netip.ParseAddr(fixed)
	if err != nil || !addr.Is4() {
		return netip.Addr{}, invalid("it is not an IPv4 address; the network's cidr is %s", s.prefix)
	}
	switch u := index(addr); {
	case !s.prefix.Contains(addr):
		return netip.Addr{}, invalid("it is outside the network's cidr %s", s.prefix)
	case u == s.lo-2:
		return netip.Addr{}, invalid("it is the network address of cidr %s", s.prefix)
	case u == s.lo-1:
		return netip.Addr{}, invalid("it is the gateway, the host's own address, of cidr %s", s.prefix)
	case u == s.hi+1:
		return netip.Addr{}, invalid("it is the broadcast address of cidr %s", s.prefix)
	}
	return addr, nil
}

// index is addr as a number; addr is IPv4.
func index(addr netip.Addr) uint32 {
	b := addr.As4()
	return binary.BigEndian.Uint32(b[:])
}

// address is the IPv4 address numbered u.
func address(u uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], u)
	return netip.AddrFrom4(b)
}
