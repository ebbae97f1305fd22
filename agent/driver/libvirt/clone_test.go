package libvirt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// cloneOf is an image copied from the node's volume source.
func cloneOf(uid, source string) *driver.Image {
	return &driver.Image{UID: uid, Name: "golden", SourceVolume: source, Format: "qcow2", PruneAfter: time.Hour}
}

// TestImageClonedFromAVolume boots a guest, clones its root volume into an
// image, and boots a second guest from that image.
func TestImageClonedFromAVolume(t *testing.T) {
	node := libvirttest.Start(t, "clone")
	d := open(t, node)
	a := machine("a")
	o, err := ensureUntil(t, d, a)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase)
	source := volumeXML(t, node, a.Disks[0].Name)
	l := raw(t, node)

	img := cloneOf("5d1c0e6a-0000-4000-8000-000000000c01", a.Disks[0].Name)
	b := imageMachine("b", img)
	b.Disks[0].SizeBytes = 2 << 30
	o, err = ensureUntil(t, d, b)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase, o.Message)

	image := volumeXML(t, node, imageVolume(img.UID))
	assert.Equal(t, source.Capacity.Value, image.Capacity.Value, "the image is the size of the volume it copies")
	assert.False(t, volumeExists(t, l, cloneMarker(img.UID)), "no marker once the copy is done")
	disk := volumeXML(t, node, b.Disks[0].Name)
	require.NotNil(t, disk.BackingStore, "a disk from a qcow2 clone is an overlay of the image")
	assert.Equal(t, image.Target.Path, disk.BackingStore.Path)
	assert.Equal(t, uint64(2<<30), disk.Capacity.Value)
	assert.True(t, volumeExists(t, l, a.Disks[0].Name), "the source stays")

	t.Run("ASecondDiskFromTheImageCopiesNothingAgain", func(t *testing.T) {
		require.NoError(t, d.Delete(context.Background(), a.UID))
		require.NoError(t, d.DeleteVolume(context.Background(), driver.Disk{Name: a.Disks[0].Name}))
		c := imageMachine("c", img)
		o, err := ensureUntil(t, d, c)
		require.NoError(t, err, "the image is on the node; its source is no longer needed")
		assert.Equal(t, driver.PhaseRunning, o.Phase)
	})

	// The hub names an image whose source is gone Held: a disk of it is
	// made of the node's copy, or not at all, never empty.
	held := func(uid string) *driver.Image {
		return &driver.Image{UID: uid, Name: "golden", Held: true, Format: "qcow2", PruneAfter: time.Hour}
	}
	t.Run("AHeldImageMakesADiskOfTheNodesCopy", func(t *testing.T) {
		e := imageMachine("e", held(img.UID))
		o, err := ensureUntil(t, d, e)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
		disk := volumeXML(t, node, e.Disks[0].Name)
		require.NotNil(t, disk.BackingStore, "made of the image")
		assert.Equal(t, image.Target.Path, disk.BackingStore.Path)
	})
	t.Run("AHeldImageTheNodeLacksMakesNoDisk", func(t *testing.T) {
		lacking := held("5d1c0e6a-0000-4000-8000-000000000c02")
		f := imageMachine("f", lacking)
		_, err := ensureUntil(t, d, f)
		require.Error(t, err)
		assert.True(t, driver.IsTerminal(err), "nothing can mend it but a source: %v", err)
		assert.Contains(t, err.Error(), "image golden is not on this node, and nothing is left to make it of")
		assert.False(t, volumeExists(t, l, f.Disks[0].Name), "no empty disk")
		assert.False(t, volumeExists(t, l, imageVolume(lacking.UID)), "no image either")
	})
}

func TestImageCloneFailures(t *testing.T) {
	node := libvirttest.Start(t, "clone-fail")
	d := open(t, node)
	a := machine("src")
	_, err := ensureUntil(t, d, a)
	require.NoError(t, err)
	l := raw(t, node)

	cases := map[string]struct {
		img     *driver.Image
		prepare func(t *testing.T)
		want    []string
	}{
		"ASourceNotOnThisNodeSaysSo": {
			img: cloneOf("5d1c0e6a-0000-4000-8000-000000000c11", "team-a_elsewhere"),
			want: []string{
				`cannot clone image golden: volume team-a_elsewhere is not on node clone-fail (pool "default-pool")`,
				"the image can only be made on the node that holds the volume it copies",
			},
		},
		"AFullPoolNamesThePoolAndSpace": {
			img:     cloneOf("5d1c0e6a-0000-4000-8000-000000000c12", a.Disks[0].Name),
			prepare: func(t *testing.T) { fillPool(t, node, 1<<20) },
			want:    []string{"cannot clone image golden from volume src-root", `needs 1073741824 bytes but storage pool "default-pool" has`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if tc.prepare != nil {
				tc.prepare(t)
			}
			m := imageMachine("fail", tc.img)
			_, err := ensureUntil(t, d, m)
			require.Error(t, err)
			assert.True(t, driver.IsFailing(err), "shown to the user and retried: %v", err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.False(t, volumeExists(t, l, imageVolume(tc.img.UID)), "no image in the pool")
			assert.False(t, volumeExists(t, l, cloneMarker(tc.img.UID)), "no marker left")
			assert.False(t, volumeExists(t, l, m.Disks[0].Name), "no disk without its image")
		})
	}
}

// TestAnUnfinishedCloneIsNeverUsed leaves what an agent killed mid-copy
// leaves, a marker and a partial image, and checks that the next agent copies
// again rather than making disks from the partial one.
func TestAnUnfinishedCloneIsNeverUsed(t *testing.T) {
	node := libvirttest.Start(t, "clone-stale")
	d := open(t, node)
	a := machine("src")
	_, err := ensureUntil(t, d, a)
	require.NoError(t, err)
	img := cloneOf("5d1c0e6a-0000-4000-8000-000000000c21", a.Disks[0].Name)

	l := raw(t, node)
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	for name, size := range map[string]uint64{cloneMarker(img.UID): 0, imageVolume(img.UID): 1 << 20} {
		x, err := (&libvirtxml.StorageVolume{Name: name, Capacity: &libvirtxml.StorageVolumeSize{Value: size, Unit: "B"}}).Marshal()
		require.NoError(t, err)
		_, err = l.StorageVolCreateXML(p, x, 0)
		require.NoError(t, err)
	}

	o, err := ensureUntil(t, d, imageMachine("b", img))
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.Equal(t, uint64(a.Disks[0].SizeBytes), volumeXML(t, node, imageVolume(img.UID)).Capacity.Value,
		"the partial 1 MiB copy was replaced by a whole one")
	assert.False(t, volumeExists(t, l, cloneMarker(img.UID)))
}
