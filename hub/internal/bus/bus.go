// Package bus is the hub's side of the wire: it writes the values the hub
// owns (intents, Fabrics) and keeps the hub informed of reports and node
// heartbeats, over NATS JetStream key-value buckets (NATS) or in memory
// (Fake).
//
// The Bus itself moves bytes under keys and knows no kind of value; Put and
// Delete write a kind's values through its declaration (wire.Kind), which
// gives them their keys and codec. A new kind of value needs no change here.
package bus

import (
	"context"
	"fmt"
	"io"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Bus is what the hub needs from the wire.
//
// Every write is idempotent: putting the value that is already stored
// changes nothing and returns its revision (agents would otherwise see a
// change that is not one), deleting an absent key succeeds. Writes are
// compare-and-set against the revision read just before, so a concurrent
// writer yields a *ConflictError (retry after re-reading) rather than a lost
// update. Any other error is transient and the caller retries.
//
// The Watch methods block until ctx is done, first delivering the current
// state of every key, then every change. They survive reconnects and server
// restarts and resume from the last revision seen, so a watcher may see a key
// again but never misses its latest state. A value its handler refuses is
// logged, counted (natswire.Rejections), and skipped: bad input never stops
// a watch.
type Bus interface {
	// Put makes value the stored value of key in bucket.
	Put(ctx context.Context, bucket, key string, value []byte) (revision uint64, err error)
	// Delete removes key from bucket.
	Delete(ctx context.Context, bucket, key string) error
	// DeleteAt removes key from bucket only if its revision is still
	// revision: what was read as stale is never confused with what was
	// written since. A key changed meanwhile yields a *ConflictError.
	DeleteAt(ctx context.Context, bucket, key string, revision uint64) error
	// List returns the keys bucket holds, each with its revision and
	// without its value.
	List(ctx context.Context, bucket string) ([]Entry, error)
	// Watch calls fn for every entry of bucket, and with a Synced entry
	// each time it has caught up with the bucket: once the entries present
	// when it began are delivered, and again whenever it resumes after the
	// connection to the server was lost. An error from fn rejects the
	// entry.
	Watch(ctx context.Context, bucket string, fn func(Entry) error) error
	// WatchNodes calls fn for every heartbeat and every node lost.
	WatchNodes(ctx context.Context, fn func(NodeEvent)) error
	// DropNode removes what the bus keeps for node beyond its keys (NATS:
	// its own reports stream, natswire.DropNodeReports), for a node
	// removed for good once its keys are deleted. A node heard from again
	// is taken afresh.
	DropNode(ctx context.Context, node string) error
	// OpenConsole opens a session to console open.Kind of guest open.UID
	// on node, through that node's agent, and returns its stream (see
	// natswire.DialConsole): reads yield the guest's output, writes reach
	// the guest, Close ends the session. An open without a session gets a
	// fresh one. ctx bounds the opening only. A node that refuses returns a
	// *natswire.ConsoleRefusedError; one that does not answer, an error
	// saying so.
	OpenConsole(ctx context.Context, node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error)
}

// Put makes v the stored value of kind k of uid on node. A node or uid that
// is not key-safe yields a *wire.KeyError, and a value whose identity is
// not uid's on node a *wire.MismatchError, before anything is sent.
func Put[V any](ctx context.Context, b Bus, k wire.Kind[V], node, uid string, v V) (revision uint64, err error) {
	key, err := k.Key(node, uid)
	if err != nil {
		return 0, err
	}
	if err := k.Check(key, node, uid, v); err != nil {
		return 0, err
	}
	value, err := k.Encode(v)
	if err != nil {
		return 0, errors.Wrapf(err, "cannot encode %s", k.Name)
	}
	return b.Put(ctx, k.Bucket, key, value)
}

// Delete removes the value of kind k of uid on node. Deleting an intent
// tells the node's agent to remove what it describes; the hub deletes a
// node's report only when the node may have missed that (it was down when
// the intent went). A node or uid that is not key-safe yields a
// *wire.KeyError before anything is sent.
func Delete[V any](ctx context.Context, b Bus, k wire.Kind[V], node, uid string) error {
	key, err := k.Key(node, uid)
	if err != nil {
		return err
	}
	return b.Delete(ctx, k.Bucket, key)
}

// Entry is the state of one key of a watched bucket.
type Entry struct {
	// Synced marks the watch catching up with its bucket; every other
	// field is then empty.
	Synced   bool
	Key      string
	Revision uint64
	// Deleted is true when the key was deleted or purged; Value is then
	// empty.
	Deleted bool
	Value   []byte
}

// NodeEvent is the state of one node's heartbeat key.
type NodeEvent struct {
	Node     string
	Revision uint64
	// Lost is true when the heartbeat expired or was removed.
	Lost      bool
	Heartbeat wire.NodeHeartbeat
}

// ConflictError means the key changed between read and write.
type ConflictError struct {
	Key string
	Err error
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("key %s was changed concurrently: %v", e.Key, e.Err)
}

func (e *ConflictError) Unwrap() error { return e.Err }
