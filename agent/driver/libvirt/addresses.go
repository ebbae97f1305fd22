package libvirt

import (
	"slices"
	"sync"
	"time"

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
