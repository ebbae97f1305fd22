package nova

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Snapshots on nova are Cinder snapshots of the server's volumes, taken
// through Nova's createImage of the volume-backed server: Nova quiesces the
// guest (freezes its filesystems through qemu-guest-agent, where the
// compute driver can), snapshots every attached volume, forced as they are
// in use, and thaws it once Cinder took them. createImage is the only way a
// tenant has to freeze a guest for Cinder: a snapshot made straight through
// Cinder is only crash-consistent. The image Nova makes alongside holds no
// data (its block_device_mapping names the snapshots) and is deleted at
// once; the snapshots are named by Nova ("snapshot for " + the image's
// name, snapshotName) and tagged by the driver with the guest, the node,
// the disk and the snapshot's ID once all of them are available: an
// untagged one is half-taken, never listed, and deleted by the next
// TakeSnapshot or DeleteSnapshot of that ID.
//
// Frozen is reported only where Nova had to freeze the guest or fail the
// snapshot: the boot volume's image metadata has hw_qemu_guest_agent and
// os_require_quiesce (Nova skips a quiesce that fails without the second
// and says so only in its log). Nova reads them when the server boots.
//
// Nova keeps no guest memory: a snapshot with memory of a running guest
// is refused. A revert cannot happen in place either: Cinder reverts only a
// detached volume (status available), only to its latest snapshot (block
// storage microversion 3.40), and Nova never detaches a boot volume. So a
// revert deletes the server (its volumes stay: they are not deleted on
// termination), reverts each volume, and leaves the guest absent for the
// next Ensure to create again from the same volumes, networks and
// addresses, started or not as the Machine says: a new Nova server, whose
// id and MACs are new. A snapshot that is not its volume's latest is
// refused before anything is touched, naming the newer ones. The restarts
// counted and the last restore made are kept on the boot volume across the
// server's deletion.
var _ driver.Snapshotter = (*Driver)(nil)

// Metadata keys of the driver's Cinder snapshots (besides MetaUID and
// MetaNode) and volumes.
const (
	metaSnapshot = "virtfleet-snapshot"
	metaDisk     = "virtfleet-disk"
	metaDisks    = "virtfleet-disks"
	metaOnline   = "virtfleet-online"
	metaFrozen   = "virtfleet-frozen"
	// metaRevertedUID, on a boot volume, is the guest whose revert wrote
	// metaLastRestore and MetaRestarts there.
	metaRevertedUID = "virtfleet-reverted-uid"
	metaLastRestore = "virtfleet-last-restore"
)

// revertMicroversion is the block storage microversion of a volume's
// revert action.
const revertMicroversion = "3.40"

// novaSnapshotPrefix starts the name Nova gives a volume's snapshot it
// takes for a server image (nova/compute/api.py, snapshot_volume_backed).
const novaSnapshotPrefix = "snapshot for "

// snapshotImage is the name of the image createImage makes for snapshot
// id.
func snapshotImage(id string) string { return Prefix + "snapshot-" + id }

// snapshotName is the name Nova gives the Cinder snapshots of snapshot id.
func snapshotName(id string) string { return novaSnapshotPrefix + snapshotImage(id) }

// TakeSnapshot implements driver.Snapshotter.
func (d *Driver) TakeSnapshot(ctx context.Context, uid string, r driver.SnapshotRequest) (driver.Snapshot, error) {
	if r.ID == "" {
		return driver.Snapshot{}, driver.Terminalf("a snapshot of guest %s needs an ID", uid)
	}
	defer d.lock(uid)()
	cached, ok := d.cached(uid)
	if !ok {
		return driver.Snapshot{}, driver.NotFoundf("no server with %s %s", MetaUID, uid)
	}
	have, err := d.snapshotSet(ctx, r.ID)
	if err != nil {
		return driver.Snapshot{}, err
	}
	if other := otherGuest(have, uid); other != "" {
		return driver.Snapshot{}, driver.Terminalf("snapshot %s is guest %s's, not guest %s's", r.ID, other, uid)
	}
	if taken, ok := d.complete(have, uid); ok {
		return taken, nil
	}
	if err := d.dropSnapshot(ctx, r.ID, have); err != nil {
		return driver.Snapshot{}, err
	}
	s, disks, err := d.serverDisks(ctx, uid, cached.ID)
	if err != nil {
		return driver.Snapshot{}, err
	}
	online := s.Status == "ACTIVE" || s.Status == "PAUSED"
	switch {
	case len(s.Image) > 0:
		return driver.Snapshot{}, driver.Terminalf("server %s boots from an image, not a volume: Nova would upload its disk to Glance rather than snapshot it in Cinder", s.ID)
	case r.Memory && online:
		return driver.Snapshot{}, driver.Terminalf("Nova keeps no guest memory: its snapshots are Cinder snapshots of the server's volumes; take the snapshot without includeMemory")
	}
	started := d.now()
	taken, err := d.takeSnapshot(ctx, uid, r.ID, s, disks, online)
	if err != nil {
		// Nothing half-taken stays: the next attempt starts afresh.
		cctx := context.WithoutCancel(ctx)
		if derr := d.dropSnapshot(cctx, r.ID, nil); derr != nil {
			return driver.Snapshot{}, errors.Join(err, derr)
		}
		return driver.Snapshot{}, err
	}
	taken.Duration = d.now().Sub(started)
	return taken, nil
}

