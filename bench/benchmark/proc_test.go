package benchmark

import (
	"os"
	"testing"

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
