package reconciler

import (
	"context"
	"slices"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/lease"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Self-fencing. A guest whose intent sets Fence is one the hub restarts on
// another node once this node has been silent for longer than its lease
// (Options.Lease). So while the lease is not held the node must not run
// such a guest: each reconcile of one destroys it (fence) instead of
// converging it, whatever its intent says, and the watchdog (watchLease)
// queues them all the moment the lease is lost. Guests without Fence are
// untouched. The lease is held again only after a heartbeat was stored and
// then the intents were read afresh, so a guest the hub moved or deleted
// meanwhile is never started again here; the Synced that ends the fence
// queues a resync, which starts the others as their intents say.

// watchLease is the watchdog's look at the lease, which was was at its last
// look. When the lease changed it logs so and queues every guest that
// fences, whose reconcile then acts on the lease as it is. It returns the
// lease's state.
func (r *Reconciler) watchLease(was lease.State) lease.State {
	l := r.opts.Lease
	now := l.State()
	if now == was {
		return now
	}
	uids := r.fencing()
	switch now {
	case lease.Lost:
		r.log.Info("Fenced: no heartbeat was stored for the node's lease; destroying the guests the hub may restart elsewhere, and starting none of them until the lease is held again",
			"lease", l.After(), "lastHeartbeat", l.LastStored(), "guests", uids)
	case lease.Renewed:
		r.log.Info("Heartbeat stored again; still fenced until the intents are read afresh", "guests", uids)
	case lease.Held:
		r.log.Info("Lease held again: the guests that fence run as their intents say", "guests", uids)
	}
	for _, uid := range uids {
		r.queue.Add(guest(uid))
	}
	return now
}

// fencing are the uids of the guests whose intent sets Fence, sorted.
func (r *Reconciler) fencing() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var uids []string
	for uid, in := range r.intents {
		if in.Fence && !in.Release {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	return uids
}

// fence destroys the guest of in, whose intent sets Fence, while the node is
// fenced. The guest's volumes stay: the copy the hub starts elsewhere, or
// this one once the lease is held again, uses them. Nothing is reported:
// the hub cannot be told while the node is cut off, and once it can, the
// fence ends soon after and the guest is reported as it is then.
func (r *Reconciler) fence(ctx context.Context, in wire.Intent) error {
	_, err := DriverCall(r.metrics, OpObserve, func() (driver.Observation, error) { return r.driver.Observe(ctx, in.UID) })
	switch {
	case driver.IsNotFound(err):
		return nil
	case err != nil:
		return errors.Wrap(err, "cannot observe guest to fence")
	}
	if err := r.call(OpDelete, func() error { return r.driver.Delete(ctx, in.UID) }); err != nil {
		return errors.Wrap(err, "cannot destroy fenced guest")
	}
	r.metrics.FencedGuests.WithLabelValues().Inc()
	r.log.Info("Destroyed guest: the node is fenced, it has not stored a heartbeat for its lease and may be restarted elsewhere",
		"uid", in.UID, "namespace", in.Namespace, "name", in.Name)
	return nil
}
