package bus

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"maps"
	"slices"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Fake is an in-memory Bus for unit tests of code above the bus. It keeps the
// Bus contract (idempotent writes, current state first on watch, refused
// entries counted) and lets a test play the agents with SetValue,
// DeleteValue and SetNode, and read what the hub wrote with Stored.
type Fake struct {
	// Consoles plays the node's agent answering OpenConsole: it gets
	// the node and the open (with its session and protocol version set)
	// and returns the stream, or a *natswire.ConsoleRefusedError. Nil
	// refuses every console. Set it before the Fake is in use.
	Consoles func(node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error)

	mu  sync.Mutex
	rev uint64
	// puts counts the hub's writes, changing or not.
	puts int
	// kv holds every bucket's latest entry of each key, by bucket, then
	// key; a deleted key's is its deletion, which a new watch delivers as
	// a bucket's watch does.
	kv       map[string]map[string]Entry
	watchers map[string][]func(Entry) error
	rej      natswire.Rejections
	nodes    []func(NodeEvent)
	nodeKV   map[string]NodeEvent
	// dropped are the nodes DropNode was called for, in order.
	dropped []string
	// down, when set, is what every write returns: the server is away
	// (SetDown).
	down error
}

var _ Bus = &Fake{}

// NewFake returns an empty Fake.
func NewFake() *Fake {
	return &Fake{kv: map[string]map[string]Entry{}, watchers: map[string][]func(Entry) error{}, nodeKV: map[string]NodeEvent{}}
}

// Stored returns the value of kind k of uid on node that f holds, if any.
func Stored[V any](f *Fake, k wire.Kind[V], node, uid string) (V, bool) {
	var v V
	key, err := k.Key(node, uid)
	if err != nil {
		return v, false
	}
	f.mu.Lock()
	e, ok := f.kv[k.Bucket][key]
	f.mu.Unlock()
	if !ok || e.Deleted {
		return v, false
	}
	v, err = k.Decode(e.Value)
	return v, err == nil
}

// SetValue plays node's agent writing v as its value of kind k of uid: a
// new revision even when v says the same, as an agent's put is. It panics
// on a key or a value k refuses, a mistake of the test.
func SetValue[V any](f *Fake, k wire.Kind[V], node, uid string, v V) {
	key, err := k.Key(node, uid)
	if err != nil {
		panic(err)
	}
	value, err := k.Encode(v)
	if err != nil {
		panic(err)
	}
	f.Set(k.Bucket, key, value)
}

// DeleteValue plays node's agent deleting its value of kind k of uid:
// watchers see the deletion even of a value never written, as an agent's
// delete is. It panics on a key k refuses, a mistake of the test.
func DeleteValue[V any](f *Fake, k wire.Kind[V], node, uid string) {
	key, err := k.Key(node, uid)
	if err != nil {
		panic(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.write(k.Bucket, Entry{Key: key, Deleted: true})
}

// Set plays an agent writing value under key in bucket, whatever it holds.
func (f *Fake) Set(bucket, key string, value []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.write(bucket, Entry{Key: key, Value: value})
}

// write stores e at the next revision and tells the bucket's watchers.
// f.mu must be held.
func (f *Fake) write(bucket string, e Entry) {
	f.rev++
	e.Revision = f.rev
	if f.kv[bucket] == nil {
		f.kv[bucket] = map[string]Entry{}
	}
	f.kv[bucket][e.Key] = e
	for _, fn := range f.watchers[bucket] {
		f.deliver(fn, e)
	}
}

// deliver hands e to a watcher, counting it as refused if the watcher
// says so. f.mu must be held.
func (f *Fake) deliver(fn func(Entry) error, e Entry) {
	if err := fn(e); err != nil {
		f.rej.Add(err)
	}
}

// Rejections counts the entries f's watchers refused.
func (f *Fake) Rejections() *natswire.Rejections { return &f.rej }

// Puts counts the hub's writes so far, including those that changed
// nothing.
func (f *Fake) Puts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.puts
}

// SetDown plays the NATS server going away (err set: every write fails
// with it) and coming back (nil: the watches catch up again, as a watch
// resumed after a reconnect does, and say Synced).
func (f *Fake) SetDown(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = err
	if err != nil {
		return
	}
	for _, fns := range f.watchers {
		for _, fn := range fns {
			f.deliver(fn, Entry{Synced: true})
		}
	}
}

// Put implements Bus.
func (f *Fake) Put(_ context.Context, bucket, key string, value []byte) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down != nil {
		return 0, f.down
	}
	f.puts++
	if cur, ok := f.kv[bucket][key]; ok && !cur.Deleted && bytes.Equal(cur.Value, value) {
		return cur.Revision, nil
	}
	f.write(bucket, Entry{Key: key, Value: value})
	return f.rev, nil
}