// takeSnapshot has Nova snapshot server s, the guest uid's with disks,
// waits for Cinder and tags the snapshots as snapshot id's. Online: the
// guest runs.
func (d *Driver) takeSnapshot(ctx context.Context, uid, id string, s *servers.Server, disks []serverDisk, online bool) (driver.Snapshot, error) {
	frozen := s.Status == "ACTIVE" && quiesceRequired(disks[0].imageMeta)
	imageID, err := servers.CreateImage(ctx, d.c.compute, s.ID, servers.CreateImageOpts{
		Name: snapshotImage(id), Metadata: map[string]string{MetaUID: uid, metaSnapshot: id},
	}).ExtractImageID()
	if err != nil {
		return driver.Snapshot{}, classify(err, "cannot have Nova snapshot server "+s.ID)
	}
	// The image holds nothing but the snapshots' names, which the driver
	// keeps itself.
	if err := d.deleteImage(ctx, imageID); err != nil {
		return driver.Snapshot{}, err
	}
	made, err := d.snapshotSet(ctx, id)
	if err != nil {
		return driver.Snapshot{}, err
	}
	byVolume := map[string]snapshots.Snapshot{}
	for _, sn := range made {
		byVolume[sn.VolumeID] = sn
	}
	for _, disk := range disks {
		sn, ok := byVolume[disk.volumeID]
		if !ok {
			return driver.Snapshot{}, errors.Errorf("Nova made no snapshot of disk %s (volume %s) of server %s", disk.Name, disk.volumeID, s.ID)
		}
		if err := d.awaitSnapshot(ctx, sn.ID, disk.Name); err != nil {
			return driver.Snapshot{}, err
		}
	}
	tag := map[string]any{
		MetaUID: uid, MetaNode: d.node, metaSnapshot: id, metaDisks: strconv.Itoa(len(disks)),
		metaOnline: strconv.FormatBool(online), metaFrozen: strconv.FormatBool(frozen),
	}
	var tagged []snapshots.Snapshot
	for _, disk := range disks {
		sn := byVolume[disk.volumeID]
		tag[metaDisk] = disk.Name
		if _, err := snapshots.UpdateMetadata(ctx, d.c.volume, sn.ID, snapshots.UpdateMetadataOpts{Metadata: tag}).ExtractMetadata(); err != nil {
			return driver.Snapshot{}, classify(err, "cannot tag snapshot "+sn.ID+" of disk "+disk.Name)
		}
		sn.Status, sn.Metadata = "available", map[string]string{}
		for k, v := range tag {
			sn.Metadata[k] = v.(string)
		}
		tagged = append(tagged, sn)
	}
	taken, _ := d.complete(tagged, uid)
	return taken, nil
}

// quiesceRequired says whether Nova's image properties of a server,
// meta, make it freeze the running guest for a snapshot or fail it.
func quiesceRequired(meta map[string]string) bool {
	return osloBool(meta["hw_qemu_guest_agent"]) && osloBool(meta["os_require_quiesce"])
}

// osloBool reads a boolean as OpenStack's services do
// (oslo_utils.strutils.bool_from_string).
func osloBool(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "t", "true", "on", "y", "yes":
		return true
	}
	return false
}

