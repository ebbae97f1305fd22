package libvirt

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// A restore writes each disk's extents into a raw volume of the driver's
// pool, sparse, one upload per run of nearby extents at its offset (the
// stream carries no holes: go-libvirt sends no sparse streams, and what
// lies between extents is never sent), and then has libvirt copy it into a
// qcow2 volume (StorageVolCreateXMLFrom, qemu-img convert), which skips
// what reads as zeros: the disk takes what its data takes.
//
// An attached volume is copied so under its own name, which Ensure finds.
// The root disk's name is the Machine's, which a restore is not told: its
// raw volume waits, under a name made of the guest's uid, for the Ensure
// that first defines the guest, which copies it into the root disk in place
// of the disk's image (takeRestoredRoot).
//
// A restore cut short (the agent stopped) leaves its raw volumes. An
// attached volume's raw volume exists until its copy is made, so one found
// at the next restore says the upload was not finished. The root's raw
// volume outlives the restore, so a marker volume stands beside it until
// its upload is finished, and the Ensure that finds the marker waits. A
// guest deleted before its restore finished takes both with it.

const (
	// restoreSuffix ends the names of the volumes restores make for
	// themselves: <uid>-<digest of the disk's name>-restore.img.
	restoreSuffix = "-restore.img"
	// restoreBatch is how much one upload sends at most; restoreGap how
	// far apart two extents may be and go in one upload, the gap sent as
	// zeros (which the copy into qcow2 skips again).
	restoreBatch = 8 << 20
	restoreGap   = 256 << 10
)

// restoreVolume is the raw volume the disk name of the guest uid is
// restored into.
func restoreVolume(uid, name string) string {
	sum := sha256.Sum256([]byte(name))
	return uid + "-" + hex.EncodeToString(sum[:6]) + restoreSuffix
}

// restoreMarker stands beside the guest uid's restored root while its
// upload is unfinished.
func restoreMarker(uid string) string { return uid + "-unfinished" + restoreSuffix }

