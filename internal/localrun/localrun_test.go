package localrun_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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
	cmd := exec.Command(bin, "-dir", runDir, "-examples", filepath.Join(root, "examples"))
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

	t.Run("PastedInstructionsReachTheExamples", func(t *testing.T) {
		get := exec.Command(kubectl[1], "get", "vm", "sample-vm", "-n", "default", "-o", "name")
		get.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig[1])
		out, err := get.CombinedOutput()
		require.NoError(t, err, string(out))
		assert.Equal(t, "virtualmachine.compute.virtfleet.io/sample-vm", strings.TrimSpace(string(out)))
	})

	t.Run("EveryExampleIsApplied", func(t *testing.T) {
		objs, err := manifests.Load(filepath.Join(root, "examples"))
		require.NoError(t, err)
		assert.Contains(t, printed.String(), " "+strconv.Itoa(len(objs))+" objects applied")
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
