package libvirt

import (
	"cmp"
	"context"
	"io"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/libvirt/qcow2"
)

// Backups on libvirt use its backup API in push mode: one
// virDomainBackupBegin copies the guest's disks, as they are at that
// moment, into a scratch qcow2 volume each, and creates the backup's
// checkpoint (a persistent dirty bitmap in each disk, named by the backup's
// ID) in the same transaction. An incremental backup copies only what the
// bitmap of the checkpoint it is since marks as written. What the scratch
// volume then holds is the backup: read through libvirt (volume download),
// its L1 and L2 tables say which guest ranges were copied. It is qcow2,
// not raw, because a range that was written and now reads as zeros is a
// zero cluster there, where in a raw file it would be a hole no different
// from what was not copied at all.
//
// What libvirt 9.0 with QEMU 7.2 allows, as found on a real host (see
// backup_qemu_test.go):
//   - A backup, and a checkpoint, only of a running guest ("cannot perform
//     disk backup for inactive domain", "cannot create checkpoint for
//     inactive domain"): a stopped guest's backup is refused as Terminal
//     (see BackUp).
//   - A checkpoint is deleted only on a running guest ("cannot delete
//     checkpoint for inactive domain"); deleting its metadata alone leaves
//     its bitmap in the disk, and a later checkpoint of that name then
//     fails ("Bitmap already exists"). A checkpoint a failed backup of a
//     guest that stopped meanwhile leaves is therefore kept, and deleted by
//     the next backup of that ID or the next commit.
//   - Persistent bitmaps only in qcow2 version 3 disks ("Cannot store
//     dirty bitmaps in qcow2 v2 files"): libvirt makes version 2 unless
//     told, so the driver makes its qcow2 volumes version 3 (compat 1.1),
//     also those a live migration copies into (PrepareIncoming).
//   - Checkpoints and internal snapshots can both be made on one guest, but
//     QEMU refuses to revert an internal snapshot of a disk with bitmaps
//     ("Device has active dirty bitmaps"); the revert of a running guest
//     then stops it, and its bitmaps are left broken. So the two never
//     stand together: TakeSnapshot of a running guest first deletes its
//     checkpoints (its next backup is then full), and refuses a stopped
//     guest with checkpoints, which libvirt cannot delete; BackUp refuses
//     a guest with snapshots, which are the user's to delete first.

var _ driver.Backuper = (*Driver)(nil)

const (
	// backupSuffix ends the names of the scratch volumes backups copy
	// into: <uid>-<target dev>-backup.qcow2, in the disk's pool. One an
	// agent that stopped half-way left is deleted by the next backup of
	// the guest, or with the guest.
	backupSuffix = "-backup.qcow2"
	// backupReadSize is how much one volume download reads, and one
	// BackupWriter.Data call hands, at most.
	backupReadSize = 4 << 20
	// checkpointMark begins the description of every checkpoint the
	// driver makes, followed by the guest's uid. A checkpoint without it
	// is never deleted by the driver.
	checkpointMark = "virtfleet backup of guest "
)

func backupScratch(uid, dev string) string { return uid + "-" + dev + backupSuffix }

// rootDiskName is BackupDisk.Name of a guest's boot disk.
const rootDiskName = "root"

// backingUp are the guests a BackUp reads now, by driver and uid: a second
// one at the same time would delete the first's scratch volumes.
var backingUp = struct {
	sync.Mutex
	now map[backupKey]bool
}{now: map[backupKey]bool{}}

type backupKey struct {
	d   *Driver
	uid string
}

// backupDisk is one disk a backup copies.
type backupDisk struct {
	driver.BackupDisk
	// dev is its target device (vda); pool the pool its scratch volume
	// is made in.
	dev, pool string
	scratch   golibvirt.StorageVol
}

// backupPlan is how a guest is backed up as it runs now.
type backupPlan struct {
	disks []backupDisk
	// skipped are the target devices not backed up: the seed, the swap,
	// read-only media.
	skipped []string
	// freeze: its filesystems are frozen through its agent for the
	// backup's begin.
	freeze bool
}

