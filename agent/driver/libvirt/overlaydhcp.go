package libvirt

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DHCP never crosses the overlay. Each node's network answers DHCP from
// its own dnsmasq, which holds the reservations of that node's guests only
// (network.go), and the network's gateway is one address and one MAC on
// every node, which is also the DHCP server's identifier. A broadcast
// flooded over the overlay reaches every node's dnsmasq, and libvirt makes
// each authoritative for the subnet: a node without the client's
// reservation answers its request with a NAK, under the same server
// identifier as the node that has it, and whichever answer arrives first
// wins. A guest could then spend minutes between NAK and retry before it
// held its address again after a reboot. So frames of the DHCP ports are
// dropped where they would enter or leave a VXLAN device: a bridge-family
// nftables table in libvirtd's network namespace, one rule per direction
// in each of the bridge's hooks a frame passes on its way. The table
// matches overlay devices by name, so it stays, idle, once the node's last
// overlay is gone.

// overlayTable is the nftables table (bridge family) of these rules.
const overlayTable = "virtfleet-overlay"

// vxlanPrefix begins the name of every overlay device (vxlanName).
const vxlanPrefix = "vfx"

// DHCP's server and client ports.
const (
	dhcpServerPort = 67
	dhcpClientPort = 68
)

// keepDHCPLocal makes the overlay table as it should be: made when
// missing, its rules replaced in one transaction otherwise.
func (d *Driver) keepDHCPLocal() error {
	c, done, err := d.nftConn()
	if err != nil {
		return err
	}
	defer done()
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: overlayTable})
	c.FlushTable(t)
	for _, h := range []struct {
		name string
		hook *nftables.ChainHook
		// through: the interfaces a frame of this hook passes, of which
		// an overlay device's drops it.
		through []expr.MetaKey
	}{
		{"input", nftables.ChainHookInput, []expr.MetaKey{expr.MetaKeyIIFNAME}},
		{"forward", nftables.ChainHookForward, []expr.MetaKey{expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME}},
		{"output", nftables.ChainHookOutput, []expr.MetaKey{expr.MetaKeyOIFNAME}},
	} {
		ch := c.AddChain(&nftables.Chain{Name: h.name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: h.hook, Priority: nftables.ChainPriorityFilter})
		for _, k := range h.through {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: dhcpThroughOverlay(k)})
		}
	}
	return errors.Wrapf(c.Flush(), "cannot keep DHCP off the overlay (nftables table bridge %s)", overlayTable)
}

// dhcpThroughOverlay drops a UDP datagram to a DHCP port whose interface
// (iifname or oifname, as nft says) is an overlay device: the register
// holds the interface's name, of which the comparison reads the prefix's
// length, as nft compiles `iifname "vfx*"`.
func dhcpThroughOverlay(iface expr.MetaKey) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: iface, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(vxlanPrefix)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binaryutil.BigEndian.PutUint16(dhcpServerPort), ToData: binaryutil.BigEndian.PutUint16(dhcpClientPort)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// nftConn is an nftables connection in libvirtd's network namespace, and
// what to call when done with it. Its netlink sockets are opened per call
// (not lasting), in the namespace done closes.
func (d *Driver) nftConn() (*nftables.Conn, func(), error) {
	if d.netns == "" {
		c, err := nftables.New()
		return c, func() {}, errors.Wrap(err, "cannot open nftables")
	}
	ns, err := netns.GetFromPath(d.netns)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "cannot open network namespace %s", d.netns)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		_ = ns.Close()
		return nil, nil, errors.Wrapf(err, "cannot open nftables in network namespace %s", d.netns)
	}
	return c, func() { _ = ns.Close() }, nil
}
