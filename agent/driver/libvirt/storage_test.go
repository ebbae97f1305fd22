package libvirt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestImportedVolumes observes volumes made by hand and by virtfleet, and
// deletes one only once no domain has it.
func TestImportedVolumes(t *testing.T) {
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

	t.Run("DeleteVolumeRefusesAVolumeADomainVirtfleetNeverMadeHas", func(t *testing.T) {
		v, err := l.StorageVolLookupByName(p, "legacy.qcow2")
		require.NoError(t, err)
		path, err := l.StorageVolGetPath(v)
		require.NoError(t, err)
		dom := libvirtxml.Domain{
			Type: "test", Name: "made-by-hand",
			Memory: &libvirtxml.DomainMemory{Value: 256, Unit: "MiB"},
			OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
			Devices: &libvirtxml.DomainDeviceList{Disks: []libvirtxml.DomainDisk{{
				Device: "disk",
				Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}},
				Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
			}}},
		}
		x, err := dom.Marshal()
		require.NoError(t, err)
		hand, err := l.DomainDefineXMLFlags(x, 0)
		require.NoError(t, err)

		err = d.DeleteVolume(ctx, driver.Disk{Name: "legacy.qcow2"})
		assert.True(t, driver.IsInUse(err), "want InUse, got %v", err)
		assert.ErrorContains(t, err, "domain made-by-hand, which virtfleet does not manage")
		assert.True(t, volumeExists(t, l, "legacy.qcow2"))
		require.NoError(t, l.DomainUndefine(hand))
	})

	t.Run("DeleteVolumeRefusesAnOrphansDisk", func(t *testing.T) {
		require.NoError(t, d.Release(ctx, guest.UID, ""))
		err := d.DeleteVolume(ctx, driver.Disk{Name: "web-root"})
		assert.True(t, driver.IsInUse(err), "want InUse, got %v", err)
		assert.ErrorContains(t, err, "orphaned from VirtualMachine team-a/web")
		assert.True(t, volumeExists(t, l, "web-root"))
	})

	t.Run("DeleteVolumeDeletesAnImportedVolume", func(t *testing.T) {
		require.NoError(t, d.DeleteVolume(ctx, driver.Disk{Name: "legacy.qcow2"}))
		assert.False(t, volumeExists(t, l, "legacy.qcow2"))
		_, err := d.ObserveVolume(ctx, driver.Disk{Name: "legacy.qcow2"})
		assert.True(t, driver.IsNotFound(err), "gone: %v", err)
	})
}

// TestAttachingImportedVolumes: a guest's imported disk is the volume as it
// is, opened in its own format, never created or resized; and a new guest
// whose definition fails for good removes what it made but never the
// volume it imported.
func TestAttachingImportedVolumes(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "attach-import")
	d, l := open(t, node), raw(t, node)
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	x, err := (&libvirtxml.StorageVolume{
		Name: "legacy.img", Capacity: &libvirtxml.StorageVolumeSize{Value: 2 << 30, Unit: "B"},
		Target: &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
	}).Marshal()
	require.NoError(t, err)
	_, err = l.StorageVolCreateXML(p, x, 0)
	require.NoError(t, err)
	withImport := func(name, imported string) driver.Machine {
		m := machine(name)
		m.Disks = append(m.Disks, driver.Disk{Name: imported, SizeBytes: 5 << 30, Imported: true})
		return m
	}

	cases := map[string]struct {
		machine      driver.Machine
		wantErr      string
		wantTerminal bool
	}{
		"AttachedAsItIs": {machine: withImport("user", "legacy.img")},
		"Missing": {
			machine: withImport("waits", "gone.img"),
			wantErr: "the imported volume is not there: no volume gone.img in storage pool default-pool on node attach-import",
		},
		"ANodesOwnVolume": {
			machine: withImport("thief", seedVolume("0b5e3f1a-7c2d-4e8f-9a1b-000000000001")),
			wantErr: "is one node attach-import keeps for itself", wantTerminal: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := tc.machine
			_, err := d.Ensure(ctx, m)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Equal(t, tc.wantTerminal, driver.IsTerminal(err), "terminal: %v", err)
				return
			}
			require.NoError(t, err)
			disk := definition(t, l, m).Devices.Disks[1]
			assert.Equal(t, "legacy.img", disk.Source.Volume.Volume)
			assert.Equal(t, "raw", disk.Driver.Type, "opened in its own format, not qcow2")
		})
	}

	t.Run("AFailedNewGuestLeavesTheImportedVolume", func(t *testing.T) {
		m := withImport("too-big", "legacy.img")
		m.Disks = append(m.Disks, driver.Disk{Name: "too-big-data", SizeBytes: 200 << 30})
		_, err := d.Ensure(ctx, m)
		require.True(t, driver.IsTerminal(err), "%v", err)
		assert.True(t, volumeExists(t, l, "legacy.img"))
		assert.False(t, volumeExists(t, l, "too-big-root"), "what it made is removed")
	})

	v, err := l.StorageVolLookupByName(p, "legacy.img")
	require.NoError(t, err)
	_, capacity, _, err := l.StorageVolGetInfo(v)
	require.NoError(t, err)
	assert.Equal(t, uint64(2<<30), capacity, "never resized to the disk's size")
}
