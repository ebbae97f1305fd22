package libvirt

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Delete implements driver.Driver.
func (d *Driver) Delete(ctx context.Context, uid string) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	dom, info, err := d.lookup(api, uid, golibvirt.DomainXMLInactive)
	var notOurs *NotOursError
	key := uid
	var released []nic
	found := false
	switch {
	case errors.As(err, &notOurs):
		return nil // another VM's now, or released: not to be touched
	case driver.IsNotFound(err):
	case err != nil:
		return err
	default:
		found = true
		key = formatUUID(dom.UUID)
		// The running definition may have interfaces the next one dropped;
		// unread, they are only left to the sweeps of the networks the
		// driver made.
		released = info.nics
		if x, err := api.DomainGetXMLDesc(dom, 0); err == nil {
			if live, err := parseDomain(x); err == nil {
				released = append(released, live.nics...)
			}
		}
		if err := forgetCheckpoints(api, dom, uid); err != nil {
			return err
		}
		if err := api.DomainDestroy(dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid, golibvirt.ErrNoDomain) {
			return errors.Wrap(err, "cannot stop domain")
		}
		flags := golibvirt.DomainUndefineManagedSave | golibvirt.DomainUndefineSnapshotsMetadata
		if info.firmware == driver.FirmwareUEFI {
			flags |= golibvirt.DomainUndefineNvram
		}
		if !d.testDriver {
			// What forgetCheckpoints could not delete (libvirt's test
			// driver takes no such flag).
			flags |= golibvirt.DomainUndefineCheckpointsMetadata
		}
		if err := api.DomainUndefineFlags(dom, flags); err != nil && !isCode(err, golibvirt.ErrNoDomain) {
			return errors.Wrap(err, "cannot undefine domain")
		}
	}
	// Also after a crash between undefine and here: the volumes are the
	// guest's alone, named by its uid.
	for _, v := range []string{seedVolume(key), swapVolume(key)} {
		if err := deleteVolume(api, d.pool, v); err != nil {
			return err
		}
	}
	var pools []string
	for _, v := range info.volumes {
		pools = append(pools, v.pool)
	}
	if err := d.sweepBackupVolumes(api, key, pools); err != nil {
		return err
	}
	// A guest readied for a migration that did not come: what the
	// migration made of it goes too, and its interfaces are no longer held.
	if err := d.dropIncoming(ctx, uid, !found); err != nil {
		return err
	}
	d.aliases.set(key, key)
	d.addresses.forget(uid)
	d.clearShutdown(uid)
	d.stateMu.Lock()
	delete(d.startedAt, uid)
	delete(d.reboots, uid)
	delete(d.crashes, uid)
	d.stateMu.Unlock()
	d.grown.Forget(uid)
	// Also when the domain was gone already: a sweep cut short before
	// is finished.
	return d.sweepNetworks(api, append(released, d.releaseIncoming(uid)...))
}
