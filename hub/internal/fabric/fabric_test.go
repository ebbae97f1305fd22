package fabric

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

type tunnels map[string]netip.Addr

func (t tunnels) Tunnels() map[string]netip.Addr { return t }

func addrs(s ...string) tunnels {
	t := tunnels{}
	for i, a := range s {
		t[string(rune('a'+i))] = netip.MustParseAddr(a)
	}
	return t
}

func TestPeers(t *testing.T) {
	cases := []struct {
		name    string
		tunnels tunnels
		node    string
		want    []string
	}{
		{"TheOthersSorted", addrs("192.0.2.3", "192.0.2.10", "192.0.2.2"), "a", []string{"192.0.2.2", "192.0.2.10"}},
		{"AloneHasNone", addrs("192.0.2.3"), "a", nil},
		{"NeverItsOwnAddressNorTwice", addrs("192.0.2.3", "192.0.2.3", "192.0.2.4", "192.0.2.4"), "a", []string{"192.0.2.4"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Peers(tc.tunnels, tc.node).Peers)
		})
	}
}

func TestSyncWritesOnlyChanges(t *testing.T) {
	ctx := context.Background()
	b := bus.NewFake()
	src := addrs("192.0.2.1", "192.0.2.2")
	w := New(src, b, logging.NewNopLogger())
	stored := func(node string) (wire.Fabric, bool) { return bus.Stored(b, wire.Fabrics, node, wire.FabricUID) }

	w.Sync(ctx)
	fa, ok := stored("a")
	require.True(t, ok)
	assert.Equal(t, []string{"192.0.2.2"}, fa.Peers)
	puts := b.Puts()
	w.Sync(ctx)
	assert.Equal(t, puts, b.Puts(), "nothing changed, nothing written")

	src["c"] = netip.MustParseAddr("192.0.2.3")
	w.Sync(ctx)
	fa, _ = stored("a")
	assert.Equal(t, []string{"192.0.2.2", "192.0.2.3"}, fa.Peers, "a node that joins is everyone's peer")

	delete(src, "b")
	b.SetDown(errors.New("nats is away"))
	w.Sync(ctx)
	b.SetDown(nil)
	fa, _ = stored("a")
	assert.Equal(t, []string{"192.0.2.2", "192.0.2.3"}, fa.Peers, "not written while the bus is down")
	w.Sync(ctx)
	fa, _ = stored("a")
	assert.Equal(t, []string{"192.0.2.3"}, fa.Peers, "a node that is lost drops out once the bus is back")
}
