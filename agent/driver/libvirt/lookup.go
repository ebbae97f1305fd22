package libvirt

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// lookup finds the guest's domain and reads its definition. It returns a
// NotFound error when there is no domain with the uid, or when the domain
// with the uid was released or now belongs to another VM (a *NotOursError),
// and a Terminal one when a domain with the uid is not virtfleet's.
func (d *Driver) lookup(api API, uid string, flags golibvirt.DomainXMLFlags) (golibvirt.Domain, domainInfo, error) {
	dom, err := d.domainOf(api, uid)
	if err != nil {
		return dom, domainInfo{}, err
	}
	info, err := d.describe(api, dom, uid, flags)
	return dom, info, err
}

// domainOf is lookup's first half: the domain of the guest uid, without its
// definition.
func (d *Driver) domainOf(api API, uid string) (golibvirt.Domain, error) {
	if err := d.aliases.load(d, api); err != nil {
		return golibvirt.Domain{}, err
	}
	if _, err := parseUUID(uid); err != nil {
		return golibvirt.Domain{}, err
	}
	key := d.aliases.keyOf(uid)
	u, err := parseUUID(key)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	dom, err := api.DomainLookupByUUID(u)
	if isCode(err, golibvirt.ErrNoDomain) && key != uid {
		// The domain uid adopted is gone (undefined behind the agent's
		// back, or a daemon that lost its state): uid has none but its own.
		d.aliases.drop(uid)
		if u, err = parseUUID(uid); err != nil {
			return golibvirt.Domain{}, err
		}
		dom, err = api.DomainLookupByUUID(u)
	}
	if isCode(err, golibvirt.ErrNoDomain) {
		return dom, driver.NotFoundf("no domain with uuid %s", uid)
	}
	return dom, errors.Wrap(err, "cannot look up domain")
}

// describe is lookup's second half: dom's definition (the running one, or
// the next with DomainXMLInactive), checked to be the guest uid's.
func (d *Driver) describe(api API, dom golibvirt.Domain, uid string, flags golibvirt.DomainXMLFlags) (domainInfo, error) {
	info, _, err := d.describeXML(api, dom, uid, flags)
	return info, err
}

// describeXML is describe, with the XML it read.
func (d *Driver) describeXML(api API, dom golibvirt.Domain, uid string, flags golibvirt.DomainXMLFlags) (domainInfo, string, error) {
	x, err := api.DomainGetXMLDesc(dom, flags)
	if isCode(err, golibvirt.ErrNoDomain) {
		return domainInfo{}, "", driver.NotFoundf("no domain with uuid %s", uid)
	}
	if err != nil {
		return domainInfo{}, "", errors.Wrap(err, "cannot read domain XML")
	}
	info, err := parseDomain(x)
	if err != nil {
		return domainInfo{}, "", err
	}
	if err := ownedBy(dom, uid, info); err != nil {
		return domainInfo{}, "", err
	}
	return info, x, nil
}

// ownedBy checks that info, a definition of dom, is the guest uid's.
func ownedBy(dom golibvirt.Domain, uid string, info domainInfo) error {
	switch o := info.owner; {
	case o == nil:
		return driver.Terminalf("domain %s with uuid %s exists on the node but is not managed by virtfleet", dom.Name, uid)
	case o.UID != uid:
		return driver.NotFound(&NotOursError{UID: uid, Domain: dom.Name, Why: "is managed by VirtualMachine " + o.Namespace + "/" + o.Name + " now"})
	case o.Orphaned:
		return driver.NotFound(&NotOursError{UID: uid, Domain: dom.Name, Why: "was released and is orphaned"})
	}
	return nil
}
