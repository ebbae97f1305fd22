package nova

import (
	"cmp"
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// A DiskImage on nova is a Glance image of the agent's project, named
// vf-image-<uid> and tagged virtfleet, shared by every Volume made from it
// in the cloud: the agent downloads the DiskImage's URL within the node's
// policy (imageimport: allowed sources, size and time limits, SHA256,
// inspection), then uploads the verified file to Glance, so Glance never
// fetches a tenant's URL itself. A DiskImage made from a disk of a backup
// is read from its location into a raw file (imageimport's FromBackup)
// and uploaded the same way, as raw. A Volume from the image is a Cinder
// volume created from it (imageRef): Cinder writes the image into the
// volume, marks it bootable and keeps the image's metadata on it, and the
// volume no longer depends on the image. An image no virtfleet volume of
// the project was made from goes after its PruneAfter.

// Glance properties of the driver's images.
const (
	// MetaImageUID is the uid of the DiskImage the image was imported for.
	MetaImageUID = "virtfleet-image-uid"
	// MetaImageName is the DiskImage's name, for people reading Glance.
	MetaImageName = "virtfleet-image-name"
	// MetaImageSHA256 is the SHA256 the download was verified against.
	MetaImageSHA256 = "virtfleet-image-sha256"
)

// imageTag marks the Glance images the driver imported.
const imageTag = "virtfleet"

// ImageName is the Glance image a DiskImage of uid becomes.
func ImageName(uid string) string { return Prefix + "image-" + uid }

// imageWait is what ensureVolume returns while the image a missing volume
// is made from is being imported: not a failure, the guest is provisioning.
type imageWait struct{ progress string }

func (w *imageWait) Error() string { return w.progress }

// importing is the progress of the import a volume waits for, or "".
func importing(err error) string {
	var w *imageWait
	if errors.As(err, &w) {
		return w.progress
	}
	return ""
}

// listImages lists the project's images the driver imported.
func (d *Driver) listImages(ctx context.Context) ([]images.Image, error) {
	page, err := images.List(d.c.image, images.ListOpts{Owner: d.c.projectID, Tags: []string{imageTag}}).AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list images")
	}
	all, err := images.ExtractImages(page)
	return all, errors.Wrap(err, "cannot read images")
}

// activeImage is the oldest active image imported for uid, or nil.
func activeImage(all []images.Image, uid string) *images.Image {
	var found *images.Image
	for i, im := range all {
		if im.Name != ImageName(uid) || im.Status != images.ImageStatusActive {
			continue
		}
		if found == nil || im.CreatedAt.Before(found.CreatedAt) {
			found = &all[i]
		}
	}
	return found
}

// imageFor returns the id of the active Glance image of img, starting or
// joining its import when there is none: then the error is an imageWait
// with the progress, or the last import's error while its backoff lasts.
// The caller holds d.imageUse for reading until the volume made from the
// image exists, so a prune never deletes the image in between.
func (d *Driver) imageFor(ctx context.Context, img *driver.Image) (string, error) {
	if d.c.image == nil {
		return "", driver.Terminalf("image %s: this cloud's catalog has no image service (Glance) to import it into", img.Name)
	}
	if img.ExternalName != "" {
		return d.externalImage(ctx, img)
	}
	if img.SourceSnapshot != "" {
		return "", driver.Terminalf("image %s is a copy of volume %s as it was in snapshot %s: the nova backend makes a volume of that volume's Cinder snapshot, never a Glance image of one", img.Name, img.SourceVolume, img.SourceSnapshot)
	}
	if img.SourceVolume != "" {
		return "", driver.Terminalf("image %s is a copy of a volume, which the nova backend cannot make; give the DiskImage a url", img.Name)
	}
	d.pruneClock.SetPruneAfter(img.UID, img.PruneAfter)
	var id string
	present := func() (bool, error) {
		all, err := d.listImages(ctx)
		if err != nil {
			return false, err
		}
		if im := activeImage(all, img.UID); im != nil {
			id = im.ID
			return true, nil
		}
		return false, nil
	}
	progress, err := d.imports.Ensure(d.ctx, img, present, d.importImage)
	switch {
	case err != nil:
		return "", err
	case progress != "":
		return "", &imageWait{progress: progress}
	}
	return id, nil
}

