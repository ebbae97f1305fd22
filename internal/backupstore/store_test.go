package backupstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

const mib = ChunkSize

// op is one call to a Writer: a disk (size set), data (split into calls
// of split bytes, when set) or a zero range.
type op struct {
	disk  string
	size  int64
	off   int64
	data  []byte
	split int
	zero  int64
}

func disk(name string, size int64) op         { return op{disk: name, size: size} }
func data(off int64, p []byte) op             { return op{off: off, data: p} }
func dataSplit(off int64, p []byte, n int) op { return op{off: off, data: p, split: n} }
func zero(off, n int64) op                    { return op{off: off, zero: n} }
func zeros(n int64) []byte                    { return make([]byte, n) }
func header(ns, vm, id string) Manifest {
	return Manifest{Namespace: ns, VMName: vm, VMUID: "uid-" + vm, ID: id}
}

func extentsOf(m Manifest, name string) []Extent {
	d, _ := m.Disk(name)
	return d.Extents
}

// randomBytes returns n bytes that seed always makes the same.
func randomBytes(seed uint64, n int64) []byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(s).Read(p)
	return p
}

// images are the disks a backup should hold, by name.
type images map[string][]byte

// apply returns what ops make of base: a disk that base has is resized,
// one it lacks starts as zeros, and disks no op names are gone.
func apply(base images, ops []op) images {
	out := images{}
	var cur string
	for _, o := range ops {
		switch {
		case o.disk != "":
			cur = o.disk
			img := make([]byte, o.size)
			copy(img, base[cur])
			out[cur] = img
		case o.data != nil:
			copy(out[cur][o.off:], o.data)
		default:
			copy(out[cur][o.off:], zeros(o.zero))
		}
	}
	return out
}

// write hands ops to w.
func write(t *testing.T, w *Writer, ops []op) {
	t.Helper()
	for _, o := range ops {
		switch {
		case o.disk != "":
			require.NoError(t, w.Disk(driver.BackupDisk{Name: o.disk, Size: o.size}))
		case o.data != nil:
			n := o.split
			if n == 0 {
				n = len(o.data)
			}
			for i := 0; i < len(o.data); i += n {
				require.NoError(t, w.Data(o.off+int64(i), o.data[i:min(i+n, len(o.data))]))
			}
		default:
			require.NoError(t, w.Zero(o.off, o.zero))
		}
	}
}

// backUp writes one backup of ops and commits it.
func backUp(t *testing.T, s *Store, h Manifest, parent *Manifest, ops []op) (Manifest, Stats) {
	t.Helper()
	ctx := context.Background()
	w, err := s.NewWriter(ctx, h, parent)
	require.NoError(t, err)
	write(t, w, ops)
	m, err := w.Commit(ctx)
	require.NoError(t, err)
	return m, w.Stats()
}

// restore reads every disk of m back through Source, checking that the
// extents come in increasing order without overlap.
func restore(t *testing.T, s *Store, m Manifest) images {
	t.Helper()
	out := images{}
	for _, d := range m.Disks {
		src, err := s.Source(m, d.Name)
		require.NoError(t, err)
		require.Equal(t, driver.BackupDisk{Name: d.Name, Size: d.Size}, src.Disk())
		img := make([]byte, d.Size)
		var end int64
		require.NoError(t, src.Extents(context.Background(), func(off int64, p []byte) error {
			require.GreaterOrEqual(t, off, end, "extents out of order")
			end = off + int64(len(p))
			copy(img[off:], p)
			return nil
		}))
		out[d.Name] = img
	}
	return out
}