// RestoreDisks implements driver.Backuper. Attached volumes are restored
// into the driver's pool: a DiskSource names no pool.
func (d *Driver) RestoreDisks(ctx context.Context, uid string, sources []driver.DiskSource) error {
	if _, err := parseUUID(uid); err != nil {
		return err
	}
	if d.testDriver {
		return driver.Terminalf("node %s runs libvirt's test driver, which restores no disks", d.node)
	}
	api, _, err := d.api()
	if err != nil {
		return err
	}
	api = rememberPools(api)
	defined := true
	switch _, err := d.domainOf(api, uid); {
	case driver.IsNotFound(err):
		defined = false
	case err != nil:
		return err
	}
	seen := map[string]bool{}
	for _, src := range sources {
		disk := src.Disk()
		switch {
		case disk.Name == "":
			return driver.Terminalf("a disk to restore for guest %s has no name", uid)
		case seen[disk.Name]:
			return driver.Terminalf("disk %s of guest %s is restored twice", disk.Name, uid)
		case disk.Size <= 0:
			return driver.Terminalf("disk %s of guest %s to restore has size %d", disk.Name, uid, disk.Size)
		case disk.Name != rootDiskName && ownVolume(disk.Name):
			return driver.Terminalf("disk %s of guest %s cannot be restored: node %s keeps volumes of that name for itself", disk.Name, uid, d.node)
		}
		seen[disk.Name] = true
		if disk.Name == rootDiskName {
			if defined {
				continue // its root disk is there
			}
			err = d.restoreRoot(ctx, api, uid, src)
		} else {
			err = d.restoreAttached(ctx, api, uid, src)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// restoreRoot writes the root disk src of guest uid into its raw volume,
// for the guest's first Ensure.
func (d *Driver) restoreRoot(ctx context.Context, api API, uid string, src driver.DiskSource) error {
	raw := restoreVolume(uid, rootDiskName)
	made, err := hasVolume(api, d.pool, raw)
	if err != nil {
		return err
	}
	unfinished, err := hasVolume(api, d.pool, restoreMarker(uid))
	switch {
	case err != nil:
		return err
	case made && !unfinished:
		return nil // restored already
	case !unfinished:
		if err := d.makeMarker(api, uid); err != nil {
			return err
		}
	}
	if err := d.uploadRaw(ctx, api, raw, src); err != nil {
		return err
	}
	return deleteVolume(api, d.pool, restoreMarker(uid))
}

// makeMarker makes the marker of the guest uid's unfinished root restore.
func (d *Driver) makeMarker(api API, uid string) error {
	_, err := makeSparse(api, d.pool, restoreMarker(uid), 0, "raw")
	return errors.Wrapf(err, "cannot start the restore of guest %s", uid)
}

// restoreAttached restores the attached volume src of guest uid: written
// into its raw volume, then copied into its own, unless that exists.
func (d *Driver) restoreAttached(ctx context.Context, api API, uid string, src driver.DiskSource) error {
	disk := src.Disk()
	raw := restoreVolume(uid, disk.Name)
	unfinished, err := hasVolume(api, d.pool, raw)
	if err != nil {
		return err
	}
	switch exists, err := hasVolume(api, d.pool, disk.Name); {
	case err != nil:
		return err
	case exists:
		// There before the restore, or copied by it before it was cut
		// short (libvirtd finishes a copy it began): left as it is.
		if unfinished {
			return deleteVolume(api, d.pool, raw)
		}
		return nil
	}
	if err := d.uploadRaw(ctx, api, raw, src); err != nil {
		return err
	}
	p, err := api.StoragePoolLookupByName(d.pool)
	if err != nil {
		return errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	from, err := findVolume(api, d.pool, raw)
	if err != nil {
		return err
	}
	if _, err := createVolumeFrom(api, p, &libvirtxml.StorageVolume{
		Name:     disk.Name,
		Capacity: &libvirtxml.StorageVolumeSize{Value: uint64(disk.Size), Unit: "B"}, //nolint:gosec // checked positive
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: defaultFormat}},
	}, &from); err != nil {
		return errors.Wrapf(err, "cannot restore volume %s", disk.Name)
	}
	return deleteVolume(api, d.pool, raw)
}

// uploadRaw writes src's extents into a new raw volume name of the
// driver's pool, in place of one an earlier restore left.
func (d *Driver) uploadRaw(ctx context.Context, api API, name string, src driver.DiskSource) error {
	disk := src.Disk()
	vol, err := makeSparse(api, d.pool, name, disk.Size, "raw")
	if err != nil {
		return errors.Wrapf(err, "cannot make a volume to restore disk %s into", disk.Name)
	}
	u := uploader{api: api, vol: vol, size: disk.Size}
	err = src.Extents(ctx, func(off int64, b []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return u.add(off, b)
	})
	if err == nil {
		err = u.flush()
	}
	if isCode(err, golibvirt.ErrNoSupport) {
		return driver.Terminal(errors.Wrapf(err, "cannot restore disk %s: the node's libvirt uploads no volumes", disk.Name))
	}
	return errors.Wrapf(err, "cannot restore disk %s", disk.Name)
}

// uploader sends extents into a raw volume in uploads of up to
// restoreBatch, extents restoreGap apart or closer in one.
type uploader struct {
	api  API
	vol  golibvirt.StorageVol
	size int64
	// batch holds what the next upload sends, at off; end is where the
	// last extent ended.
	batch    []byte
	off, end int64
}

func (u *uploader) add(off int64, b []byte) error {
	switch {
	case off < u.end:
		return errors.Errorf("extent at %d comes before the end of the one before, %d", off, u.end)
	case off+int64(len(b)) > u.size:
		return errors.Errorf("extent at %d of %d bytes ends past the disk's %d", off, len(b), u.size)
	}
	if len(u.batch) > 0 && (off-u.end > restoreGap || off+int64(len(b))-u.off > restoreBatch) {
		if err := u.flush(); err != nil {
			return err
		}
	}
	if len(u.batch) == 0 {
		u.off = off
	}
	u.batch = append(u.batch, make([]byte, off-u.off-int64(len(u.batch)))...)
	u.batch = append(u.batch, b...)
	u.end = off + int64(len(b))
	return nil
}

func (u *uploader) flush() error {
	if len(u.batch) == 0 {
		return nil
	}
	err := u.api.StorageVolUpload(u.vol, bytes.NewReader(u.batch), uint64(u.off), uint64(len(u.batch)), 0) //nolint:gosec // offsets are never negative
	u.batch = u.batch[:0]
	return err
}

// takeRestoredRoot makes m's root disk, where it is missing, from the root
// a restore made for the guest (RestoreDisks), and deletes what the
// restore made. Ensure calls it before the guest is first defined, so that
// the disk is there and never made from its image. A restore that is not
// finished is an error: the guest is not to boot without its disk.
func (d *Driver) takeRestoredRoot(api API, m driver.Machine) error {
	if len(m.Disks) == 0 || m.Disks[0].Imported {
		return nil
	}
	raw, err := findVolume(api, d.pool, restoreVolume(m.UID, rootDiskName))
	if driver.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	switch unfinished, err := hasVolume(api, d.pool, restoreMarker(m.UID)); {
	case err != nil:
		return err
	case unfinished:
		return errors.Errorf("guest %s's root disk is being restored, and is not yet whole", m.UID)
	}
	disk := m.Disks[0]
	pool := cmp.Or(disk.Pool, d.pool)
	exists, err := hasVolume(api, pool, disk.Name)
	if err != nil {
		return err
	}
	if !exists {
		p, err := api.StoragePoolLookupByName(pool)
		if err != nil {
			return errors.Wrapf(err, "cannot look up storage pool %s", pool)
		}
		_, capacity, _, err := api.StorageVolGetInfo(raw)
		if err != nil {
			return errors.Wrapf(err, "cannot read volume %s", raw.Name)
		}
		if _, err := createVolumeFrom(api, p, &libvirtxml.StorageVolume{
			Name:     disk.Name,
			Capacity: &libvirtxml.StorageVolumeSize{Value: capacity, Unit: "B"},
			Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: cmp.Or(disk.Format, defaultFormat)}},
		}, &raw); err != nil {
			return errors.Wrapf(err, "cannot make guest %s's root disk from its restore", m.UID)
		}
	}
	// There before (a disk is never rewritten), or copied now.
	return errors.Wrapf(api.StorageVolDelete(raw, 0), "cannot delete volume %s", raw.Name)
}

