package libvirt

import (
	"cmp"
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// growDisks grows each disk of m whose volume holds less than its
// SizeBytes (driver.Driver's Ensure): the volume itself while the domain is
// off, else through the domain, which has QEMU grow the disk under the
// running guest; resizing the file of a disk a QEMU has open would leave
// QEMU and the guest at the old size. It never shrinks a volume. It
// returns why a disk could not be grown, for the Observation's message.
func (d *Driver) growDisks(api API, dom golibvirt.Domain, m driver.Machine) string {
	g := grower{api: api, dom: dom, pool: d.pool}
	return d.grown.Grow(m, func(disk driver.Disk) string {
		if err := g.grow(disk); err != nil {
			return fmt.Sprintf("cannot grow disk %s to %d bytes: %v", disk.Name, disk.SizeBytes, err)
		}
		return ""
	})
}

// grower grows the volumes of one domain's disks; it reads the domain's
// state once, and only when a volume must grow.
type grower struct {
	api    API
	dom    golibvirt.Domain
	pool   string
	active *bool
}

func (g *grower) grow(disk driver.Disk) error {
	pool := cmp.Or(disk.Pool, g.pool)
	p, err := g.api.StoragePoolLookupByName(pool)
	if err != nil {
		return errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	v, err := g.api.StorageVolLookupByName(p, disk.Name)
	if err != nil {
		return errors.Wrapf(err, "cannot look up volume %s", disk.Name)
	}
	_, capacity, _, err := g.api.StorageVolGetInfo(v)
	if err != nil {
		return errors.Wrapf(err, "cannot read volume %s", disk.Name)
	}
	size := uint64(disk.SizeBytes)
	if capacity >= size {
		return nil
	}
	_, _, _, available, err := g.api.StoragePoolGetInfo(p)
	if err != nil {
		return errors.Wrapf(err, "cannot read storage pool %s", pool)
	}
	if size-capacity > available {
		return errors.Errorf("storage pool %s has %d bytes free, the disk needs %d more", pool, available, size-capacity)
	}
	on, err := g.domainActive()
	if err != nil {
		return err
	}
	if !on {
		return errors.Wrap(g.api.StorageVolResize(v, size, 0), "cannot resize the volume")
	}
	path, err := g.api.StorageVolGetPath(v)
	if err != nil {
		return errors.Wrapf(err, "cannot read the path of volume %s", disk.Name)
	}
	return errors.Wrap(g.api.DomainBlockResize(g.dom, path, size, golibvirt.DomainBlockResizeBytes), "cannot resize the running guest's disk")
}

// domainActive is whether a QEMU has the domain's disks open: running,
// paused or on its way.
func (g *grower) domainActive() (bool, error) {
	if g.active == nil {
		state, _, err := g.api.DomainGetState(g.dom, 0)
		if err != nil {
			return false, errors.Wrap(err, "cannot read domain state")
		}
		on := active(golibvirt.DomainState(state))
		g.active = &on
	}
	return *g.active, nil
}
