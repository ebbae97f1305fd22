package reconciler

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// The node's images are reported by one loop of their own, not per guest:
// an image outlives the guests that made the node import it (it is pruned
// after its pruneAfter), and the hub lists the nodes an image is on from
// these reports. The loop reads Driver.Images — cheap, it only reads — every
// ImagePollEvery, every PollTransitional while an import runs (so progress
// and the end of an import show at once), and at once when a guest waits for
// an import. It writes an ImageReport only when what it says changed, and
// deletes the key of an image no longer on the node.

// runImages reports the node's images until ctx is done; a node whose
// driver keeps none reports none.
func (r *Reconciler) runImages(ctx context.Context) {
	keeper, ok := r.driver.(driver.ImageKeeper)
	if !ok {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	importing := false
	for {
		// While an import runs the timer is already short: a guest
		// waiting for it adds nothing.
		nudged := r.imagesNudge
		if importing {
			nudged = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-nudged:
		}
		var err error
		importing, err = r.syncImages(ctx, keeper)
		if err != nil && ctx.Err() == nil {
			r.log.Debug("Cannot report the node's images; trying again", "error", err)
		}
		next := r.opts.ImagePollEvery
		if importing {
			next = r.opts.PollTransitional
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// nudgeImages asks the image loop to look now; it never blocks.
func (r *Reconciler) nudgeImages() {
	select {
	case r.imagesNudge <- struct{}{}:
	default:
	}
}

// syncImages writes the report of every image the driver has and deletes
// those of images it no longer has. It reports whether an import runs.
func (r *Reconciler) syncImages(ctx context.Context, keeper driver.ImageKeeper) (bool, error) {
	images, err := DriverCall(r.metrics, OpImages, func() ([]driver.ImageStatus, error) { return keeper.Images(ctx) })
	if err != nil {
		return false, errors.Wrap(err, "cannot list the node's images")
	}
	importing := false
	seen := map[string]bool{}
	var errs []error
	for _, st := range images {
		// A volume named like an image by someone else may not be a key.
		if wire.ValidateToken("uid", st.UID) != nil {
			continue
		}
		seen[st.UID] = true
		importing = importing || st.Phase == driver.ImagePhaseImporting
		r.observeImport(st)
		r.logImage(st)
		if err := r.imageReport(ctx, imageReport(r.node, st)); err != nil {
			errs = append(errs, err)
		}
	}
	for uid := range r.imports {
		if !seen[uid] {
			delete(r.imports, uid)
		}
	}
	r.imageErrors.retain(func(uid string) bool { return seen[uid] })
	gone := r.staleImageReports(seen)
	for _, uid := range gone {
		if err := r.imageReports.delete(ctx, uid); err != nil {
			errs = append(errs, err)
		}
	}
	return importing, errors.Join(errs...)
}

// staleImageReports lists the reports to delete: those this agent wrote of
// images no longer on the node and, once after the intents are synced, those
// of images the intents name that are not on the node — a report a previous
// run of the agent left behind (the bus skips a key that does not exist).
func (r *Reconciler) staleImageReports(seen map[string]bool) []string {
	var gone []string
	written := map[string]bool{}
	for _, uid := range r.imageReports.uids() {
		written[uid] = true
		if !seen[uid] {
			gone = append(gone, uid)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.synced || r.imagesCleaned {
		return gone
	}
	r.imagesCleaned = true
	named := map[string]bool{}
	for _, in := range r.intents {
		for _, d := range in.Machine.Disks {
			if d.Image != nil && !seen[d.Image.UID] && !named[d.Image.UID] && !written[d.Image.UID] {
				named[d.Image.UID] = true
				gone = append(gone, d.Image.UID)
			}
		}
	}
	return gone
}

// imageReport writes rep unless it says what the last one written said.
func (r *Reconciler) imageReport(ctx context.Context, rep wire.ImageReport) error {
	rep.ObservedAt = r.opts.Now().UTC()
	return r.imageReports.put(ctx, rep.UID, rep)
}

// imageReport translates what the driver sees of an image for the wire.
func imageReport(node string, st driver.ImageStatus) wire.ImageReport {
	return wire.ImageReport{
		UID:       st.UID,
		Name:      st.Name,
		Node:      node,
		Phase:     wire.ImagePhase(st.Phase),
		SizeBytes: st.SizeBytes,
		Message:   st.Message,
	}
}