// Delete implements Bus.
func (f *Fake) Delete(_ context.Context, bucket, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down != nil {
		return f.down
	}
	if cur, ok := f.kv[bucket][key]; ok && !cur.Deleted {
		f.write(bucket, Entry{Key: key, Deleted: true})
	}
	return nil
}

// DeleteAt implements Bus.
func (f *Fake) DeleteAt(_ context.Context, bucket, key string, revision uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down != nil {
		return f.down
	}
	cur, ok := f.kv[bucket][key]
	switch {
	case !ok || cur.Deleted:
		return nil
	case cur.Revision != revision:
		return &ConflictError{Key: key, Err: errors.Errorf("revision %d, not %d", cur.Revision, revision)}
	}
	f.write(bucket, Entry{Key: key, Deleted: true})
	return nil
}

// List implements Bus.
func (f *Fake) List(_ context.Context, bucket string) ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down != nil {
		return nil, f.down
	}
	var out []Entry
	for _, e := range f.kv[bucket] {
		if !e.Deleted {
			out = append(out, Entry{Key: e.Key, Revision: e.Revision})
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Revision, b.Revision) })
	return out, nil
}

// SetNode plays a heartbeat, or with ev.Lost its expiry.
func (f *Fake) SetNode(ev NodeEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	ev.Revision = f.rev
	f.nodeKV[ev.Node] = ev
	for _, fn := range f.nodes {
		fn(ev)
	}
}

// Watch implements Bus: it delivers the bucket's entries oldest first, as a
// bucket's watch does. Callbacks run under f.mu, like a watch's single
// goroutine.
func (f *Fake) Watch(ctx context.Context, bucket string, fn func(Entry) error) error {
	f.mu.Lock()
	current := slices.SortedFunc(maps.Values(f.kv[bucket]), func(a, b Entry) int { return cmp.Compare(a.Revision, b.Revision) })
	for _, e := range current {
		f.deliver(fn, e)
	}
	f.deliver(fn, Entry{Synced: true})
	f.watchers[bucket] = append(f.watchers[bucket], fn)
	i := len(f.watchers[bucket]) - 1
	f.mu.Unlock()
	f.until(ctx, func() { f.watchers[bucket][i] = func(Entry) error { return nil } })
	return nil
}

// WatchNodes implements Bus.
func (f *Fake) WatchNodes(ctx context.Context, fn func(NodeEvent)) error {
	f.mu.Lock()
	for _, e := range f.nodeKV {
		fn(e)
	}
	f.nodes = append(f.nodes, fn)
	i := len(f.nodes) - 1
	f.mu.Unlock()
	f.until(ctx, func() { f.nodes[i] = func(NodeEvent) {} })
	return nil
}

// DropNode implements Bus: it records node (Dropped).
func (f *Fake) DropNode(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down != nil {
		return f.down
	}
	f.dropped = append(f.dropped, node)
	return nil
}

// Dropped returns the nodes DropNode was called for, in order.
func (f *Fake) Dropped() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dropped)
}

// until waits for ctx to be done, then stops a watch under f.mu.
func (f *Fake) until(ctx context.Context, stop func()) {
	<-ctx.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	stop()
}

// OpenConsole implements Bus: it checks node and open as the NATS bus does,
// then asks Consoles.
func (f *Fake) OpenConsole(_ context.Context, node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error) {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down != nil {
		return nil, down
	}
	if open.Session == "" {
		open.Session = natswire.NewConsoleSession()
	}
	if _, err := wire.ConsoleOpenSubject(node); err != nil {
		return nil, err
	}
	if err := open.Validate(); err != nil {
		return nil, err
	}
	open.ProtocolVersion = wire.ProtocolVersion
	if f.Consoles == nil {
		return nil, errors.Errorf("node %s did not answer the console open: the fake bus has no Consoles", node)
	}
	return f.Consoles(node, open)
}
