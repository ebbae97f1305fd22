package nova

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/pagination"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/backupstore"
)

// Backups on nova read a server's volumes through Cinder and Glance, the
// only way into them an agent of a cloud has: each attached volume is
// snapshotted (forced, as it is in use), all of them before any is read,
// so the disks are of one moment as far as the backend's snapshots are; a
// volume is made of each snapshot and uploaded to Glance as a raw image
// (os-volume_upload_image), which the driver then downloads and hands to
// the BackupWriter: Data for each piece that holds anything, Zero for the
// runs of zeros between. The snapshot, the volume and the image are
// temporaries, deleted once the disk is read or the backup fails; one an
// agent that stopped half-way left is deleted by the guest's next backup,
// which names them the same.
//
// Cinder's own backup service (cinder-backup, whose S3 driver writes into
// a bucket) was not chosen: it writes its own objects and metadata, which
// the store's manifests and content-addressed chunks cannot name, so a
// backup it took could be neither deduplicated against the others nor
// restored through the store on a node of another backend.
//
// Cinder keeps no changed-block tracking a tenant can read, so every
// backup reads the disks whole (BackupResult.Full) and there is no
// checkpoint to keep or forget: the store still uploads only the chunks
// it does not have. Nothing freezes the guest's filesystems (Nova quiesces
// only images with a guest agent property, through a server image, not a
// volume snapshot): a backup is as consistent as a power cut at its
// moment.

var _ driver.Backuper = (*Driver)(nil)

// rootDiskName is BackupDisk.Name of the server's boot volume.
const rootDiskName = "root"

// Bounds of the waits for Cinder and Glance: how often a temporary's
// status is read, and how long one step may take. Cinder's copy of a large
// volume into Glance takes as long as the volume is big, on a loaded
// cloud.
const (
	backupPoll        = time.Second
	backupStepTimeout = time.Hour
)

// serverDisk is a volume attached to a server, named as a backup or
// snapshot names it.
type serverDisk struct {
	driver.BackupDisk
	volumeID string
	// imageMeta is the volume's image metadata, which for the boot volume
	// is the server's image properties (its guest agent among them).
	imageMeta map[string]string
}

// backupDisk is a volume of the server and the temporaries it is read
// through.
type backupDisk struct {
	serverDisk
	// temp names the temporaries: the snapshot, the volume made of it and
	// the image uploaded of that.
	temp                      string
	snapshot, volume, imageID string
}

// backupTemp names the temporaries of a backup of disk of guest uid.
func backupTemp(uid, disk string) string { return Prefix + "backup-" + uid + "-" + disk }

// BackUp implements driver.Backuper. The guest may run or not: Cinder
// snapshots an attached volume either way.
func (d *Driver) BackUp(ctx context.Context, uid string, r driver.BackupRequest, w driver.BackupWriter) (res driver.BackupResult, err error) {
	switch {
	case r.ID == "":
		return res, driver.Terminalf("a backup of guest %s needs an ID", uid)
	case d.c.image == nil:
		return res, driver.Terminalf("guest %s cannot be backed up: this cloud's catalog has no image service (Glance), through which the driver reads a volume", uid)
	}
	s, ok := d.cached(uid)
	if !ok {
		return res, driver.NotFoundf("no server with %s %s", MetaUID, uid)
	}
	disks, err := d.backupDisks(ctx, uid, s.ID)
	if err != nil {
		return res, err
	}
	defer func() {
		// Whatever happened: a temporary left behind is deleted by the
		// next backup of the guest, so a failure to delete one fails no
		// backup.
		for i := range disks {
			d.dropTemporaries(context.WithoutCancel(ctx), &disks[i])
		}
	}()
	for i := range disks {
		if err := d.snapshotDisk(ctx, &disks[i]); err != nil {
			return res, err
		}
	}
	for i := range disks {
		if err := d.awaitSnapshot(ctx, disks[i].snapshot, disks[i].Name); err != nil {
			return res, err
		}
	}
	for i := range disks {
		n, err := d.readDisk(ctx, &disks[i], w)
		res.BytesRead += n
		if err != nil {
			return res, err
		}
		d.dropTemporaries(ctx, &disks[i])
	}
	res.Full = true
	return res, nil
}

