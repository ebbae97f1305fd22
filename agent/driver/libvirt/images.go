package libvirt

import (
	"cmp"
	"context"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// A node keeps each image once, as the volume image_<uid> in the driver's
// pool. It is downloaded to a file in ImageDir by the driver's import store
// (package imageimport: within the download policy, verified, inspected),
// and only then made a volume, so a failed, refused or interrupted download
// leaves nothing in the pool.

// imagePrefix starts the names of image volumes; disks are named
// <namespace>_<name> and Kubernetes names have no "_", so they never clash.
const imagePrefix = "image_"

func imageVolume(uid string) string { return imagePrefix + uid }

// defaultPruneEvery is how often images are pruned unless configured.
const defaultPruneEvery = time.Minute

// newImports makes the import store cfg configures, on the driver's clock.
func (d *Driver) newImports(cfg imageimport.Config) *imageimport.Imports {
	cfg.Now = func() time.Time { return d.now() }
	return imageimport.New(cfg)
}

// prepareImages makes sure the images of m's missing disks are on the node.
// It returns a progress message while imports run, and a Failing error when
// one failed. The caller holds imagesInUse for reading.
func (d *Driver) prepareImages(api API, m driver.Machine) (string, error) {
	var waiting []string
	for _, disk := range m.Disks {
		if disk.Image == nil {
			continue
		}
		exists, err := hasVolume(api, cmp.Or(disk.Pool, d.pool), disk.Name)
		if err != nil {
			return "", err
		}
		if exists {
			continue
		}
		if ext := disk.Image.ExternalName; ext != "" {
			return "", driver.Terminalf("volume %s is made from image %s, which imports %q by external name: a libvirt node imports images from a url or a Volume; import an existing volume of the node as a Volume by external name instead", disk.Name, disk.Image.Name, ext)
		}
		if d.inSharedPool(disk.Pool) {
			// It would be a copy of the image, made by the first node
			// to use it; one left half-copied by a node that died
			// would be found by the next and booted as it is.
			return "", driver.Terminalf("volume %s in shared pool %s cannot be made from an image yet: make it without one, or in the node's own pool", disk.Name, disk.Pool)
		}
		msg, err := d.ensureImage(api, disk.Image)
		if err != nil {
			return "", err
		}
		if msg != "" {
			waiting = append(waiting, msg)
		}
	}
	return strings.Join(waiting, "; "), nil
}

// ensureImage returns "" when img is on the node, starts or joins its import
// otherwise and returns its progress, or returns the last import's error
// while the backoff after it lasts. The import runs for as long as the
// driver does, not the Ensure that started it.
func (d *Driver) ensureImage(api API, img *driver.Image) (string, error) {
	d.pruneClock.SetPruneAfter(img.UID, img.PruneAfter)
	return d.images.Ensure(d.ctx, img, func() (bool, error) { return d.hasImage(api, img) }, d.importImage)
}

// importImage downloads img (verified and inspected), or makes it of a
// disk of a backup (a raw file), and stores it as its volume; or clones it
// from its source volume (clone.go), as it is or as it was in a snapshot
// (snapshotcopy.go).
func (d *Driver) importImage(ctx context.Context, img *driver.Image, job *imageimport.Job) error {
	if img.SourceSnapshot != "" {
		return d.snapshotImage(ctx, img, job)
	}
	if img.SourceVolume != "" {
		return d.cloneImage(img, job)
	}
	fetch := job.Download
	if img.Backup != nil {
		fetch = job.FromBackup
	}
	path, size, err := fetch(ctx, img)
	if err != nil {
		return err
	}
	defer os.Remove(path) //nolint:errcheck // a leftover temp file is harmless
	api, _, err := d.api()
	if err != nil {
		return err
	}
	return d.storeImage(api, img, path, size)
}

// storeImage makes the verified file at path the image's volume, marked
// unfinished (uploadMarker, see clone.go) until all of it is there, so that
// an agent or libvirtd killed mid-upload leaves nothing hasImage takes for
// the image. libvirt's test driver cannot upload, so there the volume of the
// right size stands for the file. A failed upload deletes the volume again.
func (d *Driver) storeImage(api API, img *driver.Image, path string, size int64) error {
	p, err := api.StoragePoolLookupByName(d.pool)
	if err != nil {
		return errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	_, capacity, _, available, err := api.StoragePoolGetInfo(p)
	if err != nil {
		return errors.Wrapf(err, "cannot read storage pool %s", d.pool)
	}
	if uint64(size) > available {
		return errors.Errorf("cannot import image %s: it needs %d bytes but storage pool %q on node %s has %d of %d bytes free", img.Name, size, d.pool, d.node, available, capacity)
	}
	if err := d.startImage(api, p, img); err != nil {
		return err
	}
	err = d.uploadImage(api, p, img, path, size)
	if err != nil {
		if derr := deleteVolume(api, d.pool, imageVolume(img.UID)); derr != nil {
			// The marker stays: the next attempt deletes the volume.
			return errors.Errorf("%w (and the partial image stays until the next attempt: %v)", err, derr)
		}
	}
	marker, _ := markerOf(img)
	if derr := deleteVolume(api, d.pool, marker); err == nil && derr != nil {
		return errors.Wrapf(derr, "cannot finish the upload of image %s", img.Name)
	}
	return err
}

// uploadPrefix starts the names of the markers of image volumes being
// uploaded (clone.go). Like image_, it cannot be a <namespace>_<name> disk
// of a Volume, whose names are Kubernetes names.
const uploadPrefix = "uploading_"

func uploadMarker(uid string) string { return uploadPrefix + uid }

// uploadImage creates img's volume and uploads the file at path, of size
// bytes, into it. The volume is made with no allocation, so that libvirt
// leaves a raw one a sparse file of zeros rather than writing size bytes
// first, and only the file's data is sent, one upload per range of it: its
// holes read as zeros locally and in the volume alike, and a raw image of
// a disk is mostly holes. Streaming them as zeros took several times as
// long and allocated them all.
func (d *Driver) uploadImage(api API, p golibvirt.StoragePool, img *driver.Image, path string, size int64) error {
	x, err := (&libvirtxml.StorageVolume{
		Name:       imageVolume(img.UID),
		Capacity:   &libvirtxml.StorageVolumeSize{Value: uint64(size), Unit: "B"},
		Allocation: &libvirtxml.StorageVolumeSize{Value: 0, Unit: "B"},
		Target:     &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: cmp.Or(img.Format, defaultFormat)}},
	}).Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot marshal volume XML")
	}
	v, err := api.StorageVolCreateXML(p, x, 0)
	if err != nil {
		return errors.Wrapf(err, "cannot create the volume of image %s", img.Name)
	}
	if d.testDriver {
		return nil
	}
	written, length, err := volumeBytes(api, v)
	if err != nil {
		return errors.Wrapf(err, "cannot read the new volume of image %s", img.Name)
	}
	f, err := os.Open(path) //nolint:gosec // our own download file
	if err != nil {
		return errors.Wrap(err, "cannot open the image download file")
	}
	defer f.Close() //nolint:errcheck // read-only
	for _, r := range uploadRanges(dataRanges(f, size), size, written, length) {
		n := r.end - r.off
		if err := api.StorageVolUpload(v, io.NewSectionReader(f, r.off, n), uint64(r.off), uint64(n), 0); err != nil {
			return errors.Wrapf(err, "cannot upload image %s", img.Name)
		}
	}
	return nil
}