// BackUp implements driver.Backuper.
//
// A stopped guest is refused as Terminal: libvirt 9.0 backs up, and makes
// checkpoints of, running guests only. Starting it paused for the backup
// was not chosen: the agent's own reconcile resumes a paused guest it
// wants stopped in order to shut it down (so the guest would run), the
// start needs the guest's memory free on the node, and the hub would see
// it flicker through Paused.
func (d *Driver) BackUp(ctx context.Context, uid string, r driver.BackupRequest, w driver.BackupWriter) (res driver.BackupResult, err error) {
	switch {
	case r.ID == "":
		return res, driver.Terminalf("a backup of guest %s needs an ID", uid)
	case r.ID == r.Since:
		return res, driver.Terminalf("backup %s of guest %s cannot be since itself", r.ID, uid)
	case d.testDriver:
		return res, driver.Terminalf("node %s runs libvirt's test driver, which backs up no guest", d.node)
	}
	key := backupKey{d: d, uid: uid}
	backingUp.Lock()
	busy := backingUp.now[key]
	backingUp.now[key] = true
	backingUp.Unlock()
	if busy {
		return res, errors.Errorf("guest %s is being backed up already", uid)
	}
	defer func() {
		backingUp.Lock()
		delete(backingUp.now, key)
		backingUp.Unlock()
	}()

	api, _, err := d.api()
	if err != nil {
		return res, err
	}
	api = rememberPools(api)
	dom, err := d.domainOf(api, uid)
	if err != nil {
		return res, err
	}
	plan, err := d.planBackup(api, dom, uid)
	if err != nil {
		return res, err
	}
	if err := noBackupRunning(api, dom, uid); err != nil {
		return res, err
	}
	// A checkpoint of this ID is one a backup that was cut short left
	// (the agent stopped, or the guest did): taken again from the start.
	// Its deletion loses nothing: every later checkpoint's bitmap records
	// every write since it was made.
	if err := dropCheckpoint(api, dom, uid, r.ID, true); err != nil {
		return res, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, dropCheckpoint(api, dom, uid, r.ID, false))
		}
	}()
	incremental, err := hasBitmaps(api, dom, r.Since, plan.disks)
	if err != nil {
		return res, err
	}
	defer func() {
		// Whatever happened: a scratch volume left behind is deleted by
		// the next backup or with the guest, so a failure to delete one
		// fails no backup.
		for _, disk := range plan.disks {
			if disk.scratch.Name != "" {
				_ = api.StorageVolDelete(disk.scratch, 0)
			}
		}
	}()
	if err := makeScratch(api, dom, uid, plan.disks); err != nil {
		return res, err
	}
	err = whileFrozen(api, dom, plan.freeze, func(frozen bool) error {
		res.Frozen = frozen
		err := beginBackup(api, dom, uid, r.ID, since(r.Since, incremental), plan)
		if incremental && isCode(err, golibvirt.ErrCheckpointInconsistent) {
			// The bitmap is there but broken (QEMU stopped without
			// storing it): after any doubt, the backup is full.
			incremental = false
			err = beginBackup(api, dom, uid, r.ID, "", plan)
		}
		return err
	})
	if err != nil {
		return res, err
	}
	if err := awaitBackup(ctx, api, dom, uid); err != nil {
		return res, err
	}
	res.Full = !incremental
	dl, err := dialDownloads(d.socket, d.uri)
	if err != nil {
		return res, err
	}
	defer dl.Close() //nolint:errcheck // what was read was read
	for _, disk := range plan.disks {
		n, err := handDisk(ctx, dl, disk, incremental, w)
		res.BytesRead += n
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// since is the checkpoint an incremental backup is since, "" for a full
// one.
func since(id string, incremental bool) string {
	if incremental {
		return id
	}
	return ""
}

// planBackup plans the backup of dom, the guest uid's, as it runs now. It
// refuses a guest that is not running, that has snapshots (to be deleted
// first: see above), or that has a disk a checkpoint cannot keep a bitmap
// in.
func (d *Driver) planBackup(api API, dom golibvirt.Domain, uid string) (backupPlan, error) {
	_, x, err := d.describeXML(api, dom, uid, 0)
	if err != nil {
		return backupPlan{}, err
	}
	state, _, err := api.DomainGetState(dom, 0)
	if err != nil {
		return backupPlan{}, errors.Wrap(err, "cannot read domain state")
	}
	if !active(golibvirt.DomainState(state)) {
		return backupPlan{}, stoppedGuest(uid)
	}
	_, snapshots, err := api.DomainListAllSnapshots(dom, 0, 0)
	if err != nil {
		return backupPlan{}, errors.Wrap(err, "cannot count snapshots")
	}
	if snapshots > 0 {
		return backupPlan{}, driver.Terminalf("guest %s cannot be backed up while it has snapshots (%d): delete its snapshots first, then back it up. A backup's checkpoint keeps a dirty bitmap in each disk, and QEMU 7.2 refuses to revert an internal snapshot of a disk with one (\"Device has active dirty bitmaps\")", uid, snapshots)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(x); err != nil {
		return backupPlan{}, errors.Wrap(err, "cannot parse domain XML")
	}
	plan := backupPlan{freeze: golibvirt.DomainState(state) == golibvirt.DomainRunning}
	if def.Devices == nil {
		return plan, nil
	}
	key := formatUUID(dom.UUID)
	root := rootDisk(def.Devices.Disks)
	for i, disk := range def.Devices.Disks {
		if disk.Target == nil {
			continue
		}
		var vol *libvirtxml.DomainDiskSourceVolume
		if disk.Source != nil {
			vol = disk.Source.Volume
		}
		format := "raw" // what libvirt takes a disk without a format for
		if disk.Driver != nil && disk.Driver.Type != "" {
			format = disk.Driver.Type
		}
		switch {
		case disk.ReadOnly != nil, disk.Source == nil, disk.Device == "cdrom", disk.Device == "floppy",
			vol != nil && (vol.Volume == seedVolume(key) || vol.Volume == swapVolume(key)), disk.Serial == swapSerial:
			// What the guest does not write, and its swap: nothing a
			// restored guest needs (a seed is made afresh at every
			// definition, a swap formatted at every boot).
			plan.skipped = append(plan.skipped, disk.Target.Dev)
			continue
		case format != "qcow2":
			return backupPlan{}, driver.Terminalf("guest %s cannot be backed up: its %s (%s) is %s, and a backup's checkpoint keeps its dirty bitmap in qcow2 disks only; nothing was backed up", uid, diskName(disk), disk.Target.Dev, format)
		}
		bd, err := backupDiskOf(api, dom, uid, disk, i == root)
		if err != nil {
			return backupPlan{}, err
		}
		if bd.pool == "" {
			bd.pool = d.pool
		}
		plan.disks = append(plan.disks, bd)
	}
	return plan, nil
}

// stoppedGuest is the error of a backup of a guest that does not run.
func stoppedGuest(uid string) error {
	return driver.Terminalf("guest %s is not running, and libvirt 9.0 backs up only running guests (\"cannot perform disk backup for inactive domain\"); back it up while it runs", uid)
}

// rootDisk is the index of the disk the guest boots from: the one with
// boot order 1, or the first writable disk of a definition without boot
// orders.
func rootDisk(disks []libvirtxml.DomainDisk) int {
	first := -1
	for i, disk := range disks {
		if disk.Boot != nil && disk.Boot.Order == 1 {
			return i
		}
		if first < 0 && disk.ReadOnly == nil && disk.Device != "cdrom" && disk.Device != "floppy" {
			first = i
		}
	}
	return first
}

// backupDiskOf names disk, of dom, in a backup and reads its size. A qcow2
// version 2 volume is refused: QEMU keeps no bitmap in it.
func backupDiskOf(api API, dom golibvirt.Domain, uid string, disk libvirtxml.DomainDisk, root bool) (backupDisk, error) {
	bd := backupDisk{dev: disk.Target.Dev}
	vol := disk.Source.Volume
	switch {
	case root:
		bd.Name = rootDiskName
	case vol != nil:
		bd.Name = vol.Volume
	case disk.Source.File != nil:
		bd.Name = path.Base(disk.Source.File.File)
	default:
		bd.Name = disk.Target.Dev
	}
	if vol == nil {
		_, capacity, _, err := api.DomainGetBlockInfo(dom, bd.dev, 0)
		if err != nil {
			return backupDisk{}, errors.Wrapf(err, "cannot read the size of disk %s", bd.dev)
		}
		bd.Size = int64(capacity) //nolint:gosec // a disk's size fits
		return bd, nil
	}
	bd.pool = vol.Pool
	v, err := findVolume(api, vol.Pool, vol.Volume)
	if err != nil {
		return backupDisk{}, errors.Wrapf(err, "cannot find disk %s to back up", bd.dev)
	}
	def, err := volumeDef(api, v)
	if err != nil {
		return backupDisk{}, err
	}
	// libvirt says compat 1.1 of a version 3 image, and nothing of a
	// version 2 one.
	if def.Target == nil || def.Target.Compat == "" || def.Target.Compat == "0.10" {
		return backupDisk{}, driver.Terminalf("guest %s cannot be backed up: its %s (%s) is qcow2 version 2 (compat 0.10), made before the driver made version 3 disks or by libvirt for a live migration to a node without the disk's image, and QEMU keeps no dirty bitmap in it (\"Cannot store dirty bitmaps in qcow2 v2 files\"); nothing was backed up", uid, diskName(disk), bd.dev)
	}
	if def.Capacity != nil {
		bd.Size = bytesOfVolume(def.Capacity)
	}
	return bd, nil
}

// bytesOfVolume is a volume size in bytes.
func bytesOfVolume(s *libvirtxml.StorageVolumeSize) int64 {
	mult := map[string]int64{
		"": 1, "b": 1, "bytes": 1, "B": 1,
		"k": 1 << 10, "KiB": 1 << 10, "KB": 1000,
		"M": 1 << 20, "MiB": 1 << 20, "MB": 1000 * 1000,
		"G": 1 << 30, "GiB": 1 << 30, "GB": 1000 * 1000 * 1000,
		"T": 1 << 40, "TiB": 1 << 40, "TB": 1000 * 1000 * 1000 * 1000,
	}[s.Unit]
	return int64(s.Value) * cmp.Or(mult, 1) //nolint:gosec // a volume's size fits
}

// hasBitmaps says whether checkpoint id of dom has a bitmap of every disk
// in disks: an incremental backup since it can be taken. No id, or a
// checkpoint the guest no longer has, is a full backup.
func hasBitmaps(api API, dom golibvirt.Domain, id string, disks []backupDisk) (bool, error) {
	if id == "" {
		return false, nil
	}
	c, found, err := lookupCheckpoint(api, dom, id)
	if err != nil || !found {
		return false, err
	}
	x, err := api.DomainCheckpointGetXMLDesc(c, uint32(golibvirt.DomainCheckpointXMLNoDomain))
	if isCode(err, golibvirt.ErrNoDomainCheckpoint) {
		return false, nil
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot read checkpoint %s", id)
	}
	var def libvirtxml.DomainCheckpoint
	if err := def.Unmarshal(x); err != nil {
		return false, errors.Wrapf(err, "cannot parse checkpoint %s", id)
	}
	bitmaps := map[string]bool{}
	if def.Disks != nil {
		for _, disk := range def.Disks.Disks {
			bitmaps[disk.Name] = disk.Checkpoint == "bitmap"
		}
	}
	for _, disk := range disks {
		if !bitmaps[disk.dev] {
			// A disk the guest did not have then: all of it is new.
			return false, nil
		}
	}
	return true, nil
}

// lookupCheckpoint looks checkpoint id of dom up; false when dom has none
// of that name.
func lookupCheckpoint(api API, dom golibvirt.Domain, id string) (golibvirt.DomainCheckpoint, bool, error) {
	c, err := api.DomainCheckpointLookupByName(dom, id, 0)
	switch {
	case isCode(err, golibvirt.ErrNoDomainCheckpoint):
		return c, false, nil
	case isCode(err, golibvirt.ErrNoDomain):
		return c, false, driver.NotFoundf("no domain with uuid %s", formatUUID(dom.UUID))
	case err != nil:
		return c, false, errors.Wrapf(err, "cannot look up checkpoint %s", id)
	}
	return c, true, nil
}

// dropCheckpoint deletes checkpoint id of dom, the guest uid's, where the
// driver made it. One of that name the driver did not make is a Terminal
// error where refuse is set, and left alone otherwise. On a guest that does
// not run it is kept: libvirt 9.0 deletes checkpoints of running guests
// only, and deleting its metadata alone would leave its bitmap in the
// disks, in the way of the next checkpoint of that name.
func dropCheckpoint(api API, dom golibvirt.Domain, uid, id string, refuse bool) error {
	c, found, err := lookupCheckpoint(api, dom, id)
	if err != nil || !found {
		return err
	}
	ours, err := madeByDriver(api, c, uid)
	switch {
	case err != nil:
		return err
	case !ours && refuse:
		return driver.Terminalf("domain %s has a checkpoint named %s that virtfleet did not make for guest %s", dom.Name, id, uid)
	case !ours:
		return nil
	}
	return deleteCheckpoint(api, c, uid)
}

// deleteCheckpoint deletes checkpoint c of the guest uid; one already gone
// is deleted, one of a guest that does not run is kept (see
// dropCheckpoint).
func deleteCheckpoint(api API, c golibvirt.DomainCheckpoint, uid string) error {
	err := api.DomainCheckpointDelete(c, 0)
	switch {
	case err == nil, isCode(err, golibvirt.ErrNoDomainCheckpoint, golibvirt.ErrNoDomain):
		return nil
	case isCode(err, golibvirt.ErrOperationUnsupported, golibvirt.ErrOperationInvalid):
		if state, _, serr := api.DomainGetState(c.Dom, 0); serr == nil && !active(golibvirt.DomainState(state)) {
			return nil
		}
	}
	return errors.Wrapf(err, "cannot delete checkpoint %s of guest %s", c.Name, uid)
}

// madeByDriver is whether the driver made checkpoint c for the guest uid.
func madeByDriver(api API, c golibvirt.DomainCheckpoint, uid string) (bool, error) {
	x, err := api.DomainCheckpointGetXMLDesc(c, uint32(golibvirt.DomainCheckpointXMLNoDomain))
	if isCode(err, golibvirt.ErrNoDomainCheckpoint) {
		return true, nil // gone: deleting it is a no-op
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot read checkpoint %s", c.Name)
	}
	var def libvirtxml.DomainCheckpoint
	if err := def.Unmarshal(x); err != nil {
		return false, errors.Wrapf(err, "cannot parse checkpoint %s", c.Name)
	}
	return def.Description == checkpointMark+uid, nil
}

// noBackupRunning fails while dom runs a backup job: one an agent that
// stopped left runs on into its scratch volumes, and with its checkpoint,
// until it ends by itself.
func noBackupRunning(api API, dom golibvirt.Domain, uid string) error {
	_, err := api.DomainBackupGetXMLDesc(dom, 0)
	switch {
	case err == nil:
		return errors.Errorf("guest %s has a backup running, which an agent that stopped left; it ends by itself", uid)
	case isCode(err, golibvirt.ErrNoDomainBackup):
		return nil
	}
	return errors.Wrap(err, "cannot read the guest's backup job")
}

// makeScratch makes each disk's scratch volume, empty, in place of one an
// earlier backup left. It is made here, not by libvirt at the backup's
// begin, so that it is a volume of the pool, named as the driver's own.
func makeScratch(api API, dom golibvirt.Domain, uid string, disks []backupDisk) error {
	for i := range disks {
		disk := &disks[i]
		var err error
		disk.scratch, err = makeSparse(api, disk.pool, backupScratch(formatUUID(dom.UUID), disk.dev), disk.Size, "qcow2")
		if err != nil {
			return errors.Wrapf(err, "cannot make the scratch volume of disk %s of guest %s", disk.dev, uid)
		}
	}
	return nil
}

// makeSparse makes volume name of pool, of size bytes in format, empty and
// sparse, in place of one of that name: a volume a backup makes for the
// while. It is not checked against the pool's room: it takes what is
// written into it, and a pool that runs out fails the backup, never a
// guest.
func makeSparse(api API, pool, name string, size int64, format string) (golibvirt.StorageVol, error) {
	if err := deleteVolume(api, pool, name); err != nil {
		return golibvirt.StorageVol{}, err
	}
	return createSparse(api, pool, name, size, format)
}

// createSparse makes volume name of pool, of size bytes in format (qcow2
// in version 3), empty and sparse, unchecked against the pool's room (see
// makeSparse). A volume of that name is not replaced: libvirt refuses it.
func createSparse(api API, pool, name string, size int64, format string) (golibvirt.StorageVol, error) {
	p, err := api.StoragePoolLookupByName(pool)
	if err != nil {
		return golibvirt.StorageVol{}, errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	target := &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: format}}
	if format == "qcow2" {
		target.Compat = qcow2Compat
	}
	x, err := (&libvirtxml.StorageVolume{
		Name:       name,
		Capacity:   &libvirtxml.StorageVolumeSize{Value: uint64(max(size, 0)), Unit: "B"},
		Allocation: &libvirtxml.StorageVolumeSize{Value: 0, Unit: "B"},
		Target:     target,
	}).Marshal()
	if err != nil {
		return golibvirt.StorageVol{}, errors.Wrap(err, "cannot marshal volume XML")
	}
	v, err := api.StorageVolCreateXML(p, x, 0)
	return v, errors.Wrapf(err, "cannot create volume %s", name)
}

// sweepBackupVolumes deletes the scratch volumes backups of the guest uid
// left (an agent that stopped half-way) from the driver's pool and pools.
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
			if !strings.HasPrefix(v.Name, uid+"-") || !strings.HasSuffix(v.Name, backupSuffix) {
				continue
			}
			if err := api.StorageVolDelete(v, 0); err != nil && !isCode(err, golibvirt.ErrNoStorageVol) {
				return errors.Wrapf(err, "cannot delete volume %s", v.Name)
			}
		}
	}
	return nil
}

