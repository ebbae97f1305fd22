package driver

import (
	"context"
	"time"
)

// Snapshotter is implemented by a Driver that keeps snapshots of its
// guests on the node: every disk of the guest at one moment, and with it,
// where asked and the backend can, the running guest's memory and device
// state. A snapshot is named by an ID unique on the node (the
// VirtualMachineSnapshot's uid) and belongs to one guest.
//
// Every method is idempotent and keyed by the guest's uid and the
// snapshot's ID. Unlike Ensure, TakeSnapshot and RevertSnapshot wait until
// the backend is done: a snapshot is one short act of the hypervisor, not
// a transition the guest makes on its own.
//
// Errors: IsNotFound(err) means the guest is not on the node; IsTerminal
// means the request cannot succeed as given (a disk the backend cannot
// snapshot, memory asked of a backend that cannot keep it, a snapshot that
// is not the guest's); any other error is transient. No error ever leaves
// a half-taken snapshot behind, and no error leaves the guest other than it
// was: a guest that ran runs.
type Snapshotter interface {
	// TakeSnapshot takes snapshot r.ID of guest uid and returns it. A
	// snapshot with that ID the guest has already is returned as it is,
	// never taken again.
	//
	// A running guest is snapshotted online. With r.Memory its memory is
	// kept with its disks, so a revert resumes it where it was. Without,
	// only its disks are: the guest's filesystems are frozen through its
	// guest agent for the moment the disks are taken and thawed after
	// (Snapshot.Frozen), and where the guest has no agent that answers the
	// disks are crash-consistent. A stopped guest's snapshot is of its
	// disks alone, whatever r.Memory says.
	//
	// On a backend whose snapshots cannot stand beside backup checkpoints
	// (libvirt: QEMU reverts no snapshot of a disk with dirty bitmaps), the
	// guest's checkpoints are forgotten first, as a CommitBackup of a
	// backup it does not have forgets them, and its next backup is full
	// (also when the snapshot then fails). Where they cannot be forgotten (libvirt deletes checkpoints of
	// running guests only), the snapshot is refused as Terminal, saying
	// what would let it be taken.
	TakeSnapshot(ctx context.Context, uid string, r SnapshotRequest) (Snapshot, error)

	// Snapshots lists the snapshots of guest uid that this driver took,
	// oldest first; none (and no error) for a guest that is not on the
	// node.
	Snapshots(ctx context.Context, uid string) ([]Snapshot, error)

	// DeleteSnapshot deletes snapshot id of guest uid; the guest itself
	// is not touched. Deleting an absent snapshot, or one of a guest that
	// is gone, succeeds.
	DeleteSnapshot(ctx context.Context, uid, id string) error

	// RevertSnapshot brings guest uid back to its snapshot r.Snapshot: the
	// guest is stopped and its disks return to the snapshot's. A snapshot
	// with memory, reverted with r.Running set, leaves the guest running
	// from the snapshot's moment (the same boot, its processes where they
	// were); any other revert leaves it stopped, for the next Ensure to
	// start as Machine.Running says. What the driver recorded of the guest
	// since (restart and reset nonces handled, who owns it) is kept, so a
	// revert never replays an act. A snapshot the guest does not have is
	// a Terminal error.
	//
	// A revert named by r.Restore is made once: the driver records the
	// last restore it made on the guest, and a call naming it again
	// succeeds without reverting, so an agent that restarts between the
	// revert and its report never throws away what the guest did since.
	RevertSnapshot(ctx context.Context, uid string, r RevertRequest) error
}

// SnapshotRequest is a snapshot to take.
type SnapshotRequest struct {
	// ID names the snapshot on the node.
	ID string
	// Memory asks for the running guest's memory with its disks.
	Memory bool
}

// RevertRequest is a revert to make.
type RevertRequest struct {
	// Snapshot is the ID of the snapshot to go back to.
	Snapshot string
	// Restore names the revert (the VirtualMachineRestore's uid); empty
	// reverts at every call.
	Restore string
	// Running asks that a snapshot with memory be resumed.
	Running bool
}

// Snapshot is one snapshot of a guest, as the driver sees it.
type Snapshot struct {
	ID string
	// CreatedAt is the moment the snapshot holds.
	CreatedAt time.Time
	// Duration is how long taking it took, where the driver took it in
	// this process; zero for one found on the node.
	Duration time.Duration
	// SizeBytes is what the snapshot holds on the node as far as the
	// backend tells: its memory image at least; 0 where it does not tell.
	SizeBytes int64
	// Online: the guest ran when it was taken. Memory: it holds the
	// guest's memory. Frozen: the guest agent froze the guest's
	// filesystems for it.
	Online, Memory, Frozen bool
}
