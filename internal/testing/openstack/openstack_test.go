package openstack_test

import (
	"context"
	"os"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/testing/openstack"
)

func TestMain(m *testing.M) { os.Exit(openstack.Main(m)) }

// TestCloudStarts pins the harness's promise: every service answers its
// admin and the compute host is Nova's only hypervisor.
func TestCloudStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Debian's OpenStack services; skipped with -short")
	}
	c := openstack.ForTest(t)
	cl, err := c.Clients(context.Background())
	require.NoError(t, err)
	page, err := hypervisors.List(cl.Compute, nil).AllPages(context.Background())
	require.NoError(t, err)
	hs, err := hypervisors.ExtractHypervisors(page)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	require.Equal(t, c.ComputeHost, hs[0].Service.Host)
}
