package virtualmachine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
)

// A node takes or restores snapshots only once its heartbeat says it
// keeps them; one not heard from yet, or lost, is waited for, never
// refused for good.
func TestKeepsSnapshots(t *testing.T) {
	cases := map[string]struct {
		heartbeat *wire.NodeHeartbeat
		lost      bool
		wantWhy   string
		wantFinal bool
	}{
		"ANodeThatKeepsThem":   {heartbeat: &wire.NodeHeartbeat{Backend: "libvirt", Snapshots: true}},
		"ANodeNotHeardFromYet": {wantWhy: "waiting for the first heartbeat of node node1"},
		"ALostNode": {
			heartbeat: &wire.NodeHeartbeat{Backend: "libvirt", Snapshots: true}, lost: true,
			wantWhy: "node node1 sends no heartbeat; waiting for it to be back",
		},
		"ANodeThatKeepsNone": {
			heartbeat: &wire.NodeHeartbeat{Backend: "kubevirt"},
			wantWhy:   "node node1 (backend kubevirt) keeps no snapshots", wantFinal: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			f := fleettest.Start(t, b)
			if tc.heartbeat != nil {
				b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: *tc.heartbeat})
				if tc.lost {
					b.SetNode(bus.NodeEvent{Node: testNode, Lost: true})
				}
				require.Eventually(t, func() bool { s, ok := f.Heard(testNode); return ok && s.Lost == tc.lost }, 5*time.Second, time.Millisecond)
			}

			why, final := KeepsSnapshots(f, testNode)

			assert.Equal(t, tc.wantWhy, why)
			assert.Equal(t, tc.wantFinal, final)
		})
	}
}
