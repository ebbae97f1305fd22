package libvirt

import (
	"bytes"
	"context"
	"io"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// uploads records the uploads a restore makes.
type uploads struct {
	API
	calls []upload
}

type upload struct {
	off  uint64
	data []byte
}

func (u *uploads) StorageVolUpload(_ golibvirt.StorageVol, r io.Reader, off, length uint64, _ golibvirt.StorageVolUploadFlags) error {
	b, err := io.ReadAll(r)
	if err == nil && uint64(len(b)) != length {
		err = io.ErrShortBuffer
	}
	u.calls = append(u.calls, upload{off: off, data: b})
	return err
}

// TestARestoreUploadsNearbyExtentsTogether sends a disk's extents in few
// uploads: touching and nearby ones in one (the gap sent as zeros, which
// the copy into qcow2 skips), far ones and too much in the next.
func TestARestoreUploadsNearbyExtentsTogether(t *testing.T) {
	block := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	rec := &uploads{}
	u := uploader{api: rec, size: 64 << 20}
	require.NoError(t, u.add(0, block(1, 64<<10)))
	require.NoError(t, u.add(64<<10, block(2, 64<<10)))
	require.NoError(t, u.add(128<<10+100<<10, block(3, 4)), "100 KiB further: in the same upload")
	require.NoError(t, u.add(4<<20, block(4, 64<<10)), "MiBs further: the next")
	require.NoError(t, u.add(5<<20, block(5, 8<<20)), "more than an upload holds: the next")
	require.NoError(t, u.flush())

	require.Len(t, rec.calls, 3)
	first := append(append(append(block(1, 64<<10), block(2, 64<<10)...), make([]byte, 100<<10)...), block(3, 4)...)
	assert.Equal(t, upload{off: 0, data: first}, rec.calls[0])
	assert.Equal(t, upload{off: 4 << 20, data: block(4, 64<<10)}, rec.calls[1])
	assert.Equal(t, upload{off: 5 << 20, data: block(5, 8<<20)}, rec.calls[2])

	assert.ErrorContains(t, u.add(1<<20, block(6, 1)), "comes before the end of the one before")
	assert.ErrorContains(t, u.add(64<<20-1, block(7, 2)), "ends past the disk's")
}

// TestBackupsOnTheTestDriver: libvirt's test driver has no backup API and
// uploads nothing, so backups and restores are refused there for good,
// while a commit has no checkpoint to forget and a snapshot none to mind.
func TestBackupsOnTheTestDriver(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "backups")
	d := open(t, node)
	m := machine("backed")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	_, err = d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b1"}, &backupRecorder{})
	assert.True(t, driver.IsTerminal(err), "%v", err)
	assert.NoError(t, d.CommitBackup(ctx, m.UID, "b1"))
	err = d.RestoreDisks(ctx, "5d1c3b2a-4e6f-4a8b-9c0d-1e2f3a4b5c6d", nil)
	assert.True(t, driver.IsTerminal(err), "%v", err)
	_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "s1"})
	assert.NoError(t, err)

	_, err = d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b1", Since: "b1"}, &backupRecorder{})
	assert.True(t, driver.IsTerminal(err), "a backup since itself: %v", err)
	err = d.CommitBackup(ctx, "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d", "b1")
	assert.True(t, driver.IsNotFound(err), "no such guest: %v", err)
}

// TestOwnVolumesOfBackupsAndRestores: what backups and restores make for
// the while is the driver's own, never a Volume's.
func TestOwnVolumesOfBackupsAndRestores(t *testing.T) {
	uid := "5d1c3b2a-4e6f-4a8b-9c0d-1e2f3a4b5c6d"
	for _, name := range []string{backupScratch(uid, "vda"), restoreVolume(uid, "root"), restoreVolume(uid, "team-a_data"), restoreMarker(uid)} {
		assert.True(t, ownVolume(name), name)
	}
	assert.NotEqual(t, restoreVolume(uid, "root"), restoreVolume(uid, "team-a_data"))
	assert.False(t, ownVolume("team-a_backup"))
}
