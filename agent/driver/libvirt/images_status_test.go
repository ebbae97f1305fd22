package libvirt

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// imageStatus returns what Images says of uid, and whether it says anything.
func imageStatus(t *testing.T, d *Driver, uid string) (driver.ImageStatus, bool) {
	t.Helper()
	all, err := d.Images(context.Background())
	require.NoError(t, err)
	for _, st := range all {
		if st.UID == uid {
			return st, true
		}
	}
	return driver.ImageStatus{}, false
}

// TestImagesReportsTheNodesImages walks one image through its life on a node
// — importing, present, pruned — and another through a failed import, and
// checks at each step what Images says.
func TestImagesReportsTheNodesImages(t *testing.T) {
	node := libvirttest.Start(t, "img-status")
	d := open(t, node)
	useImports(d, imageimport.Config{Dir: t.TempDir()})
	now := time.Now()
	d.now = func() time.Time { return now }
	srv := serveImage(t, 1<<20)
	release := srv.hold(t)
	img := srv.image("5d1c0e6a-0000-4000-8000-000000000401")
	m := imageMachine("status", img)

	all, err := d.Images(context.Background())
	require.NoError(t, err)
	assert.Empty(t, all, "a fresh node has no images")

	t.Run("AnImportInFlightIsImportingWithItsProgress", func(t *testing.T) {
		o, err := d.Ensure(context.Background(), m)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseProvisioning, o.Phase)
		st, ok := imageStatus(t, d, img.UID)
		require.True(t, ok)
		assert.Equal(t, driver.ImagePhaseImporting, st.Phase)
		assert.Equal(t, "ubuntu", st.Name)
		assert.Contains(t, st.Message, "importing image ubuntu: ")
		assert.Zero(t, st.SizeBytes)
	})

	t.Run("AnImportedImageIsReadyWithItsSize", func(t *testing.T) {
		release()
		o, err := ensureUntil(t, d, m)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseRunning, o.Phase)
		st, ok := imageStatus(t, d, img.UID)
		require.True(t, ok)
		assert.Equal(t, driver.ImageStatus{UID: img.UID, Name: "ubuntu", Phase: driver.ImagePhaseReady, SizeBytes: int64(len(srv.data)),
			ImportStarted: now, ImportFinished: now}, st, "with when its import ran, on the driver's clock")

		// Ensure, finding the image, drops the import's job: when the
		// import ran is still told.
		_, err = d.Ensure(context.Background(), m)
		require.NoError(t, err)
		st, _ = imageStatus(t, d, img.UID)
		assert.Equal(t, now, st.ImportFinished)
	})

	t.Run("APrunedImageIsNoLongerListed", func(t *testing.T) {
		require.NoError(t, d.Delete(context.Background(), m.UID))
		require.NoError(t, d.DeleteVolume(context.Background(), m.Disks[0]))
		_, err := d.PruneImages(context.Background()) // starts the image's unused clock
		require.NoError(t, err)
		_, ok := imageStatus(t, d, img.UID)
		assert.True(t, ok, "an unused image stays until its pruneAfter")
		now = now.Add(img.PruneAfter)
		pruned, err := d.PruneImages(context.Background())
		require.NoError(t, err)
		require.Equal(t, []string{img.UID}, pruned)
		_, ok = imageStatus(t, d, img.UID)
		assert.False(t, ok, "a pruned image is not on the node")
	})

	t.Run("AFailedImportIsFailedWithItsReason", func(t *testing.T) {
		bad := serveImage(t, 1<<10)
		bad.status.Store(http.StatusNotFound)
		badImg := bad.image("5d1c0e6a-0000-4000-8000-000000000402")
		_, err := ensureUntil(t, d, imageMachine("bad", badImg))
		require.Error(t, err)
		st, ok := imageStatus(t, d, badImg.UID)
		require.True(t, ok)
		assert.Equal(t, driver.ImagePhaseFailed, st.Phase)
		assert.Contains(t, st.Message, "answered 404 Not Found")
		assert.Equal(t, now, st.ImportFinished, "when the failed import ended")
		assert.Equal(t, now, st.ImportStarted)
	})

	t.Run("AnImageFoundOnTheNodeAfterARestartIsReadyWithoutAName", func(t *testing.T) {
		again := imageMachine("again", img)
		o, err := ensureUntil(t, d, again)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseRunning, o.Phase)
		restarted := open(t, node)
		st, ok := imageStatus(t, restarted, img.UID)
		require.True(t, ok)
		assert.Equal(t, driver.ImageStatus{UID: img.UID, Phase: driver.ImagePhaseReady, SizeBytes: int64(len(srv.data))}, st)
	})
}
