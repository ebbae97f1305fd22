// Package localrun is `make run`: the whole system on one machine. It starts
// the stack (internal/harness/stack: control plane with the CRDs, embedded NATS with
// per-node credentials, the hub, and three agents each on its own private
// libvirtd), applies examples/ and prints what to paste to use it.
package localrun

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// Options configure a local run.
type Options struct {
	// Dir is the run directory: kubeconfig, logs and the lock live here.
	Dir string
	// Examples is the directory of manifests applied once the CRDs are in.
	Examples string
	// NATSPort is the embedded NATS server's port; the example
	// ClusterProviderConfig names 4222.
	NATSPort int
	// Keep reuses the run directory's etcd data and NATS store: what the
	// last run created is still there. By default a run starts fresh.
	Keep bool
	// Guests is "qemu" for one more node on a real hypervisor (QEMU in a
	// network namespace of its own) with one Debian guest; empty for the
	// simulated nodes alone.
	Guests string
	// Out receives the summary a user reads.
	Out io.Writer
	// Binaries is a directory holding the hub and agent binaries built
	// with this one; empty builds them when the system starts.
	Binaries string
	// Crossplane installs virtfleet into Crossplane's core (make run
	// CROSSPLANE=1) instead of applying its CRDs: the provider, function and
	// Configuration packages from a local registry, the hub as the
	// provider's runtime, and package/examples' requests beside examples/.
	Crossplane bool
}

// ErrAlreadyRunning is returned when another run holds the run directory.
type ErrAlreadyRunning struct {
	PID   int
	Since string
}

func (e *ErrAlreadyRunning) Error() string {
	return fmt.Sprintf("virtfleet is already running from this directory (pid %d, since %s): use it, or stop it with Ctrl-C in its terminal (or kill %d)", e.PID, e.Since, e.PID)
}

// crossplaneCore is Crossplane's core running beside the stack.
type crossplaneCore interface {
	Ready(ctx context.Context) error
	Stop()
}

// withCrossplane readies so for Crossplane's core and returns it; nil in a
// bin/local built without the crossplane tag (see crossplane.go). Crossplane
// core and the packages it installs bring a large dependency tree of their
// own (sigstore, cloud registries' credentials) into bin/local, which a
// fresh machine's plain `make run` would compile for nothing.
var withCrossplane func(ctx context.Context, so stack.Options) (stack.Options, crossplaneCore, error)

// Running is a started local system.
type Running struct {
	Stack *stack.Stack
	// Crossplane is Crossplane's core, when Options.Crossplane.
	Crossplane crossplaneCore
	// Applied counts the example objects applied.
	Applied int

	unlock func()
	guests *realGuests
}

// Start brings the system up and returns once it is ready to use.
func Start(ctx context.Context, o Options) (*Running, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create the run directory")
	}
	unlock, err := lockRunDir(o.Dir)
	if err != nil {
		return nil, err
	}
	stale := []string{"logs", "credentials", "kubeconfig"}
	if !o.Keep {
		stale = append(stale, "nats", "etcd")
	}
	for _, d := range stale {
		_ = os.RemoveAll(filepath.Join(o.Dir, d))
	}
	r := &Running{unlock: unlock}
	fmt.Fprintln(o.Out, "starting virtfleet:")
	so := stack.Options{Dir: o.Dir, NATSPort: o.NATSPort, Progress: o.Out, Binaries: o.Binaries, Subresources: true}
	examples := []string{o.Examples}
	switch o.Guests {
	case "":
	case GuestsQEMU:
		if r.guests, err = startRealGuestHost(ctx, o); err != nil {
			r.Stop()
			return nil, err
		}
		r.guests.stackOptions(&so)
	default:
		r.Stop()
		return nil, errors.Errorf("GUESTS=%s: only qemu is known", o.Guests)
	}
	if o.Crossplane {
		if withCrossplane == nil {
			r.Stop()
			return nil, errors.New("this bin/local was built without Crossplane: run make run CROSSPLANE=1")
		}
		if so, r.Crossplane, err = withCrossplane(ctx, so); err != nil {
			r.Stop()
			return nil, err
		}
		examples = append(examples, filepath.Join(filepath.Dir(o.Examples), "package", "examples"))
	}
	r.Stack, err = stack.Start(ctx, so)
	if err != nil {
		r.Stop()
		return nil, err
	}
	if r.guests != nil {
		if err := r.guests.createGuest(ctx, r.Stack.ControlPlane.Client, o.Dir); err != nil {
			r.Stop()
			return nil, err
		}
	}
	if r.Crossplane != nil {
		if err := r.Crossplane.Ready(ctx); err != nil {
			r.Stop()
			return nil, err
		}
	}
	// Under Crossplane the CRDs of managed resources and composites appear
	// a little after the packages are Healthy.
	var last error
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		applied, err := r.Stack.ApplyExamples(ctx, examples...)
		r.Applied, last = len(applied), err
		return err == nil, nil
	})
	if err != nil {
		r.Stop()
		return nil, errors.Wrap(errors.Join(err, last), "cannot apply the examples")
	}
	return r, nil
}

// PrintSummary writes what to paste to use the running system.
func (r *Running) PrintSummary(w io.Writer, o Options) {
	cp := r.Stack.ControlPlane
	fmt.Fprintf(w, "  %-14s %d objects applied from %s\n", "examples", r.Applied, o.Examples)
	fmt.Fprintf(w, "  %-14s hub %s\n", "metrics", r.Stack.HubMetricsURL())
	nodes := slices.Sorted(maps.Keys(r.Stack.Nodes))
	for _, n := range nodes {
		if u := r.Stack.AgentMetricsURL(n); u != "" {
			fmt.Fprintf(w, "  %-14s %s %s\n", "", n, u)
		}
	}
	fmt.Fprintf(w, "\nvirtfleet is up (run directory %s, logs in %s).\n", o.Dir, filepath.Join(o.Dir, "logs"))
	fmt.Fprintf(w, "To use it, paste:\n\n  export KUBECONFIG=%s\n  alias kubectl=%s\n  export PATH=%s:$PATH  # kubectl virtfleet\n  kubectl get vm -o wide\n", cp.Kubeconfig, cp.Kubectl, filepath.Dir(r.Stack.Plugin()))
	if r.guests != nil {
		r.guests.summary(w, "kubectl")
	}
	fmt.Fprintf(w, "\nCtrl-C stops everything.\n")
}

// Stop stops everything Start started and releases the run directory.
func (r *Running) Stop() {
	if r.Crossplane != nil {
		r.Crossplane.Stop()
	}
	if r.Stack != nil {
		r.Stack.Stop()
	}
	if r.guests != nil {
		r.guests.stop()
	}
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