// volumeSnapshot is the Cinder snapshot of img.SourceVolume that snapshot
// img.SourceSnapshot took, which a new volume is made from: Cinder copies
// it, bootable flag and image metadata too, and the new volume no longer
// depends on it once made. Only a snapshot taken whole (tagged) is read;
// one that holds no such volume is Terminal, as no wait would give it one.
func (d *Driver) volumeSnapshot(ctx context.Context, img *driver.Image) (snapshots.Snapshot, error) {
	src, err := d.findVolume(ctx, img.SourceVolume)
	if err != nil {
		return snapshots.Snapshot{}, err
	}
	if src == nil {
		return snapshots.Snapshot{}, driver.Terminalf("image %s copies volume %s as snapshot %s holds it, and Cinder has no volume of that name", img.Name, img.SourceVolume, img.SourceSnapshot)
	}
	set, err := d.snapshotSet(ctx, img.SourceSnapshot)
	if err != nil {
		return snapshots.Snapshot{}, err
	}
	for _, s := range set {
		if s.VolumeID == src.ID && s.Metadata[metaSnapshot] == img.SourceSnapshot && s.Status == "available" {
			return s, nil
		}
	}
	return snapshots.Snapshot{}, driver.Terminalf("image %s copies volume %s as snapshot %s holds it, and that snapshot holds no Cinder snapshot of it", img.Name, img.SourceVolume, img.SourceSnapshot)
}

// snapshotSet lists the Cinder snapshots of snapshot id, tagged or not.
func (d *Driver) snapshotSet(ctx context.Context, id string) ([]snapshots.Snapshot, error) {
	return d.listSnapshots(ctx, snapshots.ListOpts{Name: snapshotName(id)}, func(s snapshots.Snapshot) bool {
		return s.Name == snapshotName(id)
	})
}

func (d *Driver) listSnapshots(ctx context.Context, opts snapshots.ListOpts, keep func(snapshots.Snapshot) bool) ([]snapshots.Snapshot, error) {
	page, err := snapshots.ListDetail(d.c.volume, opts).AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list snapshots")
	}
	all, err := snapshots.ExtractSnapshots(page)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read snapshots")
	}
	return slices.DeleteFunc(all, func(s snapshots.Snapshot) bool { return !keep(s) }), nil
}

// otherGuest is the guest other than uid that set tags as its own, if
// any.
func otherGuest(set []snapshots.Snapshot, uid string) string {
	for _, s := range set {
		if owner := s.Metadata[MetaUID]; owner != "" && owner != uid {
			return owner
		}
	}
	return ""
}

// complete is the snapshot set holds, if it is one of guest uid on this
// node whose every disk's snapshot is tagged and available.
func (d *Driver) complete(set []snapshots.Snapshot, uid string) (driver.Snapshot, bool) {
	if len(set) == 0 {
		return driver.Snapshot{}, false
	}
	first := set[0].Metadata
	disks, _ := strconv.Atoi(first[metaDisks])
	out := driver.Snapshot{ID: first[metaSnapshot], Online: first[metaOnline] == "true", Frozen: first[metaFrozen] == "true"}
	for _, s := range set {
		md := s.Metadata
		if md[MetaUID] != uid || md[MetaNode] != d.node || md[metaSnapshot] != out.ID || s.Status != "available" {
			return driver.Snapshot{}, false
		}
		if out.CreatedAt.IsZero() || s.CreatedAt.Before(out.CreatedAt) {
			out.CreatedAt = s.CreatedAt
		}
		// What Cinder counts against the project's gigabytes.
		out.SizeBytes += int64(s.Size) * gib
	}
	return out, len(set) == disks
}

