package libvirt

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// domains lists virtfleet's domains, released ones included, with their
// live definitions.
func (d *Driver) domains(api API) ([]golibvirt.Domain, []domainInfo, error) {
	return d.listDomains(api, true)
}

// listDomains lists the node's domains with their live definitions: with
// known, only those with virtfleet's metadata. The list is read afresh (a
// domain defined a moment ago is in it: the callers decide what is in use),
// the definitions come from d.definitions when it keeps them.
func (d *Driver) listDomains(api API, known bool) ([]golibvirt.Domain, []domainInfo, error) {
	generation := d.generationNow()
	seq, at := d.definitions.mark()
	all, _, err := api.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot list domains")
	}
	d.definitions.keepListing(generation, all, seq, at)
	return d.described(api, generation, all, known)
}

// described pairs each of doms with its live definition, skipping those
// gone since they were listed: with known, also those without virtfleet's
// metadata.
func (d *Driver) described(api API, generation int, all []golibvirt.Domain, known bool) ([]golibvirt.Domain, []domainInfo, error) {
	var doms []golibvirt.Domain
	var infos []domainInfo
	for _, dom := range all {
		info, err := d.definitions.read(api, generation, dom)
		if isCode(err, golibvirt.ErrNoDomain) {
			continue // deleted since the list
		}
		if err != nil {
			return nil, nil, err
		}
		if known && info.owner == nil {
			continue
		}
		doms = append(doms, dom)
		infos = append(infos, info)
	}
	return doms, infos, nil
}

// powerState is a domain's state and its reason, as DomainGetState says.
type powerState struct {
	state  golibvirt.DomainState
	reason int32
}

// scan lists virtfleet's domains, released ones included, with their live
// definitions and their states: the states of all domains in one call
// (ConnectGetAllDomainStats), the definitions from d.definitions. A daemon
// without that call leaves states nil, and each domain's is read on its
// own.
func (d *Driver) scan(api API, generation int) ([]golibvirt.Domain, []domainInfo, map[string]powerState, error) {
	seq, at := d.definitions.mark()
	recs, err := api.ConnectGetAllDomainStats(nil, uint32(golibvirt.DomainStatsState), 0)
	if isCode(err, golibvirt.ErrNoSupport) {
		doms, infos, err := d.domains(api)
		return doms, infos, nil, err
	}
	if err != nil {
		return nil, nil, nil, errors.Wrap(err, "cannot read the domains' states")
	}
	all := make([]golibvirt.Domain, 0, len(recs))
	states := make(map[string]powerState, len(recs))
	for _, r := range recs {
		all = append(all, r.Dom)
		states[formatUUID(r.Dom.UUID)] = stateOf(r.Params)
	}
	d.definitions.keepListing(generation, all, seq, at)
	doms, infos, err := d.described(api, generation, all, true)
	return doms, infos, states, err
}

// stateOf reads a domain's state and reason from its "state" statistics.
func stateOf(params []golibvirt.TypedParam) powerState {
	var s powerState
	for _, p := range params {
		v, ok := p.Value.I.(int32)
		if !ok {
			continue
		}
		switch p.Field {
		case "state.state":
			s.state = golibvirt.DomainState(v)
		case "state.reason":
			s.reason = v
		}
	}
	return s
}

// owned lists the domains virtfleet manages: not released ones, and only
// those of the uid their metadata names (made for it, or claimed by it).
func (d *Driver) owned(api API, generation int) ([]golibvirt.Domain, []domainInfo, map[string]powerState, error) {
	if err := d.aliases.load(d, api); err != nil {
		return nil, nil, nil, err
	}
	all, infos, states, err := d.scan(api, generation)
	if err != nil {
		return nil, nil, nil, err
	}
	doms, mine := all[:0], infos[:0]
	for i, dom := range all {
		if !d.owns(dom, infos[i], false) {
			continue
		}
		doms, mine = append(doms, dom), append(mine, infos[i])
	}
	return doms, mine, states, nil
}

// owns says whether dom is virtfleet's guest: made for or claimed by the
// uid its metadata names, or, with orphans, released from it.
func (d *Driver) owns(dom golibvirt.Domain, info domainInfo, orphans bool) bool {
	o := info.owner
	switch {
	case o == nil:
		return false
	case o.Orphaned:
		return orphans
	}
	return d.aliases.keyOf(o.UID) == formatUUID(dom.UUID)
}

// List implements driver.Driver. It costs one call for the states of all
// the node's domains, and one or two per network its guests are on;
// definitions are read only for domains that changed (d.definitions).
func (d *Driver) List(_ context.Context) ([]driver.Observation, error) {
	api, conn, err := d.api()
	if err != nil {
		return nil, err
	}
	doms, infos, states, err := d.owned(api, conn.generation)
	if err != nil {
		return nil, err
	}
	return d.observeAll(api, conn.generation, doms, infos, states)
}

// observeAll observes each domain as its owner's guest, skipping those
// gone since they were listed; an orphan gets OrphanOf. states are the
// domains' states by UUID, read with the listing; a domain without one has
// its own read. The networks are read once for all of them.
func (d *Driver) observeAll(api API, generation int, doms []golibvirt.Domain, infos []domainInfo, states map[string]powerState) ([]driver.Observation, error) {
	out := make([]driver.Observation, 0, len(doms))
	nets := newNetworkView(api)
	for i, dom := range doms {
		owner := infos[i].owner
		look := d.look(api, generation, nets)
		if s, ok := states[formatUUID(dom.UUID)]; ok {
			look.state = &s
		}
		o, err := d.observeWith(look, dom, owner.UID, infos[i])
		if isCode(err, golibvirt.ErrNoDomain) || driver.IsNotFound(err) {
			continue // gone since the list, or moved to another node
		}
		if err != nil {
			return nil, err
		}
		if owner.Orphaned {
			o.OrphanOf = &driver.VMRef{Namespace: owner.Namespace, Name: owner.Name, Seal: owner.Seal}
		}
		out = append(out, o)
	}
	return out, nil
}
