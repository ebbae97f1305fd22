package reconciler

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// reconcileVolume deletes the volume of a VolumeIntent{Absent} and reports it
// Gone; once the hub, having seen that, deletes the intent, it deletes the
// report. While a guest this agent manages still has the volume it reports
// why and retries with backoff; a request it can never carry out is reported
// once and not retried. A present intent imports a volume: it is observed
// (observeVolume) and returns how soon to look again.
func (r *Reconciler) reconcileVolume(ctx context.Context, uid string) (time.Duration, error) {
	r.mu.Lock()
	in, wanted := r.volumes[uid]
	r.mu.Unlock()
	if !wanted {
		return 0, r.volumeReports.delete(ctx, uid)
	}
	if !in.Absent {
		return r.observeVolume(ctx, in)
	}
	// An imported volume is named by its external name (wire validation
	// holds Disk to it); any other is the Volume's own.
	if want := wire.NameOnNode(in.Namespace, in.Name); in.ExternalName == "" && in.Disk != want {
		return 0, r.volumeReport(ctx, wire.VolumeReport{UID: uid, Message: fmt.Sprintf(
			"malformed volume intent: disk %q is not Volume %s/%s's volume %q; refusing to delete it", in.Disk, in.Namespace, in.Name, want)})
	}
	err := r.attached(in.Disk)
	if err == nil {
		err = r.call(OpDeleteVolume, func() error { return r.driver.DeleteVolume(ctx, driver.Disk{Name: in.Disk, Pool: in.Pool}) })
	}
	if err != nil {
		if rerr := r.volumeReport(ctx, wire.VolumeReport{UID: uid, Message: err.Error()}); rerr != nil {
			return 0, rerr
		}
		if driver.IsTerminal(err) { // reported; tried again only when the intent changes
			return 0, nil
		}
		return 0, errors.Wrapf(err, "cannot delete volume %s", in.Disk)
	}
	return 0, r.volumeReport(ctx, wire.VolumeReport{UID: uid, Gone: true})
}

// observeVolume reports the volume a Volume imports, never changing it, and
// returns how soon to look again: no driver event names a volume. A volume
// that is not there is reported and looked for again; one no Volume may
// take, or a backend that cannot import, is reported once.
func (r *Reconciler) observeVolume(ctx context.Context, in wire.VolumeIntent) (time.Duration, error) {
	rep := wire.VolumeReport{UID: in.UID, Imported: true}
	im, ok := r.driver.(driver.VolumeImporter)
	if !ok {
		rep.Message = fmt.Sprintf("the backend of node %s cannot import volumes", r.node)
		return 0, r.volumeReport(ctx, rep)
	}
	obs, err := DriverCall(r.metrics, OpObserveVolume, func() (driver.VolumeObservation, error) {
		return im.ObserveVolume(ctx, driver.Disk{Name: in.Disk, Pool: in.Pool})
	})
	switch {
	case driver.IsTerminal(err):
		rep.Message = err.Error()
		return 0, r.volumeReport(ctx, rep)
	case driver.IsNotFound(err):
		rep.Message = err.Error()
	case err != nil:
		return 0, errors.Wrapf(err, "cannot observe volume %s", in.Disk)
	default:
		rep.SizeBytes, rep.ID = obs.SizeBytes, obs.ID
	}
	return r.opts.ObserveEvery, r.volumeReport(ctx, rep)
}

// attached returns an in-use error when a guest intent still names disk: its
// guest is either still wanted or not yet deleted, and the driver might not
// see the disk attached yet (a guest being created).
func (r *Reconciler) attached(disk string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, in := range r.intents {
		for _, d := range in.Machine.Disks {
			if nodeDisk(in.Namespace, d) == disk {
				return driver.InUsef("volume %s is still used by guest %s (VirtualMachine %s/%s); it is deleted once the guest is gone", disk, uid, in.Namespace, in.Name)
			}
		}
	}
	return nil
}

// volumeReport writes rep unless it says what the last one written said.
func (r *Reconciler) volumeReport(ctx context.Context, rep wire.VolumeReport) error {
	rep.ObservedAt = r.opts.Now().UTC()
	return r.volumeReports.put(ctx, rep.UID, rep)
}
