package virtualnetwork

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
)

// TestStatusNamesTheFirstUsersAndCountsThemAll pins that a network's status
// stays small however many VMs attach to it: it names the first
// inuse.MaxNamed and counts them all.
func TestStatusNamesTheFirstUsersAndCountsThemAll(t *testing.T) {
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("vm-%04d", i)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		users     []string
		wantNamed []string
	}{
		{"none", nil, nil},
		{"a few, all named", names(3), names(3)},
		{"thousands, the first named", names(5000), names(inuse.MaxNamed)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &v1alpha1.VirtualNetwork{}
			_, err := Kind.Observe(context.Background(), nil, n, tc.users)
			require.NoError(t, err)
			assert.Equal(t, tc.wantNamed, n.Status.AtProvider.AttachedTo)
			assert.Equal(t, int32(len(tc.users)), n.Status.AtProvider.AttachedCount) //nolint:gosec // test sizes
			assert.Equal(t, v1alpha1.PhaseRunning, n.Status.AtProvider.Phase)
		})
	}
}
