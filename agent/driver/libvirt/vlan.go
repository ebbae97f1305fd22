package libvirt

import (
	"fmt"
	"net"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// A bridge-mode network with a VLAN tag joins VLAN N of a host bridge the
// site runs as a trunk: the driver makes a VLAN device of id N on the host
// bridge and a Linux bridge of its own with that device as its only port
// besides the guests' taps, and the libvirt network forwards in bridge mode
// on that bridge. Guests then send and receive untagged frames; the VLAN
// device tags and untags them on the trunk.
//
// Both links live with libvirtd's bridges (Config.Netns). Their names are
// recorded in the network's mark, so that they go with the network and are
// found again however the host bridge changed meanwhile.

// maxLinkName is the longest name a Linux link can have (IFNAMSIZ less the
// terminating NUL).
const maxLinkName = 15

// vlanLinks are the links the driver makes for a network with a VLAN tag.
type vlanLinks struct {
	// Device is the VLAN device on the host bridge.
	Device string
	// Bridge is the bridge the libvirt network's guests join.
	Bridge string
}

// vlanLinkNames names the links of VLAN id on the host bridge of ifindex
// parent. The index, not the host bridge's name, goes in them: a host
// bridge's name may take all 15 characters by itself.
func vlanLinkNames(parent int, id int32) (vlanLinks, error) {
	l := vlanLinks{Device: fmt.Sprintf("vfv%d.%d", parent, id), Bridge: fmt.Sprintf("vfb%d.%d", parent, id)}
	if len(l.Device) > maxLinkName {
		return vlanLinks{}, errors.Errorf("cannot name the links of VLAN %d on the host bridge of index %d within %d characters", id, parent, maxLinkName)
	}
	return l, nil
}

// checkVLAN refuses a VLAN tag no network could carry: one outside 1 to
// 4094, or one on a network that is not a bridge-mode network the driver
// makes (an imported network is used as it is).
func checkVLAN(n driver.Network) error {
	switch {
	case n.VLAN == 0:
		return nil
	case n.VLAN < 0 || n.VLAN > 4094:
		return driver.Terminalf("network %q: vlan %d is not a VLAN id (1 to 4094)", n.Name, n.VLAN)
	case n.Mode != driver.NetworkModeBridge:
		return driver.Terminalf("network %q has vlan %d, and only a bridge-mode network can have one", n.Name, n.VLAN)
	case n.Imported:
		return driver.Terminalf("network %q has vlan %d, and an imported network is used as it is, never given a VLAN", n.Name, n.VLAN)
	case n.Bridge == "":
		return driver.Terminalf("network %q has vlan %d and no host bridge to take it from", n.Name, n.VLAN)
	}
	return nil
}

// ensureVLANLinks makes VLAN id's device on host bridge parent and the
// bridge it is a port of, both up, and returns their names: want's, or,
// when want is the zero vlanLinks, ones derived from the host bridge. On
// failure it returns the names too once it has them, so the caller can
// remove what was made. A missing host bridge is an error a retry may mend
// (the site may make it). The caller holds d.networkMu.
func (d *Driver) ensureVLANLinks(parent string, id int32, want vlanLinks) (vlanLinks, error) {
	h, err := d.linkHandle()
	if err != nil {
		return vlanLinks{}, err
	}
	defer h.Close()
	trunk, err := h.LinkByName(parent)
	var missing netlink.LinkNotFoundError
	switch {
	case errors.As(err, &missing):
		return vlanLinks{}, errors.Errorf("host bridge %s, whose VLAN %d the network joins, does not exist on this node", parent, id)
	case err != nil:
		return vlanLinks{}, errors.Wrapf(err, "cannot read host bridge %s", parent)
	}
	if want == (vlanLinks{}) {
		if want, err = vlanLinkNames(trunk.Attrs().Index, id); err != nil {
			return vlanLinks{}, err
		}
	}

	br, err := ensureLink(h, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: want.Bridge}}, func(l netlink.Link) bool {
		_, ok := l.(*netlink.Bridge)
		return ok
	})
	if err != nil {
		return want, err
	}
	dev, err := ensureLink(h, &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: want.Device, ParentIndex: trunk.Attrs().Index}, VlanId: int(id)}, func(l netlink.Link) bool {
		v, ok := l.(*netlink.Vlan)
		return ok && v.VlanId == int(id) && v.ParentIndex == trunk.Attrs().Index
	})
	if errors.Is(err, unix.EOPNOTSUPP) {
		return want, errors.Wrapf(err, "node %s cannot join VLAN %d of host bridge %s: its kernel has no 802.1Q VLAN devices (CONFIG_VLAN_8021Q, module 8021q)", d.node, id, parent)
	}
	if err != nil {
		return want, err
	}
	if dev.Attrs().MasterIndex != br.Attrs().Index {
		if err := h.LinkSetMaster(dev, br); err != nil {
			return want, errors.Wrapf(err, "cannot attach %s to bridge %s", want.Device, want.Bridge)
		}
	}
	for _, l := range []netlink.Link{dev, br} {
		if l.Attrs().Flags&net.FlagUp == 0 {
			if err := h.LinkSetUp(l); err != nil {
				return want, errors.Wrapf(err, "cannot bring %s up", l.Attrs().Name)
			}
		}
	}
	return want, nil
}

