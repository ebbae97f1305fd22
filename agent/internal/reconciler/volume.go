package reconciler

import (
	"context"
	"fmt"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// A Volume's work shares the guests' queue under its own key: uids are key
// tokens and never hold a "/".
const volumeKeyPrefix = "volume/"

func volumeKey(uid string) string { return volumeKeyPrefix + uid }

func volumeUID(key string) (string, bool) { return strings.CutPrefix(key, volumeKeyPrefix) }

// handleVolumeIntent records a Volume intent event and queues the Volume.
func (r *Reconciler) handleVolumeIntent(ev bus.VolumeIntentEvent) {
	r.mu.Lock()
	if ev.Deleted {
		delete(r.volumes, ev.UID)
	} else {
		r.volumes[ev.UID] = ev.Intent
	}
	r.mu.Unlock()
	r.queue.Add(volumeKey(ev.UID))
}

// reconcileVolume deletes the volume of a VolumeIntent{Absent} and reports it
// Gone; once the hub, having seen that, deletes the intent, it deletes the
// report. While a guest this agent manages still has the volume it reports
// why and retries with backoff; a request it can never carry out is reported
// once and not retried.
func (r *Reconciler) reconcileVolume(ctx context.Context, uid string) error {
	r.mu.Lock()
	in, wanted := r.volumes[uid]
	r.mu.Unlock()
	if !wanted {
		if err := r.reports.DeleteVolumeReport(ctx, uid); err != nil {
			return errors.Wrap(err, "cannot delete volume report")
		}
		r.mu.Lock()
		delete(r.writtenVolumes, uid)
		r.mu.Unlock()
		return nil
	}
	if want := NodeName(in.Namespace, in.Name); in.Disk != want {
		return r.volumeReport(ctx, wire.VolumeReport{UID: uid, Message: fmt.Sprintf(
			"malformed volume intent: disk %q is not Volume %s/%s's volume %q; refusing to delete it", in.Disk, in.Namespace, in.Name, want)})
	}
	err := r.attached(in.Disk)
	if err == nil {
		err = r.driver.DeleteVolume(ctx, driver.Disk{Name: in.Disk, Pool: in.Pool})
	}
	if err != nil {
		if rerr := r.volumeReport(ctx, wire.VolumeReport{UID: uid, Message: err.Error()}); rerr != nil {
			return rerr
		}
		return errors.Wrapf(err, "cannot delete volume %s", in.Disk)
	}
	return r.volumeReport(ctx, wire.VolumeReport{UID: uid, Gone: true})
}

// attached returns an in-use error when a guest intent still names disk: its
// guest is either still wanted or not yet deleted, and the driver might not
// see the disk attached yet (a guest being created).
func (r *Reconciler) attached(disk string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, in := range r.intents {
		for _, d := range in.Machine.Disks {
			if NodeName(in.Namespace, d.Name) == disk {
				return driver.InUsef("volume %s is still used by guest %s (VirtualMachine %s/%s); it is deleted once the guest is gone", disk, uid, in.Namespace, in.Name)
			}
		}
	}
	return nil
}

// volumeReport writes rep unless it says what the last one written said.
func (r *Reconciler) volumeReport(ctx context.Context, rep wire.VolumeReport) error {
	r.mu.Lock()
	last, ok := r.writtenVolumes[rep.UID]
	r.mu.Unlock()
	if ok && last.Gone == rep.Gone && last.Message == rep.Message {
		return nil
	}
	rep.ProtocolVersion = wire.ProtocolVersion
	rep.ObservedAt = r.opts.Now().UTC()
	if _, err := r.reports.PutVolumeReport(ctx, rep); err != nil {
		return errors.Wrap(err, "cannot put volume report")
	}
	r.mu.Lock()
	r.writtenVolumes[rep.UID] = rep
	r.mu.Unlock()
	return nil
}
