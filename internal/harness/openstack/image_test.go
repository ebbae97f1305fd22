package openstack_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// A volume's first creation from an image downloads and converts it while
// Cinder's volume service loads that code.
const volumeTimeout = 3 * time.Minute

// The test image: imageSize bytes, zero but for random data at two offsets
// (the second in its last cluster), so that a copy that loses, shifts or
// truncates data shows.
const imageSize = 16 << 20

var imageChunks = []struct{ offset, size int }{{1 << 20, 64 << 10}, {imageSize - 4096, 4096}}

// TestVolumeFromImage uploads an image to Glance in each format a DiskImage
// may have, makes a Cinder volume from it, and checks that the volume is
// bootable, carries the image's metadata and holds the image as raw in its
// file, and that it outlives the image: once the image is deleted it is
// still whole, and clones, snapshots and grows with its data.
func TestVolumeFromImage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Debian's OpenStack services; skipped with -short")
	}
	ctx := context.Background()
	c := openstack.ForTest(t)
	cl, err := c.Clients(ctx)
	require.NoError(t, err)
	require.NotNil(t, cl.Image, "the catalog has an image endpoint")

	want, files := testImages(t)
	for _, format := range []string{"qcow2", "raw"} {
		t.Run(format, func(t *testing.T) {
			img, err := images.Create(ctx, cl.Image, images.CreateOpts{
				Name: "vf-test-" + format, DiskFormat: format, ContainerFormat: "bare",
			}).Extract()
			require.NoError(t, err)
			imageDeleted := false
			t.Cleanup(func() {
				if !imageDeleted {
					_ = images.Delete(ctx, cl.Image, img.ID).ExtractErr()
				}
			})
			f, err := os.Open(files[format])
			require.NoError(t, err)
			defer func() { _ = f.Close() }()
			require.NoError(t, imagedata.Upload(ctx, cl.Image, img.ID, f).ExtractErr())
			img, err = images.Get(ctx, cl.Image, img.ID).Extract()
			require.NoError(t, err)
			require.Equal(t, images.ImageStatusActive, img.Status)

			start := time.Now()
			v := createVolume(t, c, cl, volumes.CreateOpts{Name: "vf-from-" + format, Size: 1, ImageID: img.ID})
			t.Logf("volume from the %s image available in %s", format, time.Since(start).Round(time.Millisecond))
			assert.Equal(t, "true", v.Bootable)
			assert.Equal(t, img.ID, v.VolumeImageMetadata["image_id"])
			assert.Equal(t, format, v.VolumeImageMetadata["disk_format"])
			checkVolumeFile(t, c, v, want)

			require.NoError(t, images.Delete(ctx, cl.Image, img.ID).ExtractErr())
			imageDeleted = true
			v, err = volumes.Get(ctx, cl.Volume, v.ID).Extract()
			require.NoError(t, err)
			assert.Equal(t, "available", v.Status, "the volume outlives its image")
			assert.Equal(t, "true", v.Bootable)
			assert.Equal(t, img.ID, v.VolumeImageMetadata["image_id"], "and keeps its metadata")
			checkVolumeFile(t, c, v, want)

			// It is a volume like any other: it clones, snapshots and grows.
			clone := createVolume(t, c, cl, volumes.CreateOpts{Name: "vf-clone-" + format, Size: 2, SourceVolID: v.ID})
			assert.Equal(t, "true", clone.Bootable, "a clone is bootable too")
			checkVolumeFile(t, c, clone, want)
			snap, err := snapshots.Create(ctx, cl.Volume, snapshots.CreateOpts{Name: "vf-snap-" + format, VolumeID: v.ID}).Extract()
			require.NoError(t, err)
			await(t, c, "snapshot "+snap.ID+" available", func() (bool, error) {
				s, err := snapshots.Get(ctx, cl.Volume, snap.ID).Extract()
				if err != nil {
					return false, err
				}
				return s.Status == "available", statusError(s.Status)
			})
			fromSnap := createVolume(t, c, cl, volumes.CreateOpts{Name: "vf-from-snap-" + format, Size: 1, SnapshotID: snap.ID})
			checkVolumeFile(t, c, fromSnap, want)
			require.NoError(t, snapshots.Delete(ctx, cl.Volume, snap.ID).ExtractErr())
			await(t, c, "snapshot "+snap.ID+" deleted", func() (bool, error) {
				s, err := snapshots.Get(ctx, cl.Volume, snap.ID).Extract()
				if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
					return true, nil
				}
				if err != nil {
					return false, err
				}
				return false, statusError(s.Status)
			})
			require.NoError(t, volumes.ExtendSize(ctx, cl.Volume, v.ID, volumes.ExtendSizeOpts{NewSize: 3}).ExtractErr())
			checkVolumeFile(t, c, waitVolume(t, c, cl, v.ID, 3), want)

			for _, id := range []string{fromSnap.ID, clone.ID, v.ID} {
				deleteVolume(t, c, cl, id)
				assert.NoFileExists(t, c.VolumePath(id), "deleting the volume removes its file")
			}
		})
	}
}

