package kubevirt

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/virtfleet/virtfleet/internal/harness/kubevirttest"
)

// cluster is the simulated KubeVirt cluster this package's tests share: one
// API server start per test binary. Each test works in a namespace of its
// own.
var cluster *kubevirttest.Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "kubevirt-driver-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster, err = kubevirttest.Start(context.Background(), kubevirttest.Options{Dir: dir, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot start the KubeVirt test cluster:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "cannot stop the KubeVirt test cluster:", err)
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
