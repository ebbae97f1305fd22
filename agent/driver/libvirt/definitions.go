package libvirt

import (
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// definitions keeps the parsed definitions of the node's domains, and the
// list of the domains, for Capacity, which every heartbeat (2 s) calls, and
// for the full observe of a resync (List, Orphans): reading every domain's
// XML each time would cost the agent and its libvirtd more than creating
// the guests does (BenchmarkCapacity and BenchmarkObserveAll measure it).
// An entry is dropped whenever its domain may have changed what is read of
// it (its owner, vCPUs, memory and interfaces): on every lifecycle event
// (defined, undefined, started, stopped...), on a metadata change event, on
// a device added or removed, and on every call of the driver's own that
// changes a domain (forgetting), before the call returns. Events sent while
// the agent was not connected are lost, so a new connection starts with no
// entries. The list of domains stands while no entry was dropped since it
// was read: every domain defined or undefined drops one.
//
// A read that began before a drop is not kept, so a definition read just
// before a change and stored just after it cannot outlive the change. No
// entry is kept longer than definitionsMaxAge: a change libvirt announces
// with no event (an interface's network changed with virsh update-device)
// shows within that.
type definitions struct {
	mu sync.Mutex
	// generation is the connection the entries were read on.
	generation int
	infos      map[definitionKey]keptDefinition
	// drops is when each UUID was last dropped, as a number of seq; a read
	// keeps its result only if no drop happened while it ran.
	drops map[string]uint64
	seq   uint64
	// listing is the node's domains as of listedAt, valid while seq is
	// listedSeq.
	listing   []golibvirt.Domain
	listedSeq uint64
	listedAt  time.Time
	listed    bool
	now       func() time.Time
}

// definitionsMaxAge bounds how long a definition or the list of domains is
// kept.
const definitionsMaxAge = 10 * time.Minute

// definitionKey is a domain's UUID and which of its definitions: the
// running one (flags 0) or the next (golibvirt.DomainXMLInactive).
type definitionKey struct {
	uuid  string
	flags golibvirt.DomainXMLFlags
}

type keptDefinition struct {
	info domainInfo
	at   time.Time
}

func newDefinitions() *definitions {
	return &definitions{infos: map[definitionKey]keptDefinition{}, drops: map[string]uint64{}, now: time.Now}
}

// forget drops the definitions of the domain with UUID key, and the list.
func (c *definitions) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.infos, definitionKey{key, 0})
	delete(c.infos, definitionKey{key, golibvirt.DomainXMLInactive})
	c.seq++
	c.drops[key] = c.seq
}

// reset drops everything when generation is another connection's. c.mu
// must be held.
func (c *definitions) resetLocked(generation int) {
	if c.generation != generation {
		c.generation, c.infos, c.drops, c.listed = generation, map[definitionKey]keptDefinition{}, map[string]uint64{}, false
	}
}

// read returns the running definition of dom, read through api on the
// connection generation when it is not kept.
func (c *definitions) read(api API, generation int, dom golibvirt.Domain) (domainInfo, error) {
	return c.readAs(api, generation, dom, 0)
}

// readAs returns the definition of dom that flags name, read through api on
// the connection generation when it is not kept.
func (c *definitions) readAs(api API, generation int, dom golibvirt.Domain, flags golibvirt.DomainXMLFlags) (domainInfo, error) {
	key := definitionKey{formatUUID(dom.UUID), flags}
	c.mu.Lock()
	c.resetLocked(generation)
	kept, ok := c.infos[key]
	drops := c.drops[key.uuid]
	now := c.now()
	c.mu.Unlock()
	if ok && now.Sub(kept.at) < definitionsMaxAge {
		return kept.info, nil
	}
	x, err := api.DomainGetXMLDesc(dom, flags)
	if err != nil {
		return domainInfo{}, errors.Wrap(err, "cannot read domain XML")
	}
	info, err := parseDomain(x)
	if err != nil {
		return domainInfo{}, err
	}
	c.mu.Lock()
	if c.generation == generation && c.drops[key.uuid] == drops {
		c.infos[key] = keptDefinition{info: info, at: now}
	}
	c.mu.Unlock()
	return info, nil
}