// testImages are the test image's raw bytes and the image as a file in
// each format.
func testImages(t *testing.T) ([]byte, map[string]string) {
	t.Helper()
	want := make([]byte, imageSize)
	for _, ch := range imageChunks {
		_, _ = rand.Read(want[ch.offset : ch.offset+ch.size])
	}
	dir := t.TempDir()
	files := map[string]string{"raw": filepath.Join(dir, "image.raw"), "qcow2": filepath.Join(dir, "image.qcow2")}
	require.NoError(t, os.WriteFile(files["raw"], want, 0o600))
	out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", files["raw"], files["qcow2"]).CombinedOutput()
	require.NoError(t, err, "qemu-img convert: %s", out)
	return want, files
}

// createVolume creates a volume and waits for it to be available.
func createVolume(t *testing.T, c *openstack.Cloud, cl *openstack.Clients, opts volumes.CreateOpts) *volumes.Volume {
	t.Helper()
	ctx := context.Background()
	v, err := volumes.Create(ctx, cl.Volume, opts, nil).Extract()
	require.NoError(t, err)
	t.Cleanup(func() { _ = volumes.Delete(ctx, cl.Volume, v.ID, volumes.DeleteOpts{}).ExtractErr() })
	return waitVolume(t, c, cl, v.ID, opts.Size)
}

// waitVolume waits for a volume to be available at size GiB.
func waitVolume(t *testing.T, c *openstack.Cloud, cl *openstack.Clients, id string, size int) *volumes.Volume {
	t.Helper()
	var v *volumes.Volume
	await(t, c, "volume "+id+" available", func() (done bool, err error) {
		if v, err = volumes.Get(context.Background(), cl.Volume, id).Extract(); err != nil {
			return false, err
		}
		return v.Status == "available" && v.Size == size, statusError(v.Status)
	})
	return v
}

// deleteVolume deletes a volume and waits for it to be gone.
func deleteVolume(t *testing.T, c *openstack.Cloud, cl *openstack.Clients, id string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, volumes.Delete(ctx, cl.Volume, id, volumes.DeleteOpts{}).ExtractErr())
	await(t, c, "volume "+id+" deleted", func() (bool, error) {
		v, err := volumes.Get(ctx, cl.Volume, id).Extract()
		if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return false, statusError(v.Status)
	})
}

// statusError fails a wait on any of Cinder's error statuses (error,
// error_deleting, error_extending...).
func statusError(status string) error {
	if strings.HasPrefix(status, "error") {
		return fmt.Errorf("status %s", status)
	}
	return nil
}

// await polls cond until it is done, fails, or volumeTimeout passes.
func await(t *testing.T, c *openstack.Cloud, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(volumeTimeout)
	for {
		done, err := cond()
		require.NoError(t, err, "%s; Cinder's volume service logs to %s", what, filepath.Join(c.Dir, "logs", "cinder-volume.log"))
		if done {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s: not after %s", what, volumeTimeout)
		time.Sleep(poll)
	}
}

// checkVolumeFile checks that v's file is a sparse file of v's size that
// starts with the image's raw bytes.
func checkVolumeFile(t *testing.T, c *openstack.Cloud, v *volumes.Volume, want []byte) {
	t.Helper()
	f, err := os.Open(c.VolumePath(v.ID))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	require.NoError(t, err)
	assert.Equal(t, int64(v.Size)<<30, st.Size(), "the file is as large as the volume")
	assert.Less(t, st.Sys().(*syscall.Stat_t).Blocks*512, int64(imageSize), "and sparse")
	got := make([]byte, len(want))
	_, err = io.ReadFull(f, got)
	require.NoError(t, err)
	for _, ch := range imageChunks {
		assert.True(t, bytes.Equal(want[ch.offset:ch.offset+ch.size], got[ch.offset:ch.offset+ch.size]),
			"the image's %d bytes at %d are in the volume at the same offset", ch.size, ch.offset)
	}
	assert.True(t, bytes.Equal(want, got), "the volume starts with the whole image as raw")
}
