package reconciler

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
)

// Backups. A BackupIntent is its own queue item, as a snapshot's is, and
// holds its guest's lock (guestLocks) while the driver reads the guest's
// disks, so nothing else acts on the guest meanwhile: a stop or a move
// asked for during a backup waits for it to end. A backup is taken once
// per intent: whatever ends it, Succeeded or Failed, is final, and a
// Running report this process did not write is a backup an earlier agent
// was taking when it stopped, which is Failed, never shown complete. The
// driver's checkpoints make that safe: the hub names, in the next intent's
// Since, only a backup that Succeeded, and the driver forgets a checkpoint
// only when a later backup is committed here.

// backupIntent records a BackupIntent and queues it.
func (r *Reconciler) backupIntent(ev bus.Event[wire.BackupIntent]) {
	record(r, r.backups, kindBackup, ev)
}

// reconcileBackup takes the backup of a present intent once and reports
// it; once the hub deletes the intent, the report goes too.
func (r *Reconciler) reconcileBackup(ctx context.Context, uid string) (time.Duration, error) {
	r.mu.Lock()
	in, wanted := r.backups[uid]
	vm, known := r.intents[in.VM]
	synced := r.synced
	r.mu.Unlock()
	switch {
	case !synced && (!wanted || !known):
		return 0, nil
	case !wanted:
		return 0, r.backupReports.delete(ctx, uid)
	}
	prev, stored, err := r.backupReports.lastOrStored(ctx, uid)
	switch {
	case err != nil:
		return 0, err
	case prev.Final():
		return 0, nil
	case stored && prev.Phase == wire.BackupPhaseRunning:
		return 0, r.backupFailed(ctx, in, prev, fmt.Errorf("the agent of node %s stopped while it took the backup; nothing of it is kept", r.node))
	}
	b, err := r.backuper()
	if err != nil {
		return 0, r.backupFailed(ctx, in, prev, err)
	}
	if !known {
		return 0, r.backupFailed(ctx, in, prev, r.notHere(in.VM))
	}
	if vm.Migration != nil || vm.Incoming != nil {
		return 0, r.backupFailed(ctx, in, prev, fmt.Errorf("guest %s is moving between nodes; take the backup once it is on one", in.VM))
	}
	unlock, ok := r.guestLocks.tryLock(in.VM)
	if !ok {
		return r.opts.PollTransitional, nil
	}
	defer unlock()
	return 0, r.takeBackup(ctx, in, b)
}

// takeBackup copies guest in.VM's disks to in.Location: the changes since
// in.Since where the store still has that backup and the driver its
// checkpoint, every disk whole otherwise. The backup exists once its
// manifest is in the store; only then is its checkpoint committed.
func (r *Reconciler) takeBackup(ctx context.Context, in wire.BackupIntent, b driver.Backuper) error {
	start := r.opts.Now().UTC()
	rep := backupIn(in, wire.BackupPhaseRunning, "")
	rep.StartedAt = &start
	if err := r.backupReport(ctx, rep); err != nil {
		return err
	}
	// since is the parent the store still has: the driver reads the
	// changes since it, or the disks whole when there is none.
	w, since, err := r.backupWriter(ctx, in)
	if err != nil {
		return r.backupFailed(ctx, in, rep, err)
	}
	progress := r.reportProgress(ctx, rep, w)
	res, err := DriverCall(r.metrics, OpBackUp, func() (driver.BackupResult, error) {
		return b.BackUp(ctx, in.VM, driver.BackupRequest{ID: in.UID, Since: since}, w)
	})
	progress()
	if err != nil {
		w.Abort()
		if driver.IsNotFound(err) {
			err = r.notHere(in.VM)
		}
		return r.backupFailed(ctx, in, rep, errors.Wrap(err, "cannot read the guest's disks"))
	}
	if res.Full {
		w.MarkFull()
	}
	m, err := w.Commit(ctx)
	if err != nil {
		return r.backupFailed(ctx, in, rep, errors.Wrap(err, "cannot write the backup to its location"))
	}
	if err := r.call(OpCommitBackup, func() error { return b.CommitBackup(ctx, in.VM, in.UID) }); err != nil {
		// The backup is whole in the store; the driver keeps older
		// checkpoints too, which costs the next backup nothing but their
		// bitmaps, and the next commit forgets them.
		r.log.Info("Cannot forget the checkpoints before a backup", "backup", in.UID, "error", err)
	}
	done := backupIn(in, wire.BackupPhaseSucceeded, "")
	done.StartedAt, done.FinishedAt = &start, ptrTo(r.opts.Now().UTC())
	done.Full, done.Parent, done.Frozen = m.Full, m.Parent, res.Frozen
	withBackupFigures(&done, w.Stats())
	if res.BytesRead > 0 {
		done.BytesRead = res.BytesRead
	}
	for _, d := range m.Disks {
		done.DiskBytes += d.Size
	}
	return r.backupReport(ctx, done)
}

