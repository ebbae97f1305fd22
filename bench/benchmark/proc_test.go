package benchmark

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStatusKiB(t *testing.T) {
	status := "Name:\thub\nVmPeak:\t 1300000 kB\nVmHWM:\t   53248 kB\nVmRSS:\t   50000 kB\n"
	v, err := parseStatusKiB(status, "VmHWM")
	require.NoError(t, err)
	assert.Equal(t, int64(53248<<10), v)
	_, err = parseStatusKiB(status, "VmSwap")
	assert.Error(t, err, "a missing key is an error, not a zero")
	_, err = parseStatusKiB("VmHWM:\t12 MB\n", "VmHWM")
	assert.Error(t, err, "an unexpected unit is an error")
}

func TestParseStatCPUCountsFromTheLastParenthesis(t *testing.T) {
	// comm "(a b) c)" holds a space and a parenthesis; utime 250, stime 50.
	stat := "4242 ((a b) c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 0 0"
	v, err := parseStatCPU(stat)
	require.NoError(t, err)
	assert.InDelta(t, 3.0, v, 1e-9)
	_, err = parseStatCPU("4242 (x) S 1")
	assert.Error(t, err)
}

func TestReadProcessUsageOfThisProcess(t *testing.T) {
	u, err := ReadProcessUsage(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, u.PeakRSSBytes)
}

func TestParseStatIdentity(t *testing.T) {
	cases := map[string]struct {
		stat    string
		command string
		ppid    int
		ok      bool
	}{
		"Plain":                {stat: "4242 (etcd) S 17 4242 4242 0", command: "etcd", ppid: 17, ok: true},
		"ParenthesesInTheName": {stat: "4242 ((a b) c)) S 9 4242", command: "(a b) c)", ppid: 9, ok: true},
		"NoParentPid":          {stat: "4242 (x) S"},
		"NotAStatLine":         {stat: "garbage"},
		"ParentPidNotANumber":  {stat: "4242 (x) S y 1"},
		"ClosingBeforeOpening": {stat: ") 4242 (x"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			command, ppid, ok := parseStatIdentity(tc.stat)
			assert.Equal(t, tc.ok, ok)
			if tc.ok {
				assert.Equal(t, tc.command, command)
				assert.Equal(t, tc.ppid, ppid)
			}
		})
	}
}

func TestParseMachineBusy(t *testing.T) {
	// user 100, nice 10, system 50, idle 1000, iowait 7, irq 1, softirq 2,
	// steal 3: busy is 166 ticks; idle and iowait are not.
	v, err := parseMachineBusy("cpu  100 10 50 1000 7 1 2 3 0 0\ncpu0 50 5 25 500 3 0 1 1 0 0\n")
	require.NoError(t, err)
	assert.InDelta(t, 1.66, v, 1e-9)
	_, err = parseMachineBusy("cpu0 1 2 3 4 5 6 7 8 9\n")
	assert.Error(t, err, "only the all-cores line counts")
}

// TestCPUShareCountsChildrenByCommand runs a busy child and finds its CPU
// time under its command name, and this process's under "bench".
func TestCPUShareCountsChildrenByCommand(t *testing.T) {
	before, err := snapshotCPU()
	require.NoError(t, err)
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	var share CPUShare
	require.Eventually(t, func() bool {
		after, err := snapshotCPU()
		if err != nil {
			return false // Eventually's goroutine must not stop the test
		}
		share = after.shareSince(before)
		return share.ByCommand["sh"] >= 0.05
	}, 30*time.Second, 10*time.Millisecond, "the busy child's CPU time")
	assert.Contains(t, share.ByCommand, "bench")
	assert.Positive(t, share.WallSeconds)
	assert.GreaterOrEqual(t, share.MachineSeconds, share.ByCommand["sh"]-0.02, "the machine was busy at least while the child was")
}

func TestCPUPerVM(t *testing.T) {
	run := CPUShare{MachineSeconds: 28, ByCommand: map[string]float64{"kube-apiserver": 13.5, "agent": 5}}
	limit := &Limit{VMs: 500, CPU: &CPUShare{MachineSeconds: 3, ByCommand: map[string]float64{"kube-apiserver": 2.5}}}
	cases := map[string]struct {
		s    Scenario
		want string
	}{
		"TheControlPlaneAlone": {
			s:    Scenario{Running: 1000, CPU: run, ControlPlane: limit},
			want: "28.0 (13.5) core-ms / 6.0 (5.0) core-ms / –",
		},
		// After a burst over simulated nodes.
		"TheWholeFlowAlone": {
			s:    Scenario{Running: 1000, CPU: run, WholeFlow: &Limit{VMs: 1000, CPU: &CPUShare{MachineSeconds: 12, ByCommand: map[string]float64{"kube-apiserver": 10}}}},
			want: "28.0 (13.5) core-ms / – / 12.0 (10.0) core-ms",
		},
		"WithTheWholeFlow": {
			s:    Scenario{Running: 1000, CPU: run, ControlPlane: limit, WholeFlow: &Limit{VMs: 1000, CPU: &CPUShare{MachineSeconds: 12, ByCommand: map[string]float64{"kube-apiserver": 10}}}},
			want: "28.0 (13.5) core-ms / 6.0 (5.0) core-ms / 12.0 (10.0) core-ms",
		},
		"NoLimitMeasured": {s: Scenario{Running: 1000, CPU: run}, want: "–"},
		"NothingRan":      {s: Scenario{CPU: run, ControlPlane: limit}, want: "–"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, cpuPerVM(tc.s))
		})
	}
}