// beginBackup begins the backup of plan's disks into their scratch
// volumes, incremental since checkpoint since unless it is empty, and
// creates checkpoint id with it.
func beginBackup(api API, dom golibvirt.Domain, uid, id, since string, plan backupPlan) error {
	backup := libvirtxml.DomainBackup{Incremental: since, Push: &libvirtxml.DomainBackupPush{Disks: &libvirtxml.DomainBackupPushDisks{}}}
	checkpoint := libvirtxml.DomainCheckpoint{Name: id, Description: checkpointMark + uid, Disks: &libvirtxml.DomainCheckpointDisks{}}
	for _, disk := range plan.disks {
		path, err := api.StorageVolGetPath(disk.scratch)
		if err != nil {
			return errors.Wrapf(err, "cannot read the path of volume %s", disk.scratch.Name)
		}
		backup.Push.Disks.Disks = append(backup.Push.Disks.Disks, libvirtxml.DomainBackupPushDisk{
			Name:   disk.dev,
			Backup: "yes",
			Driver: &libvirtxml.DomainBackupDiskDriver{Type: "qcow2"},
			Target: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}},
		})
		checkpoint.Disks.Disks = append(checkpoint.Disks.Disks, libvirtxml.DomainCheckpointDisk{Name: disk.dev, Checkpoint: "bitmap"})
	}
	for _, dev := range plan.skipped {
		backup.Push.Disks.Disks = append(backup.Push.Disks.Disks, libvirtxml.DomainBackupPushDisk{Name: dev, Backup: "no"})
		checkpoint.Disks.Disks = append(checkpoint.Disks.Disks, libvirtxml.DomainCheckpointDisk{Name: dev, Checkpoint: "no"})
	}
	bx, err := backup.Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot marshal backup XML")
	}
	cx, err := checkpoint.Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot marshal checkpoint XML")
	}
	// The scratch volumes are the pool's, made above in the format the
	// backup writes: reused, not made again by libvirt.
	err = api.DomainBackupBegin(dom, bx, golibvirt.OptString{cx}, golibvirt.DomainBackupBeginReuseExternal)
	switch {
	case err == nil:
		return nil
	case isCode(err, golibvirt.ErrNoDomain):
		return driver.NotFoundf("no domain with uuid %s", uid)
	case isCode(err, golibvirt.ErrCheckpointInconsistent):
		return err
	}
	if state, _, serr := api.DomainGetState(dom, 0); serr == nil && !active(golibvirt.DomainState(state)) {
		return stoppedGuest(uid)
	}
	if isCode(err, append(permanentCodes, golibvirt.ErrOperationUnsupported)...) {
		return driver.Terminal(errors.Wrapf(err, "libvirt refused backup %s of guest %s", id, uid))
	}
	return errors.Wrapf(err, "cannot begin backup %s of guest %s", id, uid)
}

