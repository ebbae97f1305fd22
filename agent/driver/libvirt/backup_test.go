package libvirt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestBackupsOnTheTestDriver: libvirt's test driver has no backup API, so
// backups are refused there for good, while a commit has no checkpoint to
// forget and a snapshot none to mind.
func TestBackupsOnTheTestDriver(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "backups")
	d := open(t, node)
	m := machine("backed")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	_, err = d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b1"}, &backupRecorder{})
	assert.True(t, driver.IsTerminal(err), "%v", err)
	assert.NoError(t, d.CommitBackup(ctx, m.UID, "b1"))
	_, err = d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "s1"})
	assert.NoError(t, err)

	_, err = d.BackUp(ctx, m.UID, driver.BackupRequest{ID: "b1", Since: "b1"}, &backupRecorder{})
	assert.True(t, driver.IsTerminal(err), "a backup since itself: %v", err)
	err = d.CommitBackup(ctx, "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d", "b1")
	assert.True(t, driver.IsNotFound(err), "no such guest: %v", err)
}

// TestOwnVolumes: what the driver makes for itself (images and the
// markers of images being made, seeds, swap, backups' scratch) is never a
// Volume's to import, and a Volume's name is never the driver's.
func TestOwnVolumes(t *testing.T) {
	cases := map[string]bool{
		backupScratch("5d1c3b2a-4e6f-4a8b-9c0d-1e2f3a4b5c6d", "vda"): true,
		imageVolume("u1"):   true,
		clonePrefix + "u1":  true,
		uploadPrefix + "u1": true,
		"team-a_backup":     false,
		"team-a_web-root":   false,
	}
	for name, own := range cases {
		assert.Equal(t, own, ownVolume(name), name)
	}
}
