package guestimage

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