// assertImages compares disk images without printing megabytes.
func assertImages(t *testing.T, want, got images) {
	t.Helper()
	require.Len(t, got, len(want))
	for name, w := range want {
		g, ok := got[name]
		require.True(t, ok, "disk %s missing", name)
		require.Len(t, g, len(w), "disk %s size", name)
		if i := firstDiff(w, g); i >= 0 {
			t.Fatalf("disk %s differs first at offset %d (window %d)", name, i, i/mib)
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestFullBackupRoundTrip(t *testing.T) {
	size := int64(5*mib + 12345)
	cases := map[string]struct {
		ops         []op
		wantExtents int // of disk "root"
		wantChunks  int64
	}{
		"random data with holes and a zero window": {
			ops: []op{
				disk("root", size),
				data(0, randomBytes(1, mib+mib/2)),                  // window 0, half of 1
				data(2*mib, zeros(mib)),                             // window 2: all zeros, a hole
				dataSplit(3*mib+100, randomBytes(2, mib+100), 4096), // windows 3, 4
				data(5*mib, randomBytes(3, 12345)),                  // the short last window
			},
			wantExtents: 5, wantChunks: 5,
		},
		"small unaligned calls coalesce into one chunk per window": {
			ops:         []op{disk("root", size), dataSplit(0, randomBytes(4, 2*mib), 1000)},
			wantExtents: 2, wantChunks: 2,
		},
		"zero pieces inside a window leave holes": {
			ops: []op{
				disk("root", size),
				data(0, randomBytes(5, 4096)), zero(4096, 4096), data(8192, randomBytes(6, 4096)),
				data(mib, append(randomBytes(7, 512), zeros(mib-512)...)),
			},
			wantExtents: 3, wantChunks: 3,
		},
		"an empty disk and a second disk": {
			ops: []op{
				disk("root", 64*mib),
				disk("data", mib+1), data(mib, []byte{7}),
			},
			wantExtents: 0, wantChunks: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := newMemStore(t, nil)
			m, stats := backUp(t, s.Store, header("tenant", "vm", "b1"), nil, tc.ops)
			assertImages(t, apply(nil, tc.ops), restore(t, s.Store, m))
			assert.True(t, m.Full)
			assert.Len(t, extentsOf(m, "root"), tc.wantExtents)
			assert.Equal(t, tc.wantChunks, stats.ChunksWritten)
			var read int64
			for _, o := range tc.ops {
				read += int64(len(o.data))
			}
			assert.Equal(t, read, stats.BytesRead)
			assert.Len(t, s.objs.keys("backups/chunks/"), int(tc.wantChunks))
		})
	}
}

func TestIncrementalOverlay(t *testing.T) {
	root := randomBytes(10, 4*mib)
	parentOps := []op{
		disk("root", 4*mib), data(0, root),
		disk("data", 2*mib), data(0, randomBytes(11, 2*mib)),
	}
	cases := map[string]struct {
		ops      []op
		markFull bool
		// wantInherited is how many of root's extents still name a
		// chunk of the parent.
		wantInherited int
	}{
		"data across a window edge splits the parent's extents": {
			ops: []op{
				disk("root", 4*mib), data(mib-1000, randomBytes(20, 6000)),
				disk("data", 2*mib),
			},
			wantInherited: 4, // windows 0, 1 (cut), 2, 3
		},
		"a zero range across windows punches a hole": {
			ops:           []op{disk("root", 4*mib), zero(mib/2, 2*mib+10), disk("data", 2*mib)},
			wantInherited: 3, // window 0 up to the hole, window 2 after it, window 3
		},
		"zero data over the parent's data is a hole": {
			ops:           []op{disk("root", 4*mib), data(3*mib, zeros(mib)), disk("data", 2*mib)},
			wantInherited: 3,
		},
		"writes, zeros and writes in one window": {
			ops: []op{
				disk("root", 4*mib),
				data(100, randomBytes(21, 100)), zero(300, 200), data(600, randomBytes(22, 5000)),
				data(2*mib-10, randomBytes(23, 20)),
				disk("data", 2*mib),
			},
			wantInherited: 7, // window 0 in four pieces, window 1 cut, window 2 after it, window 3
		},
		"a disk the parent lacks starts empty, one not handed is gone": {
			ops: []op{
				disk("root", 4*mib),
				disk("new", 3*mib), data(mib+5, randomBytes(24, 100)),
			},
			wantInherited: 4,
		},
		"a grown disk keeps the parent's data and reads zeros beyond it": {
			ops:           []op{disk("root", 6*mib), data(5*mib, randomBytes(25, 10)), disk("data", 2*mib)},
			wantInherited: 4,
		},
		"a shrunk disk keeps the parent's data up to its size": {
			ops:           []op{disk("root", 2*mib+77), disk("data", 2*mib)},
			wantInherited: 3,
		},
		"MarkFull drops the parent's data": {
			ops:      []op{disk("root", 4*mib), data(0, randomBytes(26, 1000)), disk("data", 2*mib)},
			markFull: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := newMemStore(t, nil)
			parent, _ := backUp(t, s.Store, header("tenant", "vm", "full"), nil, parentOps)
			w, err := s.NewWriter(ctx, header("tenant", "vm", "incr"), &parent)
			require.NoError(t, err)
			write(t, w, tc.ops)
			if tc.markFull {
				w.MarkFull()
			}
			m, err := w.Commit(ctx)
			require.NoError(t, err)
			stored, err := s.Manifest(ctx, "tenant", "full")
			require.NoError(t, err)
			assert.Equal(t, stored.Disks, parent.Disks, "the parent handed in is left as it was")

			base := apply(nil, parentOps)
			if tc.markFull {
				base = nil
			}
			assertImages(t, apply(base, tc.ops), restore(t, s.Store, m))
			assert.Equal(t, tc.markFull, m.Full)
			if tc.markFull {
				assert.Empty(t, m.Parent)
			} else {
				assert.Equal(t, "full", m.Parent)
			}
			parentChunks := map[string]bool{}
			for _, id := range parent.Chunks() {
				parentChunks[id] = true
			}
			inherited := 0
			for _, e := range extentsOf(m, "root") {
				if parentChunks[e.Chunk] {
					inherited++
				}
			}
			assert.Equal(t, tc.wantInherited, inherited)
		})
	}
}

func TestIncrementalOutlivesItsParent(t *testing.T) {
	ctx := context.Background()
	s := newMemStore(t, nil)
	parentOps := []op{disk("root", 3*mib), data(0, randomBytes(30, 3*mib))}
	parent, _ := backUp(t, s.Store, header("tenant", "vm", "full"), nil, parentOps)
	ops := []op{
		disk("root", 3*mib),
		data(mib, randomBytes(31, mib)),      // replaces window 1 whole
		data(2*mib+10, randomBytes(32, 100)), // cuts into window 2
	}
	child, _ := backUp(t, s.Store, header("tenant", "vm", "incr"), &parent, ops)

	require.NoError(t, s.Delete(ctx, "tenant", "full"))
	s.clock.Add(2 * time.Hour)
	res, err := s.CollectGarbage(ctx, s.clock.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, res.ChunksDeleted, "only the parent's window 1 is referenced by no manifest")
	assert.Equal(t, int64(mib), res.BytesDeleted)
	assert.Equal(t, 1, res.Manifests)

	assertImages(t, apply(apply(nil, parentOps), ops), restore(t, s.Store, child))
	v, err := s.Verify(ctx, child, nil)
	require.NoError(t, err)
	assert.Empty(t, v.Bad)
}

func TestSameDataIsStoredOnce(t *testing.T) {
	img := randomBytes(40, 3*mib)
	window := randomBytes(41, mib)
	cases := map[string]struct {
		first, second []op
		// wantWritten, wantReused are the second backup's chunk stats.
		wantWritten, wantReused int64
		wantChunks              int
	}{
		"two VMs from one image": {
			first:       []op{disk("root", 4*mib), data(0, img)},
			second:      []op{disk("root", 4*mib), data(0, img)},
			wantWritten: 0, wantReused: 3, wantChunks: 3,
		},
		"one VM with one more window": {
			first:       []op{disk("root", 4*mib), data(0, img)},
			second:      []op{disk("root", 4*mib), data(0, img), data(3*mib, window)},
			wantWritten: 1, wantReused: 3, wantChunks: 4,
		},
		"the same window four times in one backup": {
			first: []op{disk("root", mib), data(0, img[:mib])},
			second: []op{
				disk("a", 4*mib), data(0, window), data(mib, window), data(2*mib, window), data(3*mib, window),
			},
			wantWritten: 1, wantReused: 3, wantChunks: 2,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := newMemStore(t, nil)
			backUp(t, s.Store, header("tenant", "vm-a", "a1"), nil, tc.first)
			m, stats := backUp(t, s.Store, header("tenant", "vm-b", "b1"), nil, tc.second)
			assert.Equal(t, tc.wantWritten, stats.ChunksWritten)
			assert.Equal(t, tc.wantReused, stats.ChunksReused)
			assert.Equal(t, tc.wantWritten*mib, stats.BytesWritten)
			assert.Len(t, s.objs.keys("backups/chunks/"), tc.wantChunks)
			assertImages(t, apply(nil, tc.second), restore(t, s.Store, m))
		})
	}
}

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func TestEncryptedStoreHoldsNoPlaintext(t *testing.T) {
	ctx := context.Background()
	s := newMemStore(t, testKey(1))
	pattern := []byte("virtfleet-known-plaintext-pattern")
	window := bytes.Repeat(pattern, mib/len(pattern)+1)[:mib]
	spec := json.RawMessage(`{"userData":"password=hunter2-secret"}`)
	h := header("tenant", "vm", "enc")
	h.Spec = spec
	ops := []op{disk("root", 2*mib), data(0, window), data(mib, randomBytes(50, mib))}
	m, _ := backUp(t, s.Store, h, nil, ops)

	assert.True(t, m.Encrypted)
	assert.NotEmpty(t, m.KeyFingerprint)
	plainID := sha256.Sum256(window)
	for _, key := range s.objs.keys("") {
		body := s.objs.body(key)
		assert.False(t, bytes.Contains(body, pattern[:16]), "%s holds the plaintext", key)
		assert.NotContains(t, string(body), "hunter2", "%s holds the spec", key)
		assert.NotContains(t, key, hex.EncodeToString(plainID[:]), "a chunk's name reveals its content")
	}
	assertImages(t, apply(nil, ops), restore(t, s.Store, m))
	got, err := s.Manifest(ctx, "tenant", "enc")
	require.NoError(t, err)
	assert.JSONEq(t, string(spec), string(got.Spec))

	cases := map[string]*Store{
		"another key": s.withKey(t, testKey(2)),
		"no key":      s.withKey(t, nil),
	}
	for name, other := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := other.Source(m, "root")
			assert.ErrorIs(t, err, ErrWrongKey)
			_, err = other.Verify(ctx, m, nil)
			assert.ErrorIs(t, err, ErrWrongKey)
			_, err = other.NewWriter(ctx, header("tenant", "vm", "next"), &m)
			assert.ErrorIs(t, err, ErrWrongKey)
			got, err := other.Manifest(ctx, "tenant", "enc")
			require.NoError(t, err, "a backup is listed, and can be deleted, without its key")
			assert.Nil(t, got.Spec)
			assert.NotEmpty(t, got.SealedSpec)
		})
	}
}

