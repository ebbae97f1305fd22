// Package controlplane starts a real Kubernetes control plane (etcd and
// kube-apiserver from internal/harness/envtestassets) with virtfleet's CRDs installed,
// or — for a simulated target cluster such as internal/harness/kubevirttest's — with
// the CRDs and types its Options name. Tests use it through StartForTest;
// `make run` through Start.
package controlplane

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// FieldOwner is the server-side apply field manager of objects applied here.
const FieldOwner = "virtfleet-local"

// etcdQuotaBytes is etcd's database quota, 8 GiB: etcd's own suggested
// maximum.
const etcdQuotaBytes int64 = 8 << 30

// ControlPlane is a running etcd + kube-apiserver with virtfleet's CRDs.
type ControlPlane struct {
	// Config reaches the API server as a cluster admin.
	Config *rest.Config
	// Client is a controller-runtime client with virtfleet's types registered.
	Client client.Client
	// Scheme has the Kubernetes types and those of Options.AddToScheme
	// (virtfleet's by default).
	Scheme *k8sruntime.Scheme
	// Kubeconfig is the path of a kubeconfig file for the admin user.
	Kubeconfig string
	// Kubectl is the path of a kubectl binary matching the API server.
	Kubectl string
	// InClusterCA is the file of the CA that signed the API server's
	// serving certificate with Options.InClusterAddress; empty without it.
	InClusterCA string

	env *envtest.Environment
	// egress is the API server's way into the cluster's network
	// (Options.ClusterEgress); nil without it.
	egress *egress
	// restartable is Options.Restartable: each process is given a second
	// to stop, then killed.
	restartable bool
}

// Options tune Start.
type Options struct {
	// Dir holds the kubeconfig. Required.
	Dir string
	// Progress receives messages while binaries are built for the first time.
	Progress io.Writer
	// Output, if set, receives the API server's and etcd's logs.
	Output io.Writer
	// EtcdDir, if set, is where etcd keeps its data, kept after Stop, so a
	// later Start sees the same objects. Empty means a temporary directory.
	EtcdDir string

	// CRDDirs hold the CRDs to install. When neither CRDDirs nor CRDs is set,
	// virtfleet's CRDs (CRDDir) are installed, unless NoCRDs.
	CRDDirs []string
	// CRDs are installed besides those in CRDDirs.
	CRDs []*apiextensionsv1.CustomResourceDefinition
	// NoCRDs starts the API server with no CRDs at all: what is installed
	// on the cluster brings its own (Crossplane and its packages).
	NoCRDs bool
	// AddToScheme registers the types Client knows besides Kubernetes' own;
	// nil means virtfleet's.
	AddToScheme func(*k8sruntime.Scheme) error
	// Restartable keeps the API server's serving certificates in Dir, so
	// StopAPIServer and StartAPIServer bring it back on the same address
	// with the same credentials, as a restarted real API server would be.
	Restartable bool
	// Aggregation lets the API server proxy to aggregated API servers
	// (APIServices backed by a Service), with a front-proxy CA of its own.
	Aggregation bool
	// InClusterAddress, if set, is where the cluster's pods reach the API
	// server: it advertises it as the endpoint of the kubernetes Service
	// (a kubenode's NodeIP, where every node forwards the API server's
	// port), so kube-proxy sends the Service's address (KubernetesService)
	// there, and its serving certificate names that Service's address and
	// names besides loopback, signed by a CA of its own
	// (ControlPlane.InClusterCA) that kube-controller-manager publishes to
	// every namespace as kube-root-ca.crt, as a cluster's does: a pod
	// reaches and verifies it as any in-cluster client does, from the
	// environment the kubelet gives it and its service account's volume.
	// The ServiceAccount admission is on with it, which gives pods their
	// tokens and refuses a pod whose account does not exist (the
	// serviceaccount controller makes each namespace's default).
	InClusterAddress string
	// ClusterEgress sends what the API server dials in the cluster (an
	// APIService's endpoints, kubelets) through a proxy of this process,
	// which reaches the networks routed to it with RouteCluster (a
	// kubenode's, whose pods the API server's machine has no route to) and
	// everything else from this machine: the egress selector's HTTP CONNECT
	// a konnectivity server answers on a cluster whose control plane is off
	// the pod network. With it the API server reaches an APIService through
	// its Service's endpoints, as no Service proxy runs here.
	ClusterEgress bool
}

