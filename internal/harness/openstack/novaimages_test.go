package openstack_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// TestNovaDriverImportsDiskImagesIntoGlance runs the nova driver's image
// path against the real services: it downloads a DiskImage itself (the
// test's server is on loopback, which the image allows), verifies and
// uploads it to Glance once however many disks need it, and makes each
// disk a bootable Cinder volume created from it, holding its bytes. A
// download that fails its checksum leaves nothing in Glance. An image no
// volume was made from goes once unused for its PruneAfter, not before.
func TestNovaDriverImportsDiskImagesIntoGlance(t *testing.T) {
	ctx := context.Background()
	c, cl, d := cloudTest(t, func(cfg *nova.Config) {
		cfg.Node = "node-images"
		cfg.Images.Dir = t.TempDir()
		// PruneImages is called by the test.
		cfg.ImagePruneInterval = time.Hour
	})

	marker := []byte("made from a DiskImage through Glance")
	const markerAt = 3 << 20
	data, err := diskimagetest.Marked(t.TempDir(), 16<<20, markerAt, marker)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.ServeContent(w, r, "debian.qcow2", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(srv.Close)
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	img := &driver.Image{
		UID: uuid.NewString(), Name: "debian", URL: srv.URL + "/debian.qcow2", SHA256: hex.EncodeToString(sum[:]),
		AllowedSources: loopback, PruneAfter: 3 * time.Second,
	}
	// Each guest gets its address from the test, as from the hub: Neutron's
	// own pool of the driver's networks is one address.
	host := 10
	machine := func(name string) driver.Machine {
		host++
		return driver.Machine{
			UID: uuid.NewString(), Namespace: "ns", Name: name, Generation: 1,
			VCPU: 1, MemoryBytes: 256 << 20, Running: true,
			Disks:    []driver.Disk{{Name: "ns_" + name + "-root", SizeBytes: 1 << 30, Image: img}},
			Networks: []driver.Network{{Name: "ns_images-net", CIDR: "10.78.0.0/24", Address: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 78, 0, byte(host)}), 24)}},
		}
	}
	ms := []driver.Machine{machine("img-a"), machine("img-b")}
	t.Cleanup(func() {
		for _, m := range ms {
			assert.Eventually(t, func() bool { return d.Delete(ctx, m.UID) == nil }, migrateTimeout, poll)
			assert.Eventually(t, func() bool { return d.DeleteVolume(ctx, m.Disks[0]) == nil }, migrateTimeout, poll)
		}
	})

	t.Run("OneImportServesEveryDisk", func(t *testing.T) {
		sawImporting := false
		for _, m := range ms {
			last := ""
			require.Eventually(t, func() bool {
				o, err := d.Ensure(ctx, m)
				sawImporting = sawImporting || (o.Phase == driver.PhaseProvisioning && bytes.Contains([]byte(o.Message), []byte("importing image debian")))
				if now := fmt.Sprintf("%s %q %v (downloads: %d)", o.Phase, o.Message, err, requests.Load()); now != last {
					t.Logf("VM %s: %s", m.Name, now)
					last = now
				}
				return err == nil && o.Phase == driver.PhaseRunning
			}, bootTimeout, poll)
		}
		assert.True(t, sawImporting, "Ensure reported the import's progress while it ran")
		assert.Equal(t, int32(1), requests.Load(), "one download for two disks")

		ids := glanceImages(t, cl, nova.ImageName(img.UID))
		require.Len(t, ids, 1, "one Glance image for the DiskImage")
		gi, err := images.Get(ctx, cl.Image, ids[0]).Extract()
		require.NoError(t, err)
		assert.Equal(t, images.ImageStatusActive, gi.Status)
		assert.Equal(t, int64(len(data)), gi.SizeBytes)
		assert.Equal(t, img.SHA256, gi.Properties[nova.MetaImageSHA256], "the checksum it was verified against")
		for _, m := range ms {
			v := cinderVolume(t, cl, m.Disks[0].Name)
			assert.Equal(t, "true", v.Bootable)
			assert.Equal(t, gi.ID, v.VolumeImageMetadata["image_id"], "volume %s was made from the image", v.Name)
			got := make([]byte, len(marker))
			f, err := os.Open(c.VolumePath(v.ID))
			require.NoError(t, err)
			_, err = f.ReadAt(got, markerAt)
			_ = f.Close()
			require.NoError(t, err)
			assert.Equal(t, string(marker), string(got), "volume %s holds the image's bytes", v.Name)
		}
		st, err := d.Images(ctx)
		require.NoError(t, err)
		require.Len(t, st, 1)
		assert.Equal(t, driver.ImagePhaseReady, st[0].Phase)
		assert.Equal(t, img.UID, st[0].UID)
		assert.Equal(t, int64(len(data)), st[0].SizeBytes)
	})

	t.Run("AnImageAVolumeWasMadeFromStays", func(t *testing.T) {
		pruned, err := d.PruneImages(ctx)
		require.NoError(t, err)
		assert.Empty(t, pruned)
		time.Sleep(img.PruneAfter)
		pruned, err = d.PruneImages(ctx)
		require.NoError(t, err)
		assert.Empty(t, pruned, "its volumes still exist")
	})

	t.Run("AnUnusedImageGoesAfterItsPruneAfter", func(t *testing.T) {
		for _, m := range ms {
			require.Eventually(t, func() bool { return d.Delete(ctx, m.UID) == nil }, migrateTimeout, poll)
			require.Eventually(t, func() bool { return d.DeleteVolume(ctx, m.Disks[0]) == nil }, migrateTimeout, poll)
		}
		require.Eventually(t, func() bool { return len(cinderVolumes(t, cl, ms[0].Disks[0].Name, ms[1].Disks[0].Name)) == 0 }, migrateTimeout, poll)
		unused := time.Now()
		pruned, err := d.PruneImages(ctx)
		require.NoError(t, err)
		assert.Empty(t, pruned, "unused from now on")
		assert.Len(t, glanceImages(t, cl, nova.ImageName(img.UID)), 1)
		require.Eventually(t, func() bool {
			pruned, err = d.PruneImages(ctx)
			require.NoError(t, err)
			return len(pruned) == 1
		}, img.PruneAfter+30*time.Second, 200*time.Millisecond)
		assert.GreaterOrEqual(t, time.Since(unused), img.PruneAfter, "not before its PruneAfter")
		assert.Equal(t, []string{img.UID}, pruned)
		assert.Empty(t, glanceImages(t, cl, nova.ImageName(img.UID)), "the Glance image is deleted")
		st, err := d.Images(ctx)
		require.NoError(t, err)
		assert.Empty(t, st)
	})

	t.Run("AGlanceImageIsImportedByNameOrIdAndNeverPruned", func(t *testing.T) {
		// The cloud's own image, uploaded as an operator would.
		golden, err := images.Create(ctx, cl.Image, images.CreateOpts{Name: "vf-test-golden-" + uuid.NewString()[:8], DiskFormat: "qcow2", ContainerFormat: "bare"}).Extract()
		require.NoError(t, err)
		t.Cleanup(func() { _ = images.Delete(ctx, cl.Image, golden.ID).ExtractErr() })
		require.NoError(t, imagedata.Upload(ctx, cl.Image, golden.ID, bytes.NewReader(data)).ExtractErr())
		for _, ref := range []string{golden.Name, golden.ID} {
			m := machine("golden-" + ref[len(ref)-4:])
			m.Disks[0].Image = &driver.Image{UID: uuid.NewString(), Name: "golden", ExternalName: ref, PruneAfter: time.Millisecond}
			t.Cleanup(func() {
				assert.Eventually(t, func() bool { return d.Delete(ctx, m.UID) == nil }, migrateTimeout, poll)
				assert.Eventually(t, func() bool { return d.DeleteVolume(ctx, m.Disks[0]) == nil }, migrateTimeout, poll)
			})
			require.Eventually(t, func() bool {
				o, err := d.Ensure(ctx, m)
				require.NoError(t, err)
				return o.Phase == driver.PhaseRunning
			}, bootTimeout, poll)
			v := cinderVolume(t, cl, m.Disks[0].Name)
			assert.Equal(t, golden.ID, v.VolumeImageMetadata["image_id"], "the boot volume was made from the image %s names", ref)
		}
		before := requests.Load()
		for range 2 {
			_, err := d.PruneImages(ctx)
			require.NoError(t, err)
		}
		_, err = images.Get(ctx, cl.Image, golden.ID).Extract()
		assert.NoError(t, err, "an imported image is never pruned")
		assert.Equal(t, before, requests.Load(), "nor downloaded")
		st, err := d.Images(ctx)
		require.NoError(t, err)
		assert.Empty(t, st, "nor reported as the node's")
	})

	t.Run("ADownloadThatFailsItsChecksumLeavesNothing", func(t *testing.T) {
		bad := *img
		bad.UID, bad.SHA256 = uuid.NewString(), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
		m := machine("img-bad")
		m.Disks[0].Image = &bad
		var err error
		require.Eventually(t, func() bool {
			_, err = d.Ensure(ctx, m)
			return driver.IsFailing(err)
		}, bootTimeout, poll)
		assert.Contains(t, err.Error(), "failed its checksum")
		assert.Empty(t, glanceImages(t, cl, nova.ImageName(bad.UID)), "nothing is kept in Glance")
		assert.Empty(t, cinderVolumes(t, cl, m.Disks[0].Name), "and no volume is made")
		st, err := d.Images(ctx)
		require.NoError(t, err)
		require.Len(t, st, 1)
		assert.Equal(t, driver.ImagePhaseFailed, st[0].Phase, "the failed import is reported")
	})
}

