package bus

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/nats-io/nats.go/jetstream"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// A node is lost when it has stored no heartbeat for the nodes bucket's
// TTL. The bucket drops such a heartbeat (its max age) but leaves no marker
// a watch would see: markers need roll-ups, which a node could send
// (natswire.KeyValueConfigs). So the hub asks the bucket. Once the last
// heartbeat it has of a node is a TTL old, it reads the node's key: no key,
// or the revision it already has, means the node stored nothing since, and
// it is lost. A newer revision is a heartbeat the watch has not delivered
// yet (a watch behind, or resuming after its consumer was lost): the node
// is alive, and its heartbeat counts as received then. A read that fails
// (the server away) decides nothing and is tried again.
//
// So only what the server holds makes a node lost, as with the markers
// before: a hub cut off from NATS, or whose watch lags, never takes a live
// node for lost. That matters, for a lost node's VMs are restarted
// elsewhere once its lease has run out since its last heartbeat.

// WatchNodes implements Bus. A node's first heartbeat gives it its own
// reports stream before the node is told of (natswire.EnsureNodeReports):
// nothing is placed on a node the hub has not heard from, so its reports
// are taken by the time it has any.
func (n *NATS) WatchNodes(ctx context.Context, fn func(NodeEvent)) error {
	kv := n.buckets[wire.BucketNodes]
	l := &liveness{n: n, ctx: ctx, kv: kv, ttl: cmp.Or(n.cfg.NodeTTL, natswire.DefaultNodeTTL), fn: fn, nodes: map[string]*heard{}}
	defer l.stop()
	return n.watch(ctx, kv, func(e jetstream.KeyValueEntry) error {
		if e == nil {
			return nil
		}
		ev, err := nodeEvent(e.Key(), e.Revision(), e.Operation() != jetstream.KeyValuePut, e.Value())
		if err != nil {
			return err
		}
		if !ev.Lost {
			n.recheckReporting(ctx)
			if err := n.ensureReporting(ctx, ev.Node); err != nil {
				n.log.Info("Cannot take the node's reports yet", "node", ev.Node, "error", err)
			}
		}
		l.pass(ev)
		return nil
	})
}

// liveness passes a watch's node events on, and a node's loss once the
// bucket holds nothing newer than its heartbeat a TTL old (see the top of
// this file).
type liveness struct {
	n   *NATS
	ctx context.Context
	kv  jetstream.KeyValue
	ttl time.Duration
	fn  func(NodeEvent)

	// mu serialises the calls of fn, from the watch and from the checks.
	mu    sync.Mutex
	nodes map[string]*heard
}

// heard is what was last passed on of one node.
type heard struct {
	revision uint64
	lost     bool
	// check runs once the heartbeat is a TTL old.
	check *time.Timer
}

// pass passes ev on and, for a heartbeat, has the node checked a TTL later.
func (l *liveness) pass(ev NodeEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.nodes[ev.Node]
	if !ok {
		h = &heard{}
		node := ev.Node
		h.check = time.AfterFunc(l.ttl, func() { l.check(node) })
		l.nodes[ev.Node] = h
	}
	h.revision, h.lost = ev.Revision, ev.Lost
	if ev.Lost {
		h.check.Stop()
	} else {
		h.check.Reset(l.ttl)
	}
	l.fn(ev)
}

// check reads node's heartbeat from the bucket, a TTL after the last one
// passed on, and passes on what it finds: the node's loss, or a newer
// heartbeat.
func (l *liveness) check(node string) {
	if l.ctx.Err() != nil {
		return
	}
	l.mu.Lock()
	h := l.nodes[node]
	revision := h.revision
	l.mu.Unlock()

	key, err := wire.NodeKey(node)
	if err != nil {
		return // the watch passes on only the keys of nodes
	}
	ctx, done := l.n.request(l.ctx)
	e, err := l.kv.Get(ctx, key)
	done()

	l.mu.Lock()
	defer l.mu.Unlock()
	if h.revision != revision || h.lost || l.ctx.Err() != nil {
		return // heard from meanwhile: its own check comes
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		l.n.log.Debug("Cannot read a node's heartbeat to see whether it is lost; trying again", "node", node, "error", err)
		h.check.Reset(l.n.retry)
		return
	case e.Revision() != revision:
		// Stored after the one passed on: the node is alive. A value the
		// watch refuses is counted when the watch delivers it.
		ev, err := nodeEvent(e.Key(), e.Revision(), false, e.Value())
		h.revision = e.Revision()
		h.check.Reset(l.ttl)
		if err == nil {
			l.fn(ev)
		}
		return
	}
	h.lost = true
	l.fn(NodeEvent{Node: node, Revision: revision, Lost: true})
}

// stop ends the checks.
func (l *liveness) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.nodes {
		h.check.Stop()
	}
}
