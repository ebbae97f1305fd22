// Package crossplanecore gives tests and `make run CROSSPLANE=1` Crossplane's
// core: the crossplane binary (`crossplane core start`, `crossplane rbac
// start`), the CRDs and webhook configurations `crossplane core init`
// installs, and, to install it on a cluster as a user does, its Helm chart
// and helm. All are built or copied once per machine from the Go module
// proxy into the cache directory (internal/harness/modbuild), as the
// control plane's binaries are.
package crossplanecore

import (
	"context"
	"debug/elf"
	"io"
	"os"
	"path"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/harness/modbuild"
)

// Version of Crossplane the tests run.
const Version = "v2.4.0"

// Module is Crossplane's Go module.
const Module = "github.com/crossplane/crossplane/v2"

// HelmVersion is the helm that installs Crossplane's chart: a release
// built with the Kubernetes libraries of the tests' API server.
const HelmVersion = "v3.19.5"

// Core is a built Crossplane.
type Core struct {
	// Binary is the crossplane command, static, so that it also runs in
	// an image with no C library (Image).
	Binary string
	// CRDs is the directory of Crossplane's own CRDs (its cluster/crds).
	CRDs string
	// WebhookConfigurations is its cluster/webhookconfigurations.
	WebhookConfigurations string
	// Chart is the directory of its Helm chart (cluster/charts/crossplane),
	// and Helm the helm command that installs it.
	Chart, Helm string
}

// CacheDir is where Ensure keeps Crossplane.
func CacheDir() (string, error) { return modbuild.CacheDir("crossplane", Version) }

// Ensure returns Crossplane's binary, CRDs, webhook configurations, chart
// and helm, building or copying them into CacheDir (helm into a cache
// directory of its own) the first time (a slow build), with progress
// written to progress; concurrent callers wait for one build.
func Ensure(ctx context.Context, progress io.Writer) (Core, error) {
	dir, err := CacheDir()
	if err != nil {
		return Core{}, err
	}
	helmDir, err := modbuild.CacheDir("helm", HelmVersion)
	if err != nil {
		return Core{}, err
	}
	c := Core{
		Binary: filepath.Join(dir, "crossplane"), CRDs: filepath.Join(dir, "crds"),
		WebhookConfigurations: filepath.Join(dir, "webhookconfigurations"), Chart: filepath.Join(dir, "chart"),
		Helm: filepath.Join(helmDir, "helm"),
	}
	if c.complete() {
		return c, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Core{}, errors.Wrap(err, "cannot create Crossplane's cache directory")
	}
	unlock, err := modbuild.Lock(ctx, filepath.Join(dir, ".lock"), progress)
	if err != nil {
		return Core{}, err
	}
	defer unlock()
	if c.complete() { // built while we waited for the lock
		return c, nil
	}
	for dst, src := range map[string]string{c.CRDs: "cluster/crds", c.WebhookConfigurations: "cluster/webhookconfigurations", c.Chart: "cluster/charts/crossplane"} {
		if err := copyFromModule(ctx, src, dst); err != nil {
			return Core{}, err
		}
	}
	if !isFile(c.Helm) {
		if err := os.MkdirAll(helmDir, 0o755); err != nil {
			return Core{}, errors.Wrap(err, "cannot create helm's cache directory")
		}
		t := modbuild.Target{Binary: "helm", Module: "helm.sh/helm/v3", Version: HelmVersion, Package: "helm.sh/helm/v3/cmd/helm", Static: true}
		if err := modbuild.Build(ctx, helmDir, t, modbuild.Prefixed(progress, "helm: ")); err != nil {
			return Core{}, errors.Wrapf(err, "cannot build helm %s", HelmVersion)
		}
	}
	if isStatic(c.Binary) {
		return c, nil
	}
	t := modbuild.Target{
		Binary: "crossplane", Module: Module, Version: Version, Package: Module + "/cmd/crossplane",
		// Crossplane's go.mod replaces its apis module with ./apis, which a
		// module download does not contain; the published apis of the same
		// release stand in for it. Without this the go command picks the
		// required v2.3.4, which lacks v2.4's runtime conditions (the build
		// fails with undefined: v1.RuntimeAwaitingActivation).
		Replace: []string{"github.com/crossplane/crossplane/apis/v2=github.com/crossplane/crossplane/apis/v2@" + Version},
		// A release stamps its version in; without it Crossplane refuses
		// every package that states a Crossplane version constraint
		// ("package is not compatible with Crossplane version ():
		// invalid semantic version") yet still calls it Installed.
		Vars:   []string{"github.com/crossplane/crossplane-runtime/v2/pkg/version.version=" + Version},
		Static: true,
	}
	if err := modbuild.Build(ctx, dir, t, modbuild.Prefixed(progress, "crossplane: ")); err != nil {
		return Core{}, errors.Wrapf(err, "cannot build crossplane %s", Version)
	}
	return c, nil
}

func (c Core) complete() bool {
	for _, d := range []string{c.CRDs, c.WebhookConfigurations, c.Chart} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return false
		}
	}
	return isFile(c.Helm) && isStatic(c.Binary)
}

// isFile says whether path is a regular file.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// isStatic says whether the executable at path needs no dynamic loader:
// caches of earlier builds hold a binary built with cgo, which is built
// again.
func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// copyFromModule copies the directory src of Crossplane's module into dst,
// unless dst exists, through a temporary directory renamed at the end, so
// a half copy is never taken for a whole one.
func copyFromModule(ctx context.Context, src, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	mod, err := modbuild.ModuleDir(ctx, Module, Version)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), filepath.Base(dst)+"-")
	if err != nil {
		return errors.Wrapf(err, "cannot create a directory for %s", src)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := os.CopyFS(tmp, os.DirFS(filepath.Join(mod, src))); err != nil {
		return errors.Wrapf(err, "cannot copy Crossplane's %s", src)
	}
	// The module cache is read-only; the copy need not be.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return errors.Wrapf(err, "cannot make the copy of %s readable", src)
	}
	return errors.Wrapf(os.Rename(tmp, dst), "cannot install Crossplane's %s", src)
}

// Image is Crossplane's image as its release builds it (nix/build.nix):
// the binary at /bin/crossplane as the entrypoint, the CRDs and webhook
// configurations `core init` reads from /crds and /webhookconfigurations,
// a world-writable /tmp, and the chart's user, 65532.
func Image(c Core, p ociimage.Platform, created time.Time) (v1.Image, error) {
	binary, err := os.ReadFile(c.Binary)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read crossplane")
	}
	img, err := ociimage.Build(ociimage.Spec{Name: "crossplane", Path: "/bin/crossplane", User: "65532"}, binary, p, created)
	if err != nil {
		return nil, err
	}
	files := []ociimage.File{{Name: "/tmp", Mode: 0o1777, Dir: true}}
	for dir, src := range map[string]string{"/crds": c.CRDs, "/webhookconfigurations": c.WebhookConfigurations} {
		files = append(files, ociimage.File{Name: dir, Mode: 0o755, Dir: true})
		entries, err := os.ReadDir(src)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read %s", src)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(src, e.Name())) //nolint:gosec // the cache's own copy
			if err != nil {
				return nil, errors.Wrapf(err, "cannot read %s", e.Name())
			}
			files = append(files, ociimage.File{Name: path.Join(dir, e.Name()), Mode: 0o644, Data: b})
		}
	}
	layer, err := ociimage.FilesLayer(files, created)
	if err != nil {
		return nil, err
	}
	img, err = mutate.AppendLayers(img, layer)
	return img, errors.Wrap(err, "cannot add the CRDs to Crossplane's image")
}
