package imageimport

import (
	"bytes"
	"context"
	"encoding/binary"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

const mib = 1 << 20

// backupBucket is the bucket the tests keep backups in.
const backupBucket = "backups"

// backupLocation makes the backup bucket on srv and returns a location in
// it, with key to encrypt under (nil for none).
func backupLocation(t testing.TB, srv *s3test.Server, key []byte) wire.BackupLocation {
	t.Helper()
	require.NoError(t, srv.MakeBucket(context.Background(), backupBucket))
	return locationIn(srv, key)
}

func locationIn(srv *s3test.Server, key []byte) wire.BackupLocation {
	return wire.BackupLocation{
		Endpoint: srv.Endpoint, Insecure: true, Region: srv.Region, Bucket: backupBucket, Prefix: "site-a",
		Credentials: wire.BackupCredentials{AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, EncryptionKey: key},
	}
}

// seeded returns n bytes that seed always makes the same.
func seeded(seed uint64, n int) []byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(s).Read(p)
	return p
}

// writeBackup backs up disk root of size bytes holding data at the offsets
// of data, zeros elsewhere, as backup namespace/id in loc, and returns the
// disk as it should read back and the manifest.
func writeBackup(t testing.TB, loc wire.BackupLocation, id string, size int64, data map[int64][]byte) ([]byte, backupstore.Manifest) {
	t.Helper()
	ctx := context.Background()
	s, err := backupstore.Open(ctx, backupstore.LocationOf(loc))
	require.NoError(t, err)
	w, err := s.NewWriter(ctx, backupstore.Manifest{Namespace: "team-a", VMName: "vm", VMUID: "vm-uid", ID: id}, nil)
	require.NoError(t, err)
	require.NoError(t, w.Disk(driver.BackupDisk{Name: "root", Size: size}))
	want := make([]byte, size)
	var pos int64
	for _, off := range slices.Sorted(maps.Keys(data)) {
		if off > pos {
			require.NoError(t, w.Zero(pos, off-pos))
		}
		require.NoError(t, w.Data(off, data[off]))
		copy(want[off:], data[off])
		pos = off + int64(len(data[off]))
	}
	if pos < size {
		require.NoError(t, w.Zero(pos, size-pos))
	}
	m, err := w.Commit(ctx)
	require.NoError(t, err)
	return want, m
}

func backupImage(loc wire.BackupLocation, id, disk string) *driver.Image {
	return &driver.Image{
		UID: "5d1c0e6a-0000-4000-8000-00000000b001", Name: "restored", Format: "raw",
		Backup: &wire.ImageBackup{Location: loc, Namespace: "team-a", ID: id, Disk: disk},
	}
}

// fromBackup runs FromBackup as one import job of a store in dir.
func fromBackup(t testing.TB, dir string, img *driver.Image) (*Job, string, int64, error) {
	t.Helper()
	s := New(Config{Dir: dir})
	j := s.newJob(InputOf(img), 0)
	path, size, err := j.FromBackup(context.Background(), img)
	return j, path, size, err
}

// allocated is how many bytes the file at path takes on its file system.
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

func assertNoFiles(t *testing.T, dir string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	assert.Empty(t, left, "a failed import leaves nothing")
}

