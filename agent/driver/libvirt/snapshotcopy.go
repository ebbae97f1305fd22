package libvirt

import (
	"cmp"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// An image copied from a snapshot (driver.Image.SourceSnapshot) is a
// volume as it was in one of its guest's internal qcow2 snapshots
// (snapshot.go), which live inside the volume's file. libvirt has no call
// that reads a volume as it was in a snapshot, and the guest must run on,
// so the node copies the volume's file (and the image file it is an
// overlay of) through libvirt's volume download, as backups read disks,
// and has qemu-img convert read the snapshot out of the copy (-l
// snapshot.name=<id>) into a flat image, which is then stored as any
// downloaded image is (storeImage), marked unfinished until it is whole.
// The snapshot's clusters are never written while it exists: a guest
// writing to its disk copies a cluster a snapshot holds before changing
// it, so a copy of a running guest's file holds the snapshot whole.
//
// libvirt's test driver keeps no files: there the image is made as a
// clone of the volume is (a volume of the right size stands for it).

// qemuImg is the qemu-img the agent runs, from its PATH (Debian:
// qemu-utils, which a libvirt node with QEMU has; the agent's container
// image, one static binary, has not).
const qemuImg = "qemu-img"

// snapshotImage makes img from the volume img.SourceVolume as it was in
// snapshot img.SourceSnapshot.
func (d *Driver) snapshotImage(ctx context.Context, img *driver.Image, job *imageimport.Job) error {
	if d.testDriver {
		return d.cloneImage(img, job)
	}
	api, _, src, err := d.sourceOf(img)
	if err != nil {
		return err
	}
	def, err := volumeDef(api, src)
	if err != nil {
		return err
	}
	if f := formatOf(def); f != "qcow2" {
		return driver.Terminalf("cannot make image %s: volume %s is %s, and only a qcow2 disk holds snapshots", img.Name, img.SourceVolume, f)
	}
	if def.Capacity != nil {
		job.SetProgress(0, int64(def.Capacity.Value)) //nolint:gosec // a volume's size fits
	}

	dir, err := os.MkdirTemp("", "virtfleet-snapshot-copy-")
	if err != nil {
		return errors.Wrapf(err, "cannot stage the copy of volume %s in the temporary directory %s (mount a writable volume there, or set TMPDIR)", img.SourceVolume, os.TempDir())
	}
	defer os.RemoveAll(dir) //nolint:errcheck // a leftover temp file is harmless
	dl, err := dialDownloads(d.socket, d.uri)
	if err != nil {
		return err
	}
	defer dl.Close() //nolint:errcheck // what was read was read
	source := filepath.Join(dir, "source.qcow2")
	if err := downloadVolume(ctx, dl, src, source); err != nil {
		return err
	}
	if b := def.BackingStore; b != nil && b.Path != "" {
		if err := d.localBacking(ctx, api, dl, img, b, dir, source); err != nil {
			return err
		}
	}
	out := filepath.Join(dir, "image")
	if err := runQemuImg(ctx, "convert", "-f", "qcow2", "-l", "snapshot.name="+img.SourceSnapshot, "-O", cmp.Or(img.Format, defaultFormat), source, out); err != nil {
		err = errors.Wrapf(err, "cannot make image %s from volume %s as it was in snapshot %s", img.Name, img.SourceVolume, img.SourceSnapshot)
		if strings.Contains(err.Error(), "Can't find snapshot") {
			return driver.Terminalf("%v: the volume holds no such snapshot", err)
		}
		return err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return errors.Wrapf(err, "cannot read the copy of volume %s", img.SourceVolume)
	}
	if err := d.storeImage(api, img, out, fi.Size()); err != nil {
		return err
	}
	if def.Capacity != nil {
		job.SetProgress(int64(def.Capacity.Value), int64(def.Capacity.Value)) //nolint:gosec // a volume's size fits
	}
	return nil
}

// localBacking copies the image the volume at source is an overlay of
// into dir, and points source at the copy. That image must be a volume of
// the driver's pool with no backing of its own: the images the driver
// makes are flat.
func (d *Driver) localBacking(ctx context.Context, api API, dl *downloads, img *driver.Image, b *libvirtxml.StorageVolumeBackingStore, dir, source string) error {
	vol, err := api.StorageVolLookupByPath(b.Path)
	if err != nil {
		return errors.Wrapf(err, "cannot look up %s, the image volume %s is made from", b.Path, img.SourceVolume)
	}
	if vol.Pool != d.pool {
		return driver.Terminalf("cannot make image %s: volume %s is made from %s, which is not in storage pool %q", img.Name, img.SourceVolume, b.Path, d.pool)
	}
	def, err := volumeDef(api, vol)
	if err != nil {
		return err
	}
	if def.BackingStore != nil && def.BackingStore.Path != "" {
		return driver.Terminalf("cannot make image %s: volume %s is made from %s, which is itself made from %s; only one level is read", img.Name, img.SourceVolume, vol.Name, def.BackingStore.Path)
	}
	backing := filepath.Join(dir, "backing")
	if err := downloadVolume(ctx, dl, vol, backing); err != nil {
		return err
	}
	// An unsafe rebase rewrites only the header's backing file name: the
	// copy is the same file, overlaid on the same data.
	return runQemuImg(ctx, "rebase", "-u", "-f", "qcow2", "-b", backing, "-F", formatOf(def), source)
}

// downloadVolume writes all of vol to a new file at path.
func downloadVolume(ctx context.Context, dl *downloads, vol golibvirt.StorageVol, path string) error {
	f, err := os.Create(path) //nolint:gosec // our own temporary directory
	if err != nil {
		return errors.Wrapf(err, "cannot stage volume %s", vol.Name)
	}
	if err := dl.download(ctx, vol, 0, 0, f); err != nil {
		_ = f.Close()
		return errors.Wrapf(err, "cannot download volume %s", vol.Name)
	}
	return errors.Wrapf(f.Close(), "cannot stage volume %s", vol.Name)
}

// runQemuImg runs qemu-img with args, its output in the error.
func runQemuImg(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, qemuImg, args...).CombinedOutput() //nolint:gosec // fixed tool, our own arguments
	switch {
	case errors.Is(err, exec.ErrNotFound):
		// The agent's container image is one static binary: it has none.
		return driver.Terminalf("the agent finds no %s on its PATH (Debian: qemu-utils), which reads a disk's snapshot: run the agent where it has one", qemuImg)
	case err != nil:
		return errors.Errorf("qemu-img %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}