// sweepBackupVolumes deletes the volumes backups and restores of the guest
// uid left (scratch volumes of a backup cut short, a restore never
// finished or never used) from the driver's pool and pools.
func (d *Driver) sweepBackupVolumes(api API, uid string, pools []string) error {
	done := map[string]bool{}
	for _, pool := range append([]string{d.pool}, pools...) {
		if done[pool] {
			continue
		}
		done[pool] = true
		p, err := api.StoragePoolLookupByName(pool)
		if isCode(err, golibvirt.ErrNoStoragePool) {
			continue
		}
		if err != nil {
			return errors.Wrapf(err, "cannot look up storage pool %s", pool)
		}
		vols, _, err := api.StoragePoolListAllVolumes(p, 1, 0)
		if err != nil {
			return errors.Wrapf(err, "cannot list volumes of storage pool %s", pool)
		}
		for _, v := range vols {
			if !strings.HasPrefix(v.Name, uid+"-") || !(strings.HasSuffix(v.Name, backupSuffix) || strings.HasSuffix(v.Name, restoreSuffix)) {
				continue
			}
			if err := api.StorageVolDelete(v, 0); err != nil && !isCode(err, golibvirt.ErrNoStorageVol) {
				return errors.Wrapf(err, "cannot delete volume %s", v.Name)
			}
		}
	}
	return nil
}
