package procs

import (
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
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		stat string
		want Stat
		err  bool
	}{
		{
			name: "a running process",
			stat: "4242 (weed) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 9 0 987654 123 45 18446744073709551615",
			want: Stat{State: 'S', PPID: 1, Start: 987654},
		},
		{
			name: "a command name with spaces and parentheses",
			stat: "7 (a (b) c) Z 3 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 55 0 0",
			want: Stat{State: 'Z', PPID: 3, Start: 55},
		},
		{name: "no command name", stat: "4242 weed S 1", err: true},
		{name: "too few fields", stat: "4242 (weed) S 1 2 3", err: true},
		{name: "a parent that is no number", stat: "1 (x) S one 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5", err: true},
		{name: "a start time that is no number", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 soon", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.stat))
			if tc.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestAlive(t *testing.T) {
	self := os.Getpid()
	s, err := Read(self)
	require.NoError(t, err)
	assert.Equal(t, os.Getppid(), s.PPID)

	done := exec.Command("true")
	require.NoError(t, done.Run())

	for _, tc := range []struct {
		name  string
		pid   int
		start uint64
		want  bool
	}{
		{name: "this process", pid: self, start: s.Start, want: true},
		{name: "another process given this pid", pid: self, start: s.Start + 1},
		{name: "a process that exited", pid: done.Process.Pid, start: s.Start},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Alive(tc.pid, tc.start))
		})
	}
}

// A process of the directory whose starter exited is an orphan; one whose
// starter runs is not, nor is a process of another directory.
func TestOrphans(t *testing.T) {
	if os.Getpid() == 1 {
		t.Skip("this test binary is its pid namespace's init: its children are never re-parented")
	}
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	bin := filepath.Join(dir, "sleep")
	b, err := os.ReadFile(sleep) //nolint:gosec // the system's sleep
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755)) //nolint:gosec // an executable

	// A child of this test: its parent runs.
	child := exec.Command(bin, "60")
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	// A grandchild whose parent, the shell, exits at once.
	out, err := exec.Command("sh", "-c", bin+" 60 >/dev/null 2>&1 & echo $!").Output()
	require.NoError(t, err)
	orphan, err := strconv.Atoi(strings.TrimSpace(string(out)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(orphan, syscall.SIGKILL) })
	// A process elsewhere whose parent exited too.
	require.NoError(t, exec.Command("sh", "-c", sleep+" 1 >/dev/null 2>&1 &").Run())

	var s Stat
	require.Eventually(t, func() bool {
		s, err = Read(orphan)
		return err == nil && s.PPID != os.Getpid() && !shellRuns(s.PPID)
	}, 10*time.Second, 10*time.Millisecond, "the shell exits")
	if s.PPID != 1 {
		t.Skipf("orphans are re-parented to a subreaper (pid %d), not init: Orphans finds none on this machine", s.PPID)
	}
	got, err := Orphans(dir)
	require.NoError(t, err)
	assert.Equal(t, []int{orphan}, got)
}

// shellRuns reports whether process pid is a shell (the one that started
// the orphan, before it exits).
func shellRuns(pid int) bool {
	comm, err := Command(pid)
	return err == nil && comm == "sh"
}
