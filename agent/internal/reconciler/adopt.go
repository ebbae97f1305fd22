package reconciler

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// defaultObserveEvery is how often a guest a VM only observes is looked at:
// it is not the driver's, so no driver event names it.
const defaultObserveEvery = 5 * time.Second

// adopter is the node's driver as a driver.Adopter, or an error for the
// user saying the backend cannot keep or hand over guests.
func (r *Reconciler) adopter(what string) (driver.Adopter, error) {
	if a, ok := r.driver.(driver.Adopter); ok {
		return a, nil
	}
	return nil, driver.Terminalf("the backend of node %s cannot %s", r.node, what)
}

// release acts on a release marker: the guest is no longer managed and is
// left as it is, and the report says so. A backend that cannot keep a
// guest without its VM says so instead, and the guest stays managed.
func (r *Reconciler) release(ctx context.Context, in wire.Intent) error {
	a, err := r.adopter("keep a guest without its VM; delete the VM with the Delete management policy instead")
	if err != nil {
		return r.report(ctx, failed(in, r.node, err))
	}
	if err := r.call(OpRelease, func() error { return a.Release(ctx, in.UID, in.Seal) }); err != nil {
		r.guestError(ctx, in.UID, in.Namespace, in.Name, err)
		return errors.Wrap(err, "cannot release guest")
	}
	r.guestOK(in.UID, in.Namespace, in.Name)
	if err := r.refreshOrphans(ctx); err != nil {
		return err
	}
	rep := wire.Report{UID: in.UID, ObservedGeneration: in.Generation, Phase: wire.PhaseUnknown, Message: "released: no longer managed"}
	r.mu.Lock()
	o, orphaned := r.orphans[in.UID]
	r.mu.Unlock()
	write := r.report
	if orphaned {
		rep, write = orphanReport(o), r.reportOrphan
	}
	rep.Released = true
	return write(ctx, rep)
}

// refreshOrphans re-reads the node's orphans.
func (r *Reconciler) refreshOrphans(ctx context.Context) error {
	a, ok := r.driver.(driver.Adopter)
	if !ok {
		return nil
	}
	list, err := DriverCall(r.metrics, OpOrphans, func() ([]driver.Observation, error) { return a.Orphans(ctx) })
	if err != nil {
		return errors.Wrap(err, "cannot list orphaned guests")
	}
	orphans := make(map[string]driver.Observation, len(list))
	for _, o := range list {
		orphans[o.UID] = o
	}
	r.mu.Lock()
	r.orphans = orphans
	r.mu.Unlock()
	return nil
}

// orphaned writes the report of a guest released earlier, if uid is one:
// it stays for as long as the guest does, so a VM of the same name finds
// it to adopt.
func (r *Reconciler) orphaned(ctx context.Context, uid string) (bool, error) {
	r.mu.Lock()
	o, ok := r.orphans[uid]
	r.mu.Unlock()
	if !ok {
		return false, nil
	}
	last, _ := r.reports.last(uid)
	rep := orphanReport(o)
	rep.Released = last.Released
	return true, r.reportOrphan(ctx, rep)
}

// reportOrphan writes the report of an orphan, from a listing that may be
// older than an adoption another worker just made: an orphan adopted
// meanwhile (clearOrphanReport marks it before it deletes the report) has
// the report deleted again, so it never outlives the adoption.
func (r *Reconciler) reportOrphan(ctx context.Context, rep wire.Report) error {
	if err := r.report(ctx, rep); err != nil {
		return err
	}
	r.mu.Lock()
	adopted := r.cleared[rep.UID]
	r.mu.Unlock()
	if !adopted {
		return nil
	}
	return errors.Wrap(r.reports.delete(ctx, rep.UID), "cannot delete the adopted orphan's report")
}

