package libvirt

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// A network with a VNI spans nodes: its bridge on each node has a VXLAN
// device as a port, whose local end is the node's tunnel address and which
// floods what it does not know where to send (broadcasts: ARP, DHCP) to
// every peer, head-end replication with one all-zero FDB entry per peer,
// as `bridge fdb append 00:00:00:00:00:00 dev vfxN dst PEER` makes. It
// learns where the other nodes' guests are from what arrives.
//
// The devices live with the bridges, in libvirtd's network namespace
// (Config.Netns), which need not be the agent's; every netlink call goes
// through a handle opened there.

var _ driver.Overlay = (*Driver)(nil)

// vxlanPort is the IANA-assigned VXLAN port; Linux's own default (8472)
// predates it and other VTEPs do not listen there.
const vxlanPort = 4789

// vxlanOverhead is what VXLAN adds to a guest's frame on the underlay: the
// outer IP header, UDP, VXLAN and the inner Ethernet header.
func vxlanOverhead(tunnel netip.Addr) int {
	const udp, vxlan, ethernet = 8, 8, 14
	if tunnel.Is4() {
		return 20 + udp + vxlan + ethernet
	}
	return 40 + udp + vxlan + ethernet
}

// vxlanName names the VXLAN device of the overlay vni: at most 11
// characters, within a link name's 15.
func vxlanName(vni int32) string { return fmt.Sprintf(vxlanPrefix+"%d", vni) }

// floodMAC is the FDB address whose entries say where to flood to.
var floodMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// TunnelAddress implements driver.Overlay: the configured one.
func (d *Driver) TunnelAddress() netip.Addr { return d.tunnel }

// SetPeers implements driver.Overlay. The peers are kept for the overlays
// made later, and every overlay device of the node floods to exactly
// them (the node's own tunnel address excluded). A peer the tunnel cannot
// reach (of the other IP family) is left out and named in the error.
func (d *Driver) SetPeers(_ context.Context, peers []netip.Addr) error {
	var want []netip.Addr
	var unreachable []string
	for _, p := range peers {
		p = p.Unmap()
		switch {
		case !p.IsValid() || p == d.tunnel:
		case d.tunnel.IsValid() && p.Is4() != d.tunnel.Is4():
			unreachable = append(unreachable, p.String())
		default:
			want = append(want, p)
		}
	}
	slices.SortFunc(want, netip.Addr.Compare)
	want = slices.Compact(want)
	var errs []error
	if len(unreachable) > 0 {
		errs = append(errs, errors.Errorf("peers %v are not of the IP family of tunnel address %s", unreachable, d.tunnel))
	}

	d.networkMu.Lock()
	defer d.networkMu.Unlock()
	d.peers = want
	if !d.tunnel.IsValid() {
		return errors.Join(errs...) // no overlay without a tunnel address
	}
	h, err := d.linkHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return errors.Wrap(err, "cannot list links")
	}
	for _, l := range links {
		if v, ok := l.(*netlink.Vxlan); ok && v.Name == vxlanName(int32(v.VxlanId)) { //nolint:gosec // a VNI has 24 bits
			errs = append(errs, d.flood(h, v))
		}
	}
	return errors.Join(errs...)
}

// linkHandle opens a netlink handle in the namespace of libvirtd's bridges.
func (d *Driver) linkHandle() (*netlink.Handle, error) {
	if d.netns == "" {
		h, err := netlink.NewHandle()
		return h, errors.Wrap(err, "cannot open netlink")
	}
	ns, err := netns.GetFromPath(d.netns)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot open network namespace %s", d.netns)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	return h, errors.Wrapf(err, "cannot open netlink in network namespace %s", d.netns)
}

// underlay is the link holding the tunnel address.
func (d *Driver) underlay(h *netlink.Handle) (netlink.Link, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list addresses")
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == d.tunnel {
			l, err := h.LinkByIndex(a.LinkIndex)
			return l, errors.Wrapf(err, "cannot read the link holding tunnel address %s", d.tunnel)
		}
	}
	where := "the agent's network namespace"
	if d.netns != "" {
		where = "network namespace " + d.netns
	}
	return nil, errors.Errorf("no link in %s holds tunnel address %s", where, d.tunnel)
}

// overlayMTU is the MTU of an overlay's guests: the underlay's less what
// VXLAN adds, so that an encapsulated frame fits the underlay unfragmented.
func (d *Driver) overlayMTU() (int, error) {
	h, err := d.linkHandle()
	if err != nil {
		return 0, err
	}
	defer h.Close()
	l, err := d.underlay(h)
	if err != nil {
		return 0, err
	}
	return l.Attrs().MTU - vxlanOverhead(d.tunnel), nil
}

