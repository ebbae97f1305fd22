package libvirt

import (
	"slices"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// sighting is what one look at a guest's addresses found for one MAC.
type sighting struct {
	ips    []string
	source driver.AddressSource
}

// addressBook remembers the last addresses reported per guest and MAC, so a
// look that comes back empty (a lease renewing, an agent not up yet) does not
// make an IP flap out of the status. An address is replaced only when a
// source reports different ones, and dropped when its interface goes away.
type addressBook struct {
	mu    sync.Mutex
	byUID map[string]map[string]driver.Interface
}

func newAddressBook() *addressBook {
	return &addressBook{byUID: map[string]map[string]driver.Interface{}}
}

// merge records what one look saw for the guest's interfaces and returns them
// with their remembered addresses, in the guest's order.
func (b *addressBook) merge(uid string, nics []nic, seen map[string]sighting, now time.Time) []driver.Interface {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.byUID[uid]
	cur := make(map[string]driver.Interface, len(nics))
	out := make([]driver.Interface, 0, len(nics))
	for _, n := range nics {
		i, known := old[n.mac]
		if !known {
			i = driver.Interface{Network: n.network, MAC: n.mac}
		}
		i.Network = n.network
		if s, ok := seen[n.mac]; ok && len(s.ips) > 0 {
			i.IPs, i.Source, i.LastSeen = slices.Clone(s.ips), s.source, now
		}
		cur[n.mac] = i
		out = append(out, i)
	}
	b.byUID[uid] = cur
	return out
}

// forget drops everything remembered for a guest: it stopped or is gone, so
// its leases are no longer its own.
func (b *addressBook) forget(uid string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.byUID, uid)
}

// dnsmasqLeaseTime is how long libvirt's dnsmasq leases an address when the
// network names no lease time.
const dnsmasqLeaseTime = time.Hour

// staleLeases names the MACs of nics whose DHCP leases were all granted
// before since: the guest has not asked for an address in this boot yet. A
// lease is granted at its expiry minus the network's lease time. Networks
// whose leases cannot be read (no DHCP on them, a driver without leases) name
// none.
func staleLeases(api API, nics []nic, since time.Time) map[string]bool {
	stale := map[string]bool{}
	fresh := map[string]bool{}
	done := map[string]bool{}
	for _, n := range nics {
		if n.network == "" || done[n.network] {
			continue
		}
		done[n.network] = true
		net, err := api.NetworkLookupByName(n.network)
		if err != nil {
			continue
		}
		leaseTime := networkLeaseTime(api, net)
		leases, _, err := api.NetworkGetDhcpLeases(net, golibvirt.OptString{}, 1, 0)
		if err != nil {
			continue
		}
		for _, l := range leases {
			if len(l.Mac) == 0 || l.Expirytime <= 0 {
				continue
			}
			mac := strings.ToLower(l.Mac[0])
			// Whole seconds on both sides: a lease granted in the second
			// the guest started counts as this boot's.
			if granted := time.Unix(l.Expirytime, 0).Add(-leaseTime); granted.Before(since.Truncate(time.Second)) {
				stale[mac] = true
			} else {
				fresh[mac] = true
			}
		}
	}
	for mac := range fresh {
		delete(stale, mac)
	}
	return stale
}

// networkLeaseTime is the lease time of the network's first DHCP range.
func networkLeaseTime(api API, net golibvirt.Network) time.Duration {
	x, err := api.NetworkGetXMLDesc(net, 0)
	if err != nil {
		return dnsmasqLeaseTime
	}
	var n libvirtxml.Network
	if err := n.Unmarshal(x); err != nil {
		return dnsmasqLeaseTime
	}
	for _, ip := range n.IPs {
		if ip.DHCP == nil {
			continue
		}
		for _, r := range ip.DHCP.Ranges {
			if r.Lease != nil && r.Lease.Expiry > 0 {
				return time.Duration(r.Lease.Expiry) * leaseUnit(r.Lease.Unit)
			}
		}
	}
	return dnsmasqLeaseTime
}

func leaseUnit(u string) time.Duration {
	switch u {
	case "seconds":
		return time.Second
	case "hours":
		return time.Hour
	default: // libvirt's default unit
		return time.Minute
	}
}
