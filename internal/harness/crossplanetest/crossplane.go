// Package crossplanetest runs Crossplane's core against a test control plane
// (internal/harness/controlplane): as processes of the binary
// internal/harness/crossplanecore builds (Start): `crossplane core init`,
// then `core start` with the External package runtime (the package manager
// installs packages, their CRDs and revisions; someone else runs them), and
// `rbac start`; or, on a cluster with kubelets (internal/harness/kubenode),
// installed by its Helm chart with its default Deployment runtime
// (InstallInCluster). Packages come from an OCI registry in this process
// on 127.0.0.1.
//
// Under the External runtime the harness is the runtime: it runs the composition
// function as a process serving mTLS with a certificate from Crossplane's own
// CA and tells Crossplane where it listens (the FunctionRevision's
// status.endpoint, which the Deployment runtime would point at a Service),
// and it gives the provider the identity Crossplane's RBAC manager grants a
// provider: a ServiceAccount bound to the revision's system ClusterRole.
package crossplanetest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	pkgv1 "github.com/crossplane/crossplane/apis/v2/pkg/v1"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanecore"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
	"github.com/virtfleet/virtfleet/internal/harness/modbuild"
)

// Where Crossplane lives, as its Helm chart installs it.
const (
	Namespace      = "crossplane-system"
	ServiceAccount = "crossplane"
	caSecret       = "crossplane-root-ca"
	clientSecret   = "crossplane-tls-client"
)

// Options configure Start.
type Options struct {
	// Dir holds Crossplane's logs, package cache and certificates. Required.
	Dir string
	// Progress receives a line per step, and the first build's progress.
	Progress io.Writer
}

// Crossplane is a running Crossplane core with its registry.
type Crossplane struct {
	Registry *Registry
	// Client reaches the API server as a cluster admin and knows
	// Crossplane's package types.
	Client client.Client

	cp   *controlplane.ControlPlane
	core crossplanecore.Core
	dir  string
	prog io.Writer
	// runtime is the package runtime, External or Deployment.
	runtime string
	procs   []*process
	// ownsRegistry says Stop stops the registry: Start's own.
	ownsRegistry bool
	// unlock releases the RBAC manager's metrics port to other runs.
	unlock func()
}

// process is one of the processes the harness runs.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

// Start starts a registry and Crossplane's core and RBAC manager against cp.
func Start(ctx context.Context, cp *controlplane.ControlPlane, o Options) (*Crossplane, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	core, err := crossplanecore.Ensure(ctx, o.Progress)
	if err != nil {
		return nil, err
	}
	kube, err := packageClient(cp)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, "logs"), 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create Crossplane's log directory")
	}
	x := &Crossplane{Client: kube, cp: cp, core: core, dir: o.Dir, prog: o.Progress, runtime: "External", ownsRegistry: true}
	if err := x.start(ctx); err != nil {
		x.Stop()
		return nil, err
	}
	return x, nil
}

// packageClient reaches cp as a cluster admin and knows Crossplane's
// package types.
func packageClient(cp *controlplane.ControlPlane) (client.Client, error) {
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register Kubernetes types")
	}
	if err := pkgv1.AddToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register Crossplane's package types")
	}
	kube, err := client.New(cp.Config, client.Options{Scheme: scheme})
	return kube, errors.Wrap(err, "cannot create a client")
}

func (x *Crossplane) start(ctx context.Context) error {
	var err error
	if x.Registry, err = StartRegistry(); err != nil {
		return err
	}
	fmt.Fprintf(x.prog, "  %-14s %s\n", "registry", x.Registry.Host)
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		// The package fetcher reads this ServiceAccount's image pull secrets.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ServiceAccount}},
	} {
		if err := x.Client.Create(ctx, o); err != nil && !kerrors.IsAlreadyExists(err) {
			return errors.Wrapf(err, "cannot create %s", o.GetName())
		}
	}
	// init installs Crossplane's CRDs, its CA and client certificate, and
	// the default activation policy. Webhooks are off: nothing routes the API
	// server's calls to a webhook here, as no Service routes anything.
	// Flags whose kong-derived names are surprising (CRDsPath is
	// --cr-ds-path) are given by their environment variables.
	if err := x.run(ctx, "crossplane-init", []string{
		"CRDS_PATH=" + x.core.CRDs,
		"ENABLE_WEBHOOKS=false",
		"TLS_CA_SECRET_NAME=" + caSecret,
		"TLS_CLIENT_SECRET_NAME=" + clientSecret,
	}, "core", "init",
		// What the Helm chart activates by default: every managed
		// resource a provider package defines.
		"--activation=*",
	); err != nil {
		return err
	}
	certs := filepath.Join(x.dir, "tls", "client")
	if err := x.writeSecret(ctx, clientSecret, certs); err != nil {
		return err
	}
	// Crossplane deletes a composite's resources by leaving them to the
	// garbage collector (they are owned by the composite); envtest runs no
	// kube-controller-manager, so the harness runs Kubernetes' garbage
	// collector alone, wired as kube-controller-manager wires it.
	gcBinary, err := envtestassets.EnsureGarbageCollector(ctx, x.prog)
	if err != nil {
		return err
	}
	gc, err := startProcess(envtestassets.GarbageCollector, filepath.Join(x.dir, "logs", envtestassets.GarbageCollector+".log"), nil, gcBinary,
		"--kubeconfig="+x.cp.Kubeconfig)
	if err != nil {
		return err
	}
	x.procs = append(x.procs, gc)
	if err := x.holdRBACMetricsPort(ctx); err != nil {
		return err
	}
	if err := x.spawn("crossplane-rbac", nil, "rbac", "start"); err != nil {
		return err
	}
	// The package cache must exist, as the chart's emptyDir does: a
	// missing one fails every unpack with "read/write on closed pipe".
	cache := filepath.Join(x.dir, "xpkg-cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return errors.Wrap(err, "cannot create the package cache")
	}
	if err := x.spawn("crossplane", []string{
		"ENABLE_WEBHOOKS=false",
		"TLS_CLIENT_CERTS_DIR=" + certs,
		"XPKG_CACHE_DIR=" + cache,
	}, "core", "start",
		"--package-runtime="+x.runtime,
		"--metrics-port=0",
		"--health-probe-port=0",
		// Composites notice their composed resources' changes at once
		// (realtime compositions); this only bounds the worst case.
		"--poll-interval=15s",
	); err != nil {
		return err
	}
	fmt.Fprintf(x.prog, "  %-14s %s (%s package runtime), logs in %s\n", "crossplane", crossplanecore.Version, x.runtime, filepath.Join(x.dir, "logs"))
	return nil
}