// volumeBytes returns how much of the start of a new volume v may hold
// bytes other than zeros, and how long its file is. A raw volume made with
// no allocation holds nothing; a qcow2 one starts with the header qemu-img
// wrote (about 192 KiB), which the image's own bytes must overwrite even
// where the image has a hole. Where libvirt does not say, all of it.
func volumeBytes(api API, v golibvirt.StorageVol) (written, length int64, err error) {
	x, err := api.StorageVolGetXMLDesc(v, 0)
	if err != nil {
		return 0, 0, err
	}
	var def libvirtxml.StorageVolume
	if err := def.Unmarshal(x); err != nil {
		return 0, 0, err
	}
	inBytes := func(s *libvirtxml.StorageVolumeSize) (int64, bool) {
		if s == nil || (s.Unit != "bytes" && s.Unit != "B" && s.Unit != "") {
			return 0, false
		}
		return int64(s.Value), true //nolint:gosec // volume sizes fit in int64
	}
	length, ok := inBytes(def.Physical)
	allocated, known := inBytes(def.Allocation)
	if !ok || !known {
		return math.MaxInt64, 0, nil
	}
	if allocated == 0 {
		return 0, length, nil
	}
	return length, length, nil
}

// byteRange is the bytes [off, end) of a file.
type byteRange struct{ off, end int64 }

