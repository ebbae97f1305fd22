// Package procs reads this machine's processes as proc(5) shows them, for
// harnesses that must find what a killed test run left running: a process
// outlives the test binary that started it when nothing ties it to that
// binary's life (envtest's etcd and kube-apiserver, a daemon in a process
// group of its own).
package procs

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Stat is what /proc/<pid>/stat says of a process that the harnesses use.
type Stat struct {
	// State is the one-letter state: R, S, D, Z (zombie), X (dead)...
	State byte
	// PPID is the parent's pid: 1, or the pid namespace's init, once the
	// process that started it is gone.
	PPID int
	// Start is when the process started, in clock ticks after boot: with
	// the pid it names one process, as pids are reused.
	Start uint64
}

// Read is process pid's Stat.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")) //nolint:gosec // /proc
	if err != nil {
		return Stat{}, errors.Wrapf(err, "cannot read the state of process %d", pid)
	}
	return Parse(b)
}

// Parse reads proc(5)'s /proc/pid/stat: after the command name in
// parentheses (which can hold anything, parentheses too) come the state,
// field 3, the parent's pid, field 4, and the start time, field 22.
func Parse(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.Errorf("cannot parse process state %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	const stateField, ppidField, startField = 3, 4, 22
	if len(f) <= startField-stateField || len(f[0]) != 1 {
		return Stat{}, errors.Errorf("cannot parse process state %q", b)
	}
	ppid, err := strconv.Atoi(f[ppidField-stateField])
	if err != nil {
		return Stat{}, errors.Wrapf(err, "cannot parse process state %q", b)
	}
	start, err := strconv.ParseUint(f[startField-stateField], 10, 64)
	if err != nil {
		return Stat{}, errors.Wrapf(err, "cannot parse process state %q", b)
	}
	return Stat{State: f[0][0], PPID: ppid, Start: start}, nil
}

// Command is process pid's command name (comm, as ps shows it).
func Command(pid int) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")) //nolint:gosec // /proc
	if err != nil {
		return "", errors.Wrapf(err, "cannot read the command of process %d", pid)
	}
	return strings.TrimSpace(string(b)), nil
}

// Alive reports whether process pid, started at start, still runs: a
// zombie has stopped running, and a process started at another time is
// another process given the same pid.
func Alive(pid int, start uint64) bool {
	s, err := Read(pid)
	return err == nil && s.Start == start && s.State != 'Z' && s.State != 'X'
}

// Orphans are the running processes of an executable in dir whose parent
// is gone: re-parented to the pid namespace's init. A process whose
// executable or state cannot be read (it exited meanwhile, or is not
// ours to read) is not one.
func Orphans(dir string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, errors.Wrap(err, "cannot list processes")
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || filepath.Dir(exe) != filepath.Clean(dir) {
			continue
		}
		s, err := Read(pid)
		if err != nil || s.PPID != 1 || s.State == 'Z' || s.State == 'X' {
			continue
		}
		found = append(found, pid)
	}
	return found, nil
}
