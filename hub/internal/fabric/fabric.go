// Package fabric tells every node where the other nodes' overlay ends are.
// A node announces its tunnel address in its heartbeat; the hub writes each
// live node the addresses of the others (wire.Fabric), and the node floods
// its networks' broadcasts to them, as a VXLAN zone with a static peer list
// does. A node that is lost drops out of the others' peers; one that comes
// back is added again.
package fabric

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// DefaultEvery is how often the nodes' tunnel addresses are compared with
// what was written: a node's change reaches the others within about this.
const DefaultEvery = 2 * time.Second

// Source is what the writer reads of the fleet.
type Source interface {
	// Tunnels are the live nodes' tunnel addresses, by node.
	Tunnels() map[string]netip.Addr
}

// Writer writes the nodes' Fabrics.
type Writer struct {
	source Source
	bus    bus.Bus
	log    logging.Logger
	// written is the Fabric last written per node.
	written map[string]wire.Fabric
}

// New returns a Writer of the Fabrics of src's nodes to b.
func New(src Source, b bus.Bus, log logging.Logger) *Writer {
	return &Writer{source: src, bus: b, log: log, written: map[string]wire.Fabric{}}
}

// Run writes the Fabrics every interval until ctx is done.
func (w *Writer) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		w.Sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sync writes the Fabric of every live node with a tunnel address whose
// peers changed since they were last written. A failed write is tried again
// at the next Sync.
func (w *Writer) Sync(ctx context.Context) {
	tunnels := w.source.Tunnels()
	for _, node := range slices.Sorted(maps.Keys(tunnels)) {
		want := Peers(tunnels, node)
		if last, ok := w.written[node]; ok && slices.Equal(last.Peers, want.Peers) {
			continue
		}
		if _, err := bus.Put(ctx, w.bus, wire.Fabrics, node, wire.FabricUID, want); err != nil {
			w.log.Info("Cannot write the node's overlay peers; trying again", "node", node, "error", err)
			continue
		}
		w.written[node] = want
	}
}

// Peers is node's Fabric: the other nodes' tunnel addresses, sorted, each
// once (two nodes may share an address only by mistake, and a node never
// floods to its own).
func Peers(tunnels map[string]netip.Addr, node string) wire.Fabric {
	own := tunnels[node]
	var peers []netip.Addr
	for n, a := range tunnels {
		if n != node && a != own {
			peers = append(peers, a)
		}
	}
	slices.SortFunc(peers, netip.Addr.Compare)
	peers = slices.Compact(peers)
	f := wire.Fabric{ProtocolVersion: wire.ProtocolVersion}
	for _, a := range peers {
		f.Peers = append(f.Peers, a.String())
	}
	return f
}
