package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// OverlapError says that a VirtualNetwork's cidr overlaps the cidr of
// another that came first. A node hosting VMs of both would have two routes
// for the same addresses, and the more specific one would take the other's
// traffic. No retry mends it; another cidr, or the other network's
// deletion, does.
type OverlapError struct {
	// Network is the VirtualNetwork's name, CIDR its cidr.
	Network, CIDR string
	// Other is the name of the network that came first, empty when it is
	// of another namespace (a tenant learns nothing of another's but that
	// the range is taken); OtherCIDR is its cidr.
	Other, OtherCIDR string
}

func (e *OverlapError) Error() string {
	other := "a VirtualNetwork of another namespace"
	if e.Other != "" {
		other = "VirtualNetwork " + e.Other
	}
	return fmt.Sprintf("refused: VirtualNetwork %s's spec.forProvider.cidr %s overlaps %s of %s, which came first; no two networks the fleet makes may overlap, since a node may host VMs of both: choose another cidr", e.Network, e.CIDR, e.OtherCIDR, other)
}

// CheckOverlap refuses n, with an OverlapError, when its cidr overlaps that
// of a network of all that comes before it and is itself admitted. The
// networks are taken in the order they were created (on a tie, by
// namespace and name), and each is admitted when it overlaps no network
// admitted before it: so a network refused for an overlap, or one counts
// refuses (its namespace may not have it), takes no range from those after
// it, and no network can lose its range to one created later.
func CheckOverlap(n *v1alpha1.VirtualNetwork, all []v1alpha1.VirtualNetwork, counts func(*v1alpha1.VirtualNetwork) bool) error {
	mine, ok := prefixOf(n)
	if !ok {
		return nil
	}
	earlier := make([]*v1alpha1.VirtualNetwork, 0, len(all))
	for i := range all {
		if o := &all[i]; o.UID != n.UID && before(o, n) {
			earlier = append(earlier, o)
		}
	}
	slices.SortFunc(earlier, order)
	type taken struct {
		network *v1alpha1.VirtualNetwork
		prefix  netip.Prefix
	}
	var admitted []taken
	for _, o := range earlier {
		p, ok := prefixOf(o)
		if !ok || !counts(o) || slices.ContainsFunc(admitted, func(t taken) bool { return t.prefix.Overlaps(p) }) {
			continue
		}
		admitted = append(admitted, taken{o, p})
	}
	for _, t := range admitted {
		if t.prefix.Overlaps(mine) {
			err := &OverlapError{Network: n.Name, CIDR: n.Spec.ForProvider.CIDR, OtherCIDR: t.network.Spec.ForProvider.CIDR}
			if t.network.Namespace == n.Namespace {
				err.Other = t.network.Name
			}
			return err
		}
	}
	return nil
}

// prefixOf is the subnet of a network virtfleet makes from its cidr.
func prefixOf(n *v1alpha1.VirtualNetwork) (netip.Prefix, bool) {
	if !Addressed(n) {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(n.Spec.ForProvider.CIDR)
	return p.Masked(), err == nil
}

// order sorts networks by creation, then namespace and name.
func order(a, b *v1alpha1.VirtualNetwork) int {
	return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// before says whether a comes before b.
func before(a, b *v1alpha1.VirtualNetwork) bool { return order(a, b) < 0 }
