package reconciler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Snapshots. A SnapshotIntent is its own queue item, keyed by the
// snapshot's uid, while the driver's work is on its guest: the queue keeps
// one item to one worker, but a guest and its snapshots are different
// items, so two workers could act on one guest at once (a take while
// Ensure starts the guest, two takes of one guest). guestLocks serializes
// them. A guest's reconcile waits for the lock: at most one worker does
// per guest (the queue's promise), for at most the one driver act in
// flight. A snapshot's reconcile does not wait: it comes back after
// PollTransitional, so a burst of snapshots of one guest never holds
// every worker of the node behind that guest.

// snapshotIntent records a SnapshotIntent and queues it.
func (r *Reconciler) snapshotIntent(ev bus.Event[wire.SnapshotIntent]) {
	record(r, r.snapshots, kindSnapshot, ev)
}

// reconcileSnapshot makes one SnapshotIntent true: a present one is taken
// once (takeSnapshot), an absent one deleted and reported Gone; once the
// hub deletes the intent, the report goes too.
func (r *Reconciler) reconcileSnapshot(ctx context.Context, uid string) (time.Duration, error) {
	r.mu.Lock()
	in, wanted := r.snapshots[uid]
	vm, known := r.intents[in.VM]
	synced := r.synced
	if !wanted {
		delete(r.snapshotsFailed, uid)
	}
	r.mu.Unlock()
	switch {
	case !synced && (!wanted || !known):
		// The intent, or its guest's, may just not have arrived yet.
		return 0, nil
	case !wanted:
		return 0, r.snapshotReports.delete(ctx, uid)
	}
	unlock, ok := r.guestLocks.tryLock(in.VM)
	if !ok {
		return r.opts.PollTransitional, nil
	}
	defer unlock()
	if in.Absent {
		return 0, r.deleteSnapshot(ctx, in)
	}
	return r.takeSnapshot(ctx, in, vm, known)
}

// takeSnapshot takes the snapshot of a present intent once and reports it.
// A snapshot the node has is reported Ready, however it came to be there; one
// reported Ready or Gone before and not there any more is Gone, never taken
// again: it would hold another moment under the same name. A failure the
// driver calls terminal, or a guest that is not here, is reported Failed
// once and not tried again for the same intent; any other is retried with
// backoff, shown on the Taking report.
func (r *Reconciler) takeSnapshot(ctx context.Context, in wire.SnapshotIntent, vm wire.Intent, known bool) (time.Duration, error) {
	prev, err := r.snapshotBefore(ctx, in)
	if err != nil {
		return 0, err
	}
	if r.failedSnapshot(in) {
		return 0, nil
	}
	s, err := r.snapshotter()
	if err != nil {
		return 0, r.snapshotFailed(ctx, in, err)
	}
	taken := prev.Phase == wire.SnapshotPhaseReady || prev.Phase == wire.SnapshotPhaseGone
	if !known {
		if taken {
			return 0, r.snapshotReport(ctx, snapshotIn(in, wire.SnapshotPhaseGone, fmt.Sprintf("guest %s is no longer on node %s", in.VM, r.node)))
		}
		return 0, r.snapshotFailed(ctx, in, r.notHere(in.VM))
	}
	if !taken && (vm.Migration != nil || vm.Incoming != nil) {
		// A snapshot taken as the guest moves may hold a guest that is
		// about to be gone from here, or not here yet.
		return r.opts.PollTransitional, r.snapshotReport(ctx, snapshotIn(in, wire.SnapshotPhaseTaking, "waits for the migration"))
	}
	list, err := DriverCall(r.metrics, OpSnapshots, func() ([]driver.Snapshot, error) { return s.Snapshots(ctx, in.VM) })
	if err != nil {
		return 0, errors.Wrapf(err, "cannot list the snapshots of guest %s", in.VM)
	}
	if i := slices.IndexFunc(list, func(s driver.Snapshot) bool { return s.ID == in.UID }); i >= 0 {
		return 0, r.snapshotReport(ctx, snapshotReady(in, list[i], prev))
	}
	if taken {
		return 0, r.snapshotReport(ctx, snapshotIn(in, wire.SnapshotPhaseGone, fmt.Sprintf("the snapshot is no longer on node %s", r.node)))
	}
	if err := r.snapshotReport(ctx, snapshotIn(in, wire.SnapshotPhaseTaking, "")); err != nil {
		return 0, err
	}
	snap, err := DriverCall(r.metrics, OpTakeSnapshot, func() (driver.Snapshot, error) {
		return s.TakeSnapshot(ctx, in.VM, driver.SnapshotRequest{ID: in.UID, Memory: in.Memory})
	})
	switch {
	case driver.IsNotFound(err):
		return 0, r.snapshotFailed(ctx, in, r.notHere(in.VM))
	case driver.IsTerminal(err):
		return 0, r.snapshotFailed(ctx, in, err)
	case err != nil:
		if rerr := r.snapshotReport(ctx, snapshotIn(in, wire.SnapshotPhaseTaking, err.Error())); rerr != nil {
			return 0, rerr
		}
		return 0, errors.Wrapf(err, "cannot take snapshot %s", in.UID)
	}
	return 0, r.snapshotReport(ctx, snapshotReady(in, snap, prev))
}

