package libvirt

import (
	"context"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.Adopter = (*Driver)(nil)

// A domain's UUID is the uid of the VM it was made for, its key: its name,
// MACs, seed and swap volumes and cloud-init instance id derive from it and
// never change. The VM managing it is the one its metadata names, which
// after an adoption or an import is another: aliases maps that VM's uid to
// the domain's key, for the domains where the two differ.
type aliases struct {
	mu     sync.Mutex
	loaded bool
	key    map[string]string // managing uid -> domain uuid
	owner  map[string]string // domain uuid -> managing uid
}

func newAliases() *aliases {
	return &aliases{key: map[string]string{}, owner: map[string]string{}}
}

// load reads every domain's owner once: aliases made by an earlier run of
// the agent are in the domains' metadata.
func (a *aliases) load(d *Driver, api API) error {
	a.mu.Lock()
	loaded := a.loaded
	a.mu.Unlock()
	if loaded {
		return nil
	}
	doms, infos, err := d.domains(api)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, dom := range doms {
		if o := infos[i].owner; o != nil {
			a.setLocked(o.UID, formatUUID(dom.UUID))
		}
	}
	a.loaded = true
	return nil
}

func (a *aliases) set(uid, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setLocked(uid, key)
}

func (a *aliases) setLocked(uid, key string) {
	if old, ok := a.owner[key]; ok {
		delete(a.key, old)
		delete(a.owner, key)
	}
	if uid != key {
		a.key[uid], a.owner[key] = key, uid
	}
}

// drop forgets that uid manages another domain: that domain is gone.
func (a *aliases) drop(uid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if k, ok := a.key[uid]; ok {
		delete(a.key, uid)
		delete(a.owner, k)
	}
}

// keyOf is the UUID of the domain uid manages, as far as the aliases know.
func (a *aliases) keyOf(uid string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if k, ok := a.key[uid]; ok {
		return k
	}
	return uid
}

// ownerOf is the uid managing the domain with UUID key.
func (a *aliases) ownerOf(key string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if uid, ok := a.owner[key]; ok {
		return uid
	}
	return key
}

// NotOursError is returned by lookup for a uid whose domain now belongs to
// another VM or was released: a NotFound for Ensure and Observe, but Delete
// must leave that domain and its volumes alone.
type NotOursError struct{ UID, Domain, Why string }

func (e *NotOursError) Error() string {
	return "domain " + e.Domain + " with uuid " + e.UID + " " + e.Why
}

// Release implements driver.Adopter: the domain's metadata says it is
// orphaned, in its definition and, when running, its live state; nothing
// else of it changes.
func (d *Driver) Release(_ context.Context, uid, seal string) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	dom, info, err := d.lookup(api, uid, golibvirt.DomainXMLInactive)
	if driver.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return d.rewriteOwner(api, dom, info, func(o *ownership) { o.Orphaned, o.Seal = true, seal })
}

// rewriteOwner changes the owner in the definition and, for a running
// domain, in its live metadata, each keeping its own spec hash.
func (d *Driver) rewriteOwner(api API, dom golibvirt.Domain, defined domainInfo, change func(*ownership)) error {
	state, _, err := api.DomainGetState(dom, 0)
	if err != nil {
		return errors.Wrap(err, "cannot read domain state")
	}
	write := func(info domainInfo, flags golibvirt.DomainModificationImpact) (ownership, error) {
		o := ownership{}
		if info.owner != nil {
			o = *info.owner
		}
		change(&o)
		return o, d.setOwnership(api, dom, o, flags)
	}
	s := golibvirt.DomainState(state)
	if s != golibvirt.DomainShutoff && s != golibvirt.DomainCrashed && s != golibvirt.DomainNostate {
		x, err := api.DomainGetXMLDesc(dom, 0)
		if err != nil {
			return errors.Wrap(err, "cannot read domain XML")
		}
		live, err := parseDomain(x)
		if err != nil {
			return err
		}
		if _, err := write(live, golibvirt.DomainAffectLive); err != nil {
			return err
		}
	}
	o, err := write(defined, golibvirt.DomainAffectConfig)
	if err != nil {
		return err
	}
	d.aliases.set(o.UID, formatUUID(dom.UUID))
	return nil
}

// Orphans implements driver.Adopter.
func (d *Driver) Orphans(_ context.Context) ([]driver.Observation, error) {
	api, conn, err := d.api()
	if err != nil {
		return nil, err
	}
	doms, infos, states, err := d.scan(api, conn.generation)
	if err != nil {
		return nil, err
	}
	orphans, oinfos := doms[:0], infos[:0]
	for i, dom := range doms {
		if infos[i].owner.Orphaned {
			orphans, oinfos = append(orphans, dom), append(oinfos, infos[i])
		}
	}
	return d.observeAll(api, conn.generation, orphans, oinfos, states)
}

