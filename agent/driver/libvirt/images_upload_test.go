package libvirt

import (
	"os"
	"path/filepath"
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

func TestUploadRanges(t *testing.T) {
	const mib = 1 << 20
	for name, tc := range map[string]struct {
		data            []byteRange
		size            int64
		written, length int64
		want            []byteRange
	}{
		"a sparse raw volume gets the data alone": {
			data: []byteRange{{0, 4 * mib}, {20 * mib, 24 * mib}}, size: 64 * mib, length: 64 * mib,
			want: []byteRange{{0, 4 * mib}, {20 * mib, 24 * mib}},
		},
		"holes shorter than a MiB go as zeros": {
			data: []byteRange{{0, 4096}, {mib, mib + 4096}, {3 * mib, 4 * mib}}, size: 8 * mib, length: 8 * mib,
			want: []byteRange{{0, mib + 4096}, {3 * mib, 4 * mib}},
		},
		"a file of zeros sends nothing to a raw volume": {
			size: 8 * mib, length: 8 * mib,
		},
		"what qemu-img wrote is overwritten, holes and all": {
			data: []byteRange{{0, 4096}, {mib, 2 * mib}, {4 * mib, 5 * mib}}, size: 8 * mib, written: 196616, length: 196616,
			want: []byteRange{{0, 2 * mib}, {4 * mib, 5 * mib}, {8*mib - 1, 8 * mib}},
		},
		"a short volume's file is made as long as the image's": {
			data: []byteRange{{8 * mib, 9 * mib}}, size: 16 * mib, written: 196616, length: 196616,
			want: []byteRange{{0, 196616}, {8 * mib, 9 * mib}, {16*mib - 1, 16 * mib}},
		},
		"a volume that may hold anything gets all of it": {
			data: []byteRange{{mib, 2 * mib}}, size: 16 * mib, written: 1<<63 - 1,
			want: []byteRange{{0, 16 * mib}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, uploadRanges(tc.data, tc.size, tc.written, tc.length))
		})
	}
}

func TestDataRangesAreWhatTheFileHolds(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "sparse"))
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // test file
	const size = 64 << 20
	require.NoError(t, f.Truncate(size))
	block := make([]byte, 1<<20)
	block[0] = 1
	for _, off := range []int64{0, 16 << 20, 40 << 20} {
		_, err := f.WriteAt(block, off)
		require.NoError(t, err)
	}
	got := dataRanges(f, size)
	if len(got) == 1 && got[0] == (byteRange{0, size}) {
		t.Skipf("the file system of %s tells no holes", f.Name())
	}
	// A file system may give its data in blocks larger than a write.
	require.Len(t, got, 3, "%v", got)
	for i, off := range []int64{0, 16 << 20, 40 << 20} {
		assert.Equal(t, off, got[i].off)
		assert.GreaterOrEqual(t, got[i].end, off+1<<20)
		assert.Less(t, got[i].end, off+2<<20)
	}

	t.Run("a file that ends in data ends with it", func(t *testing.T) {
		_, err := f.WriteAt(block, size-1<<20)
		require.NoError(t, err)
		got := dataRanges(f, size)
		assert.Equal(t, byteRange{size - 1<<20, size}, got[len(got)-1])
	})
	t.Run("an empty file has none", func(t *testing.T) {
		assert.Empty(t, dataRanges(f, 0))
	})
}