// externalImage is the id of the active Glance image img.ExternalName
// names, by id or else by name, among those the project sees. It is used
// as it is: never uploaded, tagged, pruned nor deleted. None is an error a
// retry may mend (its owner may upload it); a name several images share
// is Terminal, as only an id says which.
func (d *Driver) externalImage(ctx context.Context, img *driver.Image) (string, error) {
	if im, err := images.Get(ctx, d.c.image, img.ExternalName).Extract(); err == nil {
		if im.Status != images.ImageStatusActive {
			return "", errors.Errorf("image %s: Glance image %s is %s, not active", img.Name, img.ExternalName, im.Status)
		}
		return im.ID, nil
	} else if code := statusOf(err); code != http.StatusNotFound && code != http.StatusBadRequest {
		return "", classify(err, "cannot read Glance image "+img.ExternalName)
	}
	page, err := images.List(d.c.image, images.ListOpts{Name: img.ExternalName, Status: images.ImageStatusActive}).AllPages(ctx)
	if err != nil {
		return "", classify(err, "cannot list images")
	}
	all, err := images.ExtractImages(page)
	if err != nil {
		return "", errors.Wrap(err, "cannot read images")
	}
	switch len(all) {
	case 0:
		return "", errors.Errorf("image %s: Glance has no active image with id or name %q to import", img.Name, img.ExternalName)
	case 1:
		return all[0].ID, nil
	}
	return "", driver.Terminalf("image %s: %d Glance images are named %q; name the one to import by its id", img.Name, len(all), img.ExternalName)
}

// importImage downloads, verifies and inspects img, or makes it of a disk
// of a backup (a raw file, see imageimport's FromBackup), then uploads it
// to Glance. Whatever an earlier import of this node left unfinished (an
// agent killed mid-upload) is deleted first; an upload that fails is
// deleted again, so only a complete image is ever active under its name.
func (d *Driver) importImage(ctx context.Context, img *driver.Image, job *imageimport.Job) error {
	if err := d.deleteUnfinished(ctx, img.UID); err != nil {
		return err
	}
	fetch := job.Download
	if img.Backup != nil {
		fetch = job.FromBackup
	}
	path, size, err := fetch(ctx, img)
	if err != nil {
		return err
	}
	defer os.Remove(path)   //nolint:errcheck // a leftover download is removed at the next start
	f, err := os.Open(path) //nolint:gosec // the store's own download
	if err != nil {
		return errors.Wrap(err, "cannot read the downloaded image")
	}
	defer f.Close() //nolint:errcheck // read-only
	private := images.ImageVisibilityPrivate
	props := map[string]string{MetaImageUID: img.UID, MetaImageName: img.Name, MetaNode: d.node}
	if img.SHA256 != "" {
		props[MetaImageSHA256] = img.SHA256
	}
	created, err := images.Create(ctx, d.c.image, images.CreateOpts{
		Name: ImageName(img.UID), Visibility: &private, Tags: []string{imageTag},
		ContainerFormat: "bare", DiskFormat: cmp.Or(img.Format, "qcow2"), Properties: props,
	}).Extract()
	if err != nil {
		return classify(err, "cannot create Glance image for "+img.Name)
	}
	err = imagedata.Upload(ctx, d.c.image, created.ID, f).ExtractErr()
	if err == nil {
		var got *images.Image
		if got, err = images.Get(ctx, d.c.image, created.ID).Extract(); err == nil && (got.Status != images.ImageStatusActive || got.SizeBytes != size) {
			err = errors.Errorf("Glance holds %d of %d bytes and says %s", got.SizeBytes, size, got.Status)
		}
	}
	if err != nil {
		_ = images.Delete(context.WithoutCancel(ctx), d.c.image, created.ID).ExtractErr()
		return classify(err, "cannot upload image "+img.Name+" to Glance")
	}
	return nil
}