// dataRanges returns the ranges of f, size bytes long, that hold data, in
// order, as its file system tells them (SEEK_DATA and SEEK_HOLE): what lies
// between them reads as zeros. A file system that cannot tell has all of f
// as data.
func dataRanges(f *os.File, size int64) []byteRange {
	var out []byteRange
	for off := int64(0); off < size; {
		start, err := f.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && start >= size) {
			break // nothing but a hole after off
		}
		if err != nil {
			return []byteRange{{0, size}}
		}
		end, err := f.Seek(start, unix.SEEK_HOLE)
		if err != nil {
			return []byteRange{{0, size}}
		}
		end = min(end, size)
		out = append(out, byteRange{start, end})
		off = end
	}
	return out
}

// minSkippedHole is the shortest hole between two ranges of data that is
// not uploaded as zeros: an upload costs a few milliseconds of its own,
// about what sending a MiB does.
const minSkippedHole = 1 << 20

// uploadRanges returns the ranges to upload of a file of size bytes with
// data in ranges, into a volume whose first written bytes may not be zeros
// and whose file is length bytes long: the data; the first written bytes,
// zeros of the file included, to overwrite what the volume holds; the last
// byte, to make the volume's file as long as the image's; holes shorter
// than minSkippedHole joined to the ranges around them.
func uploadRanges(data []byteRange, size, written, length int64) []byteRange {
	all := data
	if written = min(written, size); written > 0 {
		all = append([]byteRange{{0, written}}, all...)
	}
	if length < size && (len(all) == 0 || all[len(all)-1].end < size) {
		all = append(all, byteRange{size - 1, size})
	}
	var out []byteRange
	for _, r := range all {
		if n := len(out); n > 0 && r.off-out[n-1].end < minSkippedHole {
			out[n-1].end = max(out[n-1].end, r.end)
			continue
		}
		out = append(out, r)
	}
	return out
}

// ensureImageDisk creates a missing disk from its image: a qcow2 overlay
// backed by the image when both live in the driver's pool and the image is
// qcow2, a full copy otherwise (a raw image, or a disk in another pool, where
// pruning could not see that the disk depends on the image). It says
// whether it made the disk.
func (d *Driver) ensureImageDisk(api API, disk driver.Disk) (bool, error) {
	pool := cmp.Or(disk.Pool, d.pool)
	p, err := api.StoragePoolLookupByName(pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		return false, driver.Terminalf("storage pool %q does not exist on this node", pool)
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	if exists, err := hasVolume(api, pool, disk.Name); err != nil || exists {
		return false, err
	}
	ip, err := api.StoragePoolLookupByName(d.pool)
	if err != nil {
		return false, errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	iv, err := api.StorageVolLookupByName(ip, imageVolume(disk.Image.UID))
	if err != nil {
		return false, errors.Wrapf(err, "cannot find image %s on the node", disk.Image.Name)
	}
	_, imageSize, _, err := api.StorageVolGetInfo(iv)
	if err != nil {
		return false, errors.Wrapf(err, "cannot read image %s", disk.Image.Name)
	}
	// A disk smaller than its image could not hold it.
	size := max(disk.SizeBytes, int64(imageSize))
	v := &libvirtxml.StorageVolume{
		Name:     disk.Name,
		Capacity: &libvirtxml.StorageVolumeSize{Value: uint64(size), Unit: "B"},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: cmp.Or(disk.Format, defaultFormat)}},
	}
	if cmp.Or(disk.Image.Format, defaultFormat) != "qcow2" || pool != d.pool {
		_, err := createVolumeFrom(api, p, v, &iv)
		return err == nil, err
	}
	path, err := api.StorageVolGetPath(iv)
	if err != nil {
		return false, errors.Wrapf(err, "cannot read the path of image %s", disk.Image.Name)
	}
	v.Target.Format.Type = "qcow2"
	v.BackingStore = &libvirtxml.StorageVolumeBackingStore{Path: path, Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}}
	_, err = createVolumeFrom(api, p, v, nil)
	return err == nil, err
}

