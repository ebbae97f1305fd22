// Package bus is the agent's side of the wire: it watches this node's intents
// and writes this node's reports and heartbeat, over NATS JetStream (NATS) or
// in memory (Fake).
package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Bus is what an agent needs from the wire, scoped to one node.
//
// Writes are idempotent and compare-and-set: writing the report that is
// already stored changes nothing and returns its revision; a report changed
// by someone else since this agent last read it yields a *ConflictError (the
// next write re-reads). A uid that is not key-safe yields a *wire.KeyError
// before anything is sent. Other errors are transient: retry.
//
// WatchIntents blocks until ctx is done. It first delivers every intent of
// this node, then an event with Synced set (from then on an absent intent
// means "no such guest"), then every change. It survives reconnects and
// server restarts and resumes after the last revision seen, so an intent may
// be delivered again but its latest state is never missed; once a resumed
// watch has caught up it sends Synced again, so the agent looks at every
// guest at once instead of when retries that backed off through the outage
// come due. An intent that
// cannot be decoded, has a newer protocol version, or sits under a key that
// does not match it is logged, counted (natswire.Rejections) and skipped: bad
// input never stops the watch.
type Bus interface {
	WatchIntents(ctx context.Context, fn func(IntentEvent)) error
	// PutReport stores r as the report of guest r.UID on this node.
	PutReport(ctx context.Context, r wire.Report) (revision uint64, err error)
	// DeleteReport removes the report of guest uid, once the guest is gone.
	DeleteReport(ctx context.Context, uid string) error
	// PutVolumeReport stores r as the report of Volume r.UID on this node.
	PutVolumeReport(ctx context.Context, r wire.VolumeReport) (revision uint64, err error)
	// DeleteVolumeReport removes the report of Volume uid, once the hub has
	// deleted its intent.
	DeleteVolumeReport(ctx context.Context, uid string) error
	// PutImageReport stores r as the report of image r.UID on this node.
	PutImageReport(ctx context.Context, r wire.ImageReport) (revision uint64, err error)
	// DeleteImageReport removes the report of image uid, once the image is
	// gone from the node.
	DeleteImageReport(ctx context.Context, uid string) error
	// PutHeartbeat stores h as this node's heartbeat. It must be repeated
	// well within the nodes bucket's TTL, or the hub declares the node lost.
	PutHeartbeat(ctx context.Context, h wire.NodeHeartbeat) error
}

// IntentEvent is the state of one of this node's guest intents, of one of its
// Volume intents (Volume set), or the marker that the initial state has been
// delivered. Both kinds arrive on one watch of the node's keys, so that one
// Synced marker covers them.
type IntentEvent struct {
	// Synced marks the end of the initial state; no other field is set.
	Synced   bool
	UID      string
	Revision uint64
	// Deleted means the hub removed the intent: delete the guest.
	Deleted bool
	Intent  wire.Intent
	// Volume is set for a Volume's intent key ("<node>.volume.<uid>"); the
	// fields above are then empty.
	Volume *VolumeIntentEvent
	// Fabric is set for the node's Fabric key (wire.FabricKey); the fields
	// above are then empty.
	Fabric *FabricEvent
}

// FabricEvent is the state of the node's Fabric: the other nodes' tunnel
// addresses. Deleted means the hub knows no other node with one.
type FabricEvent struct {
	Revision uint64
	Deleted  bool
	Fabric   wire.Fabric
}

// VolumeIntentEvent is the state of one of this node's Volume intents.
type VolumeIntentEvent struct {
	UID      string
	Revision uint64
	// Deleted means the hub removed the intent, having seen the volume
	// gone: delete the Volume's report.
	Deleted bool
	Intent  wire.VolumeIntent
}

// ConflictError means a report changed since this agent last read it.
type ConflictError struct {
	Key string
	Err error
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("report %s was changed concurrently: %v", e.Key, e.Err)
}

func (e *ConflictError) Unwrap() error { return e.Err }

// RunHeartbeat puts the heartbeat built by next every interval until ctx is
// done. A failed put is logged and retried at the next tick: the TTL is
// several intervals long so one miss does not lose the node.
func RunHeartbeat(ctx context.Context, b Bus, interval time.Duration, log logging.Logger, next func() wire.NodeHeartbeat) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := b.PutHeartbeat(ctx, next()); err != nil && ctx.Err() == nil {
			log.Info("Cannot put heartbeat", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