func TestVerifyReportsBadChunks(t *testing.T) {
	for name, key := range map[string][]byte{"plain": nil, "encrypted": testKey(3)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := newMemStore(t, key)
			ops := []op{disk("root", 4*mib), data(0, randomBytes(60, 4*mib))}
			m, _ := backUp(t, s.Store, header("tenant", "vm", "b"), nil, ops)
			ext := extentsOf(m, "root")
			corrupt, missing, moved := ext[0].Chunk, ext[2].Chunk, ext[3].Chunk

			body := bytes.Clone(s.objs.body(s.chunkKey(corrupt)))
			body[len(body)/2] ^= 0x01
			s.objs.set(s.chunkKey(corrupt), body)
			require.NoError(t, s.objs.delete(ctx, s.chunkKey(missing)))
			// A sound chunk stored under another chunk's name.
			s.objs.set(s.chunkKey(moved), s.objs.body(s.chunkKey(ext[1].Chunk)))

			var calls, lastChunks int
			res, err := s.Verify(ctx, m, func(chunks int, _ int64) {
				calls++
				assert.Greater(t, chunks, lastChunks, "progress only grows")
				lastChunks = chunks
			})
			require.NoError(t, err)
			assert.Equal(t, 4, res.Chunks)
			assert.Equal(t, 4, calls, "progress after each chunk")
			require.Len(t, res.Bad, 3)
			reasons := map[string]string{}
			for _, b := range res.Bad {
				reasons[b.Chunk] = b.Reason
			}
			assert.Contains(t, reasons, corrupt)
			assert.Equal(t, "missing from the store", reasons[missing])
			assert.Contains(t, reasons, moved)

			ranges := res.BadRanges(m)
			require.Len(t, ranges, 3)
			for i, want := range []Extent{ext[0], ext[2], ext[3]} {
				assert.Equal(t, "root", ranges[i].Disk)
				assert.Equal(t, want, ranges[i].Extent, "bad ranges in offset order")
				assert.Equal(t, reasons[want.Chunk], ranges[i].Reason)
			}

			src, err := s.Source(m, "root")
			require.NoError(t, err)
			err = src.Extents(ctx, func(int64, []byte) error { return nil })
			var bad *CorruptChunkError
			require.ErrorAs(t, err, &bad)
			assert.ErrorIs(t, err, ErrCorrupt)
			assert.Equal(t, corrupt, bad.Chunk, "the first bad chunk in disk order")
		})
	}
}

