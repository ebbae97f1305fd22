package benchmark

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat. It
// is 100 on every Linux architecture Go supports; reading it would need cgo
// (sysconf).
const clockTicks = 100

// ProcessUsage is what the kernel counts for one process.
type ProcessUsage struct {
	// PeakRSSBytes is VmHWM, the resident set's high-water mark since the
	// process started: each scenario has fresh processes, so it is that
	// scenario's peak.
	PeakRSSBytes int64
	// CPUSeconds is user plus system time.
	CPUSeconds float64
}

// ReadProcessUsage reads pid's peak RSS and CPU time from /proc.
func ReadProcessUsage(pid int) (ProcessUsage, error) {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ProcessUsage{}, errors.Wrapf(err, "cannot read the status of process %d", pid)
	}
	hwm, err := parseStatusKiB(string(status), "VmHWM")
	if err != nil {
		return ProcessUsage{}, errors.Wrapf(err, "process %d", pid)
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ProcessUsage{}, errors.Wrapf(err, "cannot read the stat of process %d", pid)
	}
	cpu, err := parseStatCPU(string(stat))
	if err != nil {
		return ProcessUsage{}, errors.Wrapf(err, "process %d", pid)
	}
	return ProcessUsage{PeakRSSBytes: hwm, CPUSeconds: cpu}, nil
}

// parseStatusKiB reads a "Key:   1234 kB" line of /proc/<pid>/status.
func parseStatusKiB(status, key string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, key+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, errors.Errorf("unexpected %s line %q", key, line)
		}
		kib, err := strconv.ParseInt(f[0], 10, 64)
		return kib << 10, errors.Wrapf(err, "cannot parse %s", key)
	}
	return 0, errors.Errorf("no %s in the process status", key)
}

// parseStatCPU returns utime+stime in seconds from /proc/<pid>/stat. The
// command name (field 2) may hold spaces and parentheses, so fields are
// counted from the last closing parenthesis.
func parseStatCPU(stat string) (float64, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("malformed stat")
	}
	// After ")": field 3 (state) onwards; utime and stime are fields 14, 15.
	f := strings.Fields(stat[end+1:])
	if len(f) < 13 {
		return 0, errors.New("stat has too few fields")
	}
	utime, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, errors.Wrap(err, "cannot parse utime")
	}
	stime, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, errors.Wrap(err, "cannot parse stime")
	}
	return float64(utime+stime) / clockTicks, nil
}

// CPUShare is the CPU time the machine spent over an interval, and what of
// it this process and its descendants used, by command name: it says
// whether a scenario was bound by the machine's cores and which part of the
// stack (the API server, etcd, the hub, the agents, their libvirtds, this
// process's NATS server and clients) used them.
type CPUShare struct {
	// WallSeconds is the interval's length; MachineSeconds the CPU time
	// every core spent busy in it (at most WallSeconds times the cores).
	WallSeconds    float64 `json:"wallSeconds"`
	MachineSeconds float64 `json:"machineSeconds"`
	// ByCommand is CPU seconds by command name; this process is "bench".
	ByCommand map[string]float64 `json:"byCommand"`
}

// cpuSnapshot is the machine's busy time and that of this process's tree,
// by pid, at one moment.
type cpuSnapshot struct {
	at      time.Time
	machine float64
	procs   map[int]procCPU
}

type procCPU struct {
	command string
	seconds float64
}

// snapshotCPU reads /proc/stat and every descendant of this process.
func snapshotCPU() (cpuSnapshot, error) {
	s := cpuSnapshot{at: time.Now(), procs: map[int]procCPU{}}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, errors.Wrap(err, "cannot read /proc/stat")
	}
	if s.machine, err = parseMachineBusy(string(stat)); err != nil {
		return s, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return s, errors.Wrap(err, "cannot list /proc")
	}
	type proc struct {
		ppid int
		procCPU
	}
	all := map[int]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		command, ppid, ok := parseStatIdentity(string(b))
		if !ok {
			continue
		}
		cpu, err := parseStatCPU(string(b))
		if err != nil {
			continue
		}
		all[pid] = proc{ppid: ppid, procCPU: procCPU{command: command, seconds: cpu}}
	}
	self := os.Getpid()
	for pid, p := range all {
		for up, hops := pid, 0; up > 1 && hops < 64; up, hops = all[up].ppid, hops+1 {
			if up == self {
				if pid == self {
					p.command = "bench"
				}
				s.procs[pid] = p.procCPU
				break
			}
		}
	}
	return s, nil
}

// shareSince is the CPU used between before and s, by command name. A
// process that ended in between is not counted; one that started counts
// from its start.
func (s cpuSnapshot) shareSince(before cpuSnapshot) CPUShare {
	out := CPUShare{WallSeconds: s.at.Sub(before.at).Seconds(), MachineSeconds: s.machine - before.machine, ByCommand: map[string]float64{}}
	for pid, p := range s.procs {
		used := p.seconds
		if b, ok := before.procs[pid]; ok && b.command == p.command {
			used -= b.seconds
		}
		out.ByCommand[p.command] += used
	}
	return out
}

// parseMachineBusy returns the seconds every core spent busy (user, nice,
// system, irq, softirq, steal) from the "cpu" line of /proc/stat.
func parseMachineBusy(stat string) (float64, error) {
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu" {
			continue
		}
		var busy int64
		for _, i := range []int{1, 2, 3, 6, 7, 8} {
			v, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				return 0, errors.Wrapf(err, "cannot parse /proc/stat field %d", i)
			}
			busy += v
		}
		return float64(busy) / clockTicks, nil
	}
	return 0, errors.New("no cpu line in /proc/stat")
}

// parseStatIdentity returns the command name and parent pid from
// /proc/<pid>/stat.
func parseStatIdentity(stat string) (string, int, bool) {
	start, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if start < 0 || end < start {
		return "", 0, false
	}
	f := strings.Fields(stat[end+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return stat[start+1 : end], ppid, err == nil
}
