package nova

import (
	"context"
	"fmt"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// extendMicroversion is the first block storage microversion whose
// os-extend takes an attached (in-use) volume; Cinder then tells Nova,
// which has the hypervisor grow the disk under the running guest. The
// Debian bookworm Cinder the harness runs (Zed) serves up to 3.70.
const extendMicroversion = "3.42"

// growDisks extends the Cinder volumes of m's disks that hold less than
// asked (driver.Driver's Ensure), rounded up to whole GiB as a new
// volume's size is. It never shrinks a volume (Cinder cannot). It returns
// why a disk is not as big as asked yet, for the Observation's message.
func (d *Driver) growDisks(ctx context.Context, m driver.Machine) string {
	return d.grown.Grow(m, func(disk driver.Disk) string { return d.growDisk(ctx, disk) })
}

// growDisk extends disk's volume if it is smaller than asked, and says
// why it is not as big yet, or nothing once it is.
func (d *Driver) growDisk(ctx context.Context, disk driver.Disk) string {
	size := int((disk.SizeBytes + gib - 1) / gib)
	id, ready, err := d.volumeID(ctx, disk)
	switch {
	case err != nil:
		return fmt.Sprintf("cannot grow disk %s: %v", disk.Name, err)
	case !ready:
		return fmt.Sprintf("waiting for volume %s to be created", disk.Name)
	}
	v, err := volumes.Get(ctx, d.c.volume, id).Extract()
	switch {
	case err != nil:
		return fmt.Sprintf("cannot grow disk %s: %v", disk.Name, classify(err, "cannot read volume "+id))
	case v.Size >= size:
		return ""
	case v.Status == "extending":
		return fmt.Sprintf("volume %s of disk %s is growing to %d GiB", id, disk.Name, size)
	}
	c := *d.c.volume
	c.Microversion = extendMicroversion
	if err := volumes.ExtendSize(ctx, &c, id, volumes.ExtendSizeOpts{NewSize: size}).ExtractErr(); err != nil {
		return fmt.Sprintf("cannot grow disk %s to %d GiB: %v", disk.Name, size, classify(err, "cannot extend volume "+id))
	}
	// Cinder extends asynchronously: the next Ensure reads the new size.
	return fmt.Sprintf("volume %s of disk %s is growing to %d GiB", id, disk.Name, size)
}