func TestSourceFetchesEachChunkOnce(t *testing.T) {
	s := newMemStore(t, nil)
	parentOps := []op{disk("root", 2*mib), data(0, randomBytes(70, 2*mib))}
	parent, _ := backUp(t, s.Store, header("tenant", "vm", "full"), nil, parentOps)
	ops := []op{disk("root", 2*mib), data(1000, randomBytes(71, 10)), data(mib+1000, randomBytes(72, 10))}
	m, _ := backUp(t, s.Store, header("tenant", "vm", "incr"), &parent, ops)
	require.Len(t, extentsOf(m, "root"), 6, "each parent window in two pieces around a new one")

	clear(s.objs.gets)
	assertImages(t, apply(apply(nil, parentOps), ops), restore(t, s.Store, m))
	for key, n := range s.objs.gets {
		assert.Equal(t, 1, n, "%s fetched %d times", key, n)
	}
	assert.Len(t, s.objs.gets, 4)
}

func TestPlanFetchesBoundsWhatItKeeps(t *testing.T) {
	n := sourceCache/ChunkSize + 6
	var exts []Extent
	for range 2 {
		for i := range n {
			exts = append(exts, Extent{Chunk: strings.Repeat("0", 60) + hex.EncodeToString([]byte{byte(i >> 8), byte(i)})})
		}
	}
	plan := planFetches(exts)
	assert.Len(t, plan.chunks, n+6, "the chunks beyond the cache are fetched again")
	for i, e := range exts {
		assert.Equal(t, e.Chunk, plan.chunks[plan.fetch[i]])
		assert.GreaterOrEqual(t, plan.lastUse[plan.fetch[i]], i)
	}
}

