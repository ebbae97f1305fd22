package kubenode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// StartSchedulingForTest runs, until t ends, what envtest's control plane
// lacks for workloads to reach nodes: kube-scheduler, which binds pods to
// nodes (a DaemonSet's too), and kube-controller-manager with the
// controllers named (daemonset, say), both as cp's admin on the machine's
// loopback. Neither serves anything (--secure-port=0) nor elects a leader;
// the parent-death signal ends them with a killed test.
func StartSchedulingForTest(t testing.TB, cp *controlplane.ControlPlane, controllers ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bin, err := envtestassets.EnsureNode(ctx, testWriter{t})
	if err != nil {
		t.Fatalf("cannot build the scheduler and controller manager: %v", err)
	}
	common := []string{"--kubeconfig=" + cp.Kubeconfig, "--leader-elect=false", "--secure-port=0"}
	kcm := append(append([]string{}, common...), "--controllers="+strings.Join(controllers, ","))
	if cp.InClusterCA != "" {
		// What root-ca-cert-publisher publishes as kube-root-ca.crt, the
		// CA a pod's service account volume gives it.
		kcm = append(kcm, "--root-ca-file="+cp.InClusterCA)
	}
	for name, args := range map[string][]string{
		"kube-scheduler":          common,
		"kube-controller-manager": kcm,
	} {
		startComponent(t, filepath.Join(bin, name), args)
	}
}

// startComponent runs binary with args, its output in a log under t's
// temporary directory, said if t failed, and stops it when t ends.
func startComponent(t testing.TB, binary string, args []string) {
	t.Helper()
	name := filepath.Base(binary)
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatalf("cannot create the log of %s: %v", name, err)
	}
	cmd := exec.Command(binary, args...) //nolint:gosec // the harness's own command line
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if t.Failed() {
			state := "running"
			select {
			case <-exited:
				state = cmd.ProcessState.String()
			default:
			}
			t.Log(fmt.Sprintf("%s (%s); the end of its log:\n%s", name, state, tail(log.Name())))
		}
		guesthost.StopGroup(cmd.Process.Pid, exited, 15*time.Second)
		_ = log.Close()
	})
}
