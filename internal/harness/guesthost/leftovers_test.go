package guesthost

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLeftover(t *testing.T) {
	for _, tc := range []struct {
		name, netns string
		pid         int
		dir         string
		ok          bool
	}{
		{name: "vfpaira", netns: "vfpaira-4242-123456", pid: 4242, dir: "vf-vfpaira-123456", ok: true},
		{name: "vf-x", netns: "vf-x-7-1", pid: 7, dir: "vf-vf-x-1", ok: true},
		{name: "vfpaira", netns: "vfpairb-4242-123456"},
		{name: "vfpaira", netns: "vfpaira-notapid-123456"},
		{name: "vfpaira", netns: "vfpaira-4242"},
		{name: "vfpaira", netns: "vfpaira-4242-"},
		{name: "vfpaira", netns: "vfpaira-4242-12-34"},
	} {
		t.Run(tc.netns, func(t *testing.T) {
			pid, dir, ok := leftover(tc.name, tc.netns)
			assert.Equal(t, tc.ok, ok)
			if tc.ok {
				assert.Equal(t, tc.pid, pid)
				assert.Equal(t, filepath.Join(os.TempDir(), tc.dir), dir)
			}
		})
	}
}

// A killed run's host (its maker gone, a process still in its namespace)
// is removed by the next start of a host of that name; a living run's is
// not.
func TestAKilledRunsHostIsRemovedAtTheNextStart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("makes network namespaces: needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	const name = "vfleftover"
	host := func(pid int) (netns, dir string) {
		dir, err := os.MkdirTemp("", "vf-"+name+"-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		require.NoError(t, os.WriteFile(filepath.Join(dir, "libvirtd.log"), nil, 0o600))
		netns = name + "-" + strconv.Itoa(pid) + "-" + strings.TrimPrefix(filepath.Base(dir), "vf-"+name+"-")
		out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput()
		require.NoError(t, err, "%s", out)
		t.Cleanup(func() { KillNetns(netns); _ = exec.Command("ip", "netns", "del", netns).Run() })
		return netns, dir
	}
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	killed, killedDir := host(gone.Process.Pid)
	straggler := exec.Command("ip", "netns", "exec", killed, "sleep", "600")
	require.NoError(t, straggler.Start())
	waited := make(chan error, 1)
	go func() { waited <- straggler.Wait() }()
	// ip enters the namespace, then becomes sleep: until it has, nothing
	// of the namespace runs to be killed, and a removal would leave the
	// straggler running on in a namespace that no longer has a name.
	require.Eventually(t, func() bool {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(straggler.Process.Pid), "comm"))
		return string(comm) == "sleep\n"
	}, time.Minute, 10*time.Millisecond, "the straggler never ran in the namespace")
	living, livingDir := host(os.Getpid())

	var progress bytes.Buffer
	removeLeftovers(name, &progress)
	assert.Contains(t, progress.String(), "removing host "+killed)
	select {
	case err := <-waited:
		assert.Error(t, err, "what ran in the killed run's namespace is killed")
	case <-time.After(time.Minute):
		_ = straggler.Process.Kill()
		t.Error("what ran in the killed run's namespace runs on")
	}
	assert.NoFileExists(t, filepath.Join("/run/netns", killed))
	assert.NoDirExists(t, killedDir)
	assert.FileExists(t, filepath.Join("/run/netns", living), "the living run's namespace stays")
	assert.DirExists(t, livingDir)
}

// killNetnsChild names the namespace in which TestKillNetnsSparesItsCaller's
// child, the test binary run again inside it, calls KillNetns.
const killNetnsChild = "VIRTFLEET_KILLNETNS_CHILD"

// KillNetns kills what runs in the namespace but not its caller, even when
// the caller's main thread is there too (here the whole child is).
func TestKillNetnsSparesItsCaller(t *testing.T) {
	if ns := os.Getenv(killNetnsChild); ns != "" {
		KillNetns(ns)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("makes network namespaces: needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	ns := "vfkillnetns-" + strconv.Itoa(os.Getpid())
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { KillNetns(ns); _ = exec.Command("ip", "netns", "del", ns).Run() })
	sleeper := exec.Command("ip", "netns", "exec", ns, "sleep", "600")
	require.NoError(t, sleeper.Start())
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()

	exe, err := os.Executable()
	require.NoError(t, err)
	child := exec.Command("ip", "netns", "exec", ns, exe, "-test.run=^TestKillNetnsSparesItsCaller$") //nolint:gosec // the test binary itself
	child.Env = append(os.Environ(), killNetnsChild+"="+ns)
	out, err = child.CombinedOutput()
	require.NoError(t, err, "the caller survives its own KillNetns: %s", out)
	assert.Error(t, <-waited, "the namespace's other process is killed")
}
