// Package crossplanecore gives tests and `make run CROSSPLANE=1` Crossplane's
// core: the crossplane binary (`crossplane core start`, `crossplane rbac
// start`) and the CRDs `crossplane core init` installs. Both are built or
// copied once per machine from the Go module proxy into the cache directory
// (internal/harness/modbuild), as the control plane's binaries are.
package crossplanecore

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/modbuild"
)

// Version of Crossplane the tests run.
const Version = "v2.4.0"

// Module is Crossplane's Go module.
const Module = "github.com/crossplane/crossplane/v2"

// Core is a built Crossplane.
type Core struct {
	// Binary is the crossplane command.
	Binary string
	// CRDs is the directory of Crossplane's own CRDs (its cluster/crds).
	CRDs string
}

// CacheDir is where Ensure keeps Crossplane.
func CacheDir() (string, error) { return modbuild.CacheDir("crossplane", Version) }

// Ensure returns Crossplane's binary and CRDs, building them into CacheDir
// the first time (a slow build), with progress written to progress;
// concurrent callers wait for one build.
func Ensure(ctx context.Context, progress io.Writer) (Core, error) {
	dir, err := CacheDir()
	if err != nil {
		return Core{}, err
	}
	c := Core{Binary: filepath.Join(dir, "crossplane"), CRDs: filepath.Join(dir, "crds")}
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
	if err := copyCRDs(ctx, c.CRDs); err != nil {
		return Core{}, err
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
		Vars: []string{"github.com/crossplane/crossplane-runtime/v2/pkg/version.version=" + Version},
	}
	if err := modbuild.Build(ctx, dir, t, modbuild.Prefixed(progress, "crossplane: ")); err != nil {
		return Core{}, errors.Wrapf(err, "cannot build crossplane %s", Version)
	}
	return c, nil
}

func (c Core) complete() bool {
	if fi, err := os.Stat(c.Binary); err != nil || fi.IsDir() {
		return false
	}
	fi, err := os.Stat(c.CRDs)
	return err == nil && fi.IsDir()
}

// copyCRDs copies cluster/crds of Crossplane's module into dir, through a
// temporary directory renamed at the end, so a half copy is never taken for
// a whole one.
func copyCRDs(ctx context.Context, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	src, err := modbuild.ModuleDir(ctx, Module, Version)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "crds-")
	if err != nil {
		return errors.Wrap(err, "cannot create a directory for the CRDs")
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := os.CopyFS(tmp, os.DirFS(filepath.Join(src, "cluster", "crds"))); err != nil {
		return errors.Wrap(err, "cannot copy Crossplane's CRDs")
	}
	// The module cache is read-only; the copy need not be.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return errors.Wrap(err, "cannot make the CRD directory readable")
	}
	return errors.Wrap(os.Rename(tmp, dir), "cannot install Crossplane's CRDs")
}
