package e2e

import (
	"os"
	"testing"

	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// TestMain stops the real OpenStack that TestBackends/nova starts, once,
// after the last test.
func TestMain(m *testing.M) { os.Exit(openstack.Main(m)) }