func TestGarbageCollectionAndWritersExcludeEachOther(t *testing.T) {
	ctx := context.Background()
	ops := []op{disk("root", mib), data(0, randomBytes(80, mib))}

	t.Run("a collection waits for a backup being written", func(t *testing.T) {
		s := newMemStore(t, nil)
		w, err := s.NewWriter(ctx, header("tenant", "vm", "b"), nil)
		require.NoError(t, err)
		write(t, w, ops)
		_, err = s.CollectGarbage(ctx, s.clock.Now().Add(-time.Hour))
		require.ErrorIs(t, err, ErrBusy)
		_, err = w.Commit(ctx)
		require.NoError(t, err)
		_, err = s.CollectGarbage(ctx, s.clock.Now().Add(-time.Hour))
		require.NoError(t, err)
		assert.Empty(t, s.objs.keys("backups/locks/"))
	})
	t.Run("a backup waits for a collection", func(t *testing.T) {
		s := newMemStore(t, nil)
		s.objs.set("backups/"+gcLockPrefix+"other", []byte(`{}`))
		_, err := s.NewWriter(ctx, header("tenant", "vm", "b"), nil)
		require.ErrorIs(t, err, ErrBusy)
		assert.Equal(t, []string{"backups/locks/gc-other"}, s.objs.keys("backups/locks/"), "the writer took its lock back")
		s.clock.Add(gcLockTTL + time.Second)
		w, err := s.NewWriter(ctx, header("tenant", "vm", "b"), nil)
		require.NoError(t, err, "a dead collection's lock is ignored")
		w.Abort()
	})
	t.Run("a dead writer's lock and chunks are collected once old", func(t *testing.T) {
		s := newMemStore(t, nil)
		w, err := s.NewWriter(ctx, header("tenant", "vm", "b"), nil)
		require.NoError(t, err)
		write(t, w, ops)
		w.stop() // dies: its lock and chunk stay

		res, err := s.CollectGarbage(ctx, s.clock.Now().Add(-time.Hour))
		require.ErrorIs(t, err, ErrBusy)
		assert.Zero(t, res.ChunksDeleted)

		s.clock.Add(2 * time.Hour)
		res, err = s.CollectGarbage(ctx, s.clock.Now().Add(-time.Hour))
		require.NoError(t, err)
		assert.Equal(t, 1, res.ChunksDeleted)
		assert.Empty(t, s.objs.keys("backups/locks/"))
	})
	t.Run("young garbage is kept", func(t *testing.T) {
		s := newMemStore(t, nil)
		w, err := s.NewWriter(ctx, header("tenant", "vm", "b"), nil)
		require.NoError(t, err)
		write(t, w, ops)
		w.Abort()
		res, err := s.CollectGarbage(ctx, s.clock.Now().Add(-time.Hour))
		require.NoError(t, err)
		assert.Equal(t, GCResult{ChunksKept: 1}, res)
	})
	t.Run("a manifest it cannot read stops it", func(t *testing.T) {
		s := newMemStore(t, nil)
		m, _ := backUp(t, s.Store, header("tenant", "vm", "b"), nil, ops)
		require.NoError(t, s.Delete(ctx, "tenant", "b"))
		s.objs.set(s.manifestKey("other", "x"), []byte(`{"version": 1, "disks": [`))
		s.clock.Add(2 * time.Hour)
		_, err := s.CollectGarbage(ctx, s.clock.Now().Add(-time.Hour))
		require.Error(t, err)
		assert.Len(t, s.objs.keys("backups/chunks/"), len(m.Chunks()))
	})
}