// RepoRoot is the repository's root directory, found from this source file so
// tests in any package can locate package/crds.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// CRDDir is where `make generate` writes the CRDs.
func CRDDir() string {
	return filepath.Join(RepoRoot(), "package", "crds")
}

// Start starts etcd and kube-apiserver, installs the CRDs (virtfleet's from
// package/crds unless opts say otherwise) and writes a kubeconfig into
// opts.Dir.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	assets, err := envtestassets.Ensure(ctx, opts.Progress)
	if err != nil {
		return nil, err
	}
	if err := killOrphans(assets, opts.Progress); err != nil {
		return nil, err
	}
	scheme := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{clientgoscheme.AddToScheme, apiregistrationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, errors.Wrap(err, "cannot register Kubernetes types")
		}
	}
	addToScheme := opts.AddToScheme
	if addToScheme == nil {
		addToScheme = apis.AddToScheme
	}
	if err := addToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register the API types")
	}
	crdDirs := opts.CRDDirs
	if len(crdDirs) == 0 && len(opts.CRDs) == 0 && !opts.NoCRDs {
		crdDirs = []string{CRDDir()}
	}

	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        crdDirs,
		CRDs:                     opts.CRDs,
		ErrorIfCRDPathMissing:    true,
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
		// envtest waits 10 s by default for the CRDs to be served; an API
		// server among many starting at once on two cores can take longer.
		CRDInstallOptions: envtest.CRDInstallOptions{MaxTime: 90 * time.Second},
	}
	env.ControlPlane.APIServer = &envtest.APIServer{Out: opts.Output, Err: opts.Output}
	if opts.Restartable {
		// envtest keeps the address and the client CA across a restart of
		// the same APIServer, and regenerates the serving certificate only
		// when its directory lost it; a directory of our own keeps it.
		env.ControlPlane.APIServer.CertDir = filepath.Join(opts.Dir, "apiserver")
		if err := os.MkdirAll(env.ControlPlane.APIServer.CertDir, 0o700); err != nil {
			return nil, errors.Wrap(err, "cannot create the API server's certificate directory")
		}
		// A graceful stop waits for open watches (tens of seconds); an
		// outage does not. envtest applies this to every component.
		env.ControlPlaneStopTimeout = time.Second
	}
	if opts.Aggregation {
		if err := enableAggregation(env.ControlPlane.APIServer, filepath.Join(opts.Dir, "front-proxy")); err != nil {
			return nil, err
		}
	}
	var egress *egress
	if opts.ClusterEgress {
		if egress, err = startEgress(env.ControlPlane.APIServer, filepath.Join(opts.Dir, "egress")); err != nil {
			return nil, err
		}
	}
	var inClusterCA string
	if opts.InClusterAddress != "" {
		if inClusterCA, err = servePods(env.ControlPlane.APIServer, filepath.Join(opts.Dir, "apiserver"), opts.InClusterAddress); err != nil {
			return nil, err
		}
	}
	env.ControlPlane.Etcd = &envtest.Etcd{Out: opts.Output, Err: opts.Output, DataDir: opts.EtcdDir}
	// etcd refuses every write once its database passes its quota (2 GiB
	// by default): the benchmark's largest fleets come near it with their
	// history between compactions. A quota is a bound, not an allocation.
	env.ControlPlane.Etcd.Configure().Set("quota-backend-bytes", strconv.FormatInt(etcdQuotaBytes, 10))
	cfg, err := env.Start()
	if err != nil {
		// envtest leaves etcd and kube-apiserver running when it fails
		// after starting them (waiting for the CRDs, say).
		_ = env.Stop()
		return nil, errors.Wrap(err, "cannot start etcd and kube-apiserver")
	}
	cp := &ControlPlane{Config: cfg, Scheme: scheme, env: env, Kubectl: filepath.Join(assets, "kubectl"), InClusterCA: inClusterCA, egress: egress, restartable: opts.Restartable}

	admin, err := env.AddUser(envtest.User{Name: "virtfleet-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = cp.Stop()
		return nil, errors.Wrap(err, "cannot create the admin user")
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		_ = cp.Stop()
		return nil, errors.Wrap(err, "cannot render the admin kubeconfig")
	}
	cp.Kubeconfig = filepath.Join(opts.Dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kubeconfig, 0o600); err != nil {
		_ = cp.Stop()
		return nil, errors.Wrap(err, "cannot write kubeconfig")
	}
	if cp.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = cp.Stop()
		return nil, errors.Wrap(err, "cannot create a client")
	}
	return cp, nil
}

