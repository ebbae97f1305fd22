package backupstore

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.BackupWriter = (*Writer)(nil)

// ChunkSize is the size of the windows, aligned to disk offsets, that a
// disk's data is cut into: a chunk holds what one window received in one
// backup. It is part of the format: manifests record no chunk size.
const ChunkSize = 1 << 20

// uploadWorkers is how many chunks a Writer puts at once; it also bounds
// the chunks it holds waiting (as many again).
const uploadWorkers = 8

// Stats is a Writer's progress.
type Stats struct {
	// BytesRead is the data handed to Data.
	BytesRead int64
	// BytesWritten is what was uploaded of chunks (sealed, when encrypted).
	BytesWritten int64
	// ChunksWritten were uploaded; ChunksReused were in the store already,
	// or earlier in this backup, and were not.
	ChunksWritten int64
	ChunksReused  int64
}

// Writer writes one backup. It has driver.BackupWriter's methods (Disk,
// Data, Zero), is called from one goroutine, and uploads in the background;
// an upload's failure is returned by a later call or by Commit. Stats may
// be called from any goroutine.
type Writer struct {
	s      *Store
	codec  *codec
	header Manifest
	parent map[string]Disk
	lock   string

	ctx    context.Context // of the uploads
	cancel context.CancelFunc
	jobs   chan upload
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error // the first upload's failure

	disks []*diskWriter // ended
	names map[string]bool
	cur   *diskWriter
	seen  map[string]bool // chunks of this backup
	full  bool
	done  bool

	bytesRead, bytesWritten, chunksWritten, chunksReused atomic.Int64
}

type upload struct {
	id string
	p  []byte
}

// diskWriter is the disk being written: its extents so far (out), what is
// left of its parent's, beyond the ranges handed so far, and the data of
// the current window not yet cut into a chunk.
type diskWriter struct {
	name   string
	size   int64
	out    []extent
	parent []Extent
	pos    int64 // where the last range handed ended
	buf    []byte
	bufOff int64
}

// extent is an Extent and whether it came from the parent.
type extent struct {
	Extent
	inherited bool
}

// NewWriter starts backup header.ID of VM header.VMName in
// header.Namespace. With a parent (a backup of the same VM in the same
// namespace, read from this store) the backup is incremental: each disk
// starts as the parent's disk of the same name, and each range handed
// replaces what it overlaps. Without one, each disk starts empty and the
// backup is full. Created is now where header leaves it zero; Full,
// Encrypted, KeyFingerprint and Disks are the Writer's.
//
// It fails with ErrExists if the backup exists, ErrNotFound if the parent
// no longer does, ErrWrongKey if the parent was written under another key
// and ErrBusy while a garbage collection runs. The caller must end every
// Writer it gets with Commit or Abort, which release its lock.
func (s *Store) NewWriter(ctx context.Context, header Manifest, parent *Manifest) (*Writer, error) {
	if err := checkName("namespace", header.Namespace); err != nil {
		return nil, err
	}
	if err := checkName("backup ID", header.ID); err != nil {
		return nil, err
	}
	w := &Writer{s: s, codec: s.codec, header: header, names: map[string]bool{}, seen: map[string]bool{}}
	if w.header.Created.IsZero() {
		w.header.Created = s.now().UTC()
	}
	if parent != nil {
		if parent.Namespace != header.Namespace {
			return nil, errors.Errorf("parent backup %s/%s is of another namespace than %s", parent.Namespace, parent.ID, header.Namespace)
		}
		if _, err := s.codec.forManifest(*parent); err != nil {
			return nil, err
		}
		if parent.Encrypted != s.codec.encrypted() {
			return nil, errors.Wrapf(ErrWrongKey, "parent backup %s/%s is not encrypted, this one would be", parent.Namespace, parent.ID)
		}
		if err := parent.validate(); err != nil {
			return nil, errors.Wrapf(err, "parent backup %s/%s", parent.Namespace, parent.ID)
		}
		w.header.Parent = parent.ID
		w.parent = map[string]Disk{}
		for _, d := range parent.Disks {
			w.parent[d.Name] = d
		}
	}

	lock, err := s.lock(ctx, writeLockPrefix, lockBody{Kind: "write", Namespace: header.Namespace, Backup: header.ID})
	if err != nil {
		return nil, err
	}
	w.lock = lock
	if err := w.check(ctx, parent); err != nil {
		s.unlock(lock)
		return nil, err
	}

	w.ctx, w.cancel = context.WithCancel(ctx)
	w.jobs = make(chan upload, uploadWorkers)
	for range uploadWorkers {
		w.wg.Go(w.uploads)
	}
	return w, nil
}

