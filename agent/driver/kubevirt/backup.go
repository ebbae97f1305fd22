package kubevirt

import (
	"context"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.Backuper = (*Driver)(nil)

// BackUp implements driver.Backuper by refusing, saying why: kubevirt.io/api
// v1.7.0, the KubeVirt API virtfleet speaks, has changed-block tracking on
// a VM's status but no kind that reads a VM's disks out (KubeVirt's own
// VirtualMachineBackup came in a later release), and the agent has no
// other way to a PVC's bytes in the target cluster. A guest that is not
// there is NotFound, as the contract asks, before the refusal.
func (d *Driver) BackUp(ctx context.Context, uid string, _ driver.BackupRequest, _ driver.BackupWriter) (driver.BackupResult, error) {
	c, err := d.client()
	if err != nil {
		return driver.BackupResult{}, err
	}
	if _, _, err := d.get(ctx, c, uid); err != nil {
		return driver.BackupResult{}, err
	}
	return driver.BackupResult{}, driver.Terminalf("the kubevirt backend takes no backups: kubevirt.io/api v1.7.0, which virtfleet speaks to KubeVirt, has no backup kind to read a VM's disks with; back it up with the target cluster's own tools, or snapshot it (VirtualMachineSnapshot)")
}

// CommitBackup implements driver.Backuper: a guest that was never backed
// up has no checkpoint to forget.
func (d *Driver) CommitBackup(context.Context, string, string) error { return nil }