// UserClient is a client of a new user name in groups, authenticated by a
// client certificate: with no RoleBinding it may do nothing, so a test
// acting as a tenant grants it exactly what a tenant gets.
func (cp *ControlPlane) UserClient(name string, groups ...string) (client.Client, error) {
	u, err := cp.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot create user %s", name)
	}
	c, err := client.New(u.Config(), client.Options{Scheme: cp.Scheme})
	return c, errors.Wrapf(err, "cannot create a client for user %s", name)
}

// AwaitAllowed waits until the API server's authorizer lets user do each
// of what. A Role or binding takes effect once the authorizer's informers
// hold it, a moment after it is written and longer on a loaded machine,
// so a test that grants a user rights and then acts as that user asks
// here first: a refusal after that is the test's finding.
func (cp *ControlPlane) AwaitAllowed(ctx context.Context, user string, what ...authorizationv1.ResourceAttributes) error {
	for _, attrs := range what {
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
			if err := cp.Client.Create(ctx, review); err != nil {
				return false, err
			}
			return review.Status.Allowed, nil
		})
		if err != nil {
			return errors.Wrapf(err, "user %s may still not %s %s %s in namespace %q", user, attrs.Verb, attrs.Resource, attrs.Subresource, attrs.Namespace)
		}
	}
	return nil
}

// Stop stops kube-apiserver and etcd and removes their data.
func (cp *ControlPlane) Stop() error {
	err := cp.env.Stop()
	if cp.egress != nil {
		cp.egress.relay.Cut()
	}
	if err != nil && cp.restartable {
		// envtest kills a process that does not stop within the second a
		// restartable plane gives it and reports that as an error, which
		// a busy machine makes common; the plane is stopped once nothing
		// serves on its ports.
		etcd := cp.env.ControlPlane.Etcd.URL.Host
		if closed(cp.apiServerAddress(), 10*time.Second) && closed(etcd, 10*time.Second) {
			return nil
		}
	}
	return errors.Wrap(err, "cannot stop the control plane")
}

func (cp *ControlPlane) apiServerAddress() string {
	s := cp.env.ControlPlane.APIServer
	return net.JoinHostPort(s.SecureServing.Address, s.SecureServing.Port)
}

// closed reports whether nothing accepts connections on addr, waiting up
// to within for a stopping process to let go of it.
func closed(addr string, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		_ = c.Close()
	}
	return false
}

// RouteCluster makes the API server reach the addresses of prefixes
// through dial, until the returned function is called, when it was started
// with Options.ClusterEgress; without it the API server dials from this
// machine and RouteCluster does nothing. A prefix that overlaps one routed
// already is an error.
func (cp *ControlPlane) RouteCluster(dial Dialer, prefixes ...netip.Prefix) (func(), error) {
	if cp.egress == nil {
		return func() {}, nil
	}
	return cp.egress.route(dial, prefixes...)
}

// StopAPIServer stops kube-apiserver alone, as an outage would; etcd keeps
// the objects. Only a control plane started with Options.Restartable can be
// brought back with StartAPIServer.
func (cp *ControlPlane) StopAPIServer() error {
	s := cp.env.ControlPlane.APIServer
	// envtest kills it when it does not stop in time and reports that as an
	// error; what matters is that its port is closed.
	stopErr := s.Stop()
	if addr := cp.apiServerAddress(); !closed(addr, 10*time.Second) {
		return errors.Errorf("kube-apiserver still serves on %s after it was stopped (%v)", addr, stopErr)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the same
// address, with the same certificates and users.
func (cp *ControlPlane) StartAPIServer() error {
	return errors.Wrap(cp.env.ControlPlane.APIServer.Start(), "cannot start kube-apiserver")
}

// StartForTest starts a control plane for one test (or one package, when
// called from TestMain through a *testing.T of its own) and stops it at
// cleanup. It fails the test when the binaries or the control plane cannot be
// had: an integration test that silently did not run proves nothing.
func StartForTest(t testing.TB) *ControlPlane {
	t.Helper()
	return StartForTestWith(t, Options{})
}

// StartForTestWith is StartForTest with opts; Dir and Progress are the
// test's own unless set.
func StartForTestWith(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Progress == nil {
		opts.Progress = testWriter{t}
	}
	cp, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("cannot start the control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("cannot stop the control plane: %v", err)
		}
	})
	return cp
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// Apply server-side applies every object in the YAML files below dirs (in
// lexical path order), creating the namespaces they name first.
func (cp *ControlPlane) Apply(ctx context.Context, dirs ...string) ([]*unstructured.Unstructured, error) {
	objs, err := manifests.Load(dirs...)
	if err != nil {
		return nil, err
	}
	return objs, cp.ApplyObjects(ctx, objs)
}

// ApplyObjects server-side applies objs in order, creating the namespaces
// they name first.
func (cp *ControlPlane) ApplyObjects(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" {
			if err := cp.ensureNamespace(ctx, ns); err != nil {
				return err
			}
		}
		if err := cp.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return errors.Wrapf(err, "cannot apply %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		}
	}
	return nil
}