// Bounds of the wait for a backup job: how often it is looked at, and how
// long one that was aborted may take to end.
const (
	backupPollFirst = 50 * time.Millisecond
	backupPollMost  = time.Second
	backupAbortWait = 30 * time.Second
)

// awaitBackup waits for dom's backup job to end, and says how it ended.
// When ctx ends first the job is aborted, and waited for a little more, so
// that what it wrote into can go.
func awaitBackup(ctx context.Context, api API, dom golibvirt.Domain, uid string) error {
	if err := jobEnd(ctx, api, dom, uid); err != nil {
		if ctx.Err() == nil {
			return err
		}
		if err := api.DomainAbortJob(dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
			return errors.Wrap(err, "cannot abort the backup job")
		}
		abort, cancel := context.WithTimeout(context.WithoutCancel(ctx), backupAbortWait)
		defer cancel()
		if err := jobEnd(abort, api, dom, uid); err != nil {
			return errors.Wrapf(ctx.Err(), "backup aborted, and its job has not ended yet (%v)", err)
		}
		return errors.Wrap(ctx.Err(), "backup aborted")
	}
	typ, params, err := api.DomainGetJobStats(dom, golibvirt.DomainJobStatsCompleted)
	if err != nil {
		return errors.Wrap(err, "cannot read how the backup job ended")
	}
	switch golibvirt.DomainJobType(typ) {
	case golibvirt.DomainJobCompleted:
		return nil
	case golibvirt.DomainJobCancelled:
		return errors.Errorf("the backup of guest %s was cancelled: %s", uid, jobError(params))
	case golibvirt.DomainJobFailed:
		return errors.Errorf("the backup of guest %s failed: %s", uid, jobError(params))
	}
	// A guest that stopped took its job's account with it.
	if state, _, serr := api.DomainGetState(dom, 0); serr == nil && !active(golibvirt.DomainState(state)) {
		return errors.Errorf("guest %s stopped while it was backed up", uid)
	}
	return errors.Errorf("the backup job of guest %s ended, and libvirt kept no account of how", uid)
}

