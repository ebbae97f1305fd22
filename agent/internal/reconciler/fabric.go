package reconciler

import (
	"context"
	"net/netip"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// fabric records the other nodes' tunnel addresses and queues them for the
// driver. A Fabric the codec accepted holds only addresses. The node has one
// Fabric, under wire.FabricUID; a key of another uid is none of the hub's.
func (r *Reconciler) fabric(ev bus.Event[wire.Fabric]) {
	if ev.UID != wire.FabricUID {
		return
	}
	var peers []netip.Addr
	if !ev.Deleted {
		for _, p := range ev.Value.Peers {
			if a, err := netip.ParseAddr(p); err == nil {
				peers = append(peers, a)
			}
		}
	}
	r.mu.Lock()
	r.peers = peers
	r.mu.Unlock()
	r.queue.Add(item{kind: kindFabric, uid: ev.UID})
}

// reconcileFabric hands the peers to a driver whose networks span nodes; a
// network made before the peers were known gets them now.
func (r *Reconciler) reconcileFabric(ctx context.Context, _ string) (time.Duration, error) {
	o, ok := r.driver.(driver.Overlay)
	if !ok {
		return 0, nil
	}
	r.mu.Lock()
	peers := r.peers
	r.mu.Unlock()
	return 0, errors.Wrap(r.call(OpSetPeers, func() error { return o.SetPeers(ctx, peers) }), "cannot set the overlay's peers")
}
