package libvirt

import (
	"cmp"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// A cloned image (driver.Image.SourceVolume) is a copy of a volume of this
// node, made by libvirtd (StorageVolCreateXMLFrom) straight into the image's
// volume image_<uid>; a qcow2 chain is flattened on the way, so the image
// needs nothing of its source once made. The copy is taken when the node
// first needs the image: later writes to the source are not in it, and a
// source attached to a running guest is copied as it is on disk at that
// moment (crash-consistent at best).
//
// libvirt cannot rename a volume, so the copy cannot be made under a
// temporary name and renamed into place. Instead a marker volume,
// cloning_<uid>, exists from before the copy starts until it has finished:
// while it exists image_<uid> is not a usable image (hasImage), whoever made
// it. An agent killed mid-copy, or a libvirtd that died, leaves the marker;
// the next clone of the image deletes the partial copy first, and until then
// no disk is ever made from it. A partial copy of an image never asked for
// again is pruned like any unused image.
//
// An image uploaded into its volume (storeImage: a download, or a disk of a
// backup) is marked the same way, by uploading_<uid>: an upload cut short
// leaves a volume of the right size that only holds part of the image.

// clonePrefix starts the names of clone markers. Like image_, it cannot be a
// <namespace>_<name> disk of a Volume, whose names are Kubernetes names.
const clonePrefix = "cloning_"

func cloneMarker(uid string) string { return clonePrefix + uid }

// markerOf is the marker that stands while img's volume is being made, and
// what making it is called in errors.
func markerOf(img *driver.Image) (marker, making string) {
	if img.SourceVolume != "" {
		return cloneMarker(img.UID), "clone"
	}
	return uploadMarker(img.UID), "upload"
}

// markedImage returns the uid of the image whose unfinished volume the
// volume called name marks, if it is a marker.
func markedImage(name string) (string, bool) {
	if uid, ok := strings.CutPrefix(name, clonePrefix); ok {
		return uid, true
	}
	return strings.CutPrefix(name, uploadPrefix)
}

// hasImage reports whether img is on the node, ready to make disks from: its
// volume exists and nothing is still being copied or uploaded into it.
func (d *Driver) hasImage(api API, img *driver.Image) (bool, error) {
	present, err := hasVolume(api, d.pool, imageVolume(img.UID))
	if err != nil || !present {
		return present, err
	}
	marker, _ := markerOf(img)
	unfinished, err := hasVolume(api, d.pool, marker)
	return !unfinished, err
}

// cloneImage copies the volume img.SourceVolume of the driver's pool into
// the image's volume. The image is made only on the node that has the
// source: elsewhere it fails, and is retried with the import backoff, since
// the source's disk may still be on its way (made by the first guest that
// uses it).
func (d *Driver) cloneImage(img *driver.Image, job *imageimport.Job) error {
	api, p, src, err := d.sourceOf(img)
	if err != nil {
		return err
	}
	_, capacity, _, err := api.StorageVolGetInfo(src)
	if err != nil {
		return errors.Wrapf(err, "cannot read volume %s", img.SourceVolume)
	}
	job.SetProgress(0, int64(capacity))

	if err := d.startImage(api, p, img); err != nil {
		return err
	}
	_, err = createVolumeFrom(api, p, &libvirtxml.StorageVolume{
		Name:     imageVolume(img.UID),
		Capacity: &libvirtxml.StorageVolumeSize{Value: capacity, Unit: "B"},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: cmp.Or(img.Format, defaultFormat)}},
	}, &src)
	if err != nil {
		// libvirt removes a copy that failed; make sure before the marker goes.
		if derr := deleteVolume(api, d.pool, imageVolume(img.UID)); derr != nil {
			return errors.Wrapf(err, "cannot clone image %s from volume %s (and the partial copy stays until the next attempt: %v)", img.Name, img.SourceVolume, derr)
		}
		_ = deleteVolume(api, d.pool, cloneMarker(img.UID))
		return errors.Wrapf(err, "cannot clone image %s from volume %s", img.Name, img.SourceVolume)
	}
	job.SetProgress(int64(capacity), int64(capacity))
	return errors.Wrapf(deleteVolume(api, d.pool, cloneMarker(img.UID)), "cannot finish clone of image %s", img.Name)
}

// sourceOf looks up the volume img copies, in the driver's pool.
func (d *Driver) sourceOf(img *driver.Image) (API, golibvirt.StoragePool, golibvirt.StorageVol, error) {
	var none golibvirt.StorageVol
	api, _, err := d.api()
	if err != nil {
		return nil, golibvirt.StoragePool{}, none, err
	}
	p, err := api.StoragePoolLookupByName(d.pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		return nil, p, none, driver.Terminalf("storage pool %q does not exist on this node", d.pool)
	}
	if err != nil {
		return nil, p, none, errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	src, err := api.StorageVolLookupByName(p, img.SourceVolume)
	if isCode(err, golibvirt.ErrNoStorageVol) {
		return nil, p, none, errors.Errorf("cannot clone image %s: volume %s is not on node %s (pool %q); the image can only be made on the node that holds the volume it copies",
			img.Name, img.SourceVolume, d.node, d.pool)
	}
	if err != nil {
		return nil, p, none, errors.Wrapf(err, "cannot look up volume %s", img.SourceVolume)
	}
	return api, p, src, nil
}

// startImage puts img's marker in place, after removing what an earlier,
// unfinished copy or upload left: while the marker stands, image_<uid> is
// not trusted.
func (d *Driver) startImage(api API, p golibvirt.StoragePool, img *driver.Image) error {
	marker, making := markerOf(img)
	stale, err := hasVolume(api, d.pool, marker)
	if err != nil {
		return err
	}
	if !stale {
		x, err := (&libvirtxml.StorageVolume{
			Name:     marker,
			Capacity: &libvirtxml.StorageVolumeSize{Value: 0, Unit: "B"},
			Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
		}).Marshal()
		if err != nil {
			return errors.Wrap(err, "cannot marshal volume XML")
		}
		if _, err := api.StorageVolCreateXML(p, x, 0); err != nil {
			return errors.Wrapf(err, "cannot start the %s of image %s", making, img.Name)
		}
	}
	// A copy libvirtd is still making for a killed agent cannot be deleted
	// yet; the import fails and is retried after its backoff.
	return errors.Wrapf(deleteVolume(api, d.pool, imageVolume(img.UID)), "cannot remove the unfinished %s of image %s", making, img.Name)
}
