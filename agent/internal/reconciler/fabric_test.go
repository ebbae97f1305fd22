package reconciler

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

func TestFabricReachesTheDriver(t *testing.T) {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	cases := []struct {
		name   string
		events []bus.Event[wire.Fabric]
		want   []netip.Addr
	}{
		{"PeersAreHandedOver", []bus.Event[wire.Fabric]{peers("192.0.2.1", "192.0.2.2")}, []netip.Addr{a, b}},
		{"TheLastFabricWins", []bus.Event[wire.Fabric]{peers("192.0.2.1", "192.0.2.2"), peers("192.0.2.2")}, []netip.Addr{b}},
		{"ADeletedFabricLeavesNoPeers", []bus.Event[wire.Fabric]{peers("192.0.2.1"), {UID: wire.FabricUID, Deleted: true}}, nil},
		{"AFabricOfAnotherUIDIsNone", []bus.Event[wire.Fabric]{peers("192.0.2.1"), {UID: "other", Value: wire.Fabric{Peers: []string{"192.0.2.2"}}}}, []netip.Addr{a}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t)
			h.fake.Tunnel = netip.MustParseAddr("192.0.2.9")
			require.NoError(t, h.fake.SetPeers(t.Context(), []netip.Addr{netip.MustParseAddr("198.51.100.1")}))
			for _, ev := range tc.events {
				h.rec.fabric(ev)
			}
			require.Eventually(t, func() bool {
				got := h.fake.Peers()
				return len(got) == len(tc.want) && (len(got) == 0 || got[len(got)-1] == tc.want[len(tc.want)-1])
			}, 5*time.Second, 5*time.Millisecond, "the driver's peers: %v", h.fake.Peers())
			require.Equal(t, tc.want, h.fake.Peers())
		})
	}
}

func peers(addrs ...string) bus.Event[wire.Fabric] {
	return bus.Event[wire.Fabric]{UID: wire.FabricUID, Value: wire.Fabric{Peers: addrs}}
}