// jobEnd waits until dom has no job, or ctx ends.
func jobEnd(ctx context.Context, api API, dom golibvirt.Domain, uid string) error {
	wait := backupPollFirst
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		if err := ctx.Err(); err != nil {
			// Ended before the job: it is aborted whether or not it
			// ended too.
			return err
		}
		typ, _, err := api.DomainGetJobStats(dom, 0)
		switch {
		case isCode(err, golibvirt.ErrNoDomain):
			return driver.NotFoundf("no domain with uuid %s", uid)
		case err != nil:
			return errors.Wrap(err, "cannot read the backup job")
		case golibvirt.DomainJobType(typ) == golibvirt.DomainJobNone:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, backupPollMost)
		t.Reset(wait)
	}
}

// jobError is the error message of a job's statistics.
func jobError(params []golibvirt.TypedParam) string {
	for _, p := range params {
		if s, ok := p.Value.I.(string); ok && p.Field == golibvirt.DomainJobErrmsg {
			return s
		}
	}
	return "libvirt gave no reason"
}

// handDisk reads disk's scratch volume and hands what it holds to w: the
// data clusters, and for an incremental backup the zero clusters. It
// returns the bytes of data it read.
func handDisk(ctx context.Context, dl *downloads, disk backupDisk, incremental bool, w driver.BackupWriter) (int64, error) {
	if err := w.Disk(disk.BackupDisk); err != nil {
		return 0, err
	}
	im, err := qcow2.Open(&volumeReader{ctx: ctx, dl: dl, vol: disk.scratch})
	if err != nil {
		return 0, errors.Wrapf(err, "cannot read what the backup of disk %s copied", disk.dev)
	}
	im.SetReadSize(backupReadSize)
	exts, err := im.Map()
	if err != nil {
		return 0, errors.Wrapf(err, "cannot read what the backup of disk %s copied", disk.dev)
	}
	// What a full backup did not hand reads as zeros anyway.
	var zero func(off, length int64) error
	if incremental {
		zero = w.Zero
	}
	var read int64
	err = im.Read(exts, backupReadSize, func(off int64, p []byte) error {
		read += int64(len(p))
		return w.Data(off, p)
	}, zero)
	return read, err
}