func TestFromBackup(t *testing.T) {
	srv := s3test.New(t)
	loc := backupLocation(t, srv, nil)
	const size = 64 * mib
	data := map[int64][]byte{
		0:                   seeded(1, 3*mib+4096), // crosses chunk windows
		10*mib + 512:        seeded(2, 100),        // a small write inside a window
		40 * mib:            seeded(3, mib),
		size - 3*mib - 4096: seeded(4, 3*mib+4096), // up to the disk's end
	}
	want, m := writeBackup(t, loc, "b-1", size, data)
	var dataBytes int64
	for _, p := range data {
		dataBytes += int64(len(p))
	}

	t.Run("the disk becomes a sparse raw file of its size", func(t *testing.T) {
		dir := t.TempDir()
		j, path, n, err := fromBackup(t, dir, backupImage(loc, "b-1", "root"))
		require.NoError(t, err)
		assert.Equal(t, int64(size), n)
		assert.Equal(t, dir, filepath.Dir(path))
		got, err := os.ReadFile(path) //nolint:gosec // the test's own file
		require.NoError(t, err)
		require.Len(t, got, size)
		assert.True(t, bytes.Equal(want, got), "the file holds the disk as it was backed up")
		// The holes stay holes: what the file takes is about its data,
		// whatever the file system's block size rounds it to.
		assert.Less(t, allocated(t, path), dataBytes+8*mib, "the file is sparse")
		assert.Equal(t, dataBytes, j.read.Load(), "progress follows the data written")
		assert.Equal(t, dataBytes, j.total.Load())
		d, _ := m.Disk("root")
		t.Logf("%d MiB disk, %d extents, %d bytes of data: the file takes %d bytes", size/mib, len(d.Extents), dataBytes, allocated(t, path))
	})

	t.Run("a missing backup says which", func(t *testing.T) {
		dir := t.TempDir()
		_, _, _, err := fromBackup(t, dir, backupImage(loc, "b-none", "root"))
		require.ErrorIs(t, err, backupstore.ErrNotFound)
		assert.ErrorContains(t, err, "cannot import image restored from disk root of backup team-a/b-none in bucket backups at "+srv.Endpoint)
		assert.False(t, driver.IsTerminal(err), "the backup may yet be found: retried")
		assertNoFiles(t, dir)
	})

	t.Run("another namespace's backup is not found under this one's", func(t *testing.T) {
		// A tenant that learnt team-a's backup id names it from its own
		// namespace: the hub sends the node the image's namespace, and
		// the store keeps each namespace's backups under its own key.
		dir := t.TempDir()
		img := backupImage(loc, "b-1", "root")
		img.Backup.Namespace = "team-b"
		_, _, _, err := fromBackup(t, dir, img)
		require.ErrorIs(t, err, backupstore.ErrNotFound)
		assert.ErrorContains(t, err, "backup team-b/b-1")
		assertNoFiles(t, dir)
	})

	t.Run("a missing disk says which", func(t *testing.T) {
		dir := t.TempDir()
		_, _, _, err := fromBackup(t, dir, backupImage(loc, "b-1", "data"))
		require.ErrorIs(t, err, backupstore.ErrNotFound)
		assert.ErrorContains(t, err, "backup team-a/b-1 has no disk data")
		assertNoFiles(t, dir)
	})

	t.Run("a backup under another key is terminal", func(t *testing.T) {
		key := bytes.Repeat([]byte{7}, 32)
		want, _ := writeBackup(t, locationIn(srv, key), "b-sealed", 4*mib, map[int64][]byte{mib: seeded(8, mib)})
		for name, other := range map[string][]byte{"another key": bytes.Repeat([]byte{8}, 32), "no key": nil} {
			dir := t.TempDir()
			_, _, _, err := fromBackup(t, dir, backupImage(locationIn(srv, other), "b-sealed", "root"))
			require.ErrorIs(t, err, backupstore.ErrWrongKey, name)
			assert.ErrorContains(t, err, "backup team-a/b-sealed", name)
			assert.True(t, driver.IsTerminal(err), "only the right key mends it: %v", err)
			assertNoFiles(t, dir)
		}
		dir := t.TempDir()
		_, path, _, err := fromBackup(t, dir, backupImage(locationIn(srv, key), "b-sealed", "root"))
		require.NoError(t, err)
		got, err := os.ReadFile(path) //nolint:gosec // the test's own file
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, got), "its own key reads it")
	})

	t.Run("an image that is not raw is refused", func(t *testing.T) {
		dir := t.TempDir()
		img := backupImage(loc, "b-1", "root")
		img.Format = ""
		_, _, _, err := fromBackup(t, dir, img)
		require.Error(t, err)
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, `a disk of a backup is a raw image, but the image says its format is "qcow2"`)
		assertNoFiles(t, dir)
	})

	t.Run("more data than the node accepts is refused before reading it", func(t *testing.T) {
		dir := t.TempDir()
		s := New(Config{Dir: dir, MaxBytes: 2 * mib})
		img := backupImage(loc, "b-1", "root")
		_, _, err := s.newJob(InputOf(img), 0).FromBackup(context.Background(), img)
		var tooLarge *TooLargeError
		require.ErrorAs(t, err, &tooLarge)
		assert.Equal(t, dataBytes, tooLarge.Size)
		assertNoFiles(t, dir)
	})

	t.Run("a corrupt chunk fails the import and leaves nothing", func(t *testing.T) {
		// Its own backup, so that the chunk damaged is no other's.
		_, m := writeBackup(t, loc, "b-corrupt", 8*mib, map[int64][]byte{0: seeded(5, 2*mib), 6 * mib: seeded(6, mib)})
		d, _ := m.Disk("root")
		chunk := d.Extents[len(d.Extents)-1].Chunk
		c, err := srv.Client()
		require.NoError(t, err)
		junk := seeded(7, mib)
		_, err = c.PutObject(context.Background(), backupBucket, "site-a/chunks/"+chunk[:4]+"/"+chunk, bytes.NewReader(junk), int64(len(junk)), minio.PutObjectOptions{})
		require.NoError(t, err)

		dir := t.TempDir()
		_, _, _, err = fromBackup(t, dir, backupImage(loc, "b-corrupt", "root"))
		require.ErrorIs(t, err, backupstore.ErrCorrupt)
		assert.ErrorContains(t, err, "backup team-a/b-corrupt")
		assert.ErrorContains(t, err, "corrupt chunk "+chunk)
		assertNoFiles(t, dir)
	})
}