func (cp *ControlPlane) ensureNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cp.Client.Create(ctx, ns); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrapf(err, "cannot create namespace %s", name)
	}
	return nil
}

// InformersForTest returns an informer cache over cp, synced and running
// until the test ends, and the context that ends with the test.
func (cp *ControlPlane) InformersForTest(t testing.TB) (cache.Cache, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	informers, err := cache.New(cp.Config, cache.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatalf("cannot create the informer cache: %v", err)
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		t.Fatal("the informer cache did not sync")
	}
	return informers, ctx
}

// killOrphans kills the etcd and kube-apiserver of assets that killed runs
// left running. envtest starts them without tying them to its test
// binary's life, so a binary killed by go test's timeout (or by hand)
// leaves them holding memory and ports; re-parented to init, they are no
// live run's. Progress says what was killed.
func killOrphans(assets string, progress io.Writer) error {
	pids, err := procs.Orphans(assets)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		fmt.Fprintf(progress, "controlplane: killing %s (pid %d) that a killed run left behind\n", orphanName(pid), pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return errors.Wrapf(err, "cannot kill process %d that a killed run left behind", pid)
		}
	}
	return nil
}

// orphanName is the command name of process pid, for progress.
func orphanName(pid int) string {
	comm, err := procs.Command(pid)
	if err != nil {
		return "a process"
	}
	return comm
}

// The Service range envtest gives the API server, and the kubernetes
// Service's address in it (the range's first).
const (
	ServiceRange      = "10.0.0.0/24"
	KubernetesService = "10.0.0.1"
)

// servePods makes api advertise address to the cluster and serve a
// certificate pods verify (Options.InClusterAddress): it writes into dir,
// the API server's certificate directory, a serving certificate for
// loopback, address and the kubernetes Service's address and names,
// signed by a CA of its own, and returns that CA's file. envtest keeps a
// certificate it finds there and trusts the CA it is told of.
func servePods(api *envtest.APIServer, dir, address string) (caFile string, err error) {
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(KubernetesService), net.ParseIP(address)}
	if ips[2] == nil {
		return "", errors.Errorf("the in-cluster address %q is not an IP address", address)
	}
	names := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	chain, key, err := certutil.GenerateSelfSignedCertKey("kubernetes", ips, names)
	if err != nil {
		return "", errors.Wrap(err, "cannot make the API server's certificate")
	}
	// The chain is the certificate, then the CA that signed it.
	_, ca := pem.Decode(chain)
	// envtest makes the service accounts' signing key only with the
	// serving certificate it makes.
	signer, signerKey, err := certutil.GenerateSelfSignedCertKey("service-accounts", nil, nil)
	if err != nil {
		return "", errors.Wrap(err, "cannot make the service accounts' signing key")
	}
	signerCert, _ := pem.Decode(signer)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", errors.Wrap(err, "cannot create the API server's certificate directory")
	}
	caFile = filepath.Join(dir, "in-cluster-ca.crt")
	for file, b := range map[string][]byte{
		filepath.Join(dir, "apiserver.crt"): chain, filepath.Join(dir, "apiserver.key"): key, caFile: ca,
		filepath.Join(dir, "sa-signer.crt"): pem.EncodeToMemory(signerCert), filepath.Join(dir, "sa-signer.key"): signerKey,
	} {
		if err := os.WriteFile(file, b, 0o600); err != nil {
			return "", errors.Wrapf(err, "cannot write %s", file)
		}
	}
	api.CertDir = dir
	api.SecureServing.CA = ca
	// envtest turns the ServiceAccount admission off, as no controller
	// manager makes the namespaces' default accounts; without it no pod
	// is given its account's token.
	api.Configure().Set("advertise-address", address).Set("service-cluster-ip-range", ServiceRange).Disable("disable-admission-plugins")
	return caFile, nil
}