// joinOverlay makes the VXLAN device of overlay vni and makes it a port of
// bridge, flooding to the peers. A device of that name for another VNI,
// tunnel address or port is made again. The caller holds d.networkMu.
func (d *Driver) joinOverlay(bridge string, vni int32) error {
	h, err := d.linkHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	under, err := d.underlay(h)
	if err != nil {
		return err
	}
	br, err := h.LinkByName(bridge)
	if err != nil {
		return errors.Wrapf(err, "cannot find bridge %s", bridge)
	}
	// The device takes the underlay's MTU, above the bridge's (the guests'
	// MTU): it never lowers the bridge's, which the kernel would make the
	// smallest of its ports'.
	want := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: vxlanName(vni), MTU: under.Attrs().MTU, MasterIndex: br.Attrs().Index},
		VxlanId:   int(vni),
		SrcAddr:   net.IP(d.tunnel.AsSlice()),
		Port:      vxlanPort,
		Learning:  true,
	}
	l, err := h.LinkByName(want.Name)
	var missing netlink.LinkNotFoundError
	switch {
	case errors.As(err, &missing):
		l = nil
	case err != nil:
		return errors.Wrapf(err, "cannot read link %s", want.Name)
	case !sameTunnel(l, want):
		if err := h.LinkDel(l); err != nil {
			return errors.Wrapf(err, "cannot remove link %s, which is not overlay %d's as this node makes it", want.Name, vni)
		}
		l = nil
	}
	if l == nil {
		if err := h.LinkAdd(want); err != nil {
			return errors.Wrapf(err, "cannot make VXLAN device %s", want.Name)
		}
		if l, err = h.LinkByName(want.Name); err != nil {
			return errors.Wrapf(err, "cannot read link %s", want.Name)
		}
	}
	if l.Attrs().MTU != want.MTU {
		if err := h.LinkSetMTU(l, want.MTU); err != nil {
			return errors.Wrapf(err, "cannot set the MTU of %s", want.Name)
		}
	}
	if l.Attrs().MasterIndex != br.Attrs().Index {
		if err := h.LinkSetMaster(l, br); err != nil {
			return errors.Wrapf(err, "cannot attach %s to bridge %s", want.Name, bridge)
		}
	}
	// Before the device is up: no DHCP frame crosses it.
	if err := d.keepDHCPLocal(); err != nil {
		return err
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(l); err != nil {
			return errors.Wrapf(err, "cannot bring %s up", want.Name)
		}
	}
	return d.flood(h, l)
}

// sameTunnel says whether link l is the VXLAN device want describes.
func sameTunnel(l netlink.Link, want *netlink.Vxlan) bool {
	v, ok := l.(*netlink.Vxlan)
	return ok && v.VxlanId == want.VxlanId && v.SrcAddr.Equal(want.SrcAddr) && v.Port == want.Port && v.Learning == want.Learning
}

// leaveOverlay removes overlay vni's VXLAN device, if it is there.
func (d *Driver) leaveOverlay(vni int32) error {
	h, err := d.linkHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(vxlanName(vni))
	var missing netlink.LinkNotFoundError
	switch {
	case errors.As(err, &missing):
		return nil
	case err != nil:
		return errors.Wrapf(err, "cannot read link %s", vxlanName(vni))
	}
	if v, ok := l.(*netlink.Vxlan); !ok || v.VxlanId != int(vni) {
		return nil // not the overlay's device
	}
	return errors.Wrapf(h.LinkDel(l), "cannot remove VXLAN device %s", l.Attrs().Name)
}

// flood makes the VXLAN device l flood to exactly d.peers. The caller
// holds d.networkMu.
func (d *Driver) flood(h *netlink.Handle, l netlink.Link) error {
	entries, err := h.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return errors.Wrapf(err, "cannot list the forwarding entries of %s", l.Attrs().Name)
	}
	have := map[netip.Addr]bool{}
	for _, e := range entries {
		dst, ok := netip.AddrFromSlice(e.IP)
		if !ok || !slices.Equal(e.HardwareAddr, floodMAC) {
			continue
		}
		dst = dst.Unmap()
		if slices.Contains(d.peers, dst) {
			have[dst] = true
			continue
		}
		if err := h.NeighDel(floodEntry(l, dst)); err != nil {
			return errors.Wrapf(err, "cannot stop %s flooding to %s", l.Attrs().Name, dst)
		}
	}
	for _, p := range d.peers {
		if have[p] {
			continue
		}
		if err := h.NeighAppend(floodEntry(l, p)); err != nil {
			return errors.Wrapf(err, "cannot make %s flood to %s", l.Attrs().Name, p)
		}
	}
	return nil
}

// floodEntry is the FDB entry of l that floods to peer.
func floodEntry(l netlink.Link, peer netip.Addr) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    l.Attrs().Index,
		Family:       unix.AF_BRIDGE,
		Flags:        netlink.NTF_SELF,
		State:        netlink.NUD_PERMANENT | netlink.NUD_NOARP,
		HardwareAddr: floodMAC,
		IP:           net.IP(peer.AsSlice()),
	}
}
