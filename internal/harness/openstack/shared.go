package openstack

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// The cloud of one test binary: started by the first test that asks,
// stopped by Main after the last test. Two test binaries (go test runs
// packages side by side: this package's and test/e2e) each start one;
// clouds share nothing but the machine (ports, directories, RabbitMQ
// nodes and hosts' names are each cloud's own), and two fit its memory
// easily, so neither waits for the other.
var shared struct {
	sync.Mutex
	cloud *Cloud
	err   error
}

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
	shared.cloud, shared.err = Start(ctx, Options{Progress: os.Stderr})
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
	return code
}