// check runs once the writer's lock is in the store: from then on no
// collection deletes a chunk the parent references, so the parent's
// chunks are there as long as its manifest still is.
func (w *Writer) check(ctx context.Context, parent *Manifest) error {
	s := w.s
	gcs, _, err := s.liveLocks(ctx, gcLockPrefix, s.now().Add(-gcLockTTL))
	if err != nil {
		return err
	}
	if len(gcs) > 0 {
		return errors.Wrapf(ErrBusy, "a garbage collection runs (lock %s)", gcs[0].Key)
	}
	key := s.manifestKey(w.header.Namespace, w.header.ID)
	if _, err := s.objs.stat(ctx, key); err == nil {
		return errors.Wrapf(ErrExists, "backup %s/%s", w.header.Namespace, w.header.ID)
	} else if !isNoObject(err) {
		return err
	}
	if parent != nil {
		if _, err := s.objs.stat(ctx, s.manifestKey(parent.Namespace, parent.ID)); err != nil {
			if isNoObject(err) {
				return errors.Wrapf(ErrNotFound, "parent backup %s/%s was deleted; take a full backup", parent.Namespace, parent.ID)
			}
			return err
		}
	}
	return nil
}

// uploads puts the chunks handed to it that the store does not have.
func (w *Writer) uploads() {
	for u := range w.jobs {
		if w.failed() != nil {
			continue // drain
		}
		body := w.codec.seal(u.id, u.p)
		put, err := w.s.objs.putIfAbsent(w.ctx, w.s.chunkKey(u.id), body)
		switch {
		case err != nil:
			w.fail(err)
		case put:
			w.chunksWritten.Add(1)
			w.bytesWritten.Add(int64(len(body)))
		default:
			w.chunksReused.Add(1)
		}
	}
}

