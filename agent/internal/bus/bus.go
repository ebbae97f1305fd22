// Package bus is the agent's side of the wire: it watches this node's intents
// and writes this node's reports and heartbeat, over NATS JetStream (NATS) or
// in memory (Fake). It knows no kind of value: each is a wire.Kind, handled
// through On (intents) and PutReport and DeleteReport (reports).
package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Reports is where an agent writes what it observes: this node's keys of the
// reports bucket. PutReport and DeleteReport write a kind of report through
// it.
//
// Writes are idempotent and compare-and-set: writing the value that is
// already stored changes nothing and returns its revision; a value changed
// by someone else since this agent last read it yields a *ConflictError (the
// next write re-reads). A key that is not this node's yields a
// *wire.KeyError before anything is sent. Other errors are transient: retry.
type Reports interface {
	// Node is the node whose keys these are.
	Node() string
	// Put stores value, which is never empty (that reads as absent), under
	// key.
	Put(ctx context.Context, key string, value []byte) (revision uint64, err error)
	// Delete removes the value under key; deleting what is not there is
	// harmless.
	Delete(ctx context.Context, key string) error
	// Get is the value stored under key, nil when there is none: what
	// this agent or an earlier one of its node last wrote there. An agent
	// that starts afresh reads in it what was under way when the last one
	// stopped (a restore it finished, a snapshot that failed).
	Get(ctx context.Context, key string) ([]byte, error)
	// Keys are the keys of every value stored under this node's prefix,
	// of every kind: what an agent that starts afresh finds its node
	// reported before (a guest whose VM was deleted while the agent and
	// the guest were gone).
	Keys(ctx context.Context) ([]string, error)
}

// Bus is what an agent needs from the wire, scoped to one node.
//
// WatchIntents blocks until ctx is done. It first delivers every intent of
// this node, of every kind, then calls Synced (from then on an absent intent
// means "no such thing"), then delivers every change. Each intent goes to the
// handler of its kind. It survives reconnects and server restarts and resumes
// after the last revision seen, so an intent may be delivered again but its
// latest state is never missed; once a resumed watch has caught up it calls
// Synced again, so the agent looks at everything at once instead of when
// retries that backed off through the outage come due. An intent that cannot
// be decoded, has a newer protocol version, sits under a key that does not
// match it or is of a kind no handler takes is logged, counted
// (natswire.Rejections) and skipped: bad input never stops the watch.
type Bus interface {
	Reports
	WatchIntents(ctx context.Context, hs Handlers) error
	// ResumeIntents has a running WatchIntents resume after the last
	// revision it saw, as after a reconnect, and call Synced again once it
	// has caught up: that Synced shows the intents as they are after this
	// call. It returns at once.
	ResumeIntents()
	// PutHeartbeat stores h as this node's heartbeat. It must be repeated
	// well within the nodes bucket's TTL, or the hub declares the node lost.
	PutHeartbeat(ctx context.Context, h wire.NodeHeartbeat) error
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
// several intervals long so one miss does not lose the node. After each put
// that succeeded it calls stored, if set, with the time taken just before
// the put was issued, which is never later than when the server stored it.
func RunHeartbeat(ctx context.Context, b Bus, interval time.Duration, log logging.Logger, next func() wire.NodeHeartbeat, stored func(issued time.Time)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		h := next()
		issued := time.Now()
		switch err := b.PutHeartbeat(ctx, h); {
		case err != nil && ctx.Err() == nil:
			log.Info("Cannot put heartbeat", "error", err)
		case err == nil && stored != nil:
			stored(issued)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// BoundError means the node's reports are at their bound
// (natswire.EnsureNodeReports): a new key was refused, while the keys the
// node holds still take new values and deleting one frees its room once its
// marker expires (natswire.ReportDeletedTTL). It says the node reports on
// more guests, volumes and images than the fleet lets one node hold.
type BoundError struct {
	Node string
	Key  string
	Err  error
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("node %s holds as many reports as a node may; report %s was refused: %v", e.Node, e.Key, e.Err)
}

func (e *BoundError) Unwrap() error { return e.Err }
