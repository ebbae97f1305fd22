package driver

import "context"

// Backuper is implemented by a Driver that can copy its guests' disks off
// the node for a backup. The store the copy goes to is not the driver's
// concern: the driver hands a disk's ranges to a BackupWriter. A backup is
// restored through an image made from one of its disks (Image.Backup),
// which a new guest's disk is made from as from any image.
//
// Changed-block tracking is the driver's: each backup leaves a checkpoint
// of the guest named by the backup's ID (for libvirt, a domain checkpoint
// over QEMU's persistent dirty bitmaps), and the next backup that names it
// in BackupRequest.Since reads only what was written after it. A
// checkpoint is forgotten only through CommitBackup, which the caller
// makes once a later backup is safe in the store, so a backup that fails
// or is cut short (the agent killed half-way) never loses a change: the
// next one, since the last committed checkpoint, reads it again. On a
// backend whose snapshots cannot stand beside checkpoints (libvirt), a
// snapshot forgets them too (see Snapshotter.TakeSnapshot), and the next
// backup is full.
//
// Errors: IsNotFound(err) means the guest is not on the node; IsTerminal
// means the request cannot succeed as given (a disk the backend cannot
// read, a backend without backups); any other error is transient. No error
// leaves the guest other than it was: a guest that ran runs.
type Backuper interface {
	// BackUp reads guest uid's disks as they are at one moment — a running
	// guest online, its filesystems frozen through its guest agent for
	// that moment where one answers — and hands each disk to w: Disk
	// first, then its ranges in increasing offset order. It makes a
	// checkpoint r.ID at that moment.
	//
	// With r.Since naming a checkpoint the guest still has, only the
	// ranges written since it are handed (Data for what they hold now,
	// Zero for what now reads as zeros), and BackupResult.Full is false.
	// Otherwise — no Since, or a checkpoint the guest no longer has — every
	// range that may hold data is handed, ranges not handed read as zeros,
	// and Full is true.
	//
	// When BackUp returns an error the checkpoint r.ID is removed again,
	// where the driver still can.
	//
	// On a backend whose snapshots cannot stand beside checkpoints, a
	// guest with snapshots is refused as Terminal: its snapshots are to be
	// deleted first.
	BackUp(ctx context.Context, uid string, r BackupRequest, w BackupWriter) (BackupResult, error)

	// CommitBackup says that backup id of guest uid is safe in the store:
	// the driver forgets every other checkpoint of the guest, so the next
	// backup that names id in Since reads only what was written after it.
	// Committing a checkpoint the guest does not have succeeds and forgets
	// the others all the same: the next backup is then full.
	CommitBackup(ctx context.Context, uid, id string) error
}

// BackupRequest is a backup to take.
type BackupRequest struct {
	// ID names the backup, and the checkpoint it leaves, on the node.
	ID string
	// Since names the checkpoint of the last backup that is safe in the
	// store; empty asks for a full backup.
	Since string
}

// BackupResult is what a BackUp read.
type BackupResult struct {
	// Full: every disk was handed whole, not only what changed since
	// BackupRequest.Since.
	Full bool
	// Frozen: the guest agent froze the guest's filesystems for the
	// moment the disks were read.
	Frozen bool
	// BytesRead is what the driver read of the disks.
	BytesRead int64
}

// BackupDisk names one disk of a guest in a backup.
type BackupDisk struct {
	// Name is the disk's role in the guest, stable across nodes: "root"
	// for the disk the guest boots from, a Volume's name for an attached
	// volume.
	Name string
	// Size is the disk's size in bytes as the guest sees it.
	Size int64
}

// BackupWriter receives a backup's disks. It is called from one goroutine;
// p is the caller's until the call returns.
type BackupWriter interface {
	// Disk starts a disk; the ranges that follow are its own.
	Disk(d BackupDisk) error
	// Data says that the disk holds p at offset off.
	Data(off int64, p []byte) error
	// Zero says that the disk reads as zeros over [off, off+length).
	Zero(off, length int64) error
}

// DiskSource is one disk of a backup as the store gives it back
// (backupstore.Source): the disk whole, as it was at the backup's moment,
// however little of it that backup's BackUp handed.
type DiskSource interface {
	// Disk names the disk and gives its size.
	Disk() BackupDisk
	// Extents calls fn for each range of the disk that holds data, in
	// increasing offset order; what no call covers reads as zeros. p is
	// the source's, valid only during the call.
	Extents(ctx context.Context, fn func(off int64, p []byte) error) error
}