// volumeReader reads a volume through libvirt's volume download (see
// downloads): one stream per read, so its reader reads in large pieces.
type volumeReader struct {
	ctx context.Context
	dl  *downloads
	vol golibvirt.StorageVol
}

func (v *volumeReader) ReadAt(p []byte, off int64) (int, error) {
	if err := v.ctx.Err(); err != nil {
		return 0, err
	}
	w := &sliceWriter{p: p}
	if err := v.dl.download(v.ctx, v.vol, uint64(off), uint64(len(p)), w); err != nil { //nolint:gosec // offsets are never negative
		return w.n, errors.Wrapf(err, "cannot download volume %s", v.vol.Name)
	}
	if w.n < len(p) {
		return w.n, io.ErrUnexpectedEOF
	}
	return w.n, nil
}

// sliceWriter fills p, and refuses more.
type sliceWriter struct {
	p []byte
	n int
}

func (s *sliceWriter) Write(b []byte) (int, error) {
	n := copy(s.p[s.n:], b)
	s.n += n
	if n < len(b) {
		return n, io.ErrShortWrite
	}
	return n, nil
}

// CommitBackup implements driver.Backuper. It deletes the guest's other
// checkpoints that the driver made, the newest first; libvirt 9.0 deletes
// checkpoints of running guests only, so on a stopped guest it fails, to
// be tried again once it runs.
func (d *Driver) CommitBackup(_ context.Context, uid, id string) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	dom, err := d.domainOf(api, uid)
	if err != nil {
		return err
	}
	if _, err := d.describe(api, dom, uid, golibvirt.DomainXMLInactive); err != nil {
		return err
	}
	return forgetCheckpointsBut(api, dom, uid, id)
}