func TestInputOfABackupIsWhereItIsAndWhichDisk(t *testing.T) {
	loc := wire.BackupLocation{Endpoint: "s3.example:9000", Bucket: backupBucket, Prefix: "site-a", Credentials: wire.BackupCredentials{
		AccessKeyID: "AKIDSECRETISH", SecretAccessKey: "very-secret",
	}}
	root := InputOf(backupImage(loc, "b-1", "root"))
	assert.NotEqual(t, root, InputOf(backupImage(loc, "b-1", "data")), "another disk")
	assert.NotEqual(t, root, InputOf(backupImage(loc, "b-2", "root")), "another backup")
	other := loc
	other.Bucket = "elsewhere"
	assert.NotEqual(t, root, InputOf(backupImage(other, "b-1", "root")), "another location")
	assert.NotEqual(t, root, InputOf(&driver.Image{UID: "u", Format: "raw"}), "no backup")

	rotated := loc
	rotated.Credentials.SecretAccessKey = "rotated"
	assert.Equal(t, root, InputOf(backupImage(rotated, "b-1", "root")), "new credentials read the same backup")
	assert.False(t, strings.Contains(root, "very-secret") || strings.Contains(root, "AKIDSECRETISH"), "no credentials in %s", root)
}

// BenchmarkFromBackup makes the raw image of a 1 GiB disk holding 200 MiB
// of data, in runs of 4 MiB spread over the disk, from a real store.
func BenchmarkFromBackup(b *testing.B) {
	const size, run, runs = 1 << 30, 4 * mib, 50
	srv := s3test.New(b)
	loc := backupLocation(b, srv, nil)
	data := map[int64][]byte{}
	for i := range int64(runs) {
		data[i*(size/runs)] = seeded(uint64(100+i), run)
	}
	start := time.Now()
	writeBackup(b, loc, "bench", size, data)
	b.Logf("backed up %d MiB of data of a %d MiB disk in %s", runs*run/mib, size/mib, time.Since(start))
	img := backupImage(loc, "bench", "root")
	b.SetBytes(runs * run)
	for b.Loop() {
		dir := b.TempDir()
		_, path, _, err := fromBackup(b, dir, img)
		require.NoError(b, err)
		b.StopTimer()
		b.ReportMetric(float64(allocated(b, path))/mib, "MiB-on-disk")
		require.NoError(b, os.Remove(path))
		b.StartTimer()
	}
}
