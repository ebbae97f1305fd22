package libvirt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// TestASharedDiskRunsOnOneHostAtATime runs a guest whose disk is in a pool
// on storage both hosts of a pair reach (one directory, defined as a pool
// of the same name on each libvirtd), on real QEMU. While host A's QEMU
// runs it, host B cannot start it: QEMU's image lock refuses the disk, the
// second line behind the agents' leases. Once A's copy is destroyed, as its
// agent does when its lease runs out, B starts the guest on the very same
// disk, never a new one.
func TestASharedDiskRunsOnOneHostAtATime(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pair, err := guesthost.StartPair(ctx, "vfha", os.Stderr)
	require.NoError(t, err)
	t.Cleanup(pair.Close)
	a, b := openPair(ctx, t, pair)

	dir, err := os.MkdirTemp("", "vf-shared-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o777)) //nolint:gosec // both hosts' QEMU write here, as on an NFS export
	for _, h := range pair.Hosts() {
		require.NoError(t, h.DefinePool("shared", dir))
	}

	m := driver.Machine{
		UID:         "7c1e5b2a-3d4f-4a6b-8c9d-1e2f3a4b5c6d",
		Namespace:   "team-a",
		Name:        "ha",
		Generation:  1,
		VCPU:        1,
		MemoryBytes: 128 << 20,
		Running:     true,
		Disks:       []driver.Disk{{Name: "ha-root", SizeBytes: 64 << 20, Pool: "shared"}},
	}
	o, err := a.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	disk := filepath.Join(dir, "ha-root")
	made, err := os.Stat(disk)
	require.NoError(t, err, "the disk is a file of the shared directory")

	t.Run("AnotherHostCannotStartItWhileItRuns", func(t *testing.T) {
		o, err := b.Ensure(ctx, m)
		if err == nil {
			assert.NotEqual(t, driver.PhaseRunning, o.Phase, "B runs a second copy")
			err = errorOf(o)
		}
		require.Error(t, err)
		assert.Contains(t, err.Error(), "lock", "QEMU's image lock refused the disk")
		o, err = a.Observe(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseRunning, o.Phase, "A's copy runs on")
	})

	t.Run("OnceFencedOnAItRunsOnBOnTheSameDisk", func(t *testing.T) {
		require.NoError(t, a.Delete(ctx, m.UID))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			o, err := b.Ensure(ctx, m)
			if assert.NoError(c, err) {
				assert.Equal(c, driver.PhaseRunning, o.Phase, o.Message)
			}
		}, time.Minute, time.Second, "B starts the guest once A's copy is gone")
		now, err := os.Stat(disk)
		require.NoError(t, err)
		assert.True(t, os.SameFile(made, now), "B opened the disk A made, not a new one")
	})
}

// errorOf is an observation's message as an error, for a backend that
// reports a failed start as a phase rather than an error.
func errorOf(o driver.Observation) error {
	if o.Message == "" {
		return nil
	}
	return errors.New(o.Message)
}
