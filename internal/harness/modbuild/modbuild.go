// Package modbuild builds a command from a module fetched through the Go
// module proxy into a cache directory outside the repository, once per
// machine. There is no internet here and no prebuilt binary to download, so
// the control plane's binaries (internal/harness/envtestassets) and
// Crossplane's core (internal/harness/crossplanecore) are made this way.
package modbuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// EnvCacheDir overrides where built binaries are kept.
const EnvCacheDir = "VIRTFLEET_CACHE_DIR"

// CacheDir is $VIRTFLEET_CACHE_DIR/elem..., or the user's cache directory's
// virtfleet/elem... when the variable is unset.
func CacheDir(elem ...string) (string, error) {
	root := os.Getenv(EnvCacheDir)
	if root == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("cannot find a cache directory; set %s: %w", EnvCacheDir, err)
		}
		root = filepath.Join(d, "virtfleet")
	}
	return filepath.Join(append([]string{root}, elem...)...), nil
}

// Lock takes an exclusive flock on path, creating it, so that concurrent
// callers (parallel test packages, make run, make caches) wait for one build
// instead of racing. A caller that has to wait says so on progress, and stops
// waiting when ctx is done. The returned function releases the lock.
func Lock(ctx context.Context, path string, progress io.Writer) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644) //nolint:gosec // a lock file in our cache directory
	if err != nil {
		return nil, fmt.Errorf("cannot open build lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintf(progress, "waiting for %s, which another build or run holds\n", path)
		done := make(chan error, 1)
		go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
		select {
		case err = <-done:
		case <-ctx.Done():
			_ = f.Close() // the waiting flock returns once the file is closed
			return nil, ctx.Err()
		}
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("cannot take build lock: %w", err)
		}
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

// Target is one binary built from one module.
type Target struct {
	Binary  string   // file name in the output directory
	Module  string   // module to require
	Version string   // its exact version (the proxy here often lacks @latest)
	Package string   // main package to build, unless Source is set
	Replace []string // go mod edit -replace arguments, old=new@version
	// Source, when set, holds the Go files of a main package of this
	// repository that is built against Module instead of a package of it.
	// They are built by name, so a build constraint that keeps them out of
	// this repository's own module (whose dependencies differ) does not
	// apply.
	Source fs.FS
	// Vars are -X linker settings, package.variable=value, such as the
	// version a release build stamps in.
	Vars []string
	// Static builds without cgo, for a binary that runs in an image with
	// no C library.
	Static bool
}

// Build makes a throw-away module under dir that requires t.Module, lets the
// go command resolve it through the module proxy, and builds t.Package into
// dir/t.Binary. The binary is written under a temporary name and renamed, so
// an interrupted build never leaves a truncated binary that later calls would
// take as complete. Progress names the build and its duration.
//
// The caller holds the lock of dir (Lock), so a build directory of the same
// binary left in dir is one a killed build left behind: it is removed.
func Build(ctx context.Context, dir string, t Target, progress io.Writer) error {
	stale, _ := filepath.Glob(filepath.Join(dir, "build-"+t.Binary+"-*")) // the pattern is valid
	for _, s := range stale {
		_ = os.RemoveAll(s)
	}
	work, err := os.MkdirTemp(dir, "build-"+t.Binary+"-")
	if err != nil {
		return fmt.Errorf("cannot create build directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()

	start := time.Now()
	fmt.Fprintf(progress, "building %s %s from the Go module proxy (once per machine, several minutes)\n", t.Binary, t.Version)

	get, build := t.Package+"@"+t.Version, []string{t.Package}
	if t.Source != nil {
		if build, err = copySource(t.Source, work); err != nil {
			return err
		}
		get = t.Module + "@" + t.Version
	}
	steps := [][]string{{"mod", "init", "virtfleet.local/build-" + t.Binary}}
	for _, r := range t.Replace {
		steps = append(steps, []string{"mod", "edit", "-replace", r})
	}
	steps = append(steps,
		[]string{"get", get},
		append([]string{"build", "-ldflags=" + ldflags(t.Vars), "-o", filepath.Join(work, t.Binary)}, build...),
	)
	var env []string
	if t.Static {
		env = append(env, "CGO_ENABLED=0")
	}
	for _, args := range steps {
		if _, err := goCommand(ctx, work, env, args...); err != nil {
			return err
		}
	}
	if err := os.Rename(filepath.Join(work, t.Binary), filepath.Join(dir, t.Binary)); err != nil {
		return fmt.Errorf("cannot install binary: %w", err)
	}
	fmt.Fprintf(progress, "built %s in %s\n", t.Binary, time.Since(start).Round(time.Second))
	return nil
}

// copySource copies the files of src into dir and returns the names of its
// Go files.
func copySource(src fs.FS, dir string) ([]string, error) {
	if err := os.CopyFS(dir, src); err != nil {
		return nil, fmt.Errorf("cannot copy the main package's source: %w", err)
	}
	files, err := fs.Glob(src, "*.go")
	if err != nil {
		return nil, fmt.Errorf("cannot list the main package's source: %w", err)
	}
	if len(files) == 0 {
		return nil, errors.New("the main package has no Go files")
	}
	return files, nil
}

func ldflags(vars []string) string {
	f := "-s -w"
	for _, v := range vars {
		f += " -X " + v
	}
	return f
}

// ModuleDir downloads module@version through the module proxy (checked
// against the checksum database) and returns its directory in the module
// cache, for files a build needs besides the binary, such as CRDs.
func ModuleDir(ctx context.Context, module, version string) (string, error) {
	work, err := os.MkdirTemp("", "virtfleet-moddownload-")
	if err != nil {
		return "", fmt.Errorf("cannot create a scratch directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	out, err := goCommand(ctx, work, nil, "mod", "download", "-json", module+"@"+version)
	if err != nil {
		return "", err
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("cannot parse go mod download's answer: %w", err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("cannot download %s@%s: %s", module, version, m.Error)
	}
	return m.Dir, nil
}

// goCommand runs go with args in dir, outside any module or workspace of
// the caller, with env added to the environment, and returns its standard
// output. Without env it builds as the caller's own go commands do (cgo as
// the machine allows, paths not trimmed): on a fresh machine the standard
// library, which these builds share with virtfleet's own, then compiles
// once, not once per configuration.
func goCommand(ctx context.Context, dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off"), env...)
	// A test that times out is killed, not cancelled: without this its
	// build ran on, orphaned, competing for the cores with the next
	// caller's build of the same binary, and its result was never used.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr []byte
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // exec returns it unwrapped
		stderr = ee.Stderr
	}
	if err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s%s", args[0], err, out, stderr)
	}
	return out, nil
}

// Prefixed returns a writer that writes each progress line to w with prefix
// before it, so the user sees which build speaks.
func Prefixed(w io.Writer, prefix string) io.Writer { return prefixed{w, prefix} }

type prefixed struct {
	w      io.Writer
	prefix string
}

func (p prefixed) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, p.prefix+string(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}
