package benchmark

import (
	"os"
	"strconv"
	"strings"

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