// deleteSnapshot deletes the snapshot of an absent intent and reports it
// Gone; a node whose backend keeps none has none. A failure is shown on
// the report as it was, and retried unless terminal.
func (r *Reconciler) deleteSnapshot(ctx context.Context, in wire.SnapshotIntent) error {
	var err error
	if s, nosnap := r.snapshotter(); nosnap == nil {
		err = r.call(OpDeleteSnapshot, func() error { return s.DeleteSnapshot(ctx, in.VM, in.UID) })
	}
	if err == nil {
		return r.snapshotReport(ctx, snapshotIn(in, wire.SnapshotPhaseGone, ""))
	}
	rep, ok := r.snapshotReports.last(in.UID)
	if !ok {
		rep = snapshotIn(in, wire.SnapshotPhaseReady, "")
	}
	rep.Message = err.Error()
	if rerr := r.snapshotReport(ctx, rep); rerr != nil {
		return rerr
	}
	if driver.IsTerminal(err) {
		return nil
	}
	return errors.Wrapf(err, "cannot delete snapshot %s", in.UID)
}

// snapshotBefore is the snapshot's last report: this process's or, where it
// wrote none, what an earlier agent of the node left. An earlier agent's
// Failed is final for the intent as it is now: the wire promises no second
// try, and the hub may have acted on it.
func (r *Reconciler) snapshotBefore(ctx context.Context, in wire.SnapshotIntent) (wire.SnapshotReport, error) {
	prev, stored, err := r.snapshotReports.lastOrStored(ctx, in.UID)
	if err != nil {
		return prev, err
	}
	if stored && prev.Phase == wire.SnapshotPhaseFailed {
		r.mu.Lock()
		r.snapshotsFailed[in.UID] = in
		r.mu.Unlock()
	}
	return prev, nil
}

// failedSnapshot says whether in, as it is, failed for good.
func (r *Reconciler) failedSnapshot(in wire.SnapshotIntent) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	failed, ok := r.snapshotsFailed[in.UID]
	return ok && failed == in
}

// snapshotFailed reports in Failed with err's message, and keeps that it
// did once the report is written, so it is not tried again until the
// intent changes.
func (r *Reconciler) snapshotFailed(ctx context.Context, in wire.SnapshotIntent, err error) error {
	if err := r.snapshotReport(ctx, snapshotIn(in, wire.SnapshotPhaseFailed, err.Error())); err != nil {
		return err
	}
	r.mu.Lock()
	r.snapshotsFailed[in.UID] = in
	r.mu.Unlock()
	return nil
}

// snapshotter is the driver's Snapshotter, or a Terminal error for the
// user saying the node's backend keeps no snapshots.
func (r *Reconciler) snapshotter() (driver.Snapshotter, error) {
	if s, ok := r.driver.(driver.Snapshotter); ok {
		return s, nil
	}
	return nil, driver.Terminalf("the %s of node %s keeps no snapshots", r.backendName(), r.node)
}

// notHere says that guest vm, whose snapshot or restore this node was
// asked for, is not on it.
func (r *Reconciler) notHere(vm string) error {
	return driver.Terminalf("guest %s is not on node %s", vm, r.node)
}

// snapshotReport writes rep unless it says what the last one written said.
func (r *Reconciler) snapshotReport(ctx context.Context, rep wire.SnapshotReport) error {
	rep.Node = r.node
	rep.ObservedAt = r.opts.Now().UTC()
	return r.snapshotReports.put(ctx, rep.UID, rep)
}

// snapshotIn is the report of in in phase p, saying msg.
func snapshotIn(in wire.SnapshotIntent, p wire.SnapshotPhase, msg string) wire.SnapshotReport {
	return wire.SnapshotReport{UID: in.UID, VM: in.VM, Phase: p, Message: msg}
}

// snapshotReady is the Ready report of s. A snapshot found on the node
// rather than taken by this process has no duration; the one reported
// when it was taken (prev) stays.
func snapshotReady(in wire.SnapshotIntent, s driver.Snapshot, prev wire.SnapshotReport) wire.SnapshotReport {
	rep := snapshotIn(in, wire.SnapshotPhaseReady, "")
	if !s.CreatedAt.IsZero() {
		t := s.CreatedAt.UTC()
		rep.CreatedAt = &t
	}
	rep.DurationMilliseconds = s.Duration.Milliseconds()
	if s.Duration == 0 {
		rep.DurationMilliseconds = prev.DurationMilliseconds
	}
	rep.SizeBytes = max(s.SizeBytes, 0)
	rep.Online, rep.Memory, rep.Frozen = s.Online, s.Memory, s.Frozen
	return rep
}

// guestLocks are locks by guest uid, each there only while someone holds
// or waits for it.
type guestLocks struct {
	mu    sync.Mutex
	locks map[string]*guestLock
}

type guestLock struct {
	sync.Mutex
	users int
}

// lock waits for uid's lock and returns its unlock.
func (l *guestLocks) lock(uid string) (unlock func()) {
	g := l.acquire(uid)
	g.Lock()
	return func() { g.Unlock(); l.release(uid, g) }
}

// tryLock takes uid's lock if it is free.
func (l *guestLocks) tryLock(uid string) (unlock func(), ok bool) {
	g := l.acquire(uid)
	if !g.TryLock() {
		l.release(uid, g)
		return nil, false
	}
	return func() { g.Unlock(); l.release(uid, g) }, true
}

func (l *guestLocks) acquire(uid string) *guestLock {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.locks == nil {
		l.locks = map[string]*guestLock{}
	}
	g, ok := l.locks[uid]
	if !ok {
		g = &guestLock{}
		l.locks[uid] = g
	}
	g.users++
	return g
}

func (l *guestLocks) release(uid string, g *guestLock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g.users--; g.users == 0 {
		delete(l.locks, uid)
	}
}
