// Package guestimage gives the real-guest tests and `make run GUESTS=qemu` a
// bootable Debian cloud image: bookworm with Debian's cloud kernel,
// cloud-init (NoCloud, or an OpenStack config drive), openssh-server,
// qemu-guest-agent and systemd-networkd DHCP, booted by extlinux from ext4.
// It is trimmed to boot fast where guests run under TCG, leaving out nothing
// a small cloud image is used for: an initramfs of the few drivers that
// find the root, the TSC as the clock, no kvm module loaded unasked, and
// cloud-init's config stage run within its final one (recipe.sh says why).
// There is no internet here to download a cloud image from, but Debian's apt
// mirror is reachable, so the image is built from Debian packages with
// mmdebstrap, once per machine and recipe, into a cache directory next to
// the envtest binaries. A build is slow; every later call returns at once.
//
// The image's default user is "debian" (cloud-init's default_user), which
// receives the VM's publicKey.
package guestimage

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/sys/unix"

	"github.com/virtfleet/virtfleet/internal/harness/modbuild"
)

// EnvCacheDir overrides where built artifacts are kept (shared with envtest).
const EnvCacheDir = modbuild.EnvCacheDir

// DefaultUser is the image's cloud-init default user: the one the VM's
// publicKey lets in.
const DefaultUser = "debian"

// FileName is the image's name inside its recipe directory.
const FileName = "debian-bookworm.qcow2"

// recipe is the whole build; its hash names the cache directory, so an edited
// recipe builds a new image and never reuses an old one.
//
//go:embed recipe.sh
var recipe []byte

// Tools are the host commands the recipe runs (hack/deps.sh installs them).
var Tools = []string{"mmdebstrap", "sfdisk", "losetup", "mkfs.ext4", "mount", "extlinux", "qemu-img", "dd"}

// RecipeHash names one version of the recipe.
func RecipeHash() string {
	s := sha256.Sum256(recipe)
	return hex.EncodeToString(s[:])[:16]
}

// Path is where the image of the current recipe is, built or not.
func Path() (string, error) {
	dir, err := modbuild.CacheDir("guest-image", RecipeHash())
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, FileName), nil
}

// Ensure returns the path of the image, building it first when it is not in
// the cache, with progress written to progress. Concurrent callers (parallel
// test packages, `make` steps) wait for one build instead of racing. The
// build needs root (mmdebstrap into a directory, a loop mount for extlinux).
func Ensure(ctx context.Context, progress io.Writer) (string, error) {
	path, err := Path()
	if err != nil {
		return "", err
	}
	if built(path) {
		return path, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", errors.Wrap(err, "cannot create image directory")
	}
	unlock, err := modbuild.Lock(ctx, filepath.Join(dir, ".lock"), progress)
	if err != nil {
		return "", err
	}
	defer unlock()
	if built(path) { // another caller built it while this one waited
		return path, nil
	}
	if err := removeRemains(dir, progress); err != nil {
		return "", err
	}
	if err := build(ctx, path, progress); err != nil {
		return "", errors.Wrap(err, "cannot build the guest image")
	}
	return path, nil
}

func built(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Size() > 0
}

// build runs the recipe in a scratch directory beside the image and renames
// the result into place, so an interrupted build never leaves an image later
// calls would take as complete.
func build(ctx context.Context, path string, progress io.Writer) error {
	for _, t := range Tools {
		if _, err := exec.LookPath(t); err != nil {
			return errors.Errorf("%s is not installed (run make deps)", t)
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("building the guest image needs root (mmdebstrap, loop mount)")
	}
	dir := filepath.Dir(path)
	work, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return errors.Wrap(err, "cannot create build directory")
	}
	defer func() { _ = removeBuild(work) }()
	script := filepath.Join(work, "recipe.sh")
	if err := os.WriteFile(script, recipe, 0o755); err != nil {
		return errors.Wrap(err, "cannot write recipe")
	}
	start := time.Now()
	fmt.Fprintf(progress, "guest-image: building %s from Debian packages (once per machine, about ten minutes)\n", path)
	tmp := filepath.Join(work, FileName)
	// nice: the build shares the machine with running tests.
	cmd := exec.CommandContext(ctx, "nice", "-n", "10", "bash", script, filepath.Join(work, "scratch"), tmp)
	cmd.Stdout, cmd.Stderr = progress, progress
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C.UTF-8")
	// A cancelled build must not leave a loop device or a mount behind:
	// interrupt the script so its cleanup trap runs.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	if err := cmd.Run(); err != nil {
		return errors.Wrap(err, "recipe failed")
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Wrap(err, "cannot install image")
	}
	fmt.Fprintf(progress, "guest-image: built %s in %s\n", path, time.Since(start).Round(time.Second))
	return nil
}

// removeRemains removes the build directories of builds that were killed
// (the caller holds the lock, so none is running).
func removeRemains(dir string, progress io.Writer) error {
	remains, err := filepath.Glob(filepath.Join(dir, "build-*"))
	if err != nil {
		return errors.Wrap(err, "cannot look for interrupted builds")
	}
	for _, r := range remains {
		fmt.Fprintf(progress, "guest-image: removing %s, left by an interrupted build\n", r)
		if err := removeBuild(r); err != nil {
			return err
		}
	}
	return nil
}

// removeBuild detaches every mount below a build directory, deepest first,
// then removes it. A recipe killed inside mmdebstrap leaves the chroot's
// /proc, /sys, /dev/pts and /dev/shm mounted; removing the directory without
// this would walk into them and fail, leaving it behind for good.
func removeBuild(work string) error {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return errors.Wrap(err, "cannot read mounts")
	}
	var points []string
	for _, line := range strings.Split(string(info), "\n") {
		// Field 5 is the mount point (proc(5)); a build's paths hold no
		// characters mountinfo escapes.
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], work+"/") {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return errors.Wrapf(err, "cannot unmount %s", p)
		}
	}
	return errors.Wrapf(os.RemoveAll(work), "cannot remove %s", work)
}

// Boot takes the machine-wide lock under which one guest at a time boots
// from the image, and returns its release. Under TCG a booting guest keeps
// a core busy, so two suites booting guests side by side on a 2-core
// machine (test/guest and test/e2e's real Nova guest, run in parallel by
// `make test`) starve each other's guests past their tests' patience. A
// guest that is up costs little, so the lock is held while a guest boots,
// not while a suite runs: the other suite boots between one's boots. A
// caller that has to wait says so on progress.
func Boot(ctx context.Context, progress io.Writer) (func(), error) {
	path, err := Path()
	if err != nil {
		return nil, err
	}
	// Beside every recipe's directory, so one lock serves them all.
	root := filepath.Dir(filepath.Dir(path))
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create the guest image directory")
	}
	return modbuild.Lock(ctx, filepath.Join(root, "boot.lock"), progress)
}

// HoldBoot is Boot for a test: it fails t when the lock cannot be taken,
// logs a wait, and returns the release, which is also t's cleanup and may
// be called early, once the guests t boots are up.
func HoldBoot(ctx context.Context, t testing.TB) func() {
	t.Helper()
	start := time.Now()
	release, err := Boot(ctx, os.Stderr)
	if err != nil {
		t.Fatalf("cannot take the machine's guest boot lock: %v", err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %s for the machine's guest boot lock", waited.Round(time.Second))
	}
	var once sync.Once
	r := func() { once.Do(release) }
	t.Cleanup(r)
	return r
}
