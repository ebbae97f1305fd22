package libvirt

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestImageCopiedFromASnapshotOnARealNode makes an image of a running
// guest's disk as it was in one of its snapshots (guesthost, libvirt 9.0
// and QEMU 7.2 on Debian 12). The disk is an overlay of an image, so the
// copy must hold what the snapshot kept in the overlay and what it read
// through to the image, and none of what was written after.
func TestImageCopiedFromASnapshotOnARealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n := startRealNode(t, "vfsnapcp")
	d, api, l, exists := n.d, n.api, n.l, n.exists
	images := n.h.LibDir("images")

	// The guest's disk is made from a base image holding 0x55 at 8 MiB.
	base := filepath.Join(t.TempDir(), "base.qcow2")
	qemuTool(t, "qemu-img", "create", "-f", "qcow2", base, "64M")
	qemuTool(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x55 8M 64k", base)
	st, err := os.Stat(base)
	require.NoError(t, err)
	baseImg := &driver.Image{UID: "5d1c0e6a-0000-4000-8000-000000000d01", Name: "base", Format: "qcow2"}
	require.NoError(t, d.storeImage(api, baseImg, base, st.Size()))

	m := driver.Machine{
		UID:         "5e2a7c1d-9b3f-4d6e-8a0c-2b4d6f8a0d02",
		Namespace:   "team-a",
		Name:        "source",
		Generation:  1,
		VCPU:        1,
		MemoryBytes: 128 << 20,
		Disks:       []driver.Disk{{Name: "team-a_source-root", SizeBytes: 64 << 20, Image: baseImg, Format: "qcow2"}},
	}
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	disk := filepath.Join(images, m.Disks[0].Name)
	// The guest is stopped: its disk can be written to from outside.
	// Whole clusters are written, so its image (at its path inside the
	// host's namespace) is never read.
	write := func(t *testing.T, commands ...string) {
		t.Helper()
		var args []string
		for _, c := range commands {
			args = append(args, "-c", c)
		}
		qemuTool(t, "qemu-io", append(args, `json:{"driver":"qcow2","file":{"driver":"file","filename":"`+disk+`"},"backing":null}`)...)
	}
	write(t, "write -P 0x11 1M 64k")
	m.Running, m.Generation = true, 2
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	snap, err := d.TakeSnapshot(ctx, m.UID, driver.SnapshotRequest{ID: "d6a1c0de-0000-4000-8000-000000000d03"})
	require.NoError(t, err)

	// After the snapshot, both places are overwritten; then the guest
	// runs again, as it does while its clone is made.
	m.Running, m.Generation = false, 3
	require.Eventually(t, func() bool {
		o, err := d.Ensure(ctx, m)
		return err == nil && o.Phase == driver.PhaseStopped
	}, time.Minute, 200*time.Millisecond)
	write(t, "write -P 0x22 1M 64k", "write -P 0x33 8M 64k")
	m.Running, m.Generation = true, 4
	o, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)

	copyOf := func(uid, snapshot string) *driver.Image {
		return &driver.Image{UID: uid, Name: "copy", SourceVolume: m.Disks[0].Name, SourceSnapshot: snapshot, Format: "qcow2", PruneAfter: time.Hour}
	}
	ensure := func(t *testing.T, img *driver.Image) error {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			msg, err := d.ensureImage(api, img)
			if err != nil || msg == "" {
				return err
			}
			require.True(t, time.Now().Before(deadline), "still importing: %s", msg)
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("TheCopyIsTheDiskAsTheSnapshotHasIt", func(t *testing.T) {
		img := copyOf("5d1c0e6a-0000-4000-8000-000000000d04", snap.ID)
		require.NoError(t, ensure(t, img))
		out := filepath.Join(images, imageVolume(img.UID))
		qemuTool(t, "qemu-io", "-r", "-f", "qcow2",
			"-c", "read -P 0x11 1M 64k", // the overlay's, from the snapshot
			"-c", "read -P 0x55 8M 64k", // the base image's, read through
			"-c", "read -P 0 2M 64k", out)
		info := qemuTool(t, "qemu-img", "info", "-f", "qcow2", out)
		assert.NotContains(t, string(info), "backing file", "the copy needs nothing of its source")
		assert.NotContains(t, string(info), "Snapshot list", "the copy holds the snapshot's disk, not the snapshot")
		assert.False(t, exists(t, cloneMarker(img.UID)), "no marker once made")

		s, _, err := l.DomainGetState(domainOf(t, l, m.UID), 0)
		require.NoError(t, err)
		assert.Equal(t, golibvirt.DomainRunning, golibvirt.DomainState(s), "the source runs on")
		listed, err := d.Snapshots(ctx, m.UID)
		require.NoError(t, err)
		require.Len(t, listed, 1, "the snapshot stays")
	})

	t.Run("ASnapshotTheDiskDoesNotHoldIsTerminal", func(t *testing.T) {
		img := copyOf("5d1c0e6a-0000-4000-8000-000000000d05", "d6a1c0de-0000-4000-8000-0000000000ff")
		err := ensure(t, img)
		require.Error(t, err)
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.ErrorContains(t, err, "the volume holds no such snapshot")
		assert.False(t, exists(t, imageVolume(img.UID)), "no image is left")
		assert.False(t, exists(t, cloneMarker(img.UID)), "nor its marker")
	})
}

// qemuTool runs one of QEMU's tools, skipping the test where it is not
// installed, and returns its output.
func qemuTool(t *testing.T, tool string, args ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s is not installed (Debian: qemu-utils, make deps)", tool)
	}
	out, err := exec.Command(tool, args...).CombinedOutput() //nolint:gosec // the test's own arguments
	require.NoError(t, err, "%s %v: %s", tool, args, out)
	return out
}