func TestStoreCatalogue(t *testing.T) {
	ctx := context.Background()
	s := newMemStore(t, nil)
	ops := []op{disk("root", mib), data(0, randomBytes(90, 10))}
	for _, b := range []struct{ ns, id string }{{"a", "b2"}, {"a", "b1"}, {"ab", "b3"}} {
		backUp(t, s.Store, header(b.ns, "vm", b.id), nil, ops)
		s.clock.Add(time.Minute)
	}

	ms, err := s.Backups(ctx, "a")
	require.NoError(t, err)
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.Namespace+"/"+m.ID)
	}
	assert.Equal(t, []string{"a/b2", "a/b1"}, ids, "one namespace's, oldest first")

	_, err = s.Manifest(ctx, "a", "b3")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.ErrorIs(t, s.Delete(ctx, "a", "nope"), ErrNotFound)
	_, err = s.NewWriter(ctx, header("a", "vm", "b1"), nil)
	assert.ErrorIs(t, err, ErrExists)

	for _, bad := range []string{"", "..", "a/b", "-x", ".hidden"} {
		_, err := s.Manifest(ctx, bad, "b1")
		assert.Error(t, err, "namespace %q", bad)
		_, err = s.NewWriter(ctx, header("a", "vm", bad), nil)
		assert.Error(t, err, "backup ID %q", bad)
	}

	// A manifest copied under another namespace is not taken for one of it.
	s.objs.set(s.manifestKey("c", "b1"), s.objs.body(s.manifestKey("a", "b1")))
	_, err = s.Manifest(ctx, "c", "b1")
	assert.Error(t, err)
}

func TestCommitOfABackupThatAppearedMeanwhile(t *testing.T) {
	ctx := context.Background()
	s := newMemStore(t, nil)
	ops := []op{disk("root", mib), data(0, randomBytes(91, 10))}
	w1, err := s.NewWriter(ctx, header("a", "vm", "b"), nil)
	require.NoError(t, err)
	w2, err := s.NewWriter(ctx, header("a", "vm", "b"), nil)
	require.NoError(t, err)
	write(t, w1, ops)
	write(t, w2, ops)
	_, err = w1.Commit(ctx)
	require.NoError(t, err)
	_, err = w2.Commit(ctx)
	assert.ErrorIs(t, err, ErrExists)
	assert.Empty(t, s.objs.keys("backups/locks/"))
}

func TestWriterRefusesRangesOutOfTurn(t *testing.T) {
	cases := map[string]func(w *Writer) error{
		"a range before its disk": func(w *Writer) error { return w.Data(0, []byte{1}) },
		"a range before the last": func(w *Writer) error {
			_ = w.Disk(driver.BackupDisk{Name: "root", Size: mib})
			_ = w.Data(100, []byte{1})
			return w.Zero(50, 10)
		},
		"a range past the disk": func(w *Writer) error {
			_ = w.Disk(driver.BackupDisk{Name: "root", Size: mib})
			return w.Data(mib-1, []byte{1, 2})
		},
		"a disk handed twice": func(w *Writer) error {
			_ = w.Disk(driver.BackupDisk{Name: "root", Size: mib})
			return w.Disk(driver.BackupDisk{Name: "root", Size: mib})
		},
		"a call after Commit": func(w *Writer) error {
			_, _ = w.Commit(context.Background())
			return w.Disk(driver.BackupDisk{Name: "root", Size: mib})
		},
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			s := newMemStore(t, nil)
			w, err := s.NewWriter(context.Background(), header("a", "vm", "b"), nil)
			require.NoError(t, err)
			defer w.Abort()
			assert.Error(t, call(w))
		})
	}
}