// find looks up the domain ref names, with its definition.
func (d *Driver) find(api API, ref driver.Ref) (golibvirt.Domain, domainInfo, error) {
	var (
		dom golibvirt.Domain
		err error
	)
	switch {
	case ref.Orphan != "":
		var u golibvirt.UUID
		if u, err = parseUUID(d.aliases.keyOf(ref.Orphan)); err == nil {
			dom, err = api.DomainLookupByUUID(u)
		}
	default:
		dom, err = api.DomainLookupByName(ref.ExternalName)
		if u, perr := parseUUID(ref.ExternalName); isCode(err, golibvirt.ErrNoDomain) && perr == nil {
			dom, err = api.DomainLookupByUUID(u)
		}
	}
	if isCode(err, golibvirt.ErrNoDomain) || driver.IsTerminal(err) {
		return dom, domainInfo{}, driver.NotFoundf("no domain %s on node %s", ref, d.node)
	}
	if err != nil {
		return dom, domainInfo{}, errors.Wrap(err, "cannot look up domain")
	}
	x, err := api.DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive)
	if err != nil {
		return dom, domainInfo{}, errors.Wrap(err, "cannot read domain XML")
	}
	info, err := parseDomain(x)
	if err != nil {
		return dom, domainInfo{}, err
	}
	if ref.Orphan != "" && (info.owner == nil || !info.owner.Orphaned || info.owner.UID != ref.Orphan) {
		return dom, domainInfo{}, driver.NotFoundf("no orphan %s on node %s", ref.Orphan, d.node)
	}
	return dom, info, nil
}

// Claim implements driver.Adopter. An orphan adopted by the VM of the name
// it was released from is driven like one the VM made; any other domain
// (made outside virtfleet, or by a VM of another name) is imported: its
// power state and restarts are managed, its definition is never rewritten.
func (d *Driver) Claim(_ context.Context, m driver.Machine, ref driver.Ref) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	if err := d.aliases.load(d, api); err != nil {
		return err
	}
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	if _, _, err := d.lookup(api, m.UID, golibvirt.DomainXMLInactive); !driver.IsNotFound(err) {
		return err // nil: claimed before
	}
	dom, info, err := d.find(api, ref)
	if err != nil {
		return err
	}
	if o := info.owner; o != nil && !o.Orphaned {
		return driver.Terminalf("domain %s is already managed by VirtualMachine %s/%s (uid %s); a guest has one VirtualMachine", dom.Name, o.Namespace, o.Name, o.UID)
	}
	// The reset nonce the VM comes with counts as handled, as its restart
	// nonce does: taking a guest over never resets it. Recorded first: once
	// the owner is rewritten, a Claim again finds the guest claimed.
	if err := recordReset(api, dom, m.ResetNonce); err != nil {
		return err
	}
	adopt := info.owner != nil && info.owner.Namespace == m.Namespace && info.owner.Name == m.Name
	return d.rewriteOwner(api, dom, info, func(o *ownership) {
		o.Imported = o.Imported || !adopt
		o.UID, o.Namespace, o.Name, o.Generation, o.LastNonce, o.Orphaned, o.Seal = m.UID, m.Namespace, m.Name, m.Generation, m.RestartNonce, false, ""
	})
}

// ObserveRef implements driver.Adopter.
func (d *Driver) ObserveRef(_ context.Context, ref driver.Ref) (driver.Observation, error) {
	api, _, err := d.api()
	if err != nil {
		return driver.Observation{}, err
	}
	dom, _, err := d.find(api, ref)
	if err != nil {
		return driver.Observation{}, err
	}
	x, err := api.DomainGetXMLDesc(dom, 0)
	if err != nil {
		return driver.Observation{}, errors.Wrap(err, "cannot read domain XML")
	}
	live, err := parseDomain(x)
	if err != nil {
		return driver.Observation{}, err
	}
	key := formatUUID(dom.UUID)
	return d.observe(api, dom, key, live)
}

// Owner is who manages a domain, as its virtfleet metadata says.
type Owner struct {
	// UID is the VM managing the domain, or, when Orphaned, the VM it was
	// released from.
	UID, Namespace, Name string
	Orphaned             bool
}

// OwnerOf reads a domain's owner from its XML; ok is false for a domain
// virtfleet does not know. It lets tools outside the agent (the chaos
// check) tell a guest's VM without the agent.
func OwnerOf(domainXML string) (o Owner, ok bool, err error) {
	info, err := parseDomain(domainXML)
	if err != nil || info.owner == nil {
		return Owner{}, false, err
	}
	return Owner{UID: info.owner.UID, Namespace: info.owner.Namespace, Name: info.owner.Name, Orphaned: info.owner.Orphaned}, true, nil
}
