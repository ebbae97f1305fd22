package virtualmachine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
)

// TestGuestNode pins where a VM stripped of its binding is bound again:
// to the one node that reports its own guest; nowhere (placed as new) when
// none does or only an orphan of its name is reported; an error when its
// guests run on several nodes.
func TestGuestNode(t *testing.T) {
	cases := []struct {
		name string
		// reports are the nodes reporting the VM's uid; orphaned ones
		// report it as a released guest.
		reports, orphaned []string
		wantNode          string
		wantFound         bool
		wantErr           string
	}{
		{name: "NoGuestAnywhereIsPlacedAsNew"},
		{name: "ItsOneGuestBindsItThere", reports: []string{"node-b"}, wantNode: "node-b", wantFound: true},
		{name: "AnOrphanedGuestIsNoBinding", orphaned: []string{"node-a"}},
		{name: "GuestsOnSeveralNodesAreAnError", reports: []string{"node-a", "node-b"}, wantErr: "guests of the VM run on nodes node-a, node-b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := bus.NewFake()
			f := fleettest.Start(t, b)
			put := func(node string, orphan *wire.Orphan) {
				bus.SetValue(b, wire.GuestReports, node, testUID, wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: testUID, Node: node, Phase: wire.PhaseRunning, Orphan: orphan})
			}
			for _, n := range tc.reports {
				put(n, nil)
			}
			for _, n := range tc.orphaned {
				put(n, &wire.Orphan{Namespace: "tenant", Name: "vm"})
			}
			require.Eventually(t, func() bool { return len(f.Guests.All(testUID)) == len(tc.reports)+len(tc.orphaned) }, 5*time.Second, time.Millisecond)

			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "vm", UID: testUID}}
			node, found, err := guestNode(f, vm)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantFound, found)
			assert.Equal(t, tc.wantNode, node)
		})
	}
}
