package libvirt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/testing/libvirttest"
)

func TestObserveVolume(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "import-volume")
	d, l := open(t, node), raw(t, node)
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	// Made by hand, as virsh vol-create-as would: virtfleet never saw it.
	x, err := (&libvirtxml.StorageVolume{Name: "legacy.qcow2", Capacity: &libvirtxml.StorageVolumeSize{Value: 3 << 30, Unit: "B"}}).Marshal()
	require.NoError(t, err)
	_, err = l.StorageVolCreateXML(p, x, 0)
	require.NoError(t, err)
	guest := machine("web")
	_, err = d.Ensure(ctx, guest)
	require.NoError(t, err)

	cases := map[string]struct {
		disk     driver.Disk
		want     driver.VolumeObservation
		notFound bool
		terminal bool
	}{
		"AVolumeMadeByHand":    {disk: driver.Disk{Name: "legacy.qcow2"}, want: driver.VolumeObservation{SizeBytes: 3 << 30}},
		"AVolumeVirtfleetMade": {disk: driver.Disk{Name: "web-root"}, want: driver.VolumeObservation{SizeBytes: 1 << 30}},
		"NoSuchVolume":         {disk: driver.Disk{Name: "nope"}, notFound: true},
		"NoSuchPool":           {disk: driver.Disk{Name: "legacy.qcow2", Pool: "nope"}, notFound: true},
		"AGuestsSeed":          {disk: driver.Disk{Name: seedVolume(guest.UID)}, terminal: true},
		"AGuestsSwap":          {disk: driver.Disk{Name: swapVolume(guest.UID)}, terminal: true},
		"AnImage":              {disk: driver.Disk{Name: imageVolume("0b5e3f1a")}, terminal: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := d.ObserveVolume(ctx, tc.disk)
			switch {
			case tc.notFound:
				assert.True(t, driver.IsNotFound(err), "want NotFound, got %v", err)
			case tc.terminal:
				assert.True(t, driver.IsTerminal(err), "want Terminal, got %v", err)
			default:
				require.NoError(t, err)
				assert.Equal(t, tc.want.SizeBytes, got.SizeBytes)
				assert.NotEmpty(t, got.ID, "the volume's key")
			}
		})
	}

	t.Run("DeleteVolumeDeletesAnImportedVolume", func(t *testing.T) {
		require.NoError(t, d.DeleteVolume(ctx, driver.Disk{Name: "legacy.qcow2"}))
		assert.False(t, volumeExists(t, l, "legacy.qcow2"))
		_, err := d.ObserveVolume(ctx, driver.Disk{Name: "legacy.qcow2"})
		assert.True(t, driver.IsNotFound(err), "gone: %v", err)
	})
}