// domains returns the node's domains, listed through api on the
// connection generation unless a listing is kept.
func (c *definitions) domains(api API, generation int) ([]golibvirt.Domain, error) {
	c.mu.Lock()
	c.resetLocked(generation)
	seq, now := c.seq, c.now()
	if c.listed && c.listedSeq == seq && now.Sub(c.listedAt) < definitionsMaxAge {
		doms := c.listing
		c.mu.Unlock()
		return doms, nil
	}
	c.mu.Unlock()
	all, _, err := api.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list domains")
	}
	c.keepListing(generation, all, seq, now)
	return all, nil
}

// mark is the point a listing begins at, for keepListing.
func (c *definitions) mark() (uint64, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq, c.now()
}

// keepListing keeps doms, listed on connection generation from seq on, as
// the node's domains, unless a domain was dropped since; it drops the
// entries of domains not in doms, those gone from the node.
func (c *definitions) keepListing(generation int, doms []golibvirt.Domain, seq uint64, at time.Time) {
	present := make(map[string]bool, len(doms))
	for _, d := range doms {
		present[formatUUID(d.UUID)] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.generation != generation {
		return
	}
	if c.seq == seq {
		c.listing, c.listedSeq, c.listedAt, c.listed = doms, seq, at, true
	}
	for key := range c.infos {
		if !present[key.uuid] {
			delete(c.infos, key)
		}
	}
	for key := range c.drops {
		if !present[key] {
			delete(c.drops, key)
		}
	}
}

// forgetting is the API the driver calls libvirt through: each of its
// calls that changes a domain's definitions, or the set of domains, drops
// what definitions keeps of it once the call returns, so what the driver
// itself changed is read afresh at once, without waiting for the change's
// event.
type forgetting struct {
	API
	defs *definitions
}

func (f forgetting) DomainDefineXMLFlags(x string, flags golibvirt.DomainDefineFlags) (golibvirt.Domain, error) {
	dom, err := f.API.DomainDefineXMLFlags(x, flags)
	if err == nil {
		f.defs.forget(formatUUID(dom.UUID))
	}
	return dom, err
}

func (f forgetting) DomainSetMetadata(dom golibvirt.Domain, typ int32, metadata, key, uri golibvirt.OptString, flags golibvirt.DomainModificationImpact) error {
	defer f.defs.forget(formatUUID(dom.UUID))
	return f.API.DomainSetMetadata(dom, typ, metadata, key, uri, flags)
}

// DomainCreate: a start makes the next definition the running one.
func (f forgetting) DomainCreate(dom golibvirt.Domain) error {
	defer f.defs.forget(formatUUID(dom.UUID))
	return f.API.DomainCreate(dom)
}

// DomainDestroy: a domain that stops has no running definition.
func (f forgetting) DomainDestroy(dom golibvirt.Domain) error {
	defer f.defs.forget(formatUUID(dom.UUID))
	return f.API.DomainDestroy(dom)
}

func (f forgetting) DomainUndefineFlags(dom golibvirt.Domain, flags golibvirt.DomainUndefineFlagsValues) error {
	defer f.defs.forget(formatUUID(dom.UUID))
	return f.API.DomainUndefineFlags(dom, flags)
}

// DomainMigratePerform3Params: a guest that left is undefined here.
func (f forgetting) DomainMigratePerform3Params(dom golibvirt.Domain, dconnuri golibvirt.OptString, params []golibvirt.TypedParam, cookieIn []byte, flags golibvirt.DomainMigrateFlags) ([]byte, error) {
	defer f.defs.forget(formatUUID(dom.UUID))
	return f.API.DomainMigratePerform3Params(dom, dconnuri, params, cookieIn, flags)
}

// DomainRevertToSnapshot: a revert brings back the definitions the
// snapshot keeps.
func (f forgetting) DomainRevertToSnapshot(snap golibvirt.DomainSnapshot, flags uint32) error {
	defer f.defs.forget(formatUUID(snap.Dom.UUID))
	return f.API.DomainRevertToSnapshot(snap, flags)
}
