package guestimage

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A built image is found by its recipe's hash and returned at once; an
// edited recipe names another directory, so it is built anew.
func TestEnsureReturnsTheImageOfTheCurrentRecipe(t *testing.T) {
	cache := t.TempDir()
	t.Setenv(EnvCacheDir, cache)
	path, err := Path()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(cache, "guest-image", RecipeHash(), FileName), path)

	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte("qcow2"), 0o644))
	var progress bytes.Buffer
	got, err := Ensure(context.Background(), &progress)
	require.NoError(t, err)
	assert.Equal(t, path, got)
	assert.Empty(t, progress.String(), "nothing is built when the image is there")

	old := recipe
	t.Cleanup(func() { recipe = old })
	recipe = append(bytes.Clone(old), "\n# changed\n"...)
	other, err := Path()
	require.NoError(t, err)
	assert.NotEqual(t, path, other, "a changed recipe is another image")
}

// A build killed inside mmdebstrap leaves mounts in its chroot; the next
// build detaches them and removes the directory instead of keeping it for
// good.
func TestTheRemainsOfAnInterruptedBuildAreRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a file system inside a build directory needs root")
	}
	dir := t.TempDir()
	proc := filepath.Join(dir, "build-1", "scratch", "root", "proc")
	pts := filepath.Join(dir, "build-1", "scratch", "root", "dev", "pts")
	for _, m := range []string{proc, pts} {
		require.NoError(t, os.MkdirAll(m, 0o755))
		require.NoError(t, unix.Mount("tmpfs", m, "tmpfs", 0, "size=1m"))
		t.Cleanup(func() { _ = unix.Unmount(m, unix.MNT_DETACH) })
		require.NoError(t, os.WriteFile(filepath.Join(m, "busy"), []byte("x"), 0o644))
	}
	var progress bytes.Buffer
	require.NoError(t, removeRemains(dir, &progress))
	assert.NoDirExists(t, filepath.Join(dir, "build-1"))
	assert.Contains(t, progress.String(), "interrupted build")
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), dir, "no mount is left behind")
}

// TestBootIsOneTestAtATime: a second Boot waits until the first is
// released, and gives up when its context ends.
func TestBootIsOneTestAtATime(t *testing.T) {
	t.Setenv(EnvCacheDir, t.TempDir())
	release, err := Boot(context.Background(), io.Discard)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = Boot(ctx, io.Discard)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the machine's guests are another test's")
	release()
	again, err := Boot(context.Background(), io.Discard)
	require.NoError(t, err, "free once released")
	again()
}
