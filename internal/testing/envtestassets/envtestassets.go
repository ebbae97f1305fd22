// Package envtestassets gives tests and `make run` the binaries of a real
// control plane: kube-apiserver, etcd and kubectl.
//
// There is no internet here and no prebuilt binary to download, so when
// KUBEBUILDER_ASSETS is not set the binaries are built from source fetched
// through the Go module proxy, once per machine, into a cache directory
// outside the repository. A build takes about ten minutes on two cores; every
// later call returns at once.
package envtestassets

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Versions of the control plane the tests run against. The Kubernetes staging
// modules are published as v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>.
const (
	KubernetesVersion = "v1.34.4"
	StagingVersion    = "v0.34.4"
	EtcdVersion       = "v3.6.5"
)

// EnvAssets is the variable controller-runtime's envtest reads.
const EnvAssets = "KUBEBUILDER_ASSETS"

// EnvCacheDir overrides where built binaries are kept.
const EnvCacheDir = "VIRTFLEET_CACHE_DIR"

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

// target is one binary built from one module.
type target struct {
	binary  string // file name in the asset directory
	module  string // module to require
	version string
	pkg     string // main package to build
	replace []string
}

func targets() []target {
	replace := make([]string, 0, len(stagingModules))
	for _, m := range stagingModules {
		replace = append(replace, fmt.Sprintf("k8s.io/%s=k8s.io/%s@%s", m, m, StagingVersion))
	}
	return []target{
		{binary: "kube-apiserver", module: "k8s.io/kubernetes", version: KubernetesVersion, pkg: "k8s.io/kubernetes/cmd/kube-apiserver", replace: replace},
		{binary: "kubectl", module: "k8s.io/kubernetes", version: KubernetesVersion, pkg: "k8s.io/kubernetes/cmd/kubectl", replace: replace},
		{binary: "etcd", module: "go.etcd.io/etcd/server/v3", version: EtcdVersion, pkg: "go.etcd.io/etcd/server/v3"},
	}
}

// CacheDir is where Ensure keeps the binaries when KUBEBUILDER_ASSETS is unset.
func CacheDir() (string, error) {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return filepath.Join(d, "envtest", assetsName()), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", errors.Wrap(err, "cannot find a cache directory; set "+EnvCacheDir)
	}
	return filepath.Join(d, "virtfleet", "envtest", assetsName()), nil
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
			return "", errors.Errorf("%s=%s lacks %v", EnvAssets, d, missing)
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
		return "", errors.Wrap(err, "cannot create asset directory")
	}
	unlock, err := lock(filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()

	for _, t := range targets() {
		if _, err := os.Stat(filepath.Join(dir, t.binary)); err == nil {
			continue
		}
		if err := build(ctx, dir, t, progress); err != nil {
			return "", errors.Wrapf(err, "cannot build %s %s", t.binary, t.version)
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

func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, errors.Wrap(err, "cannot open build lock")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, errors.Wrap(err, "cannot take build lock")
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

// build makes a throw-away module that requires t.module, lets the go command
// resolve it through the module proxy, and builds t.pkg into dir. The binary is
// written under a temporary name and renamed, so an interrupted build never
// leaves a truncated binary that later calls would take as complete.
func build(ctx context.Context, dir string, t target, progress io.Writer) error {
	work, err := os.MkdirTemp(dir, "build-"+t.binary+"-")
	if err != nil {
		return errors.Wrap(err, "cannot create build directory")
	}
	defer func() { _ = os.RemoveAll(work) }()

	start := time.Now()
	fmt.Fprintf(progress, "envtest: building %s %s from the Go module proxy (once per machine, several minutes)\n", t.binary, t.version)

	steps := [][]string{{"mod", "init", "virtfleet.local/envtest-" + t.binary}}
	for _, r := range t.replace {
		steps = append(steps, []string{"mod", "edit", "-replace", r})
	}
	steps = append(steps,
		[]string{"get", t.pkg + "@" + t.version},
		[]string{"build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(work, t.binary), t.pkg},
	)
	for _, args := range steps {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return errors.Errorf("go %s: %v\n%s", args[0], err, out)
		}
	}
	if err := os.Rename(filepath.Join(work, t.binary), filepath.Join(dir, t.binary)); err != nil {
		return errors.Wrap(err, "cannot install binary")
	}
	fmt.Fprintf(progress, "envtest: built %s in %s\n", t.binary, time.Since(start).Round(time.Second))
	return nil
}