func (w *Writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

func (w *Writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// usable is the error of a call to a Writer that cannot take more.
func (w *Writer) usable() error {
	if w.done {
		return errors.New("backup writer used after Commit or Abort")
	}
	return w.failed()
}

// Stats returns the progress so far.
func (w *Writer) Stats() Stats {
	return Stats{
		BytesRead:     w.bytesRead.Load(),
		BytesWritten:  w.bytesWritten.Load(),
		ChunksWritten: w.chunksWritten.Load(),
		ChunksReused:  w.chunksReused.Load(),
	}
}

// Disk starts a disk; the ranges that follow are its own, in increasing
// offset order.
func (w *Writer) Disk(d driver.BackupDisk) error {
	if err := w.usable(); err != nil {
		return err
	}
	if d.Name == "" || w.names[d.Name] {
		return errors.Errorf("disk name %q empty or handed before", d.Name)
	}
	if d.Size < 0 {
		return errors.Errorf("disk %s: negative size %d", d.Name, d.Size)
	}
	w.endDisk()
	w.names[d.Name] = true
	// overlay trims the extents it is given: the parent's are the caller's.
	w.cur = &diskWriter{name: d.Name, size: d.Size, parent: slices.Clone(w.parent[d.Name].Extents)}
	return nil
}

// rangeOf checks that [off, off+n) may follow what was handed of the disk.
func (w *Writer) rangeOf(off, n int64) (*diskWriter, error) {
	if err := w.usable(); err != nil {
		return nil, err
	}
	d := w.cur
	switch {
	case d == nil:
		return nil, errors.New("a range handed before its disk")
	case n < 0 || off < d.pos || off+n > d.size:
		return nil, errors.Errorf("disk %s: range [%d, %d) is not after %d and within %d bytes", d.name, off, off+n, d.pos, d.size)
	}
	return d, nil
}

// Data says that the current disk holds p at off.
func (w *Writer) Data(off int64, p []byte) error {
	d, err := w.rangeOf(off, int64(len(p)))
	if err != nil {
		return err
	}
	w.bytesRead.Add(int64(len(p)))
	for len(p) > 0 {
		if len(d.buf) > 0 && off != d.bufOff+int64(len(d.buf)) {
			w.cut(d)
		}
		if len(d.buf) == 0 {
			d.bufOff = off
			if d.buf == nil {
				d.buf = make([]byte, 0, ChunkSize)
			}
		}
		windowEnd := (off/ChunkSize + 1) * ChunkSize
		n := min(int64(len(p)), windowEnd-off)
		d.buf = append(d.buf, p[:n]...)
		off, p = off+n, p[n:]
		if off == windowEnd {
			w.cut(d)
		}
	}
	d.pos = off
	return w.failed()
}

// Zero says that the current disk reads as zeros over [off, off+length).
func (w *Writer) Zero(off, length int64) error {
	d, err := w.rangeOf(off, length)
	if err != nil {
		return err
	}
	w.cut(d)
	d.overlay(off, off+length, nil)
	d.pos = off + length
	return nil
}

// cut makes a chunk of the data gathered of the current window, or a hole
// where it is all zeros, and queues its upload.
func (w *Writer) cut(d *diskWriter) {
	if len(d.buf) == 0 {
		return
	}
	p, off := d.buf, d.bufOff
	d.buf = nil // the upload's now; the next window gets its own
	end := off + int64(len(p))
	if allZero(p) {
		d.overlay(off, end, nil)
		return
	}
	id := w.codec.id(p)
	d.overlay(off, end, &Extent{Offset: off, Length: int64(len(p)), Chunk: id})
	if w.seen[id] {
		w.chunksReused.Add(1)
		return
	}
	w.seen[id] = true
	select {
	case w.jobs <- upload{id: id, p: p}:
	case <-w.ctx.Done():
		w.fail(w.ctx.Err())
	}
}

func allZero(p []byte) bool {
	for len(p) >= 8 {
		if p[0]|p[1]|p[2]|p[3]|p[4]|p[5]|p[6]|p[7] != 0 {
			return false
		}
		p = p[8:]
	}
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// overlay makes [a, b) hold e (nothing: zeros, with e nil): what is left
// of the parent's extents before a becomes the disk's, the parent extent
// that crosses b keeps its part after b. Ranges come in increasing order,
// so both lists stay sorted.
func (d *diskWriter) overlay(a, b int64, e *Extent) {
	for len(d.parent) > 0 && d.parent[0].Offset < b {
		p := d.parent[0]
		if p.Offset < a {
			left := p
			left.Length = min(p.end(), a) - p.Offset
			d.out = append(d.out, extent{left, true})
		}
		if p.end() > b {
			right := p
			right.Offset, right.Length = b, p.end()-b
			right.ChunkOffset += b - p.Offset
			d.parent[0] = right
			break
		}
		d.parent = d.parent[1:]
	}
	if e != nil {
		d.out = append(d.out, extent{*e, false})
	}
}

// endDisk closes the current disk: its last window is cut and what is
// left of the parent's extents within its size is kept.
func (w *Writer) endDisk() {
	if d := w.cur; d != nil {
		w.cut(d)
		d.overlay(d.size, d.size, nil) // keeps the parent's up to the size
		w.disks = append(w.disks, d)
		w.cur = nil
	}
}

// MarkFull says that the disks were handed whole although the Writer has a
// parent (driver.BackupResult.Full: the driver no longer had the parent's
// checkpoint), so what no range covered reads as zeros, not as the
// parent's data. It may be called any time before Commit.
func (w *Writer) MarkFull() { w.full = true }

// Commit waits for the uploads and then puts the manifest, which makes the
// backup exist; it returns the manifest. It fails with ErrExists if a
// backup with the ID appeared meanwhile. The Writer is done either way.
func (w *Writer) Commit(ctx context.Context) (Manifest, error) {
	if err := w.usable(); err != nil {
		w.Abort()
		return Manifest{}, err
	}
	w.endDisk()
	w.stop()
	defer w.s.unlock(w.lock)
	if err := w.failed(); err != nil {
		return Manifest{}, err
	}

	m := w.header
	m.Version = ManifestVersion
	m.Full = w.parent == nil || w.full
	if m.Full {
		m.Parent = ""
	}
	m.Encrypted, m.KeyFingerprint, m.SealedSpec = w.codec.encrypted(), w.codec.fingerprint, nil
	m.Disks = make([]Disk, 0, len(w.disks))
	for _, d := range w.disks {
		disk := Disk{Name: d.name, Size: d.size, Extents: make([]Extent, 0, len(d.out))}
		for _, e := range d.out {
			if !e.inherited || !m.Full {
				disk.Extents = append(disk.Extents, e.Extent)
			}
		}
		m.Disks = append(m.Disks, disk)
	}
	if err := m.validate(); err != nil {
		return Manifest{}, errors.Wrap(err, "backup writer made an invalid manifest")
	}
	body, err := w.s.encodeManifest(w.codec, m)
	if err != nil {
		return Manifest{}, err
	}
	key := w.s.manifestKey(m.Namespace, m.ID)
	put, err := w.s.objs.putIfAbsent(ctx, key, body)
	switch {
	case err != nil:
		return Manifest{}, errors.Wrapf(err, "cannot commit backup %s/%s", m.Namespace, m.ID)
	case !put:
		return Manifest{}, errors.Wrapf(ErrExists, "backup %s/%s", m.Namespace, m.ID)
	}
	return m, nil
}

// Abort ends a Writer without a backup: the chunks it uploaded stay until
// a garbage collection. It may be called after Commit, to no effect.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.cancel()
	w.stop()
	w.s.unlock(w.lock)
}

// stop ends the uploads; they are all done when it returns.
func (w *Writer) stop() {
	w.done = true
	close(w.jobs)
	w.wg.Wait()
	w.cancel()
}
