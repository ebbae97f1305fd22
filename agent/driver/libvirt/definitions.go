package libvirt

import (
	"sync"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// definitions keeps the parsed definitions of the node's domains for
// Capacity, which every heartbeat (2 s) calls: reading every domain's XML
// each time would cost the agent and its libvirtd more than creating the
// guests does (BenchmarkCapacity measures it). An entry is dropped
// whenever its domain may have changed what Capacity reads of it (its
// owner, vCPUs and memory): on every lifecycle event (defined, undefined,
// started, stopped...), on a metadata change event, and on every define and
// metadata write of the driver's own, before the call returns. (A device
// hotplugged changes none of the three, nor does a vCPU or memory hotplug:
// it changes the current amounts, not the maximums Capacity counts.) Events
// sent while the agent was not connected are lost, so a new connection
// starts with no entries.
//
// A read that began before a drop is not kept, so a definition read just
// before a change and stored just after it cannot outlive the change.
type definitions struct {
	mu sync.Mutex
	// generation is the connection the entries were read on.
	generation int
	infos      map[string]domainInfo // by domain UUID
	// drops is when each UUID was last dropped, as a number of seq; a read
	// keeps its result only if no drop happened while it ran.
	drops map[string]uint64
	seq   uint64
}

func newDefinitions() *definitions {
	return &definitions{infos: map[string]domainInfo{}, drops: map[string]uint64{}}
}

// forget drops the definition of the domain with UUID key.
func (c *definitions) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.infos, key)
	c.seq++
	c.drops[key] = c.seq
}

// read returns the definition of dom, read through api on the connection
// generation when it is not kept.
func (c *definitions) read(api API, generation int, dom golibvirt.Domain) (domainInfo, error) {
	key := formatUUID(dom.UUID)
	c.mu.Lock()
	if c.generation != generation {
		c.generation, c.infos, c.drops = generation, map[string]domainInfo{}, map[string]uint64{}
	}
	info, ok := c.infos[key]
	drops := c.drops[key]
	c.mu.Unlock()
	if ok {
		return info, nil
	}
	x, err := api.DomainGetXMLDesc(dom, 0)
	if err != nil {
		return domainInfo{}, errors.Wrap(err, "cannot read domain XML")
	}
	if info, err = parseDomain(x); err != nil {
		return domainInfo{}, err
	}
	c.mu.Lock()
	if c.generation == generation && c.drops[key] == drops {
		c.infos[key] = info
	}
	c.mu.Unlock()
	return info, nil
}

// keepOnly drops the entries of domains not in doms, those gone from the
// node.
func (c *definitions) keepOnly(doms []golibvirt.Domain) {
	present := make(map[string]bool, len(doms))
	for _, d := range doms {
		present[formatUUID(d.UUID)] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.infos {
		if !present[key] {
			delete(c.infos, key)
		}
	}
	for key := range c.drops {
		if !present[key] {
			delete(c.drops, key)
		}
	}
}