// claim takes over, or with ObserveOnly only looks at, the guest the intent
// names, then drives it as any other. An orphan that is gone is no reason
// to fail: the VM gets a new guest.
func (r *Reconciler) claim(ctx context.Context, in wire.Intent, m driver.Machine) (driver.Observation, error) {
	a, err := r.adopter("adopt or import guests")
	if err != nil {
		return driver.Observation{}, err
	}
	ref := driver.Ref{Orphan: in.Claim.Orphan, ExternalName: in.Claim.ExternalName}
	if ref.Orphan != "" {
		known, err := r.mayAdopt(in)
		switch {
		case err != nil:
			return driver.Observation{}, err
		case !known && in.ObserveOnly:
			return driver.Observation{}, missing(driver.NotFoundf("no guest of node %s was orphaned from VirtualMachine %s/%s", r.node, in.Namespace, in.Name))
		case !known:
			// Gone, or never an orphan of this node: a uid is no licence
			// to take over a guest virtfleet did not release.
			return r.ensure(ctx, m)
		}
	}
	if in.ObserveOnly {
		obs, err := DriverCall(r.metrics, OpObserveRef, func() (driver.Observation, error) { return a.ObserveRef(ctx, ref) })
		obs.UID = in.UID
		return obs, missing(err)
	}
	err = r.call(OpClaim, func() error { return a.Claim(ctx, m, ref) })
	switch {
	case driver.IsNotFound(err) && ref.Orphan != "":
	case driver.IsNotFound(err):
		return driver.Observation{}, missing(err)
	case err != nil:
		return driver.Observation{}, err
	case ref.Orphan != "":
		if err := r.clearOrphanReport(ctx, ref.Orphan); err != nil {
			return driver.Observation{}, err
		}
	}
	return r.ensure(ctx, m)
}

// mayAdopt says whether the orphan the intent claims is one this node
// released (known), and refuses it when it was released from another
// VirtualMachine than the intent's, whatever the hub asked: a guest left by
// one namespace is never handed to another, nor to another VM of the same
// namespace under a name it was not released from.
func (r *Reconciler) mayAdopt(in wire.Intent) (known bool, err error) {
	r.mu.Lock()
	o, ok := r.orphans[in.Claim.Orphan]
	r.mu.Unlock()
	switch {
	case !ok:
		return false, nil
	case o.OrphanOf != nil && o.OrphanOf.Namespace == in.Namespace && o.OrphanOf.Name == in.Name:
		return true, nil
	}
	return false, driver.Terminalf("guest %s was not orphaned from VirtualMachine %s/%s; a VirtualMachine adopts only the guest released from its own namespace and name", in.Claim.Orphan, in.Namespace, in.Name)
}

// clearOrphanReport deletes the report of an orphan just adopted, once per
// agent run: after a restart the report may still be there. The orphan is
// marked adopted before the delete: a report of it written meanwhile from
// an older listing either lands before the delete or sees the mark
// (reportOrphan).
func (r *Reconciler) clearOrphanReport(ctx context.Context, uid string) error {
	r.mu.Lock()
	done := r.cleared[uid]
	r.cleared[uid] = true
	r.mu.Unlock()
	if done {
		return nil
	}
	if err := r.reports.delete(ctx, uid); err != nil {
		r.mu.Lock()
		delete(r.cleared, uid)
		r.mu.Unlock()
		return errors.Wrap(err, "cannot delete the adopted orphan's report")
	}
	r.mu.Lock()
	delete(r.orphans, uid)
	r.mu.Unlock()
	return nil
}

// orphanReport is the report of an orphaned guest.
func orphanReport(o driver.Observation) wire.Report {
	rep := report(wire.Intent{UID: o.UID}, o)
	if o.OrphanOf != nil {
		rep.Orphan = &wire.Orphan{Namespace: o.OrphanOf.Namespace, Name: o.OrphanOf.Name, Seal: o.OrphanOf.Seal}
		rep.Message = "orphaned from VirtualMachine " + o.OrphanOf.Namespace + "/" + o.OrphanOf.Name + "; a VirtualMachine of that name adopts it"
	}
	return rep
}

// missing shows a claimed guest that is not there as Failed, retried: it
// may be made yet.
func missing(err error) error {
	if driver.IsNotFound(err) {
		return driver.Failing(err)
	}
	return err
}
