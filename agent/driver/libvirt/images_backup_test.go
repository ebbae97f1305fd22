package libvirt

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

// backedUpDisk writes a backup, team-a/id, of one disk, root, of size
// bytes with data at its start, to a bucket of a new store, and returns
// where it is.
func backedUpDisk(t *testing.T, id string, size int64, data []byte) wire.BackupLocation {
	t.Helper()
	ctx := context.Background()
	srv := s3test.New(t)
	require.NoError(t, srv.MakeBucket(ctx, "backups"))
	loc := wire.BackupLocation{
		Endpoint: srv.Endpoint, Insecure: true, Region: srv.Region, Bucket: "backups",
		Credentials: wire.BackupCredentials{AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey},
	}
	s, err := backupstore.Open(ctx, backupstore.LocationOf(loc))
	require.NoError(t, err)
	w, err := s.NewWriter(ctx, backupstore.Manifest{Namespace: "team-a", VMName: "vm", VMUID: "vm-uid", ID: id}, nil)
	require.NoError(t, err)
	require.NoError(t, w.Disk(driver.BackupDisk{Name: "root", Size: size}))
	require.NoError(t, w.Data(0, data))
	require.NoError(t, w.Zero(int64(len(data)), size-int64(len(data))))
	_, err = w.Commit(ctx)
	require.NoError(t, err)
	return loc
}

func TestAnImageFromABackupBecomesTheImageVolume(t *testing.T) {
	node := libvirttest.Start(t, "img-backup")
	d := open(t, node)
	useImports(d, imageimport.Config{Dir: t.TempDir()})
	const size = 16 << 20
	loc := backedUpDisk(t, "b-1", size, serveRawImage(t, 1<<20).data)
	img := &driver.Image{
		UID: "5d1c0e6a-0000-4000-8000-000000000701", Name: "restored", Format: "raw",
		Backup: &wire.ImageBackup{Location: loc, Namespace: "team-a", ID: "b-1", Disk: "root"},
	}
	m := imageMachine("restored", img)

	o, err := ensureUntil(t, d, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	image := volumeXML(t, node, imageVolume(img.UID))
	assert.Equal(t, uint64(size), image.Capacity.Value, "the image volume has the backed-up disk's size")
	assert.Equal(t, "raw", image.Target.Format.Type)
	disk := volumeXML(t, node, m.Disks[0].Name)
	assert.Nil(t, disk.BackingStore, "a disk of a raw image is a copy")
	assert.Equal(t, uint64(m.Disks[0].SizeBytes), disk.Capacity.Value)
	st, err := d.Images(context.Background())
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, driver.ImagePhaseReady, st[0].Phase)
	assert.False(t, st[0].ImportFinished.IsZero(), "imported here: %+v", st[0])
	left, _ := filepath.Glob(filepath.Join(d.images.Dir(), "*"))
	assert.Empty(t, left, "the raw file is removed once imported")

	t.Run("a missing backup fails naming it, and makes nothing", func(t *testing.T) {
		img := *img
		img.UID = "5d1c0e6a-0000-4000-8000-000000000702"
		img.Backup = &wire.ImageBackup{Location: loc, Namespace: "team-a", ID: "b-gone", Disk: "root"}
		m := imageMachine("gone", &img)
		_, err := ensureUntil(t, d, m)
		require.Error(t, err)
		assert.True(t, driver.IsFailing(err), "shown to the user and retried: %v", err)
		assert.ErrorContains(t, err, "cannot import image restored from disk root of backup team-a/b-gone")
		l := raw(t, node)
		assert.False(t, volumeExists(t, l, imageVolume(img.UID)), "no image")
		assert.False(t, volumeExists(t, l, m.Disks[0].Name), "no disk without its image")
		left, _ := filepath.Glob(filepath.Join(d.images.Dir(), "*"))
		assert.Empty(t, left, "nothing left behind")
	})
}
