package e2e

import (
	"flag"
	"os"
	"testing"

	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// TestMain stops the real OpenStack that the nova tests start, once, after
// the last test, and removes the binaries the stacks shared.
func TestMain(m *testing.M) {
	flag.Parse()
	// Every test is parallel and waits for a stack slot (schedule_test.go):
	// -parallel, unless given, must not bound them first, at GOMAXPROCS.
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", "64")
	}
	code := openstack.Main(m)
	removeBinaries()
	os.Exit(code)
}