// deleteUnfinished deletes the images of uid this node created that never
// became active.
func (d *Driver) deleteUnfinished(ctx context.Context, uid string) error {
	all, err := d.listImages(ctx)
	if err != nil {
		return err
	}
	for _, im := range all {
		if im.Name != ImageName(uid) || im.Status == images.ImageStatusActive || im.Properties[MetaNode] != d.node {
			continue
		}
		if err := images.Delete(ctx, d.c.image, im.ID).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
			return classify(err, "cannot delete unfinished image "+im.ID)
		}
	}
	return nil
}

// imageUID is the DiskImage uid of one of the driver's images.
func imageUID(im images.Image) string {
	if uid, ok := im.Properties[MetaImageUID].(string); ok && uid != "" {
		return uid
	}
	uid, _ := strings.CutPrefix(im.Name, ImageName(""))
	return uid
}

// Images implements driver.ImageKeeper: the project's active images the
// driver imported, and the imports running or failed on this node.
func (d *Driver) Images(ctx context.Context) ([]driver.ImageStatus, error) {
	if d.c.image == nil {
		return nil, nil
	}
	all, err := d.listImages(ctx)
	if err != nil {
		return nil, err
	}
	present := map[string]int64{}
	for _, im := range all {
		if im.Status == images.ImageStatusActive {
			present[imageUID(im)] = im.SizeBytes
		}
	}
	return d.imports.Status(present), nil
}

// PruneImages deletes the project's images that no virtfleet volume was
// made from for their PruneAfter, and returns their DiskImage uids. While
// Cinder is still creating a volume of the driver's, it prunes nothing:
// the volume may be copying an image it names only once it is made.
func (d *Driver) PruneImages(ctx context.Context) ([]string, error) {
	if d.c.image == nil {
		return nil, nil
	}
	d.imageUse.Lock()
	defer d.imageUse.Unlock()
	all, err := d.listImages(ctx)
	if err != nil {
		return nil, err
	}
	page, err := volumes.List(d.c.volume, volumes.ListOpts{}).AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list volumes")
	}
	vols, err := volumes.ExtractVolumes(page)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read volumes")
	}
	madeFrom := map[string]bool{}
	for _, v := range vols {
		if v.Description != Description {
			continue
		}
		if v.Status == "creating" || v.Status == "downloading" {
			return nil, nil
		}
		if id := v.VolumeImageMetadata["image_id"]; id != "" {
			madeFrom[id] = true
		}
	}
	used := map[string]bool{}
	byUID := map[string][]string{}
	for _, im := range all {
		if im.Status != images.ImageStatusActive {
			continue
		}
		uid := imageUID(im)
		used[uid] = used[uid] || madeFrom[im.ID]
		byUID[uid] = append(byUID[uid], im.ID)
	}
	var pruned []string
	for _, uid := range d.pruneClock.Due(d.now(), used) {
		for _, id := range byUID[uid] {
			if err := images.Delete(ctx, d.c.image, id).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
				return pruned, classify(err, "cannot prune image "+id)
			}
		}
		d.pruneClock.Pruned(uid)
		d.imports.Forget(uid)
		pruned = append(pruned, uid)
	}
	slices.Sort(pruned)
	return pruned, nil
}

// pruneEvery prunes the images every interval until the driver closes; a
// failed round is simply tried again at the next.
func (d *Driver) pruneEvery(interval time.Duration) {
	defer d.loops.Done()
	wait.UntilWithContext(d.ctx, func(ctx context.Context) { _, _ = d.PruneImages(ctx) }, interval)
}
