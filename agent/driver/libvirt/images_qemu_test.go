package libvirt

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// TestImagesUploadedToARealNode stores images, as an import does once it
// has the file, into the directory pool of a real libvirtd (guesthost,
// libvirt 9.0 on Debian 12), and reads them back.
func TestImagesUploadedToARealNode(t *testing.T) {
	n := startRealNode(t, "vfimg")
	d, api, l, exists := n.d, n.api, n.l, n.exists

	t.Run("ASparseRawImageTakesNoMoreThanItsDataAndReadsBackTheSame", func(t *testing.T) {
		const size, chunk = 1 << 30, 4 << 20
		var at []int64
		for off := int64(0); off < size-chunk; off += 20 << 20 {
			at = append(at, off) // 200 MiB of data, the last 40 MiB a hole
		}
		path := sparseFile(t, size, chunk, at...)
		img := &driver.Image{UID: "5d1c0e6a-0000-4000-8000-000000000b01", Name: "sparse", Format: "raw"}

		start := time.Now()
		require.NoError(t, d.storeImage(api, img, path, size))
		t.Logf("a 1 GiB raw image with %d MiB of data stored in %s", len(at)*chunk>>20, time.Since(start).Round(time.Millisecond))

		v := imageVol(t, l, img)
		_, capacity, allocation, err := l.StorageVolGetInfo(v)
		require.NoError(t, err)
		assert.Equal(t, uint64(size), capacity)
		data := uint64(len(at) * chunk)
		assert.GreaterOrEqual(t, allocation, data)
		assert.LessOrEqual(t, allocation, data+1<<20, "%d MiB allocated for %d MiB of data", allocation>>20, data>>20)
		assert.Equal(t, fileSum(t, path), volumeSum(t, l, v, size), "the volume holds the file, byte for byte")
		assert.False(t, exists(t, uploadMarker(img.UID)), "no marker once uploaded")
		st, ok := imageStatus(t, d, img.UID)
		require.True(t, ok)
		assert.Equal(t, driver.ImagePhaseReady, st.Phase)
		// The file system can allocate a block of its own metadata (an
		// extent block) when it writes the data back, after the status was
		// taken: what the image takes is the same give or take that.
		assert.InDelta(t, int64(allocation), st.SizeBytes, 64<<10, "the status says what the image takes") //nolint:gosec // small
	})

	t.Run("ASparseQcow2ImageOverwritesTheHeaderLibvirtWrote", func(t *testing.T) {
		// A qcow2 image of 4 KiB clusters takes a few KiB; libvirt's new
		// qcow2 volume starts with qemu-img's header of 64 KiB clusters,
		// whose tables at 64 and 128 KiB lie in the image's hole.
		qcow := smallClusterQcow2(t, 16<<20, 8<<20, []byte("virtfleet image marker"))
		size := int64(len(qcow)) + 4<<20
		var at []int64
		for off := 0; off < len(qcow); off += 4096 {
			if !allZero(qcow[off:min(off+4096, len(qcow))]) {
				at = append(at, int64(off))
			}
		}
		path := filepath.Join(t.TempDir(), "image.qcow2")
		f, err := os.Create(path)
		require.NoError(t, err)
		require.NoError(t, f.Truncate(size))
		for _, off := range at {
			_, err := f.WriteAt(qcow[off:min(off+4096, int64(len(qcow)))], off)
			require.NoError(t, err)
		}
		require.NoError(t, f.Close())
		img := &driver.Image{UID: "5d1c0e6a-0000-4000-8000-000000000b02", Name: "sparse-qcow2", Format: "qcow2"}

		require.NoError(t, d.storeImage(api, img, path, size))
		v := imageVol(t, l, img)
		assert.Equal(t, fileSum(t, path), volumeSum(t, l, v, size), "the volume holds the file, byte for byte")
	})

	t.Run("AnUploadCutShortLeavesNeitherImageNorMarker", func(t *testing.T) {
		const size, chunk = 64 << 20, 1 << 20
		path := sparseFile(t, size, chunk, 0, 16<<20, 32<<20)
		img := &driver.Image{UID: "5d1c0e6a-0000-4000-8000-000000000b03", Name: "cut", Format: "raw"}
		cut := &cutUpload{API: api, after: 1}
		cut.during = func() {
			assert.True(t, exists(t, imageVolume(img.UID)), "the volume is there")
			assert.True(t, exists(t, uploadMarker(img.UID)), "marked unfinished")
			has, err := d.hasImage(api, img)
			assert.NoError(t, err)
			assert.False(t, has, "not an image yet")
			_, listed := imageStatus(t, d, img.UID)
			assert.False(t, listed, "not on the node yet")
		}

		err := d.storeImage(cut, img, path, size)
		require.ErrorContains(t, err, "cannot upload image cut: the connection broke")
		assert.Equal(t, 2, cut.calls, "one range went, the next failed")
		assert.False(t, exists(t, imageVolume(img.UID)), "the partial image is deleted")
		assert.False(t, exists(t, uploadMarker(img.UID)), "and its marker")
	})
}

