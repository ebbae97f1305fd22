package backupstore

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

// s3Location makes a bucket on srv and returns a Location in it.
func s3Location(t testing.TB, srv *s3test.Server, key []byte) Location {
	t.Helper()
	require.NoError(t, srv.MakeBucket(context.Background(), "backups"))
	return Location{
		Endpoint: srv.Endpoint, Region: srv.Region, Bucket: "backups", Prefix: "site-a",
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Key: key,
	}
}

// s3Keys lists the bucket's keys under prefix, as the store holds them.
func s3Keys(t *testing.T, c *minio.Client, prefix string) []string {
	t.Helper()
	var keys []string
	for o := range c.ListObjects(context.Background(), "backups", minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		require.NoError(t, o.Err)
		keys = append(keys, o.Key)
	}
	return keys
}

func TestS3(t *testing.T) {
	ctx := context.Background()
	srv := s3test.New(t)
	loc := s3Location(t, srv, nil)
	client, err := srv.Client()
	require.NoError(t, err)
	s, err := Open(ctx, loc)
	require.NoError(t, err)

	img := randomBytes(100, 3*mib)
	ops := []op{
		disk("root", 8*mib+100), data(0, img), data(5*mib, zeros(mib)), data(8*mib, randomBytes(101, 100)),
		disk("data", mib), dataSplit(0, randomBytes(102, mib), 4096),
	}
	first, stats := backUp(t, s, header("tenant", "vm-a", "a1"), nil, ops)
	assert.Equal(t, Stats{BytesRead: int64(len(img)) + mib + 100 + mib, BytesWritten: 4*mib + 100, ChunksWritten: 5}, stats)

	t.Run("a backup reads back as it was written", func(t *testing.T) {
		assertImages(t, apply(nil, ops), restore(t, s, first))
		got, err := s.Manifest(ctx, "tenant", "a1")
		require.NoError(t, err)
		assert.Equal(t, first.Disks, got.Disks)
	})

	t.Run("the same data of another VM is stored once", func(t *testing.T) {
		m, stats := backUp(t, s, header("tenant", "vm-b", "b1"), nil, ops)
		assert.Equal(t, int64(5), stats.ChunksReused)
		assert.Zero(t, stats.ChunksWritten)
		assert.Zero(t, stats.BytesWritten)
		assert.Len(t, s3Keys(t, client, "site-a/chunks/"), 5)
		assertImages(t, apply(nil, ops), restore(t, s, m))
	})

	t.Run("an incremental outlives its parent", func(t *testing.T) {
		incr := []op{disk("root", 8*mib+100), data(mib, randomBytes(103, mib)), disk("data", mib)}
		m, stats := backUp(t, s, header("tenant", "vm-a", "a2"), &first, incr)
		assert.Equal(t, int64(1), stats.ChunksWritten)
		require.NoError(t, s.Delete(ctx, "tenant", "a1"))
		require.NoError(t, s.Delete(ctx, "tenant", "b1"))
		res, err := s.CollectGarbage(ctx, time.Now().Add(time.Hour))
		require.NoError(t, err)
		assert.Equal(t, GCResult{Manifests: 1, ChunksKept: 5, ChunksDeleted: 1, BytesDeleted: mib}, res)
		assertImages(t, apply(apply(nil, ops), incr), restore(t, s, m))
		assert.Empty(t, s3Keys(t, client, "site-a/locks/"))
	})

	t.Run("verify reports a chunk corrupted in the store", func(t *testing.T) {
		m, err := s.Manifest(ctx, "tenant", "a2")
		require.NoError(t, err)
		bad := extentsOf(m, "root")[0].Chunk
		key := s.chunkKey(bad)
		obj, err := client.GetObject(ctx, "backups", key, minio.GetObjectOptions{})
		require.NoError(t, err)
		body, err := io.ReadAll(obj)
		require.NoError(t, err)
		body[7] ^= 0x80
		_, err = client.PutObject(ctx, "backups", key, bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{})
		require.NoError(t, err)

		res, err := s.Verify(ctx, m, nil)
		require.NoError(t, err)
		assert.Equal(t, []BadChunk{{Chunk: bad, Reason: "its content does not match its name"}}, res.Bad)
		assert.Equal(t, 5, res.Chunks)
	})
}

func TestS3Refusals(t *testing.T) {
	ctx := context.Background()
	srv := s3test.New(t)
	loc := s3Location(t, srv, nil)

	wrongSecret := loc
	wrongSecret.SecretKey += "x"
	_, err := Open(ctx, wrongSecret)
	assert.ErrorIs(t, err, ErrAccessDenied, "a wrong secret key")

	wrongAccess := loc
	wrongAccess.AccessKey = "nobody"
	_, err = Open(ctx, wrongAccess)
	assert.ErrorIs(t, err, ErrAccessDenied, "an unknown access key")

	noBucket := loc
	noBucket.Bucket = "nope"
	_, err = Open(ctx, noBucket)
	assert.ErrorIs(t, err, ErrNoBucket)

	s, err := Open(ctx, loc)
	require.NoError(t, err)
	_, err = s.Manifest(ctx, "tenant", "none")
	assert.ErrorIs(t, err, ErrNotFound)
}

// BenchmarkS3 writes and reads back a 256 MiB disk of random data (nothing
// to deduplicate) on a real store.
func BenchmarkS3(b *testing.B) {
	const size = 256 * mib
	srv := s3test.New(b)
	ctx := context.Background()
	base := s3Location(b, srv, nil)
	for _, enc := range []struct {
		name string
		key  []byte
	}{{"plain", nil}, {"encrypted", testKey(9)}} {
		loc := base
		loc.Prefix, loc.Key = enc.name, enc.key
		s, err := Open(ctx, loc)
		require.NoError(b, err)
		var last Manifest
		b.Run("write/"+enc.name, func(b *testing.B) {
			b.SetBytes(size)
			n := 0
			for b.Loop() {
				b.StopTimer()
				img := randomBytes(uint64(1000+n), size)
				n++
				b.StartTimer()
				w, err := s.NewWriter(ctx, header("bench", "vm", enc.name+strconv.Itoa(n)), nil)
				require.NoError(b, err)
				require.NoError(b, w.Disk(driver.BackupDisk{Name: "root", Size: size}))
				for off := 0; off < size; off += 4 * mib {
					require.NoError(b, w.Data(int64(off), img[off:off+4*mib]))
				}
				last, err = w.Commit(ctx)
				require.NoError(b, err)
			}
		})
		b.Run("read/"+enc.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				src, err := s.Source(last, "root")
				require.NoError(b, err)
				var got int64
				require.NoError(b, src.Extents(ctx, func(_ int64, p []byte) error {
					got += int64(len(p))
					return nil
				}))
				require.Equal(b, int64(size), got)
			}
		})
	}
}
