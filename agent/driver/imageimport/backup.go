package imageimport

import (
	"cmp"
	"context"
	"os"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/backupstore"
)

// FromBackup writes disk img.Backup.Disk of backup img.Backup, read from
// its location, into a raw file of the store's Dir, and returns the file's
// path and size, the disk's. Only the disk's data is written: the rest of
// the file is holes, which read as zeros as the backup's do, so the file
// takes on the node what the backup holds of the disk. Like Download it
// waits for a slot first, keeps to the store's limits (its data within
// MaxBytes, its reading within Timeout) and leaves nothing when it fails;
// the job's progress follows the bytes of data written. The caller removes
// the file once done with it.
//
// A missing backup or disk, a chunk that is missing or does not match its
// name, or a store that cannot be reached fail it, naming the backup; a
// backup under another key than the location's is Terminal, and so is an
// image that does not say it is raw, which it always is.
func (j *Job) FromBackup(ctx context.Context, img *driver.Image) (string, int64, error) {
	b := img.Backup
	if b == nil {
		return "", 0, errors.Errorf("cannot import image %s: it is not made from a backup", img.Name)
	}
	what := backupName(b.Namespace, b.ID, b.Disk, b.Location.Endpoint, b.Location.Bucket)
	if img.Format != "raw" {
		return "", 0, driver.Terminalf("cannot import image %s from %s: a disk of a backup is a raw image, but the image says its format is %q", img.Name, what, cmp.Or(img.Format, defaultFormat))
	}
	s := j.s
	release, err := s.acquire(ctx, j, img.Namespace)
	if err != nil {
		return "", 0, errors.Wrapf(err, "cannot import image %s", img.Name)
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()

	fail := func(err error) (string, int64, error) {
		err = errors.Errorf("cannot import image %s from %s: %w", img.Name, what, s.timedOut(ctx, err))
		if errors.Is(err, backupstore.ErrWrongKey) {
			err = driver.Terminal(err)
		}
		return "", 0, err
	}
	store, err := backupstore.Open(ctx, backupstore.LocationOf(b.Location))
	if err != nil {
		return fail(err)
	}
	m, err := store.Manifest(ctx, b.Namespace, b.ID)
	if err != nil {
		return fail(err)
	}
	src, err := store.Source(m, b.Disk)
	if err != nil {
		return fail(err)
	}
	d, _ := m.Disk(b.Disk) // Source found it
	var data int64
	for _, e := range d.Extents {
		data += e.Length
	}
	if data > s.cfg.MaxBytes {
		return fail(&TooLargeError{Host: b.Location.Endpoint, Size: data, Max: s.cfg.MaxBytes})
	}
	j.SetProgress(0, data)

	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return "", 0, errors.Wrap(err, "cannot create the image download directory")
	}
	f, err := os.CreateTemp(s.cfg.Dir, partPrefix+img.UID+"-*.part")
	if err != nil {
		return "", 0, errors.Wrap(err, "cannot create the image download file")
	}
	size := src.Disk().Size
	err = writeSparse(ctx, f, size, src, func(n int) { j.read.Add(int64(n)) })
	if cerr := f.Close(); err == nil && cerr != nil {
		err = errors.Wrap(cerr, "cannot write the image download file")
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fail(err)
	}
	return f.Name(), size, nil
}

// writeSparse makes f size bytes long, all holes, and writes src's
// extents into it, calling written after each.
func writeSparse(ctx context.Context, f *os.File, size int64, src *backupstore.Source, written func(n int)) error {
	if err := f.Truncate(size); err != nil {
		return errors.Wrap(err, "cannot size the image download file")
	}
	return src.Extents(ctx, func(off int64, p []byte) error {
		if _, err := f.WriteAt(p, off); err != nil {
			return errors.Wrap(err, "cannot write the image download file")
		}
		written(len(p))
		return nil
	})
}

// backupName names disk of backup namespace/id in bucket at endpoint, for
// messages.
func backupName(namespace, id, disk, endpoint, bucket string) string {
	return "disk " + disk + " of backup " + namespace + "/" + id + " in bucket " + bucket + " at " + endpoint
}