// run runs crossplane with args to completion.
func (x *Crossplane) run(ctx context.Context, name string, env []string, args ...string) error {
	p, err := x.startProcess(name, env, args...)
	if err != nil {
		return err
	}
	select {
	case err := <-p.done:
		_ = p.log.Close()
		return errors.Wrapf(err, "crossplane %s failed; see %s", args[0]+" "+args[1], p.log.Name())
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		return ctx.Err()
	}
}

// spawn starts crossplane with args and keeps it running until Stop.
func (x *Crossplane) spawn(name string, env []string, args ...string) error {
	p, err := x.startProcess(name, env, args...)
	if err != nil {
		return err
	}
	x.procs = append(x.procs, p)
	return nil
}

func (x *Crossplane) startProcess(name string, env []string, args ...string) (*process, error) {
	env = append([]string{"KUBECONFIG=" + x.cp.Kubeconfig, "POD_NAMESPACE=" + Namespace, "POD_SERVICE_ACCOUNT=" + ServiceAccount}, env...)
	return startProcess(name, filepath.Join(x.dir, "logs", name+".log"), env, x.core.Binary, append(args, "--debug")...)
}

func startProcess(name, logPath string, env []string, binary string, args ...string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // our own log directory
	if err != nil {
		return nil, errors.Wrapf(err, "cannot open the log of %s", name)
	}
	cmd := exec.Command(binary, args...) //nolint:gosec // binaries this harness built
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Never outlive the test, even if the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, errors.Wrapf(err, "cannot start %s", name)
	}
	p := &process{name: name, cmd: cmd, done: make(chan error, 1), log: f}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// stop sends SIGTERM and waits up to 10 s before killing.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	_ = p.log.Close()
}

// Stop stops every process the harness started, then the registry Start
// started. Crossplane installed in a cluster has none: its pods go with
// the nodes, and the registry is the caller's.
func (x *Crossplane) Stop() {
	for i := len(x.procs) - 1; i >= 0; i-- {
		x.procs[i].stop()
	}
	x.procs = nil
	if x.unlock != nil {
		x.unlock()
		x.unlock = nil
	}
	if x.Registry != nil && x.ownsRegistry {
		x.Registry.Stop()
	}
}

// rbacMetricsAddress is where `crossplane rbac start` serves metrics.
// Crossplane v2.4.0 builds the RBAC manager's controller manager without
// metrics options and has no flag or environment variable for them
// (cmd/crossplane/rbac/rbac.go), so controller-runtime binds its default,
// :8080 on every interface, and a second RBAC manager on the machine exits
// with "address already in use".
const rbacMetricsAddress = ":8080"

// holdRBACMetricsPort takes a machine-wide lock for the RBAC manager's fixed
// metrics port, held until Stop, so concurrent runs (parallel test
// packages, make run CROSSPLANE=1) wait for each other instead of failing,
// and says what else holds the port if it is not free.
func (x *Crossplane) holdRBACMetricsPort(ctx context.Context) error {
	dir, err := crossplanecore.CacheDir()
	if err != nil {
		return err
	}
	unlock, err := modbuild.Lock(ctx, filepath.Join(dir, "rbac-metrics-port.lock"), x.prog)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", rbacMetricsAddress)
	if err != nil {
		unlock()
		return errors.Wrapf(err, "crossplane rbac start serves metrics on %s, which v2.4.0 has no flag to move, and something else on this machine listens there", rbacMetricsAddress)
	}
	_ = l.Close()
	x.unlock = unlock
	return nil
}

// writeSecret writes the TLS Secret name of Crossplane's namespace into dir
// as the files a mounted Secret would give: ca.crt, tls.crt and tls.key.
func (x *Crossplane) writeSecret(ctx context.Context, name, dir string) error {
	s := &corev1.Secret{}
	if err := x.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, s); err != nil {
		return errors.Wrapf(err, "cannot read Secret %s", name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.Wrap(err, "cannot create the certificate directory")
	}
	for _, k := range []string{"ca.crt", corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		if len(s.Data[k]) == 0 {
			return errors.Errorf("Secret %s has no %s", name, k)
		}
		if err := os.WriteFile(filepath.Join(dir, k), s.Data[k], 0o600); err != nil {
			return errors.Wrapf(err, "cannot write %s", k)
		}
	}
	return nil
}

// poll calls done every 250 ms until it says true, for at most timeout; the
// error names what was awaited and the last reason it was not yet so.
func poll(ctx context.Context, timeout time.Duration, what string, done func(ctx context.Context) (bool, string, error)) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, why, err := done(ctx)
		last = why
		return ok, err
	})
	if err != nil {
		return errors.Wrapf(err, "%s within %s (last: %s)", what, timeout, last)
	}
	return nil
}
