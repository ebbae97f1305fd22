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

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// What a killed run's node left (a process in its cgroup and network
// namespace, as a container's shim is, the namespace, the cgroups, the
// directory and the unlocked record) is removed by the next start; a live
// node's locked record is left alone.
func TestRemoveLeftovers(t *testing.T) {
	ctx, dir, id := nodeDir(t)
	killed := &Node{Dir: dir, Netns: "vfkn-" + id, Cgroup: "vfkn-" + id}
	killed.rec = record{Dir: killed.Dir, Netns: killed.Netns, Cgroup: killed.Cgroup}
	t.Cleanup(func() { _ = remove(context.Background(), killed.rec) })
	cgroupProcs, err := makeCgroups(killed.Cgroup)
	require.NoError(t, err)
	require.NoError(t, killed.makeNetns(ctx, true))
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

// A node that joined another's network namespace (Options.Netns) is
// removed without it: its own process (in its cgroup) is killed, the
// namespace and the owner's process in it stay, and only the node's
// address leaves the namespace's loopback.
func TestRemoveLeavesAJoinedNamespace(t *testing.T) {
	ctx, dir, id := nodeDir(t)
	owner := "vfkn-owner" + id
	require.NoError(t, exec.Command("ip", "netns", "add", owner).Run())
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", owner).Run() })
	n := &Node{Dir: dir, Netns: owner, Cgroup: "vfkn-" + id}
	n.rec = record{Dir: n.Dir, Netns: n.Netns, Cgroup: n.Cgroup, Joined: true}
	t.Cleanup(func() { _ = remove(context.Background(), n.rec) })
	cgroupProcs, err := makeCgroups(n.Cgroup)
	require.NoError(t, err)
	require.NoError(t, n.makeNetns(ctx, false))

	// sleep starts a process in the namespace; exited closes once it ended.
	sleep := func() (*exec.Cmd, chan struct{}) {
		cmd := exec.Command("ip", "netns", "exec", owner, "sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, cmd.Start())
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		return cmd, exited
	}
	nodes, nodeExited := sleep()
	require.NoError(t, os.WriteFile(cgroupProcs, []byte(strconv.Itoa(nodes.Process.Pid)), 0o644))
	_, ownerExited := sleep()
	addrs := func() string {
		out, err := exec.Command("ip", "-n", owner, "-o", "addr", "show", "dev", "lo").CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	require.Contains(t, addrs(), NodeIP+"/32", "the node's address is on the namespace's loopback")

	require.NoError(t, remove(ctx, n.rec))

	select {
	case <-nodeExited:
	case <-ctx.Done():
		t.Fatal("the node's process still runs")
	}
	select {
	case <-ownerExited:
		t.Fatal("the namespace owner's process was killed")
	default:
	}
	assert.NotContains(t, addrs(), NodeIP+"/32", "the node's address stays")
	routes, err := exec.Command("ip", "-n", owner, "route", "show", controlplane.ServiceRange).CombinedOutput()
	require.NoError(t, err, "%s", routes)
	assert.Empty(t, strings.TrimSpace(string(routes)), "the node's route to the Service range stays")
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "%s is left", dir)
}

// nodeDir skips t where a node cannot run, and makes a node's directory
// as Start does, returning it and the id that names the node's namespace
// and cgroup, with a context that ends with t or in two minutes.
func nodeDir(t *testing.T) (ctx context.Context, dir, id string) {
	t.Helper()
	if m := Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	dir, err := os.MkdirTemp("", "vf-kn-")
	require.NoError(t, err)
	return ctx, dir, strings.TrimPrefix(filepath.Base(dir), "vf-kn-")
}
