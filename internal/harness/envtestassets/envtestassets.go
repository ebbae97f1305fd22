// Package envtestassets gives tests and `make run` the binaries of a real
// control plane: kube-apiserver, etcd and kubectl; and, for the tests that
// run a real node, the node binaries of the same release (NodeBinaries).
//
// There is no internet here and no prebuilt binary to download, so when
// KUBEBUILDER_ASSETS is not set the binaries are built from source fetched
// through the Go module proxy, once per machine, into a cache directory
// outside the repository. A build is slow; every later call returns at
// once.
//
// It and modbuild import only the standard library: on a fresh machine
// `make run` compiles hack/envtest-assets first, before anything else is
// in Go's build cache, and the errors package of crossplane-runtime alone
// would pull apimachinery, and hundreds of packages with it, into that
// compile.
package envtestassets

import (
	"context"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/virtfleet/virtfleet/internal/harness/modbuild"
)

// Versions of the control plane the tests run against. The Kubernetes staging
// modules are published as v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>.
const (
	KubernetesVersion = "v1.34.4"
	StagingVersion    = "v0.34.4"
	EtcdVersion       = "v3.6.5"
	// CoreDNSVersion is the cluster DNS the node tests run, as kubeadm
	// deploys one: the release of the proxy here nearest to the one
	// Kubernetes KubernetesVersion names.
	CoreDNSVersion = "v1.11.3"
)

// EnvAssets is the variable controller-runtime's envtest reads.
const EnvAssets = "KUBEBUILDER_ASSETS"

// EnvCacheDir overrides where built binaries are kept.
const EnvCacheDir = modbuild.EnvCacheDir

// Binaries are the files a complete asset directory holds.
var Binaries = []string{"kube-apiserver", "etcd", "kubectl"}

// stagingModules are the modules k8s.io/kubernetes replaces with its own
// ./staging directories; outside that repository each must be pinned to the
// published StagingVersion or the build does not resolve.
var stagingModules = []string{
	"api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime",
	"client-go", "cloud-provider", "cluster-bootstrap", "code-generator",
	"component-base", "component-helpers", "controller-manager", "cri-api",
	"cri-client", "csi-translation-lib", "dynamic-resource-allocation",
	"endpointslice", "externaljwt", "kms", "kube-aggregator",
	"kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl",
	"kubelet", "metrics", "mount-utils", "pod-security-admission",
	"sample-apiserver", "sample-cli-plugin", "sample-controller",
}

func targets() []modbuild.Target {
	replace := make([]string, 0, len(stagingModules))
	for _, m := range stagingModules {
		replace = append(replace, fmt.Sprintf("k8s.io/%s=k8s.io/%s@%s", m, m, StagingVersion))
	}
	return []modbuild.Target{
		{Binary: "kube-apiserver", Module: "k8s.io/kubernetes", Version: KubernetesVersion, Package: "k8s.io/kubernetes/cmd/kube-apiserver", Replace: replace},
		{Binary: "kubectl", Module: "k8s.io/kubernetes", Version: KubernetesVersion, Package: "k8s.io/kubernetes/cmd/kubectl", Replace: replace},
		{Binary: "etcd", Module: "go.etcd.io/etcd/server/v3", Version: EtcdVersion, Package: "go.etcd.io/etcd/server/v3"},
	}
}

// CacheDir is where Ensure keeps the binaries when KUBEBUILDER_ASSETS is unset.
func CacheDir() (string, error) {
	return modbuild.CacheDir("envtest", assetsName())
}

func assetsName() string {
	return "kubernetes-" + KubernetesVersion + "-etcd-" + EtcdVersion
}

// Ensure returns a directory holding kube-apiserver, etcd and kubectl.
// KUBEBUILDER_ASSETS wins when set. Otherwise the binaries are built into
// CacheDir the first time, with progress written to progress; concurrent
// callers (parallel test packages) wait for one build instead of racing.
func Ensure(ctx context.Context, progress io.Writer) (string, error) {
	if d := os.Getenv(EnvAssets); d != "" {
		if missing := missingBinaries(d); len(missing) > 0 {
			return "", fmt.Errorf("%s=%s lacks %v", EnvAssets, d, missing)
		}
		return d, nil
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	if len(missingBinaries(dir)) == 0 {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cannot create asset directory: %w", err)
	}
	unlock, err := modbuild.Lock(ctx, filepath.Join(dir, ".lock"), progress)
	if err != nil {
		return "", err
	}
	defer unlock()

	for _, t := range targets() {
		if _, err := os.Stat(filepath.Join(dir, t.Binary)); err == nil {
			continue
		}
		if err := modbuild.Build(ctx, dir, t, modbuild.Prefixed(progress, "envtest: ")); err != nil {
			return "", fmt.Errorf("cannot build %s %s: %w", t.Binary, t.Version, err)
		}
	}
	return dir, nil
}

func missingBinaries(dir string) []string {
	var missing []string
	for _, b := range Binaries {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
			missing = append(missing, b)
		}
	}
	return missing
}

