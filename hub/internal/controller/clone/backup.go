package clone

import (
	"context"
	"fmt"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// throughBackup makes the new VM's disks of src's from a full backup of
// src into the clone's spec.backupLocation, which the clone takes first:
// any node makes a disk of a backup, so the new VM is placed as any VM is,
// its disks on that node's own storage. It returns the clone's status and
// its start's event message.
func (r *Reconciler) throughBackup(ctx context.Context, c *v1alpha1.VirtualMachineClone, src *source) (v1alpha1.VirtualMachineCloneStatus, string, error) {
	st := c.Status
	if src.Snapshot != nil {
		// The API refuses it; a snapshot lives in its VM's disks.
		return st, "", refuse("a clone of VirtualMachineSnapshot %s cannot go through a backup: the snapshot lives in its VM's disks, which no backup reads", src.Snapshot.Name)
	}
	disks, err := diskNames(c, src)
	if err != nil {
		return st, "", err
	}
	b, err := r.backUp(ctx, c, src)
	if err != nil {
		return st, "", err
	}
	format := v1alpha1.DiskFormatRaw // what a disk of a backup is
	for i, d := range disks {
		img := v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{
			Location: b.Spec.Location, ID: string(b.UID),
			Disk: v1alpha1.BackupDiskName(i, src.VM.Spec.ForProvider.DiskAttachments[i].Name),
		}}
		if err := r.makeDisk(ctx, c, d, src.Volumes[i], img, &format); err != nil {
			return st, "", err
		}
	}
	st.Backup, st.Disks = b.Name, disks
	st.Message = fmt.Sprintf("the disks of %s are made of VirtualMachineBackup %s on the node the new VM is placed on", src, b.Name)
	return st, fmt.Sprintf("Cloning %s into VM %s through VirtualMachineBackup %s in BackupLocation %s", src, c.Spec.Target.Name, b.Name, b.Spec.Location), nil
}

// backUp returns the clone's full backup of src once it succeeded, taking
// it first; the clone waits while it is taken and fails with it.
func (r *Reconciler) backUp(ctx context.Context, c *v1alpha1.VirtualMachineClone, src *source) (*v1alpha1.VirtualMachineBackup, error) {
	b := &v1alpha1.VirtualMachineBackup{ObjectMeta: objectMeta(c, c.Name)}
	b.Spec = v1alpha1.VirtualMachineBackupSpec{VMName: v1alpha1.LocalName(src.VM.Name), Location: c.Spec.BackupLocation, Full: true}
	if err := r.create(ctx, c, b); err != nil {
		return nil, err
	}
	switch {
	case b.Status.Phase == v1alpha1.BackupFailed:
		return nil, refuse("VirtualMachineBackup %s of %s, which the clone copies the disks through, failed: %s", b.Name, src, b.Status.Message)
	case b.Status.Phase != v1alpha1.BackupSucceeded:
		return nil, wait("VirtualMachineBackup %s backs %s up to BackupLocation %s for the clone (it is %s)", b.Name, src, b.Spec.Location, orNone(string(b.Status.Phase)))
	case b.Status.SourceUID != string(src.VM.UID):
		// Its VM of that name was made again since.
		return nil, refuse("VirtualMachineBackup %s is of another VirtualMachine than %s", b.Name, src)
	}
	return b, nil
}
