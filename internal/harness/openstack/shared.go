package openstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// The cloud of one test binary: started by the first test that asks,
// stopped by Main after the last test. Two test binaries (go test runs
// packages side by side) would each start one, twice the memory of the
// machine's largest harness: a file lock makes the second wait for the
// first to stop.
var shared struct {
	sync.Mutex
	cloud *Cloud
	err   error
	lock  *os.File
}

// lockPath is machine-wide on purpose.
var lockPath = filepath.Join(os.TempDir(), "virtfleet-openstack.lock")

// Shared returns the test binary's cloud, starting it on the first call
// (progress on stderr). A start that failed fails every later call the
// same way, without trying again.
func Shared(ctx context.Context) (*Cloud, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.cloud != nil || shared.err != nil {
		return shared.cloud, shared.err
	}
	if missing := Missing(); len(missing) > 0 {
		shared.err = errors.Errorf("the Debian packages of the test OpenStack are not installed: %v; run `make deps` as root", missing)
		return nil, shared.err
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600) //nolint:gosec // a fixed lock file
	if err != nil {
		shared.err = errors.Wrap(err, "cannot open the test OpenStack's lock")
		return nil, shared.err
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		fmt.Fprintf(os.Stderr, "openstack: waiting for another test binary's cloud to stop (%s)\n", lockPath)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			_ = f.Close()
			shared.err = errors.Wrap(err, "cannot lock the test OpenStack")
			return nil, shared.err
		}
	}
	shared.lock = f
	shared.cloud, shared.err = Start(ctx, Options{Progress: os.Stderr})
	if shared.err != nil {
		_ = f.Close()
		shared.lock = nil
	}
	return shared.cloud, shared.err
}

// ForTest is Shared for a test: it fails the test, with the reason, when
// the cloud cannot start (the packages missing included: a test that needs
// the real services never passes without them).
func ForTest(t testing.TB) *Cloud {
	t.Helper()
	c, err := Shared(context.Background())
	if err != nil {
		t.Fatalf("the test OpenStack is unavailable: %v", err)
	}
	return c
}

// Main runs the tests and stops the shared cloud, if one started. Use it in
// TestMain: os.Exit(openstack.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.cloud != nil {
		shared.cloud.Stop()
		shared.cloud = nil
	}
	if shared.lock != nil {
		_ = shared.lock.Close()
		shared.lock = nil
	}
	return code
}
