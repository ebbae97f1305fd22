package fake

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// recorder is a BackupWriter that keeps what it is handed, and a
// DiskSource of what it kept.
type recorder struct {
	disk  driver.BackupDisk
	data  map[int64][]byte
	zeros []int64
}

func (r *recorder) Disk(d driver.BackupDisk) error {
	r.disk, r.data = d, map[int64][]byte{}
	return nil
}

func (r *recorder) Data(off int64, p []byte) error {
	r.data[off] = bytes.Clone(p)
	return nil
}

func (r *recorder) Zero(off, _ int64) error {
	r.zeros = append(r.zeros, off)
	return nil
}

// source is a recorder's content as a DiskSource.
type source struct{ *recorder }

func (s source) Disk() driver.BackupDisk { return s.disk }

func (s source) Extents(_ context.Context, fn func(int64, []byte) error) error {
	for off := int64(0); off < s.disk.Size; off += BlockSize {
		if p, ok := s.data[off]; ok {
			if err := fn(off, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestBackuper pins the fake's driver.Backuper to the contract: a full
// backup, an incremental one of only what was written since, a checkpoint
// kept until a later backup is committed; and DigestOf the backups read
// back is the disk's DiskDigest.
func TestBackuper(t *testing.T) {
	ctx := context.Background()
	d := New("node-1")
	m := driver.Machine{UID: uid, Namespace: "team-a", Name: "web-1", Disks: []driver.Disk{{Name: "root", SizeBytes: 1 << 30, Image: &driver.Image{UID: "debian"}}}, VCPU: 1, MemoryBytes: 512 << 20, Running: true}
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	full := &recorder{}
	res, err := d.BackUp(ctx, uid, driver.BackupRequest{ID: "b1"}, full)
	require.NoError(t, err)
	assert.True(t, res.Full)
	assert.True(t, res.Frozen, "every fake guest has an agent that answers")
	assert.Equal(t, driver.BackupDisk{Name: "root", Size: 1 << 30}, full.disk)
	assert.Len(t, full.data, imageBlocks+1, "the image's blocks and the guest's own")

	written := bytes.Repeat([]byte{0x5a}, BlockSize)
	require.NoError(t, d.WriteDisk(uid, 64<<20, written))
	require.NoError(t, d.WriteDisk(uid, 0, make([]byte, BlockSize)))
	incr := &recorder{}
	res, err = d.BackUp(ctx, uid, driver.BackupRequest{ID: "b2", Since: "b1"}, incr)
	require.NoError(t, err)
	assert.False(t, res.Full)
	assert.Equal(t, map[int64][]byte{64 << 20: written}, incr.data, "only what was written since b1")
	assert.Equal(t, []int64{0}, incr.zeros, "a block written with zeros reads as zeros now")
	assert.Equal(t, []string{"b1", "b2"}, d.Checkpoints(uid), "b1 stays until b2 is committed")

	require.NoError(t, d.CommitBackup(ctx, uid, "b2"))
	assert.Equal(t, []string{"b2"}, d.Checkpoints(uid))
	res, err = d.BackUp(ctx, uid, driver.BackupRequest{ID: "b3", Since: "b1"}, &recorder{})
	require.NoError(t, err)
	assert.True(t, res.Full, "a checkpoint forgotten is a full backup")

	want, err := d.DiskDigest(uid)
	require.NoError(t, err)
	// The disk as it is now: the full backup with the incremental on it.
	now := &recorder{disk: full.disk, data: full.data}
	for off, p := range incr.data {
		now.data[off] = p
	}
	for _, off := range incr.zeros {
		delete(now.data, off)
	}
	got, err := DigestOf(ctx, source{now})
	require.NoError(t, err)
	assert.Equal(t, want, got, "the backups read back are the disk as it is now")
	got, err = DigestOf(ctx, pieces{source{now}, 100_000})
	require.NoError(t, err)
	assert.Equal(t, want, got, "however the extents cut the disk")

	require.NoError(t, d.WriteDisk(uid, 128<<20, written))
	changed, err := d.DiskDigest(uid)
	require.NoError(t, err)
	assert.NotEqual(t, got, changed, "the disk written since is not the backups'")
}

// pieces hands a source's extents in pieces of n bytes, a piece running
// on into the next extent where they touch: extents that do not keep to
// BlockSize.
type pieces struct {
	source
	n int
}

func (p pieces) Extents(ctx context.Context, fn func(int64, []byte) error) error {
	var run []byte
	var at int64
	flush := func() error {
		for len(run) > 0 {
			n := min(p.n, len(run))
			if err := fn(at, run[:n]); err != nil {
				return err
			}
			at, run = at+int64(n), run[n:]
		}
		return nil
	}
	err := p.source.Extents(ctx, func(off int64, b []byte) error {
		if off != at+int64(len(run)) {
			if err := flush(); err != nil {
				return err
			}
			at = off
		}
		run = append(run, b...)
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}