// Snapshots implements driver.Snapshotter: the snapshots the driver tagged
// as guest uid's on this node. They outlive the server, as its volumes do.
func (d *Driver) Snapshots(ctx context.Context, uid string) ([]driver.Snapshot, error) {
	all, err := d.listSnapshots(ctx, snapshots.ListOpts{}, func(s snapshots.Snapshot) bool {
		return strings.HasPrefix(s.Name, novaSnapshotPrefix+Prefix) && s.Metadata[MetaUID] == uid && s.Metadata[metaSnapshot] != ""
	})
	if err != nil {
		return nil, err
	}
	sets := map[string][]snapshots.Snapshot{}
	for _, s := range all {
		sets[s.Metadata[metaSnapshot]] = append(sets[s.Metadata[metaSnapshot]], s)
	}
	var out []driver.Snapshot
	for _, set := range sets {
		if s, ok := d.complete(set, uid); ok {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b driver.Snapshot) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// DeleteSnapshot implements driver.Snapshotter.
func (d *Driver) DeleteSnapshot(ctx context.Context, uid, id string) error {
	defer d.lock(uid)()
	have, err := d.snapshotSet(ctx, id)
	if err != nil {
		return err
	}
	if otherGuest(have, uid) != "" {
		return nil // not the guest's: it has none of that id
	}
	return d.dropSnapshot(ctx, id, have)
}

// dropSnapshot deletes what snapshot id is made of: set, its Cinder
// snapshots (listed again when nil), and an image a createImage left. One
// Cinder is still taking is waited for: Cinder deletes no snapshot while
// it is created.
func (d *Driver) dropSnapshot(ctx context.Context, id string, set []snapshots.Snapshot) error {
	ims, err := idsOf(ctx, images.List(d.c.image, images.ListOpts{Name: snapshotImage(id), Owner: d.c.projectID}), "images", images.ExtractImages,
		func(im images.Image) (string, bool) { return im.ID, im.Name == snapshotImage(id) })
	if err != nil {
		return err
	}
	for _, im := range ims {
		if err := d.deleteImage(ctx, im); err != nil {
			return err
		}
	}
	if set == nil {
		if set, err = d.snapshotSet(ctx, id); err != nil {
			return err
		}
	}
	for _, s := range set {
		if s.Status == "creating" {
			if err := d.awaitSnapshot(ctx, s.ID, cmp.Or(s.Metadata[metaDisk], s.VolumeID)); err != nil && ctx.Err() != nil {
				return err
			}
		}
		if s.Status == "deleting" {
			continue
		}
		if err := d.deleteSnapshot(ctx, s.ID); err != nil {
			return err
		}
	}
	return nil
}

// RevertSnapshot implements driver.Snapshotter: see the package's
// snapshot notes for why the server is deleted and made again.
func (d *Driver) RevertSnapshot(ctx context.Context, uid string, r driver.RevertRequest) error {
	defer d.lock(uid)()
	set, err := d.snapshotSet(ctx, r.Snapshot)
	if err != nil {
		return err
	}
	if _, ok := d.complete(set, uid); !ok {
		return driver.Terminalf("guest %s has no snapshot %s", uid, r.Snapshot)
	}
	boot := slices.IndexFunc(set, func(s snapshots.Snapshot) bool { return s.Metadata[metaDisk] == rootDiskName })
	if boot < 0 {
		return driver.Terminalf("snapshot %s of guest %s holds no boot disk", r.Snapshot, uid)
	}
	bootVolume, err := volumes.Get(ctx, d.c.volume, set[boot].VolumeID).Extract()
	if err != nil {
		return classify(err, "cannot read boot volume "+set[boot].VolumeID)
	}
	if r.Restore != "" && bootVolume.Metadata[metaRevertedUID] == uid && bootVolume.Metadata[metaLastRestore] == r.Restore {
		return nil
	}
	found, err := d.find(ctx, uid)
	switch {
	case err != nil:
		return err
	case len(found) == 0:
		return driver.NotFoundf("no server with %s %s", MetaUID, uid)
	case imported(found[0].Metadata):
		return driver.Terminalf("server %s was imported, not made by virtfleet: Cinder reverts only detached volumes, and the driver would have to delete the server to detach its boot volume", found[0].ID)
	}
	if err := d.revertable(ctx, set); err != nil {
		return err
	}
	for _, s := range found {
		if err := d.deleteServer(ctx, s.ID); err != nil {
			return err
		}
	}
	d.forget(uid)
	for _, s := range set {
		if err := d.revertVolume(ctx, s); err != nil {
			return err
		}
	}
	md := bootVolume.Metadata
	if md == nil {
		md = map[string]string{}
	}
	md[metaRevertedUID], md[metaLastRestore] = uid, r.Restore
	md[MetaRestarts] = cmp.Or(found[0].Metadata[MetaRestarts], "0")
	_, err = volumes.Update(ctx, d.c.volume, bootVolume.ID, volumes.UpdateOpts{Metadata: md}).Extract()
	return classify(err, "cannot record the revert on boot volume "+bootVolume.ID)
}

// restartsAfterRevert is what a new server of guest uid, booting from
// boot, counts as restarts: what the server a revert deleted had counted.
func restartsAfterRevert(boot *volumes.Volume, uid string) string {
	if boot.Metadata[metaRevertedUID] != uid {
		return "0"
	}
	return cmp.Or(boot.Metadata[MetaRestarts], "0")
}

// revertable fails unless every snapshot of set is its volume's latest,
// which is all Cinder reverts a volume to.
func (d *Driver) revertable(ctx context.Context, set []snapshots.Snapshot) error {
	for _, s := range set {
		newer, err := d.listSnapshots(ctx, snapshots.ListOpts{VolumeID: s.VolumeID}, func(o snapshots.Snapshot) bool {
			return o.ID != s.ID && o.VolumeID == s.VolumeID && o.CreatedAt.After(s.CreatedAt)
		})
		if err != nil {
			return err
		}
		if len(newer) == 0 {
			continue
		}
		names := make([]string, 0, len(newer))
		temporary := false
		for _, o := range newer {
			names = append(names, cmp.Or(o.Metadata[metaSnapshot], o.Name, o.ID))
			temporary = temporary || strings.HasPrefix(o.Name, Prefix+"backup-")
		}
		slices.Sort(names)
		if temporary {
			return errors.Errorf("a backup is reading disk %s: its temporary snapshot is newer than snapshot %s", s.Metadata[metaDisk], s.Metadata[metaSnapshot])
		}
		return driver.Terminalf("Cinder reverts a volume only to its latest snapshot, and disk %s has newer ones (%s): delete them to restore this one, or restore it into a new VM", s.Metadata[metaDisk], strings.Join(names, ", "))
	}
	return nil
}

// unsnapshotted fails while volume id, of disk, has snapshots, which
// Cinder deletes no volume with: a VM's snapshots are the user's to
// delete (Failing: shown, and retried until they are gone); one being
// deleted, or a backup's temporary, goes by itself.
func (d *Driver) unsnapshotted(ctx context.Context, id, disk string) error {
	snaps, err := d.listSnapshots(ctx, snapshots.ListOpts{VolumeID: id}, func(s snapshots.Snapshot) bool { return s.VolumeID == id })
	if err != nil {
		return err
	}
	var kept []string
	for _, s := range snaps {
		if strings.HasPrefix(s.Name, novaSnapshotPrefix+Prefix) && s.Status != "deleting" {
			kept = append(kept, cmp.Or(s.Metadata[metaSnapshot], s.Name))
		}
	}
	switch {
	case len(kept) > 0:
		slices.Sort(kept)
		return driver.Failingf("volume %s has snapshots of its VM (%s): Cinder deletes it once they are deleted", disk, strings.Join(kept, ", "))
	case len(snaps) > 0:
		return errors.Errorf("volume %s has snapshots Cinder is deleting or a backup's temporary one, which go by themselves", disk)
	}
	return nil
}

// deleteServer deletes server id and waits until Nova has, which detaches
// its volumes.
func (d *Driver) deleteServer(ctx context.Context, id string) error {
	if err := servers.Delete(ctx, d.c.compute, id).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
		return classify(err, "cannot delete server "+id)
	}
	return awaitStatus(ctx, "the deletion of server "+id+" for the revert", "gone", func(ctx context.Context) (string, error) {
		s, err := servers.Get(ctx, d.c.compute, id).Extract()
		switch {
		case statusOf(err) == http.StatusNotFound:
			return "gone", nil
		case err != nil:
			return "", classify(err, "cannot read server "+id)
		case s.Status == "DELETED":
			return "gone", nil
		}
		return strings.ToLower(s.Status), nil
	})
}

// revertVolume brings snapshot s's volume back to it, once the volume is
// detached, and waits until Cinder has.
func (d *Driver) revertVolume(ctx context.Context, s snapshots.Snapshot) error {
	what := "volume " + s.VolumeID + " of disk " + s.Metadata[metaDisk]
	if err := d.awaitVolume(ctx, s.VolumeID, what); err != nil {
		return err
	}
	c := *d.c.volume
	c.Microversion = revertMicroversion
	body := struct {
		Revert struct {
			SnapshotID string `json:"snapshot_id"`
		} `json:"revert"`
	}{}
	body.Revert.SnapshotID = s.ID
	if _, err := c.Post(ctx, c.ServiceURL("volumes", s.VolumeID, "action"), body, nil, &gophercloud.RequestOpts{OkCodes: []int{http.StatusAccepted}}); err != nil {
		return classify(err, "cannot revert "+what+" to snapshot "+s.ID)
	}
	// Reverting, then available; error where Cinder failed.
	if err := d.awaitVolume(ctx, s.VolumeID, "the revert of "+what); err != nil {
		return err
	}
	return d.awaitSnapshot(ctx, s.ID, s.Metadata[metaDisk])
}