// ensureLink makes the link want describes, unless one of its name is
// already what same says; one that is not is removed and made again (its
// name is the driver's).
func ensureLink(h *netlink.Handle, want netlink.Link, same func(netlink.Link) bool) (netlink.Link, error) {
	name := want.Attrs().Name
	l, err := h.LinkByName(name)
	var missing netlink.LinkNotFoundError
	switch {
	case errors.As(err, &missing):
	case err != nil:
		return nil, errors.Wrapf(err, "cannot read link %s", name)
	case same(l):
		return l, nil
	default:
		if err := h.LinkDel(l); err != nil {
			return nil, errors.Wrapf(err, "cannot remove link %s, which is not the %s this node makes", name, want.Type())
		}
	}
	if err := h.LinkAdd(want); err != nil {
		return nil, errors.Wrapf(err, "cannot make %s device %s", want.Type(), name)
	}
	l, err = h.LinkByName(name)
	return l, errors.Wrapf(err, "cannot read link %s", name)
}

// removeVLANLinks removes the links made for network nw, unless another
// network of the node forwards on the same bridge (two VirtualNetworks on
// one VLAN of one host bridge share them). Links already gone, or no
// longer of the kind the driver makes, are left alone. The caller holds
// d.networkMu.
func (d *Driver) removeVLANLinks(api API, nw string, made vlanLinks) error {
	if made == (vlanLinks{}) {
		return nil
	}
	refs, _, err := api.ConnectListAllNetworks(1, 0)
	if err != nil {
		return errors.Wrap(err, "cannot list networks")
	}
	for _, ref := range refs {
		if ref.Name == nw {
			continue
		}
		other, err := readNetwork(api, ref)
		if isCode(err, golibvirt.ErrNoNetwork) {
			continue
		}
		if err != nil {
			return err
		}
		if other.def.Bridge != nil && other.def.Bridge.Name == made.Bridge {
			return nil
		}
	}
	h, err := d.linkHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	for _, link := range []struct {
		name string
		ours func(netlink.Link) bool
	}{
		{made.Bridge, func(l netlink.Link) bool { _, ok := l.(*netlink.Bridge); return ok }},
		{made.Device, func(l netlink.Link) bool { _, ok := l.(*netlink.Vlan); return ok }},
	} {
		if link.name == "" {
			continue
		}
		l, err := h.LinkByName(link.name)
		var missing netlink.LinkNotFoundError
		switch {
		case errors.As(err, &missing):
			continue
		case err != nil:
			return errors.Wrapf(err, "cannot read link %s", link.name)
		case !link.ours(l):
			continue
		}
		if err := h.LinkDel(l); err != nil {
			return errors.Wrapf(err, "cannot remove %s device %s", l.Type(), link.name)
		}
	}
	return nil
}
