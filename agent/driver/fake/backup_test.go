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
// kept until a later backup is committed, and a restore that makes the
// same disk for another guest.
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
	const other = "0c6b1f0e-2a54-4d8e-9b1c-3f5e7a9c1d2b"
	require.NoError(t, d.RestoreDisks(ctx, other, []driver.DiskSource{source{now}}))
	got, err := d.DiskDigest(other)
	require.NoError(t, err)
	assert.Equal(t, want, got, "the restored disk before its guest is ensured")
	restored := m
	restored.UID = other
	_, err = d.Ensure(ctx, restored)
	require.NoError(t, err)
	got, err = d.DiskDigest(other)
	require.NoError(t, err)
	assert.Equal(t, want, got, "the guest ensured after the restore starts from its disk")
}