// realNode is a driver on a real libvirtd (guesthost) of its own.
type realNode struct {
	h   *guesthost.Host
	d   *Driver
	api API
	l   *golibvirt.Libvirt
}

// startRealNode starts a real libvirtd called name and opens a driver on
// it, skipping the test where the machine cannot run one.
func startRealNode(t *testing.T, name string) *realNode {
	t.Helper()
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h, err := guesthost.Start(ctx, name, os.Stderr)
	require.NoError(t, err)
	h.StopWith(t)
	d, err := Open(context.Background(), Config{Node: "real", Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType, ShutdownGrace: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	api, _, err := d.api()
	require.NoError(t, err)
	return &realNode{h: h, d: d, api: api, l: dialHost(t, h)}
}

// exists says whether the node's pool has a volume called name.
func (n *realNode) exists(t *testing.T, name string) bool {
	t.Helper()
	ok, err := hasVolume(n.api, guesthost.Pool, name)
	require.NoError(t, err)
	return ok
}

// sparseFile is a file of size bytes, holes but for chunk bytes of random
// data at each of at.
func sparseFile(t *testing.T, size, chunk int64, at ...int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.raw")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // checked below
	require.NoError(t, f.Truncate(size))
	data := make([]byte, chunk)
	for _, off := range at {
		_, _ = rand.Read(data)
		_, err := f.WriteAt(data, off)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	return path
}

// smallClusterQcow2 is a qcow2 image of 4 KiB clusters of a disk of size
// bytes, all zeros but for marker at offset, as qemu-img converts it.
func smallClusterQcow2(t *testing.T, size, offset int64, marker []byte) []byte {
	t.Helper()
	dir := t.TempDir()
	raw, qcow := filepath.Join(dir, "disk.raw"), filepath.Join(dir, "disk.qcow2")
	f, err := os.Create(raw)
	require.NoError(t, err)
	_, err = f.WriteAt(marker, offset)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-o", "cluster_size=4096", raw, qcow).CombinedOutput()
	require.NoError(t, err, "%s", out)
	data, err := os.ReadFile(qcow) //nolint:gosec // the test's own file
	require.NoError(t, err)
	return data
}

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

func imageVol(t *testing.T, l *golibvirt.Libvirt, img *driver.Image) golibvirt.StorageVol {
	t.Helper()
	p, err := l.StoragePoolLookupByName(guesthost.Pool)
	require.NoError(t, err)
	v, err := l.StorageVolLookupByName(p, imageVolume(img.UID))
	require.NoError(t, err)
	return v
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path) //nolint:gosec // the test's own file
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // read-only
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// volumeSum downloads v whole and returns its sha256, once it checked that
// it is size bytes long.
func volumeSum(t *testing.T, l *golibvirt.Libvirt, v golibvirt.StorageVol, size int64) string {
	t.Helper()
	h := sha256.New()
	n := &countingHash{Writer: h}
	require.NoError(t, l.StorageVolDownload(v, n, 0, 0, 0))
	assert.Equal(t, size, n.n, "the volume's length")
	return hex.EncodeToString(h.Sum(nil))
}

type countingHash struct {
	io.Writer
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.Writer.Write(p)
}

// cutUpload lets after uploads through, then calls during and fails the
// next, as a connection that broke would.
type cutUpload struct {
	API
	after, calls int
	during       func()
}

func (c *cutUpload) StorageVolUpload(v golibvirt.StorageVol, r io.Reader, off, n uint64, flags golibvirt.StorageVolUploadFlags) error {
	c.calls++
	if c.calls <= c.after {
		return c.API.StorageVolUpload(v, r, off, n, flags)
	}
	c.during()
	return errors.New("the connection broke")
}