// forgetCheckpointsBut deletes the checkpoints the driver made of dom, the
// guest uid's, but keep (none where keep is empty), the newest first.
// libvirt 9.0 deletes checkpoints of running guests only: on a stopped
// guest it fails.
func forgetCheckpointsBut(api API, dom golibvirt.Domain, uid, keep string) error {
	// Parents before children: deleted from the end, every checkpoint
	// goes before the one it was made after.
	all, _, err := api.DomainListAllCheckpoints(dom, 1, uint32(golibvirt.DomainCheckpointListTopological))
	switch {
	case isCode(err, golibvirt.ErrNoSupport):
		return nil // libvirt's test driver keeps no checkpoints
	case isCode(err, golibvirt.ErrNoDomain):
		return driver.NotFoundf("no domain with uuid %s", uid)
	case err != nil:
		return errors.Wrap(err, "cannot list checkpoints")
	}
	for i := len(all) - 1; i >= 0; i-- {
		c := all[i]
		if c.Name == keep {
			continue
		}
		ours, err := madeByDriver(api, c, uid)
		if err != nil {
			return err
		}
		if !ours {
			continue
		}
		if err := api.DomainCheckpointDelete(c, 0); err != nil && !isCode(err, golibvirt.ErrNoDomainCheckpoint) {
			if state, _, serr := api.DomainGetState(dom, 0); serr == nil && !active(golibvirt.DomainState(state)) {
				return errors.Wrapf(err, "cannot forget checkpoint %s of guest %s while it is stopped: libvirt 9.0 deletes checkpoints of running guests only", c.Name, uid)
			}
			return errors.Wrapf(err, "cannot delete checkpoint %s of guest %s", c.Name, uid)
		}
	}
	return nil
}

