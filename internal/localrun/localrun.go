// Package localrun is `make run`: the whole system on one machine. It starts
// a local control plane (etcd + kube-apiserver), installs the CRDs, applies
// examples/ and prints what to paste to use it. Later issues add the embedded
// NATS server, the hub and three agents on private libvirtds.
package localrun

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/controlplane"
)

// Options configure a local run.
type Options struct {
	// Dir is the run directory: kubeconfig, logs and the lock live here.
	Dir string
	// Examples is the directory of manifests applied once the CRDs are in.
	Examples string
	// Out receives the summary a user reads.
	Out io.Writer
}

// ErrAlreadyRunning is returned when another run holds the run directory.
type ErrAlreadyRunning struct {
	PID   int
	Since string
}

func (e *ErrAlreadyRunning) Error() string {
	return fmt.Sprintf("virtfleet is already running from this directory (pid %d, since %s): use it, or stop it with Ctrl-C in its terminal (or kill %d)", e.PID, e.Since, e.PID)
}

// Running is a started local system.
type Running struct {
	ControlPlane *controlplane.ControlPlane
	// Applied counts the example objects applied.
	Applied int

	unlock func()
	logs   *os.File
}

// Start brings the system up and returns once it is ready to use.
func Start(ctx context.Context, o Options) (*Running, error) {
	if err := os.MkdirAll(filepath.Join(o.Dir, "logs"), 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create the run directory")
	}
	unlock, err := lockRunDir(o.Dir)
	if err != nil {
		return nil, err
	}
	logs, err := os.Create(filepath.Join(o.Dir, "logs", "control-plane.log"))
	if err != nil {
		unlock()
		return nil, errors.Wrap(err, "cannot create the control plane log")
	}
	r := &Running{unlock: unlock, logs: logs}

	r.ControlPlane, err = controlplane.Start(ctx, controlplane.Options{Dir: o.Dir, Progress: o.Out, Output: logs})
	if err != nil {
		r.Stop()
		return nil, err
	}
	objs, err := r.ControlPlane.Apply(ctx, o.Examples)
	if err != nil {
		r.Stop()
		return nil, errors.Wrap(err, "cannot apply the examples")
	}
	r.Applied = len(objs)
	return r, nil
}

// PrintSummary writes one line per component and what to paste to use it.
func (r *Running) PrintSummary(w io.Writer, o Options) {
	cp := r.ControlPlane
	fmt.Fprintf(w, "virtfleet is up (run directory %s)\n", o.Dir)
	fmt.Fprintf(w, "  control plane  kube-apiserver %s, etcd (log: %s)\n", cp.Config.Host, filepath.Join(o.Dir, "logs", "control-plane.log"))
	fmt.Fprintf(w, "  examples       %d objects applied from %s\n", r.Applied, o.Examples)
	fmt.Fprintf(w, "\nTo use it, paste:\n\n  export KUBECONFIG=%s\n  alias kubectl=%s\n  kubectl get vm -o wide\n\nCtrl-C stops everything.\n", cp.Kubeconfig, cp.Kubectl)
}

// Stop stops everything Start started and releases the run directory.
func (r *Running) Stop() {
	if r.ControlPlane != nil {
		_ = r.ControlPlane.Stop()
	}
	_ = r.logs.Close()
	r.unlock()
}

// lockRunDir takes an exclusive lock on the run directory, so a second
// `make run` says what is going on instead of failing on a busy port or a
// locked etcd. The lock dies with the process, so a crash never leaves a
// stale lock behind.
func lockRunDir(dir string) (func(), error) {
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, errors.Wrap(err, "cannot open the run lock")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer func() { _ = f.Close() }()
		holder, _ := os.ReadFile(path) //nolint:gosec // our own lock file
		pid, since := parseHolder(string(holder))
		return nil, &ErrAlreadyRunning{PID: pid, Since: since}
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("%d %s\n", os.Getpid(), time.Now().Format(time.RFC3339))), 0)
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

func parseHolder(s string) (int, string) {
	fields := strings.Fields(s)
	if len(fields) < 2 {
		return 0, "an unknown time"
	}
	pid, _ := strconv.Atoi(fields[0])
	return pid, fields[1]
}
