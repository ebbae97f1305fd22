package app_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBinary runs the agent command as a DaemonSet would, configured only
// through the environment and the seed file hack/mint-agent-credentials
// writes: it serves its node, and SIGTERM makes it exit cleanly.
func TestBinary(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH, so the agent binary cannot be built")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "agent")
	build := exec.Command(gobin, "build", "-o", bin, "github.com/virtfleet/virtfleet/agent") //nolint:gosec // fixed arguments
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	f := newFleet(t, 0, "bin1")
	seed := filepath.Join(dir, "bin1.nk")
	require.NoError(t, os.WriteFile(seed, f.ids["bin1"].Seed, 0o600))
	host := f.hosts["bin1"]
	metricsAddr := freeAddress(t)
	cmd := exec.Command(bin) //nolint:gosec // built above
	cmd.Env = append(os.Environ(),
		"VIRTFLEET_NODE=bin1",
		"VIRTFLEET_NATS_URL="+f.srv.URL(),
		"VIRTFLEET_NATS_CREDENTIALS="+seed,
		"VIRTFLEET_LIBVIRT_SOCKET="+host.Socket,
		"VIRTFLEET_LIBVIRT_URI="+host.URI,
		"VIRTFLEET_LIBVIRT_POOL="+testPool,
		"VIRTFLEET_METRICS_BIND_ADDRESS="+metricsAddr,
	)
	logs, err := os.Create(filepath.Join(dir, "agent.log"))
	require.NoError(t, err)
	defer logs.Close() //nolint:errcheck // test log
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	agentLog := func() string { b, _ := os.ReadFile(logs.Name()); return string(b) }

	in := vm("bin")
	f.put(t, "bin1", in)
	f.waitReport(t, "bin1", in.UID, "Running", running(1))
	// The agent's metrics are the process's: one node per process.
	served := assert.Eventually(t, func() bool {
		families, err := scrape(metricsAddr)
		return err == nil && gauge(families, "virtfleet_agent_guests", map[string]string{"phase": "Running"}) == 1
	}, waitFor, 50*time.Millisecond, "the agent serves its metrics where its variable says")
	if !served {
		t.Logf("the agent's log:\n%s", agentLog())
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "the agent must exit 0 on SIGTERM; its log:\n%s", agentLog())
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the agent did not exit within 10s of SIGTERM; its log:\n%s", agentLog())
	}
	require.NotContains(t, agentLog(), string(f.ids["bin1"].Seed), "the seed must never be logged")
}
