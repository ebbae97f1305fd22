package kubenode

import (
	"context"
	"io"
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

	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// What a killed run's node left (a process in its cgroup and network
// namespace, as a container's shim is, the namespace, the cgroups, the
// directory and the unlocked record) is removed by the next start; a live
// node's locked record is left alone.
func TestRemoveLeftovers(t *testing.T) {
	if m := Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "vf-kn-")
	require.NoError(t, err)
	id := strings.TrimPrefix(filepath.Base(dir), "vf-kn-")
	killed := &Node{Dir: dir, Netns: "vfkn-" + id, Cgroup: "vfkn-" + id}
	killed.rec = record{Dir: killed.Dir, Netns: killed.Netns, Cgroup: killed.Cgroup}
	t.Cleanup(func() { _ = remove(context.Background(), killed.rec) })
	cgroupProcs, err := makeCgroups(killed.Cgroup)
	require.NoError(t, err)
	require.NoError(t, killed.makeNetns(ctx))
	sleeper := exec.Command("ip", "netns", "exec", killed.Netns, "sleep", "600")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, sleeper.Start())
	exited := make(chan error, 1)
	go func() { exited <- sleeper.Wait() }()
	require.NoError(t, os.WriteFile(cgroupProcs, []byte(strconv.Itoa(sleeper.Process.Pid)), 0o644))
	killedRec, err := procs.WriteRecord(runDir(), killed.Netns, killed.rec)
	require.NoError(t, err)
	killedRec.Abandon()

	live := record{Dir: filepath.Join(os.TempDir(), "vf-kn-live"+id), Netns: "vfkn-live" + id, Cgroup: "vfkn-live" + id}
	liveRec, err := procs.WriteRecord(runDir(), live.Netns, live)
	require.NoError(t, err)
	t.Cleanup(liveRec.Remove)

	require.NoError(t, removeLeftovers(ctx, io.Discard))

	select {
	case err := <-exited:
		assert.Error(t, err, "the node's process ended by itself")
	case <-ctx.Done():
		t.Fatal("the node's process still runs")
	}
	ns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	assert.NotContains(t, string(ns), killed.Netns)
	cgroups, err := filepath.Glob(filepath.Join(cgroupRoot, "*", killed.Cgroup))
	require.NoError(t, err)
	assert.Empty(t, cgroups, "cgroups are left")
	for _, p := range []string{killed.Dir, killedRec.Path()} {
		_, err = os.Stat(p)
		assert.True(t, os.IsNotExist(err), "%s is left", p)
	}
	_, err = os.Stat(liveRec.Path())
	assert.NoError(t, err, "a live node's record was removed")
}