// glanceImages are the ids of the Glance images named name.
func glanceImages(t *testing.T, cl *openstack.Clients, name string) []string {
	t.Helper()
	page, err := images.List(cl.Image, images.ListOpts{Name: name}).AllPages(context.Background())
	require.NoError(t, err)
	all, err := images.ExtractImages(page)
	require.NoError(t, err)
	var ids []string
	for _, im := range all {
		ids = append(ids, im.ID)
	}
	return ids
}

// cinderVolumes are the Cinder volumes of any project with these names.
func cinderVolumes(t *testing.T, cl *openstack.Clients, names ...string) []volumes.Volume {
	t.Helper()
	page, err := volumes.List(cl.Volume, volumes.ListOpts{AllTenants: true}).AllPages(context.Background())
	require.NoError(t, err)
	all, err := volumes.ExtractVolumes(page)
	require.NoError(t, err)
	var out []volumes.Volume
	for _, v := range all {
		for _, n := range names {
			if v.Name == n {
				out = append(out, v)
			}
		}
	}
	return out
}

// cinderVolume is the one Cinder volume named name.
func cinderVolume(t *testing.T, cl *openstack.Clients, name string) volumes.Volume {
	t.Helper()
	all := cinderVolumes(t, cl, name)
	require.Len(t, all, 1, "one volume %s", name)
	return all[0]
}
