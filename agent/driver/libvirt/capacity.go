package libvirt

import (
	"context"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Capacity implements driver.Driver. It counts virtfleet's guests, orphans
// included: a released guest still holds its share of the host. It reads
// the list of domains and their definitions through d.definitions, so a
// heartbeat on a node where nothing changed makes no call at all.
func (d *Driver) Capacity(_ context.Context) (driver.Capacity, error) {
	api, conn, err := d.api()
	if err != nil {
		return driver.Capacity{}, err
	}
	if err := d.aliases.load(d, api); err != nil {
		return driver.Capacity{}, err
	}
	all, err := d.definitions.domains(api, conn.generation)
	if err != nil {
		return driver.Capacity{}, err
	}
	c := driver.Capacity{VCPU: conn.hostCPUs, MemoryBytes: conn.hostMemory, Hypervisor: conn.domainType}
	for _, dom := range all {
		info, err := d.definitions.read(api, conn.generation, dom)
		switch {
		case isCode(err, golibvirt.ErrNoDomain):
			continue // deleted since the list
		case err != nil:
			return driver.Capacity{}, err
		case !d.owns(dom, info, true):
			continue
		}
		c.AllocatedVCPU += info.vcpu
		c.AllocatedMemoryBytes += info.memory
	}
	return c, nil
}