// CommitBackup implements driver.Backuper: every backup on nova is full,
// and leaves no checkpoint to forget.
func (d *Driver) CommitBackup(context.Context, string, string) error { return nil }

// backupDisks are the volumes attached to server id, the guest uid's, as
// serverDisks names them. Whatever temporaries an earlier backup of the
// guest left are deleted.
func (d *Driver) backupDisks(ctx context.Context, uid, id string) ([]backupDisk, error) {
	_, attached, err := d.serverDisks(ctx, uid, id)
	if err != nil {
		return nil, err
	}
	disks := make([]backupDisk, 0, len(attached))
	for _, a := range attached {
		disk := backupDisk{serverDisk: a, temp: backupTemp(uid, a.Name)}
		if err := d.dropLeftovers(ctx, disk.temp); err != nil {
			return nil, err
		}
		disks = append(disks, disk)
	}
	return disks, nil
}

// serverDisks reads server id, the guest uid's, and the volumes attached
// to it: the boot volume first, named root, then the others by name.
func (d *Driver) serverDisks(ctx context.Context, uid, id string) (*servers.Server, []serverDisk, error) {
	s, err := servers.Get(ctx, d.c.compute, id).Extract()
	switch {
	case statusOf(err) == http.StatusNotFound:
		return nil, nil, driver.NotFoundf("no server with %s %s", MetaUID, uid)
	case err != nil:
		return nil, nil, classify(err, "cannot read server "+id)
	}
	var disks []serverDisk
	for _, a := range s.AttachedVolumes {
		v, err := volumes.Get(ctx, d.c.volume, a.ID).Extract()
		if err != nil {
			return nil, nil, classify(err, "cannot read volume "+a.ID+" of server "+id)
		}
		name := cmp.Or(v.Name, v.ID)
		if name == s.Metadata[MetaBoot] {
			name = rootDiskName
		}
		disks = append(disks, serverDisk{BackupDisk: driver.BackupDisk{Name: name, Size: int64(v.Size) * gib}, volumeID: v.ID, imageMeta: v.VolumeImageMetadata})
	}
	if len(disks) == 0 {
		return nil, nil, driver.Terminalf("guest %s has no disk Cinder can snapshot: server %s has no volume attached", uid, id)
	}
	slices.SortFunc(disks, func(a, b serverDisk) int {
		if (a.Name == rootDiskName) != (b.Name == rootDiskName) {
			if a.Name == rootDiskName {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return s, disks, nil
}

// snapshotDisk asks Cinder for a snapshot of the disk's volume, forced as
// the volume is attached.
func (d *Driver) snapshotDisk(ctx context.Context, disk *backupDisk) error {
	snap, err := snapshots.Create(ctx, d.c.volume, snapshots.CreateOpts{
		VolumeID: disk.volumeID, Force: true, Name: disk.temp, Description: Description,
	}).Extract()
	if err != nil {
		return classify(err, "cannot snapshot volume "+disk.volumeID+" ("+disk.Name+")")
	}
	disk.snapshot = snap.ID
	return nil
}

// awaitSnapshot waits for snapshot id of disk to be available.
func (d *Driver) awaitSnapshot(ctx context.Context, id, disk string) error {
	return awaitStatus(ctx, "snapshot "+id+" of disk "+disk, "available", func(ctx context.Context) (string, error) {
		s, err := snapshots.Get(ctx, d.c.volume, id).Extract()
		if err != nil {
			return "", classify(err, "cannot read snapshot "+id)
		}
		return s.Status, nil
	})
}

// readDisk makes a volume of the disk's snapshot, uploads it to Glance as
// raw and hands its bytes to w. It returns the bytes it read.
func (d *Driver) readDisk(ctx context.Context, disk *backupDisk, w driver.BackupWriter) (int64, error) {
	sizeGiB := int(disk.Size / gib)
	v, err := volumes.Create(ctx, d.c.volume, volumes.CreateOpts{
		Name: disk.temp, Size: sizeGiB, SnapshotID: disk.snapshot, Description: Description,
	}, nil).Extract()
	if err != nil {
		return 0, classify(err, "cannot make a volume of snapshot "+disk.snapshot+" of disk "+disk.Name)
	}
	disk.volume = v.ID
	if err := d.awaitVolume(ctx, disk.volume, "volume "+disk.volume+" of disk "+disk.Name); err != nil {
		return 0, err
	}
	up, err := volumes.UploadImage(ctx, d.c.volume, disk.volume, volumes.UploadImageOpts{
		ImageName: disk.temp, DiskFormat: "raw", ContainerFormat: "bare",
	}).Extract()
	if err != nil {
		return 0, classify(err, "cannot upload volume "+disk.volume+" of disk "+disk.Name+" to Glance")
	}
	disk.imageID = up.ImageID
	// The volume is available again once Cinder wrote all of it.
	if err := d.awaitVolume(ctx, disk.volume, "the upload of disk "+disk.Name+" to Glance"); err != nil {
		return 0, err
	}
	if err := awaitStatus(ctx, "image "+disk.imageID+" of disk "+disk.Name, string(images.ImageStatusActive), func(ctx context.Context) (string, error) {
		im, err := images.Get(ctx, d.c.image, disk.imageID).Extract()
		if err != nil {
			return "", classify(err, "cannot read image "+disk.imageID)
		}
		if im.Status == images.ImageStatusActive && im.SizeBytes != disk.Size {
			return "", errors.Errorf("Glance image %s of disk %s holds %d bytes, and the volume has %d", disk.imageID, disk.Name, im.SizeBytes, disk.Size)
		}
		return string(im.Status), nil
	}); err != nil {
		return 0, err
	}
	body, err := imagedata.Download(ctx, d.c.image, disk.imageID).Extract()
	if err != nil {
		return 0, classify(err, "cannot download image "+disk.imageID+" of disk "+disk.Name)
	}
	defer body.Close() //nolint:errcheck // read-only
	return handDisk(disk.BackupDisk, body, w)
}

// awaitVolume waits for volume id to be available.
func (d *Driver) awaitVolume(ctx context.Context, id, what string) error {
	return awaitStatus(ctx, what, "available", func(ctx context.Context) (string, error) {
		v, err := volumes.Get(ctx, d.c.volume, id).Extract()
		if err != nil {
			return "", classify(err, "cannot read volume "+id)
		}
		return v.Status, nil
	})
}

// awaitStatus waits until status says want. A status that begins with
// "error" (error, error_deleting), or a status that cannot be read, fails
// the wait; so does one that lasts longer than backupStepTimeout.
func awaitStatus(ctx context.Context, what, want string, status func(context.Context) (string, error)) error {
	last := ""
	err := wait.PollUntilContextTimeout(ctx, backupPoll, backupStepTimeout, true, func(ctx context.Context) (bool, error) {
		s, err := status(ctx)
		if err != nil {
			return false, err
		}
		last = s
		if strings.HasPrefix(s, "error") || s == string(images.ImageStatusKilled) || s == string(images.ImageStatusDeleted) {
			return false, errors.Errorf("%s is %s", what, s)
		}
		return s == want, nil
	})
	if err != nil && wait.Interrupted(err) && ctx.Err() == nil {
		return errors.Errorf("%s is still %s after %s", what, cmp.Or(last, "unknown"), backupStepTimeout)
	}
	return err
}

// zeros is a piece of disk that holds nothing, to compare pieces with.
var zeros = make([]byte, backupstore.ChunkSize)

// handDisk hands disk, read from body, to w: body holds the disk whole,
// raw. It is read in the store's chunk windows: a window of zeros is
// handed as Zero (runs of them as one), any other as Data. It returns the
// bytes read, and fails when body holds more or less than the disk.
func handDisk(disk driver.BackupDisk, body io.Reader, w driver.BackupWriter) (int64, error) {
	if err := w.Disk(disk); err != nil {
		return 0, err
	}
	buf := make([]byte, len(zeros))
	var off int64
	zeroFrom := int64(-1)
	flush := func() error {
		if zeroFrom < 0 {
			return nil
		}
		err := w.Zero(zeroFrom, off-zeroFrom)
		zeroFrom = -1
		return err
	}
	for off < disk.Size {
		p := buf[:min(int64(len(buf)), disk.Size-off)]
		n, err := io.ReadFull(body, p)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return off + int64(n), errors.Errorf("disk %s: Glance gave %d of its %d bytes", disk.Name, off+int64(n), disk.Size)
			}
			return off + int64(n), errors.Wrapf(err, "cannot read disk %s from Glance", disk.Name)
		}
		if bytes.Equal(p, zeros[:len(p)]) {
			if zeroFrom < 0 {
				zeroFrom = off
			}
		} else {
			if err := flush(); err != nil {
				return off, err
			}
			if err := w.Data(off, p); err != nil {
				return off, err
			}
		}
		off += int64(len(p))
	}
	if err := flush(); err != nil {
		return off, err
	}
	if n, _ := body.Read(buf[:1]); n > 0 {
		return off, errors.Errorf("disk %s: Glance gave more than its %d bytes", disk.Name, disk.Size)
	}
	return off, nil
}

// dropTemporaries deletes what readDisk made of disk, as far as it can.
func (d *Driver) dropTemporaries(ctx context.Context, disk *backupDisk) {
	if disk.imageID != "" && d.deleteImage(ctx, disk.imageID) == nil {
		disk.imageID = ""
	}
	if disk.volume != "" && d.deleteTempVolume(ctx, disk.volume) == nil {
		disk.volume = ""
	}
	if disk.snapshot != "" && d.deleteSnapshot(ctx, disk.snapshot) == nil {
		disk.snapshot = ""
	}
}

// dropLeftovers deletes the temporaries named name that an earlier backup
// left: the image, the volume, then the snapshot.
func (d *Driver) dropLeftovers(ctx context.Context, name string) error {
	ours := func(n, desc string) bool { return n == name && desc == Description }
	kinds := []struct {
		find func() ([]string, error)
		drop func(context.Context, string) error
	}{
		{func() ([]string, error) {
			return idsOf(ctx, images.List(d.c.image, images.ListOpts{Name: name, Owner: d.c.projectID}), "images", images.ExtractImages,
				func(im images.Image) (string, bool) { return im.ID, im.Name == name })
		}, d.deleteImage},
		{func() ([]string, error) {
			return idsOf(ctx, volumes.List(d.c.volume, volumes.ListOpts{Name: name}), "volumes", volumes.ExtractVolumes,
				func(v volumes.Volume) (string, bool) { return v.ID, ours(v.Name, v.Description) })
		}, d.deleteTempVolume},
		{func() ([]string, error) {
			return idsOf(ctx, snapshots.List(d.c.volume, snapshots.ListOpts{Name: name}), "snapshots", snapshots.ExtractSnapshots,
				func(s snapshots.Snapshot) (string, bool) { return s.ID, ours(s.Name, s.Description) })
		}, d.deleteSnapshot},
	}
	for _, k := range kinds {
		ids, err := k.find()
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := k.drop(ctx, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// idsOf lists all that pager pages, what, and returns the ids of those
// keep keeps.
func idsOf[T any](ctx context.Context, pager pagination.Pager, what string, extract func(pagination.Page) ([]T, error), keep func(T) (string, bool)) ([]string, error) {
	page, err := pager.AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list "+what)
	}
	all, err := extract(page)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read "+what)
	}
	var ids []string
	for _, x := range all {
		if id, ok := keep(x); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (d *Driver) deleteImage(ctx context.Context, id string) error {
	if err := images.Delete(ctx, d.c.image, id).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
		return classify(err, "cannot delete image "+id)
	}
	return nil
}

// deleteTempVolume deletes a temporary volume; one Cinder still uploads
// is refused (400) and left to the next backup.
func (d *Driver) deleteTempVolume(ctx context.Context, id string) error {
	err := volumes.Delete(ctx, d.c.volume, id, volumes.DeleteOpts{}).ExtractErr()
	if err != nil && statusOf(err) != http.StatusNotFound {
		return classify(err, "cannot delete temporary volume "+id)
	}
	return nil
}

func (d *Driver) deleteSnapshot(ctx context.Context, id string) error {
	if err := snapshots.Delete(ctx, d.c.volume, id).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
		return classify(err, "cannot delete snapshot "+id)
	}
	return nil
}