// GarbageCollector is the file name of the garbage-collector command in
// CacheDir: Kubernetes' garbage collector alone (see garbagecollector/main.go).
// envtest runs no kube-controller-manager; a test that needs its garbage
// collector, as Crossplane does to delete composed resources, starts this
// command with --kubeconfig.
const GarbageCollector = "garbage-collector"

//go:embed garbagecollector/main.go
var garbageCollectorSource embed.FS

func garbageCollectorTarget() modbuild.Target {
	t := targets()[0]
	src, err := fs.Sub(garbageCollectorSource, "garbagecollector")
	if err != nil {
		panic(err) // the directory is embedded above
	}
	t.Binary, t.Package, t.Source = GarbageCollector, "", src
	return t
}

// EnsureGarbageCollector returns the path of the garbage-collector command
// of KubernetesVersion, building it into CacheDir the first time (it shares
// most of its packages with kube-apiserver, so a warm build cache spares
// most of the work).
func EnsureGarbageCollector(ctx context.Context, progress io.Writer) (string, error) {
	paths, err := ensureInCache(ctx, progress, garbageCollectorTarget())
	if err != nil {
		return "", err
	}
	return paths[0], nil
}

// NodeBinaries are the commands a cluster of real nodes needs besides
// Binaries: the kubelet, which runs a node's pods through a container
// runtime, kube-proxy, which makes its Services reachable, and the
// scheduler and controller manager, which place pods (those of a
// DaemonSet too) and make them from workloads.
var NodeBinaries = []string{"kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager"}

// coreDNSTarget builds CoreDNS, the cluster DNS of the node tests, which
// EnsureNode keeps beside the node binaries as "coredns": static, as it
// runs in an image of its own.
func coreDNSTarget() modbuild.Target {
	return modbuild.Target{Binary: "coredns", Module: "github.com/coredns/coredns", Version: CoreDNSVersion, Package: "github.com/coredns/coredns", Static: true}
}

// nodeTargets build the node binaries with their release's version
// stamped in, as Kubernetes' own release build does: the kubelet reports
// it in its Node's status, where an unstamped build says v0.0.0-master.
func nodeTargets() []modbuild.Target {
	api := targets()[0]
	major, minor, _ := strings.Cut(strings.TrimPrefix(KubernetesVersion, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	vars := []string{
		"k8s.io/component-base/version.gitVersion=" + KubernetesVersion,
		"k8s.io/component-base/version.gitMajor=" + major,
		"k8s.io/component-base/version.gitMinor=" + minor,
	}
	ts := make([]modbuild.Target, 0, len(NodeBinaries))
	for _, b := range NodeBinaries {
		t := api
		t.Binary, t.Package, t.Vars = b, "k8s.io/kubernetes/cmd/"+b, vars
		ts = append(ts, t)
	}
	return ts
}

// EnsureNode returns a directory holding the NodeBinaries of
// KubernetesVersion and coredns (CoreDNSVersion), building them into
// CacheDir the first time. They are not among Binaries: only the tests
// that start a node need them.
func EnsureNode(ctx context.Context, progress io.Writer) (string, error) {
	if _, err := ensureInCache(ctx, progress, append(nodeTargets(), coreDNSTarget())...); err != nil {
		return "", err
	}
	return CacheDir()
}

// ensureInCache builds into CacheDir whichever of ts is not there yet,
// under the cache's lock, and returns the paths of all of them.
func ensureInCache(ctx context.Context, progress io.Writer, ts ...modbuild.Target) ([]string, error) {
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	paths := make([]string, len(ts))
	var missing []modbuild.Target
	for i, t := range ts {
		paths[i] = filepath.Join(cache, t.Binary)
		if fi, err := os.Stat(paths[i]); err != nil || fi.IsDir() {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return paths, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create asset directory: %w", err)
	}
	unlock, err := modbuild.Lock(ctx, filepath.Join(cache, ".lock"), progress)
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, t := range missing {
		if _, err := os.Stat(filepath.Join(cache, t.Binary)); err == nil { // built while we waited for the lock
			continue
		}
		if err := modbuild.Build(ctx, cache, t, modbuild.Prefixed(progress, "envtest: ")); err != nil {
			return nil, fmt.Errorf("cannot build %s %s: %w", t.Binary, t.Version, err)
		}
	}
	return paths, nil
}
