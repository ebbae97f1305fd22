package libvirt

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestAnUnfinishedUploadIsNeverUsed leaves what an agent killed mid-upload
// leaves, the marker and an image volume that holds part of the image, and
// checks that the image is not reported Ready, and that the next Ensure
// uploads it again rather than make a disk of the partial one.
func TestAnUnfinishedUploadIsNeverUsed(t *testing.T) {
	node := libvirttest.Start(t, "img-unfinished")
	d := open(t, node)
	useImports(d, imageimport.Config{Dir: t.TempDir()})
	srv := serveImage(t, 4<<20)
	img := srv.image("5d1c0e6a-0000-4000-8000-000000000a01")

	l := raw(t, node)
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	for name, size := range map[string]uint64{uploadMarker(img.UID): 0, imageVolume(img.UID): 1 << 20} {
		x, err := (&libvirtxml.StorageVolume{Name: name, Capacity: &libvirtxml.StorageVolumeSize{Value: size, Unit: "B"}}).Marshal()
		require.NoError(t, err)
		_, err = l.StorageVolCreateXML(p, x, 0)
		require.NoError(t, err)
	}

	_, listed := imageStatus(t, d, img.UID)
	assert.False(t, listed, "an unfinished image is not on the node, let alone Ready")
	api, _, err := d.api()
	require.NoError(t, err)
	has, err := d.hasImage(api, img)
	require.NoError(t, err)
	assert.False(t, has, "nothing is made from it")

	m := imageMachine("again", img)
	o, err := ensureUntil(t, d, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	assert.Equal(t, int32(1), srv.requests.Load(), "downloaded again")
	assert.Equal(t, uint64(len(srv.data)), volumeXML(t, node, imageVolume(img.UID)).Capacity.Value,
		"the partial 1 MiB image was replaced by a whole one")
	assert.False(t, volumeExists(t, l, uploadMarker(img.UID)), "no marker once uploaded")
	st, listed := imageStatus(t, d, img.UID)
	require.True(t, listed)
	assert.Equal(t, driver.ImagePhaseReady, st.Phase)
}
