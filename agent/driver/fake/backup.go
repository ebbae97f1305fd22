package fake

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.Backuper = (*Driver)(nil)

// The fake's guests have a root disk with content, so that backups carry
// something a test can check. It is made of blocks of
// BlockSize: imageBlocks of them at the start come from the disk's image
// (the same for every guest of one image, as a cloned image is), and one
// more, at identityOffset, from the guest's uid (what its first boot would
// have written). WriteDisk changes it as a guest would.
const (
	BlockSize      = 64 << 10
	imageBlocks    = 32
	identityOffset = 8 << 20
)

// disk is a fake disk: its size, and its blocks that are not all zeros by
// offset.
type disk struct {
	size   int64
	blocks map[int64][]byte
}

// checkpoint is what changed on a guest's root disk since a backup.
type checkpoint struct {
	id    string
	dirty map[int64]bool
}

// rootDisk is guest uid's root disk, made on first use from the machine's
// image.
func (d *Driver) rootDisk(uid string, g *guest) *disk {
	if g.root != nil {
		return g.root
	}
	size := int64(identityOffset + BlockSize)
	seed := "no image"
	if len(g.machine.Disks) > 0 {
		size = max(size, g.machine.Disks[0].SizeBytes)
		if img := g.machine.Disks[0].Image; img != nil {
			seed = img.UID
		}
	}
	g.root = &disk{size: size, blocks: map[int64][]byte{}}
	for i := range int64(imageBlocks) {
		g.root.blocks[i*BlockSize] = pattern(seed, i)
	}
	g.root.blocks[identityOffset] = pattern(uid, 0)
	return g.root
}

// pattern is block i of content seeded by seed.
func pattern(seed string, i int64) []byte {
	out := make([]byte, 0, BlockSize)
	var n [16]byte
	binary.BigEndian.PutUint64(n[:8], uint64(i)) //nolint:gosec // a block index, never negative
	for j := uint64(0); len(out) < BlockSize; j++ {
		binary.BigEndian.PutUint64(n[8:], j)
		sum := sha256.Sum256(append([]byte(seed), n[:]...))
		out = append(out, sum[:]...)
	}
	return out[:BlockSize]
}

// WriteDisk writes p at off on guest uid's root disk, as its guest would;
// off and len(p) are multiples of BlockSize. It is how a test changes what
// the next backup reads.
func (d *Driver) WriteDisk(uid string, off int64, p []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.guests[uid]
	if !ok {
		return driver.NotFoundf("guest %s not found", uid)
	}
	if off%BlockSize != 0 || len(p)%BlockSize != 0 {
		return driver.Terminalf("fake disks are written in blocks of %d bytes", BlockSize)
	}
	root := d.rootDisk(uid, g)
	for i := 0; i < len(p); i += BlockSize {
		at := off + int64(i)
		block := bytes.Clone(p[i : i+BlockSize])
		if allZero(block) {
			delete(root.blocks, at)
		} else {
			root.blocks[at] = block
		}
		for _, c := range g.checkpoints {
			c.dirty[at] = true
		}
	}
	return nil
}

// DiskDigest is a digest of guest uid's root disk content: equal digests,
// equal disks. DigestOf gives the same of a backup's disk.
func (d *Driver) DiskDigest(uid string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.guests[uid]
	if !ok {
		return "", driver.NotFoundf("guest %s not found", uid)
	}
	return digest(d.rootDisk(uid, g).blocks), nil
}

// DigestOf is the digest DiskDigest gives of a disk with src's content, so
// that a test can compare a backup read back from its store with a fake
// guest's disk.
func DigestOf(ctx context.Context, src driver.DiskSource) (string, error) {
	blocks := map[int64][]byte{}
	err := src.Extents(ctx, func(off int64, p []byte) error {
		for len(p) > 0 {
			block, at := off-off%BlockSize, off%BlockSize
			b, ok := blocks[block]
			if !ok {
				b = make([]byte, BlockSize)
				blocks[block] = b
			}
			n := copy(b[at:], p)
			off, p = off+int64(n), p[n:]
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	maps.DeleteFunc(blocks, func(_ int64, b []byte) bool { return allZero(b) })
	return digest(blocks), nil
}

// digest is a digest of a disk's blocks that are not all zeros, by
// offset: sha256 over each block's offset and content, in offset order.
func digest(blocks map[int64][]byte) string {
	h := sha256.New()
	var at [8]byte
	for _, off := range slices.Sorted(maps.Keys(blocks)) {
		binary.BigEndian.PutUint64(at[:], uint64(off)) //nolint:gosec // offsets are never negative
		h.Write(at[:])
		h.Write(blocks[off])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// BackUp implements driver.Backuper: it hands the guest's root disk, whole
// or the blocks written since r.Since, and every guest's agent answers, so
// a running guest's backup is Frozen.
func (d *Driver) BackUp(ctx context.Context, uid string, r driver.BackupRequest, w driver.BackupWriter) (driver.BackupResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "BackUp", UID: uid}, &d.NextBackUpErr); err != nil {
		return driver.BackupResult{}, err
	}
	g, ok := d.guests[uid]
	if !ok {
		return driver.BackupResult{}, driver.NotFoundf("guest %s not found", uid)
	}
	root := d.rootDisk(uid, g)
	since := slices.IndexFunc(g.checkpoints, func(c *checkpoint) bool { return c.id == r.Since })
	res := driver.BackupResult{Full: r.Since == "" || since < 0, Frozen: g.obs.Phase == driver.PhaseRunning}
	offsets := slices.Sorted(maps.Keys(root.blocks))
	if !res.Full {
		offsets = slices.Sorted(maps.Keys(g.checkpoints[since].dirty))
	}
	if err := w.Disk(driver.BackupDisk{Name: "root", Size: root.size}); err != nil {
		return driver.BackupResult{}, err
	}
	for _, off := range offsets {
		if err := ctx.Err(); err != nil {
			return driver.BackupResult{}, err
		}
		block, data := root.blocks[off]
		var err error
		if data {
			err = w.Data(off, block)
		} else {
			err = w.Zero(off, BlockSize)
		}
		if err != nil {
			return driver.BackupResult{}, err
		}
		res.BytesRead += BlockSize
	}
	g.checkpoints = append(g.checkpoints, &checkpoint{id: r.ID, dirty: map[int64]bool{}})
	return res, nil
}

// CommitBackup implements driver.Backuper.
func (d *Driver) CommitBackup(_ context.Context, uid, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "CommitBackup", UID: uid}, &d.NextCommitBackupErr); err != nil {
		return err
	}
	if g, ok := d.guests[uid]; ok {
		g.checkpoints = slices.DeleteFunc(g.checkpoints, func(c *checkpoint) bool { return c.id != id })
	}
	return nil
}

// Checkpoints are the IDs of guest uid's checkpoints, oldest first.
func (d *Driver) Checkpoints(uid string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.guests[uid]
	if !ok {
		return nil
	}
	out := make([]string, 0, len(g.checkpoints))
	for _, c := range g.checkpoints {
		out = append(out, c.id)
	}
	return out
}

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}
