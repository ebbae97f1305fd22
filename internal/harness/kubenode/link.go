package kubenode

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"sync/atomic"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// links counts the links this process made (Link), each of which takes
// the next /30 of linkRange.
var links atomic.Uint32

// linkRange holds the links' addresses: outside clusterCIDR, the Service
// range and the guests' networks.
var linkRange = netip.MustParsePrefix("10.252.0.0/16")

// Link joins nodes a and b as a cluster's network joins its nodes: a veth
// pair between their network namespaces, an address of a /30 at each end,
// in each namespace a route to the other's pod subnet through it, and
// forwarding on in both. Their
// pods, and what runs on their hosts' networks (an agent), then reach the
// other's pods, and a Service whose endpoint is there. The pods' subnets
// must differ (Options.PodSubnet). The pair goes with either namespace.
func Link(ctx context.Context, a, b *Node) error {
	if a.PodSubnet.Overlaps(b.PodSubnet) {
		return errors.Errorf("nodes %s and %s have overlapping pod subnets %s and %s", a.Name, b.Name, a.PodSubnet, b.PodSubnet)
	}
	k := links.Add(1)
	if k >= 1<<14 {
		return errors.New("no more link addresses")
	}
	base := linkRange.Addr().As4()
	base[2], base[3] = byte(k>>6), byte(k<<2)
	atA, atB := netip.AddrFrom4(base).Next(), netip.AddrFrom4(base).Next().Next()
	// Each end is named after the node at its other end: the nodes' ids
	// are unique, and short enough for a link's name.
	toB, toA := "vl"+nodeID(b), "vl"+nodeID(a)
	steps := [][]string{
		{"netns", "exec", a.Netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"netns", "exec", b.Netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"-n", a.Netns, "link", "add", toB, "type", "veth", "peer", "name", toA, "netns", b.Netns},
		{"-n", a.Netns, "addr", "add", atA.String() + "/30", "dev", toB},
		{"-n", b.Netns, "addr", "add", atB.String() + "/30", "dev", toA},
		{"-n", a.Netns, "link", "set", toB, "up"},
		{"-n", b.Netns, "link", "set", toA, "up"},
		{"-n", a.Netns, "route", "add", b.PodSubnet.String(), "via", atB.String()},
		{"-n", b.Netns, "route", "add", a.PodSubnet.String(), "via", atA.String()},
	}
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, "ip", s...).CombinedOutput(); err != nil { //nolint:gosec // the harness's own arguments
			return errors.Errorf("cannot link nodes %s and %s: ip %s: %v: %s", a.Name, b.Name, strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// nodeID is what names n's directory, namespace and cgroup.
func nodeID(n *Node) string { return strings.TrimPrefix(n.Cgroup, "vfkn-") }
