package reconciler

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// restore carries out the restore in's intent asks for, once per restore
// ID, before the guest is ensured: the guest goes back to the snapshot,
// reverted with the intent's Running, and the Ensure that follows starts
// it where the revert left it stopped. Its progress is kept by ID and
// shown on every report of the guest while the intent asks for it
// (restoreOf). The caller never calls it while the guest migrates.
//
// A restore this process finished, or one an earlier agent of the node
// reported finished, is never done again: a second revert would throw away
// what the guest did since. A restore that cannot succeed is Failed and
// the guest is ensured as it is; any other failure is shown on the Running
// restore and returned, to be retried with backoff. Failed is final on the
// wire (the hub then drops the restore), so it is never reported for what
// a retry may mend.
func (r *Reconciler) restore(ctx context.Context, in wire.Intent) error {
	if in.Restore == nil {
		return nil
	}
	st, done, err := r.restoreBefore(ctx, in)
	if done || err != nil {
		return err
	}
	s, err := r.snapshotter()
	if err == nil && in.ObserveOnly {
		err = driver.Terminalf("VirtualMachine %s/%s only observes its guest, which is not restored", in.Namespace, in.Name)
	}
	if err != nil {
		r.restored(in, st, err)
		return nil
	}
	obs, err := DriverCall(r.metrics, OpObserve, func() (driver.Observation, error) { return r.driver.Observe(ctx, in.UID) })
	switch {
	case driver.IsNotFound(err):
		r.restored(in, st, r.notHere(in.UID))
		return nil
	case err != nil:
		return errors.Wrap(err, "cannot observe the guest to restore")
	}
	r.keepRestore(in.UID, st)
	if err := r.report(ctx, report(in, obs)); err != nil {
		return err
	}
	r.forgetSettled(in.UID)
	err = r.call(OpRevertSnapshot, func() error {
		return s.RevertSnapshot(ctx, in.UID, driver.RevertRequest{Snapshot: in.Restore.Snapshot, Restore: in.Restore.ID, Running: in.Running})
	})
	switch {
	case driver.IsNotFound(err):
		err = r.notHere(in.UID)
	case err != nil && !driver.IsTerminal(err):
		st.Message = err.Error()
		r.keepRestore(in.UID, st)
		if rerr := r.report(ctx, report(in, obs)); rerr != nil {
			return rerr
		}
		return errors.Wrapf(err, "cannot restore snapshot %s", in.Restore.Snapshot)
	}
	r.restored(in, st, err)
	return nil
}

// restoreBefore is in's restore as this process or an earlier agent of the
// node left it, and whether it is finished; a restore not begun yet starts
// now.
func (r *Reconciler) restoreBefore(ctx context.Context, in wire.Intent) (wire.RestoreReport, bool, error) {
	id := in.Restore.ID
	r.mu.Lock()
	st, ok := r.restores[in.UID][id]
	r.mu.Unlock()
	if !ok {
		prev, _, err := r.reports.lastOrStored(ctx, in.UID)
		if err != nil {
			return st, false, err
		}
		if prev.Restore != nil && prev.Restore.ID == id {
			st, ok = *prev.Restore, true
			r.keepRestore(in.UID, st)
		}
	}
	if !ok {
		now := r.opts.Now().UTC()
		st = wire.RestoreReport{ID: id, StartedAt: &now}
	}
	if st.Phase != "" && st.Phase != wire.RestoreRunning {
		return st, true, nil
	}
	st.Phase, st.Message = wire.RestoreRunning, ""
	return st, false, nil
}

// restored finishes restore st of in's guest: Succeeded, or Failed with
// err's message. The guest is then ensured, and its next report says so.
func (r *Reconciler) restored(in wire.Intent, st wire.RestoreReport, err error) {
	now := r.opts.Now().UTC()
	st.Phase, st.FinishedAt, st.Message = wire.RestoreSucceeded, &now, ""
	if err != nil {
		st.Phase, st.Message = wire.RestoreFailed, err.Error()
	}
	r.keepRestore(in.UID, st)
}

// keepRestore keeps st as the state of its restore of guest uid.
func (r *Reconciler) keepRestore(uid string, st wire.RestoreReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.restores[uid] == nil {
		r.restores[uid] = map[string]wire.RestoreReport{}
	}
	r.restores[uid][st.ID] = st
}

// restoreOf is what guest uid's report says of the restore its intent asks
// for: nothing until the restore has begun.
func (r *Reconciler) restoreOf(uid string) *wire.RestoreReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.intents[uid]
	if !ok || in.Restore == nil {
		return nil
	}
	st, ok := r.restores[uid][in.Restore.ID]
	if !ok {
		return nil
	}
	return &st
}
