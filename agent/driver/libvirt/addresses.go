package libvirt

import (
	"slices"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

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

// networkView reads each network once for one look at the node's guests:
// a full observe of a node whose guests share a network costs the
// network's reads once, not once per guest. A failed read is not retried
// within the view.
type networkView struct {
	api  API
	nets map[string]*viewedNetwork
}

// viewedNetwork is what a networkView read of one network; err is the
// lookup's or the read's failure.
type viewedNetwork struct {
	nw  network
	err error
	// leases are the network's DHCP leases once read (leasesRead); a
	// network whose leases cannot be read has leasesErr.
	leases     []golibvirt.NetworkDhcpLease
	leasesErr  error
	leasesRead bool
}

func newNetworkView(api API) *networkView {
	return &networkView{api: api, nets: map[string]*viewedNetwork{}}
}

// network is the network called name, looked up and read once.
func (v *networkView) network(name string) *viewedNetwork {
	if n, ok := v.nets[name]; ok {
		return n
	}
	n := &viewedNetwork{}
	v.nets[name] = n
	ref, err := v.api.NetworkLookupByName(name)
	if err != nil {
		n.err = err
		return n
	}
	n.nw, n.err = readNetwork(v.api, ref)
	n.nw.ref = ref
	return n
}

// know takes nw, which the caller has just read and changed, as what the
// view reads of it. A nil view knows nothing.
func (v *networkView) know(nw network) {
	if v == nil {
		return
	}
	v.nets[nw.ref.Name] = &viewedNetwork{nw: nw}
}

// dhcpLeases are the DHCP leases of the network called name.
func (v *networkView) dhcpLeases(name string) ([]golibvirt.NetworkDhcpLease, error) {
	n := v.network(name)
	if n.nw.ref.Name == "" {
		return nil, n.err
	}
	if !n.leasesRead {
		n.leasesRead = true
		n.leases, _, n.leasesErr = v.api.NetworkGetDhcpLeases(n.nw.ref, golibvirt.OptString{}, 1, 0)
	}
	return n.leases, n.leasesErr
}

// staleLeases names the MACs of nics whose DHCP leases were all granted
// before since: the guest has not asked for an address in this boot yet. A
// lease is granted at its expiry minus the network's lease time. Networks
// whose leases cannot be read (no DHCP on them, a driver without leases) name
// none.
func staleLeases(nets *networkView, nics []nic, since time.Time) map[string]bool {
	stale := map[string]bool{}
	fresh := map[string]bool{}
	done := map[string]bool{}
	for _, n := range nics {
		if n.network == "" || done[n.network] {
			continue
		}
		done[n.network] = true
		leases, err := nets.dhcpLeases(n.network)
		if err != nil {
			continue
		}
		leaseTime := networkLeaseTime(nets.network(n.network))
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
func networkLeaseTime(n *viewedNetwork) time.Duration {
	if n.err != nil || n.nw.def == nil {
		return dnsmasqLeaseTime
	}
	for _, ip := range n.nw.def.IPs {
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

// addressSources in the order they are trusted: the DHCP server's leases,
// then the guest agent, then the host's ARP table.
var addressSources = []struct {
	src  golibvirt.DomainInterfaceAddressesSource
	name driver.AddressSource
}{
	{golibvirt.DomainInterfaceAddressesSrcLease, driver.AddressSourceLease},
	{golibvirt.DomainInterfaceAddressesSrcAgent, driver.AddressSourceGuestAgent},
	{golibvirt.DomainInterfaceAddressesSrcArp, driver.AddressSourceARP},
}

// sightings asks each source in turn until every interface has addresses.
// A source that fails (no guest agent, say) is skipped: addresses are best
// effort and remembered across looks.
//
// since is when this boot of the guest began, if known. dnsmasq keeps a
// lease for an hour, so right after a start the leases (and the host's ARP
// table) still show the previous boot's address while the guest is in its
// firmware: an interface whose only lease was granted before since is
// reported by the guest agent alone, which speaks for the running guest.
func (d *Driver) sightings(nets *networkView, dom golibvirt.Domain, nics []nic, since *time.Time) map[string]sighting {
	api := nets.api
	seen := map[string]sighting{}
	if d.testDriver {
		var ours map[string]bool
		seen, ours = reservedLeases(nets, nics)
		// On a network virtfleet did not make, with its DHCP range, the
		// test driver's made-up address stands for a dynamic lease.
		nics = slices.DeleteFunc(slices.Clone(nics), func(n nic) bool { return ours[n.network] })
		if len(nics) == 0 {
			return seen
		}
	}
	stale := map[string]bool{}
	if since != nil {
		stale = staleLeases(nets, nics, *since)
	}
	wanted := len(seen) + len(nics)
	asked := map[string]bool{}
	for _, n := range nics {
		asked[n.mac] = true
	}
	for _, s := range addressSources {
		if len(seen) >= wanted {
			break
		}
		ifaces, err := api.DomainInterfaceAddresses(dom, uint32(s.src), 0)
		if err != nil {
			continue
		}
		for _, i := range ifaces {
			if len(i.Hwaddr) == 0 || len(i.Addrs) == 0 {
				continue
			}
			mac := strings.ToLower(i.Hwaddr[0])
			if _, ok := seen[mac]; ok || !asked[mac] {
				continue
			}
			if stale[mac] && s.name != driver.AddressSourceGuestAgent {
				continue
			}
			ips := make([]string, 0, len(i.Addrs))
			for _, a := range i.Addrs {
				ips = append(ips, a.Addr)
			}
			// A guest holds a link-local address before DHCP answers: an
			// interface with only such is one without addresses yet.
			if ips = driver.Reachable(ips); len(ips) > 0 {
				seen[mac] = sighting{ips: ips, source: s.name}
			}
		}
	}
	return seen
}

// reservedLeases are the addresses the DHCP reservations of the networks
// virtfleet made give nics, as leases, and the names of those networks.
// This is what a guest of libvirt's test driver holds there: the test driver
// runs no dnsmasq and no guest, and the addresses its
// DomainInterfaceAddresses makes up (from the domain's id, the same on
// every node) are no guest's; a simulated guest takes the lease it is
// offered.
func reservedLeases(nets *networkView, nics []nic) (map[string]sighting, map[string]bool) {
	seen, ours := map[string]sighting{}, map[string]bool{}
	macs := map[string]bool{}
	for _, n := range nics {
		macs[n.mac] = true
	}
	read := map[string]bool{}
	for _, n := range nics {
		if read[n.network] {
			continue
		}
		read[n.network] = true
		v := nets.network(n.network)
		if v.err != nil || v.nw.mark == nil {
			continue
		}
		ours[n.network] = true
		for _, ip := range v.nw.def.IPs {
			for _, h := range dhcpHosts(ip) {
				if mac := strings.ToLower(h.MAC); macs[mac] && h.IP != "" {
					seen[mac] = sighting{ips: []string{h.IP}, source: driver.AddressSourceLease}
				}
			}
		}
	}
	return seen, ours
}
