package openstack

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// fakeCloud is a cloud's directory with what removeCloud looks at, and
// processes as the cloud's services leave them when their test binary is
// killed: each started with the cloud's HOME in a process group of its own
// whose leader has died (its parent-death signal), leaving its child in the
// group and a grandchild in a session of its own (as rabbitmq-server
// leaves beam.smp and erl_child_setup), and a process as libvirt starts
// QEMU, with an environment of its own but in libvirtd's mount namespace,
// where /run/libvirt is the cloud's <dir>/libvirt/run.
type fakeCloud struct {
	dir   string
	procs map[string]procs.Stat
	pids  map[string]int
}

func newFakeCloud(t *testing.T) *fakeCloud {
	t.Helper()
	dir, err := os.MkdirTemp("", dirPrefix)
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, d := range []string{"home", "volumes", "libvirt/run"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, d), 0o700))
	}
	f := &fakeCloud{dir: dir, procs: map[string]procs.Stat{}, pids: map[string]int{}}

	pids := filepath.Join(dir, "pids")
	service := exec.Command("sh", "-c", `sleep 600 & echo $! >"$1.tmp"; setsid sleep 600 & echo $! >>"$1.tmp"; mv "$1.tmp" "$1"; wait`, "sh", pids)
	service.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + filepath.Join(dir, "home")}
	service.Dir = dir
	service.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, service.Start())
	var b []byte
	require.Eventually(t, func() bool { b, err = os.ReadFile(pids); return err == nil }, 10*time.Second, 10*time.Millisecond)
	f.track(t, "service", service.Process.Pid)
	for i, name := range []string{"child", "grandchild"} {
		pid, err := strconv.Atoi(strings.Fields(string(b))[i])
		require.NoError(t, err)
		f.track(t, name, pid)
	}
	require.NoError(t, service.Process.Kill())
	require.Error(t, service.Wait())

	qemu := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs tmpfs /run && mkdir /run/libvirt && mount --bind "$1" /run/libvirt && exec sleep 600`,
		"sh", filepath.Join(dir, "libvirt", "run"))
	qemu.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	qemu.Dir = "/"
	qemu.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, qemu.Start())
	go func() { _ = qemu.Wait() }()
	require.Eventually(t, func() bool {
		comm, err := procs.Command(qemu.Process.Pid)
		return err == nil && comm == "sleep"
	}, 10*time.Second, 10*time.Millisecond, "the mount namespace is not made")
	f.track(t, "qemu", qemu.Process.Pid)
	return f
}

// track notes process pid as name, and kills it at the end of the test if
// it still runs.
func (f *fakeCloud) track(t *testing.T, name string, pid int) {
	t.Helper()
	s, err := procs.Read(pid)
	require.NoError(t, err)
	f.procs[name], f.pids[name] = s, pid
	t.Cleanup(func() {
		if procs.Alive(pid, s.Start) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// What a killed test binary's cloud left (its services' descendants,
// QEMU, a DHCP namespace with its dnsmasq, a bridge, a loop device over a
// volume, the directory and the record nobody locks) is removed; a live
// cloud beside it, with the same kinds of processes, is not touched.
func TestRemoveLeftovers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount and network namespaces, bridges, loop devices")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	apartFromOtherRuns(t)
	killed, live := newFakeCloud(t), newFakeCloud(t)

	network := uuid.NewString()
	netns, bridge := "qdhcp-"+network, "brq"+network[:11]
	require.NoError(t, os.MkdirAll(filepath.Join(killed.dir, "state", "neutron", "dhcp", network), 0o700))
	require.NoError(t, exec.Command("ip", "netns", "add", netns).Run())
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", netns).Run() })
	// dnsmasq, as a process of the namespace only.
	dnsmasq := exec.Command("ip", "netns", "exec", netns, "sleep", "600")
	dnsmasq.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	dnsmasq.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, dnsmasq.Start())
	go func() { _ = dnsmasq.Wait() }()
	require.Eventually(t, func() bool {
		comm, err := procs.Command(dnsmasq.Process.Pid)
		return err == nil && comm == "sleep"
	}, 10*time.Second, 10*time.Millisecond)
	killed.track(t, "dnsmasq", dnsmasq.Process.Pid)
	require.NoError(t, exec.Command("ip", "link", "add", bridge, "type", "bridge").Run())
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", bridge).Run() })
	volume := filepath.Join(killed.dir, "volumes", "volume-1")
	require.NoError(t, os.WriteFile(volume, nil, 0o600))
	require.NoError(t, os.Truncate(volume, 1<<20))
	out, err := exec.Command("losetup", "--find", "--show", volume).Output()
	require.NoError(t, err)
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })

	killedRec, err := procs.WriteRecord(runDir(), recordName(killed.dir), record{Dir: killed.dir, Owner: 1 << 30})
	require.NoError(t, err)
	killedRec.Abandon()
	t.Cleanup(func() { _ = os.Remove(killedRec.Path()) })
	liveRec, err := procs.WriteRecord(runDir(), recordName(live.dir), record{Dir: live.dir, Owner: os.Getpid()})
	require.NoError(t, err)
	t.Cleanup(liveRec.Remove)

	var progress bytes.Buffer
	require.NoError(t, removeLeftovers(ctx, &progress))
	t.Log(progress.String())

	for name, s := range killed.procs {
		pid := killed.pids[name]
		assert.Eventually(t, func() bool { return !procs.Alive(pid, s.Start) }, 10*time.Second, 10*time.Millisecond, "the killed cloud's %s (pid %d) still runs", name, pid)
	}
	for name, s := range live.procs {
		if name != "service" {
			assert.True(t, procs.Alive(live.pids[name], s.Start), "the live cloud's %s was killed", name)
		}
	}
	for _, p := range []string{killed.dir, killedRec.Path(), filepath.Join("/run/netns", netns), filepath.Join("/sys/class/net", bridge)} {
		_, err := os.Stat(p)
		assert.True(t, os.IsNotExist(err), "%s is left", p)
	}
	backing, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(loop), "loop", "backing_file"))
	assert.False(t, err == nil && strings.HasPrefix(string(backing), volume), "%s still backs %s", volume, loop)
	for _, p := range []string{live.dir, liveRec.Path()} {
		_, err := os.Stat(p)
		assert.NoError(t, err, "the live cloud's %s was removed", p)
	}
	for _, said := range []string{killed.dir, "killed 3 processes", "network namespace " + netns, "bridge " + bridge, loop, "removed " + killed.dir} {
		assert.Contains(t, progress.String(), said)
	}
	assert.NotContains(t, progress.String(), live.dir)
}

// apartFromOtherRuns keeps the clouds and records of t, and of the runs it
// starts, apart from other test packages' (runDir and the clouds'
// directories are in the temporary directory): a cloud another package
// starts meanwhile sweeps the run directory the clouds share, and would
// remove a killed run's cloud before t does.
func apartFromOtherRuns(t *testing.T) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "vf-openstack-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	t.Setenv("TMPDIR", tmp)
}

// killedRunEnv makes the test binary the killed run of
// TestAKilledRunsCloudIsRemoved.
const killedRunEnv = "VIRTFLEET_OPENSTACK_KILLED_RUN"

// A real cloud's test binary killed while the cloud starts, once MariaDB
// and RabbitMQ run, leaves processes behind (RabbitMQ's beam.smp); the
// next start removes them and the cloud's directory.
func TestAKilledRunsCloudIsRemoved(t *testing.T) {
	if os.Getenv(killedRunEnv) != "" {
		_, err := Start(context.Background(), Options{Progress: os.Stderr})
		t.Fatalf("this run was to be killed while its cloud started: %v", err)
	}
	if testing.Short() {
		t.Skip("starts Debian's MariaDB and RabbitMQ; skipped with -short")
	}
	if m := Missing(); len(m) > 0 {
		t.Fatalf("the Debian packages of the test OpenStack are not installed: %v; run `make deps` as root", m)
	}
	apartFromOtherRuns(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAKilledRunsCloudIsRemoved$") //nolint:gosec // this test binary
	run.Env = append(os.Environ(), killedRunEnv+"=1")
	stderr, err := run.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, run.Start())
	var dir string
	var said []string
	ready := map[string]bool{}
	lines := bufio.NewScanner(stderr)
	for !ready["MariaDB"] || !ready["RabbitMQ"] {
		require.True(t, lines.Scan(), "the run ended before MariaDB and RabbitMQ ran:\n%s", strings.Join(said, "\n"))
		said = append(said, lines.Text())
		if _, d, ok := strings.Cut(lines.Text(), "state in "); ok {
			dir = d
		}
		for _, s := range []string{"MariaDB", "RabbitMQ"} {
			ready[s] = ready[s] || strings.Contains(lines.Text(), s+" ready")
		}
	}
	require.NoError(t, run.Process.Kill())
	require.Error(t, run.Wait())
	require.NotEmpty(t, dir, "the run did not say where its cloud is:\n%s", strings.Join(said, "\n"))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	left := func() []string {
		var names []string
		require.NoError(t, eachProcess(dir, func(pid, _ int) {
			comm, _ := procs.Command(pid)
			names = append(names, comm)
		}))
		return names
	}
	before := left()
	require.NotEmpty(t, before, "the killed run left nothing behind: nothing to remove")
	t.Logf("the killed run left %v", before)

	var progress bytes.Buffer
	require.NoError(t, removeLeftovers(ctx, &progress))
	t.Log(progress.String())
	assert.Empty(t, left(), "processes of the killed run's cloud still run")
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "%s is left", dir)
	_, err = os.Stat(filepath.Join(runDir(), recordName(dir)+".json"))
	assert.True(t, os.IsNotExist(err), "the record of %s is left", dir)
	assert.Contains(t, progress.String(), "removed "+dir)
}
