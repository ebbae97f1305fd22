package reconciler

import (
	"context"
	"net/netip"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
)

// fabricKey is the queue key of the node's Fabric. It has a dot, which no
// guest uid has, so it is never mistaken for one.
const fabricKey = "fabric.peers"

// handleFabric records the other nodes' tunnel addresses and queues them
// for the driver. A Fabric the codec accepted holds only addresses.
func (r *Reconciler) handleFabric(ev bus.FabricEvent) {
	var peers []netip.Addr
	if !ev.Deleted {
		for _, p := range ev.Fabric.Peers {
			if a, err := netip.ParseAddr(p); err == nil {
				peers = append(peers, a)
			}
		}
	}
	r.mu.Lock()
	r.peers = peers
	r.mu.Unlock()
	r.queue.Add(fabricKey)
}

// reconcileFabric hands the peers to a driver whose networks span nodes; a
// network made before the peers were known gets them now.
func (r *Reconciler) reconcileFabric(ctx context.Context) error {
	o, ok := r.driver.(driver.Overlay)
	if !ok {
		return nil
	}
	r.mu.Lock()
	peers := r.peers
	r.mu.Unlock()
	return errors.Wrap(r.call(OpSetPeers, func() error { return o.SetPeers(ctx, peers) }), "cannot set the overlay's peers")
}