// forgetCheckpoints deletes the checkpoints of dom, the guest uid's that
// is being deleted, while it runs: their bitmaps go from its disks with
// them, where the disks outlive it (an attached volume), and a snapshot of
// a later guest of the disks can be reverted. The checkpoints of a guest
// that does not run cannot be deleted (libvirt 9.0); their bitmaps stay.
func forgetCheckpoints(api API, dom golibvirt.Domain, uid string) error {
	all, _, err := api.DomainListAllCheckpoints(dom, 1, uint32(golibvirt.DomainCheckpointListTopological))
	switch {
	case isCode(err, golibvirt.ErrNoSupport, golibvirt.ErrNoDomain):
		return nil
	case err != nil:
		return errors.Wrap(err, "cannot list checkpoints")
	case len(all) == 0:
		return nil
	}
	for i := len(all) - 1; i >= 0; i-- {
		if err := deleteCheckpoint(api, all[i], uid); err != nil {
			return err
		}
	}
	return nil
}

// checkpointCount is how many checkpoints dom has; none on a backend
// without checkpoints (libvirt's test driver).
func checkpointCount(api API, dom golibvirt.Domain) (int32, error) {
	_, n, err := api.DomainListAllCheckpoints(dom, 0, 0)
	if isCode(err, golibvirt.ErrNoSupport) {
		return 0, nil
	}
	return n, errors.Wrap(err, "cannot count checkpoints")
}