// PruneImages deletes the images on the node that no volume in the driver's
// pool is backed by and that have been unused for their PruneAfter (the
// last one an Ensure asked for, else driver.DefaultPruneAfter; see
// imageimport.PruneClock). It returns the uids of the images it deleted.
func (d *Driver) PruneImages(context.Context) ([]string, error) {
	d.imagesInUse.Lock()
	defer d.imagesInUse.Unlock()
	api, vols, err := d.poolVolumes()
	if err != nil {
		return nil, err
	}
	backing := map[string]bool{}
	present := map[string]golibvirt.StorageVol{}
	var others []golibvirt.StorageVol
	for _, v := range vols {
		if uid, ok := strings.CutPrefix(v.Name, imagePrefix); ok {
			present[uid] = v
			continue
		}
		others = append(others, v)
	}
	if len(present) == 0 {
		// No image to keep: the volumes' backing files need no reading,
		// which would cost a call per volume of the pool every round.
		others = nil
	}
	for _, v := range others {
		def, err := volumeDef(api, v)
		if isCode(err, golibvirt.ErrNoStorageVol) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if def.BackingStore != nil {
			backing[def.BackingStore.Path] = true
		}
	}
	used := make(map[string]bool, len(present))
	for uid, v := range present {
		path, err := api.StorageVolGetPath(v)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read the path of volume %s", v.Name)
		}
		used[uid] = backing[path]
	}

	var pruned []string
	for _, uid := range d.pruneClock.Due(d.now(), used) {
		v := present[uid]
		if err := api.StorageVolDelete(v, 0); err != nil && !isCode(err, golibvirt.ErrNoStorageVol) {
			return pruned, errors.Wrapf(err, "cannot prune image volume %s", v.Name)
		}
		d.pruneClock.Pruned(uid)
		d.images.Forget(uid)
		pruned = append(pruned, uid)
	}
	return pruned, nil
}

// poolVolumes lists the volumes of the driver's pool, with the connection
// it used.
func (d *Driver) poolVolumes() (API, []golibvirt.StorageVol, error) {
	api, _, err := d.api()
	if err != nil {
		return nil, nil, err
	}
	p, err := api.StoragePoolLookupByName(d.pool)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	vols, _, err := api.StoragePoolListAllVolumes(p, 1, 0)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "cannot list volumes of storage pool %s", d.pool)
	}
	return api, vols, nil
}

// Images implements driver.Driver: the image volumes in the driver's pool,
// and the imports running or failed. An image volume being uploaded or
// copied is still Importing, and one left unfinished (clone.go's markers)
// is not on the node; a failed import is reported until the next attempt
// starts or the image arrives.
func (d *Driver) Images(context.Context) ([]driver.ImageStatus, error) {
	api, vols, err := d.poolVolumes()
	if err != nil {
		return nil, err
	}
	unfinished := map[string]bool{}
	for _, v := range vols {
		if uid, ok := markedImage(v.Name); ok {
			unfinished[uid] = true
		}
	}
	present := map[string]int64{}
	for _, v := range vols {
		uid, ok := strings.CutPrefix(v.Name, imagePrefix)
		if !ok || unfinished[uid] {
			continue // not an image, or one still being made
		}
		_, capacity, allocation, err := api.StorageVolGetInfo(v)
		if isCode(err, golibvirt.ErrNoStorageVol) {
			continue // pruned since the listing
		}
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read image volume %s", v.Name)
		}
		// The bytes the image takes on the node; a backend that does not
		// account for allocation (libvirt's test driver) has only capacity.
		present[uid] = int64(cmp.Or(allocation, capacity)) //nolint:gosec // volume sizes fit in int64
	}

	return d.images.Status(present), nil
}

// hasVolume reports whether pool holds a volume called name.
func hasVolume(api API, pool, name string) (bool, error) {
	p, err := api.StoragePoolLookupByName(pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		return false, driver.Terminalf("storage pool %q does not exist on this node", pool)
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	_, err = api.StorageVolLookupByName(p, name)
	switch {
	case err == nil:
		return true, nil
	case isCode(err, golibvirt.ErrNoStorageVol):
		return false, nil
	default:
		return false, errors.Wrapf(err, "cannot look up volume %s", name)
	}
}