// backupWriter opens in's location and starts the backup there, on the
// backup in.Since names where the store still has it, and returns that
// parent's ID; empty when the backup is full.
func (r *Reconciler) backupWriter(ctx context.Context, in wire.BackupIntent) (*backupstore.Writer, string, error) {
	store, err := backupstore.Open(ctx, backupstore.LocationOf(in.Location))
	if err != nil {
		return nil, "", err
	}
	var parent *backupstore.Manifest
	if in.Since != "" {
		m, err := store.Manifest(ctx, in.Namespace, in.Since)
		switch {
		case errors.Is(err, backupstore.ErrNotFound):
			// Deleted: nothing to build on, so the backup is full.
		case err != nil:
			return nil, "", err
		default:
			parent = &m
		}
	}
	header := backupstore.Manifest{ID: in.UID, Namespace: in.Namespace, VMName: in.VMName, VMUID: in.VM, Spec: in.Spec}
	w, err := store.NewWriter(ctx, header, parent)
	if parent != nil && (errors.Is(err, backupstore.ErrWrongKey) || errors.Is(err, backupstore.ErrNotFound)) {
		// The parent was written under another key, or deleted since it
		// was read: the backup is full.
		parent = nil
		w, err = store.NewWriter(ctx, header, nil)
	}
	if err != nil {
		return nil, "", err
	}
	if parent == nil {
		return w, "", nil
	}
	return w, parent.ID, nil
}

// reportProgress reports rep with w's figures every BackupProgress until
// the returned stop is called, which returns once no report is being
// written.
func (r *Reconciler) reportProgress(ctx context.Context, rep wire.BackupReport, w *backupstore.Writer) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.opts.BackupProgress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				withBackupFigures(&rep, w.Stats())
				if err := r.backupReport(ctx, rep); err != nil {
					r.log.Debug("Cannot report a backup's progress", "backup", rep.UID, "error", err)
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func withBackupFigures(rep *wire.BackupReport, s backupstore.Stats) {
	rep.BytesRead, rep.BytesWritten = s.BytesRead, s.BytesWritten
	rep.ChunksWritten, rep.ChunksReused = s.ChunksWritten, s.ChunksReused
}

// backupFailed reports the backup Failed with err's message, keeping what
// rep said of its start.
func (r *Reconciler) backupFailed(ctx context.Context, in wire.BackupIntent, rep wire.BackupReport, err error) error {
	failed := backupIn(in, wire.BackupPhaseFailed, err.Error())
	failed.StartedAt, failed.FinishedAt = rep.StartedAt, ptrTo(r.opts.Now().UTC())
	return r.backupReport(ctx, failed)
}

// backuper is the driver's Backuper, or a Terminal error for the user
// saying the node's backend takes no backups.
func (r *Reconciler) backuper() (driver.Backuper, error) {
	if b, ok := r.driver.(driver.Backuper); ok {
		return b, nil
	}
	return nil, driver.Terminalf("the %s of node %s takes no backups", r.backendName(), r.node)
}

// backendName names the node's backend in messages.
func (r *Reconciler) backendName() string {
	if r.opts.Backend != "" {
		return r.opts.Backend + " backend"
	}
	return "backend"
}

// backupReport writes rep unless it says what the last one written said.
func (r *Reconciler) backupReport(ctx context.Context, rep wire.BackupReport) error {
	rep.Node = r.node
	rep.ObservedAt = r.opts.Now().UTC()
	return r.backupReports.put(ctx, rep.UID, rep)
}

// backupIn is the report of in in phase p, saying msg.
func backupIn(in wire.BackupIntent, p wire.BackupPhase, msg string) wire.BackupReport {
	return wire.BackupReport{UID: in.UID, VM: in.VM, Phase: p, Message: msg}
}

func ptrTo[T any](v T) *T { return &v }
