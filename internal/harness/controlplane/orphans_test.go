package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// An etcd whose test binary was killed (here: whose shell exited) is
// killed by the next start; one whose starter runs is left alone.
func TestAKilledRunsEtcdIsKilledAtTheNextStart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs envtest's etcd; skipped with -short")
	}
	assets, err := envtestassets.Ensure(context.Background(), os.Stderr)
	require.NoError(t, err)
	etcd := func(dir string) []string {
		client, err := freeport.Pick()
		require.NoError(t, err)
		peer, err := freeport.Pick()
		require.NoError(t, err)
		return []string{
			"--data-dir", dir,
			"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", client),
			"--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", client),
			"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		}
	}

	// The living run's etcd: a child of this test.
	living := exec.Command(filepath.Join(assets, "etcd"), etcd(t.TempDir())...) //nolint:gosec // envtest's etcd
	require.NoError(t, living.Start())
	t.Cleanup(func() { _ = living.Process.Kill(); _ = living.Wait() })

	// The killed run's etcd: its parent, a shell, is gone at once.
	script := strings.Join(append([]string{filepath.Join(assets, "etcd")}, etcd(t.TempDir())...), " ") + " >/dev/null 2>&1 & echo $!"
	out, err := exec.Command("sh", "-c", script).Output()
	require.NoError(t, err)
	orphan, err := strconv.Atoi(strings.TrimSpace(string(out)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(orphan, syscall.SIGKILL) })
	s, err := procs.Read(orphan)
	require.NoError(t, err)
	var reaper int
	require.Eventually(t, func() bool {
		got, err := procs.Read(orphan)
		reaper = got.PPID
		return err == nil && (got.PPID == 1 || ancestor(got.PPID))
	}, 10*time.Second, 10*time.Millisecond, "the killed run's etcd is re-parented to init")
	if reaper != 1 {
		t.Skipf("this test binary runs under a child subreaper (pid %d, as under hack/cputime), which takes the orphan instead of init; only init's orphans are a killed run's", reaper)
	}

	var progress bytes.Buffer
	require.NoError(t, killOrphans(assets, &progress))
	assert.Contains(t, progress.String(), fmt.Sprintf("killing etcd (pid %d) that a killed run left behind", orphan))
	assert.Eventually(t, func() bool { return !procs.Alive(orphan, s.Start) }, 10*time.Second, 10*time.Millisecond, "the killed run's etcd is gone")
	l, err := procs.Read(living.Process.Pid)
	require.NoError(t, err)
	assert.NotEqual(t, byte('Z'), l.State, "the living run's etcd runs on")
}

// ancestor says whether pid is this process's parent or one of its
// parent's ancestors.
func ancestor(pid int) bool {
	for p := os.Getppid(); p > 1; {
		if p == pid {
			return true
		}
		s, err := procs.Read(p)
		if err != nil {
			return false
		}
		p = s.PPID
	}
	return false
}
