package localrun_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/controlplane"
	"github.com/virtfleet/virtfleet/internal/localrun"
	"github.com/virtfleet/virtfleet/internal/manifests"
)

// TestMakeRun runs the command behind `make run` as a user would: it waits for
// the instructions, pastes them, and stops the run with Ctrl-C (SIGINT).
func TestMakeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver; skipped with -short")
	}
	root := controlplane.RepoRoot()
	bin := filepath.Join(t.TempDir(), "local")
	build := exec.Command("go", "build", "-o", bin, "./cluster/local")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))

	runDir := t.TempDir()
	// A free NATS port, so the test never collides with a user's make run.
	cmd := exec.Command(bin, "-dir", runDir, "-examples", filepath.Join(root, "examples"), "-nats-port", strconv.Itoa(freePort(t)))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// Read until the run says how to use it.
	var printed strings.Builder
	lines := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	for lines.Scan() {
		printed.WriteString(lines.Text() + "\n")
		if strings.HasPrefix(lines.Text(), "Ctrl-C stops everything") {
			break
		}
	}
	deadline.Stop()
	require.Contains(t, printed.String(), "Ctrl-C stops everything", "stdout:\n%s\nstderr:\n%s", printed.String(), stderr.String())

	kubeconfig := regexp.MustCompile(`export KUBECONFIG=(\S+)`).FindStringSubmatch(printed.String())
	require.Len(t, kubeconfig, 2, printed.String())
	assert.Equal(t, filepath.Join(runDir, "kubeconfig"), kubeconfig[1])
	kubectl := regexp.MustCompile(`alias kubectl=(\S+)`).FindStringSubmatch(printed.String())
	require.Len(t, kubectl, 2, printed.String())

	kubectlGet := func(args ...string) string {
		get := exec.Command(kubectl[1], append([]string{"get"}, args...)...)
		get.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig[1])
		out, err := get.CombinedOutput()
		require.NoError(t, err, string(out))
		return string(out)
	}

	t.Run("KubectlGetVMShowsTheSeedTable", func(t *testing.T) {
		var out string
		require.Eventually(t, func() bool {
			out = kubectlGet("vm", "sample-vm", "-n", "default")
			return strings.Contains(out, "Running")
		}, 90*time.Second, 500*time.Millisecond, "sample-vm never ran:\n%s", out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2)
		assert.Equal(t, []string{"NAME", "STATUS", "RESTARTS", "AGE"}, strings.Fields(lines[0]))
		assert.Equal(t, []string{"sample-vm", "Running", "0"}, strings.Fields(lines[1])[:3])
	})

	t.Run("WideViewAddsNodeAndAddresses", func(t *testing.T) {
		out := kubectlGet("vm", "sample-vm", "-n", "default", "-o", "wide")
		assert.Regexp(t, `sample-vm\s+Running\s+0\s+\S+\s+node[123]\s+net-db\(10\.10\.120\.\d+\), net-backend\(10\.10\.150\.\d+\), net-frontend\(10\.10\.110\.\d+\)\s+True\s+True`, out)
	})

	t.Run("EveryExampleVMRuns", func(t *testing.T) {
		require.Eventually(t, func() bool {
			out := kubectlGet("vm", "-n", "default", "--no-headers")
			return strings.Count(out, "Running") == strings.Count(out, "\n") && strings.Count(out, "\n") >= 3
		}, 90*time.Second, 500*time.Millisecond)
	})

	t.Run("EveryExampleIsApplied", func(t *testing.T) {
		objs, err := manifests.Load(filepath.Join(root, "examples"))
		require.NoError(t, err)
		// All but the example ClusterProviderConfig: the run made its own.
		assert.Contains(t, printed.String(), " "+strconv.Itoa(len(objs)-1)+" objects applied")
	})

	t.Run("ASecondRunSaysOneIsRunning", func(t *testing.T) {
		_, err := localrun.Start(context.Background(), localrun.Options{Dir: runDir, Examples: filepath.Join(root, "examples"), Out: &bytes.Buffer{}})
		var running *localrun.ErrAlreadyRunning
		require.True(t, errors.As(err, &running), "got %v", err)
		assert.Equal(t, cmd.Process.Pid, running.PID)
		assert.Contains(t, err.Error(), "already running")
	})

	t.Run("CtrlCStopsCleanly", func(t *testing.T) {
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		done := make(chan error, 1)
		go func() {
			for lines.Scan() { // drain so the process never blocks on a full pipe
			}
			done <- cmd.Wait()
		}()
		select {
		case err := <-done:
			assert.NoError(t, err, stderr.String())
		case <-time.After(time.Minute):
			t.Fatal("the run did not stop within a minute of Ctrl-C")
		}
		assert.FileExists(t, filepath.Join(runDir, "logs", "control-plane.log"), "logs stay in the run directory")
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
