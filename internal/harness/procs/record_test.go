package procs

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type testRecord struct {
	Name string `json:"name"`
}

// A record is its process's for as long as that lives, however it ends:
// one locked by a live process is left alone, one whose process was
// killed is removed once what it names is, and kept when that fails.
func TestRemoveAbandoned(t *testing.T) {
	dir := t.TempDir()
	mine, err := WriteRecord(dir, "mine", testRecord{Name: "mine"})
	require.NoError(t, err)
	killed, err := WriteRecord(dir, "killed", testRecord{Name: "killed"})
	require.NoError(t, err)
	// Its process holds the lock instead of this one, then dies; flock
	// keeps the lock to itself (--close), and its command says it is held.
	holder := exec.Command("flock", "--exclusive", "--close", killed.Path(), "sh", "-c", "echo $$; exec sleep 600")
	out, err := holder.StdoutPipe()
	require.NoError(t, err)
	killed.Abandon()
	require.NoError(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "flock did not lock the record")
	sleeper, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(sleeper, syscall.SIGKILL) })
	require.NoError(t, RemoveAbandoned(dir, func(r testRecord) error {
		t.Errorf("the record %s of a live process was taken for a killed run's", r.Name)
		return nil
	}))
	_, err = os.Stat(killed.Path())
	require.NoError(t, err)

	require.NoError(t, holder.Process.Kill())
	require.Error(t, holder.Wait())
	failure := errors.New("busy")
	err = RemoveAbandoned(dir, func(testRecord) error { return failure })
	require.ErrorIs(t, err, failure)
	_, err = os.Stat(killed.Path())
	require.NoError(t, err, "the record of what could not be removed is gone")

	var removed []string
	require.NoError(t, RemoveAbandoned(dir, func(r testRecord) error { removed = append(removed, r.Name); return nil }))
	assert.Equal(t, []string{"killed"}, removed)
	_, err = os.Stat(killed.Path())
	assert.True(t, os.IsNotExist(err), "the killed run's record is left")
	_, err = os.Stat(mine.Path())
	require.NoError(t, err, "a live process's record was removed")

	mine.Remove()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "Remove left %v", entries)
	assert.Equal(t, filepath.Join(dir, "mine.json"), mine.Path())
}
