package bus

import (
	"context"
	"reflect"
	"sync"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Fake is an in-memory Bus for unit tests of code above the bus. It keeps the
// Bus contract (idempotent writes, key validation, current state first on
// watch) and lets a test play the agents with SetReport and SetNode.
type Fake struct {
	mu       sync.Mutex
	rev      uint64
	intents  map[string]wire.Intent // by "<node>.<uid>"
	reports  []func(ReportEvent)
	nodes    []func(NodeEvent)
	reportKV map[string]ReportEvent
	nodeKV   map[string]NodeEvent
}

var _ Bus = &Fake{}

// NewFake returns an empty Fake.
func NewFake() *Fake {
	return &Fake{intents: map[string]wire.Intent{}, reportKV: map[string]ReportEvent{}, nodeKV: map[string]NodeEvent{}}
}

// Intent returns the stored intent of uid on node.
func (f *Fake) Intent(node, uid string) (wire.Intent, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.intents[node+"."+uid]
	return in, ok
}

// PutIntent implements Bus.
func (f *Fake) PutIntent(_ context.Context, node string, in wire.Intent) (uint64, error) {
	key, err := wire.IntentKey(node, in.UID)
	if err != nil {
		return 0, err
	}
	in.ProtocolVersion = wire.ProtocolVersion
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.intents[key]; ok && reflect.DeepEqual(cur, in) {
		return f.rev, nil
	}
	f.rev++
	f.intents[key] = in
	return f.rev, nil
}

// DeleteIntent implements Bus.
func (f *Fake) DeleteIntent(_ context.Context, node, uid string) error {
	key, err := wire.IntentKey(node, uid)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.intents, key)
	return nil
}

// SetReport plays node's agent writing (or, with deleted, removing) a report.
func (f *Fake) SetReport(ev ReportEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	ev.Revision = f.rev
	f.reportKV[ev.Node+"."+ev.UID] = ev
	for _, fn := range f.reports {
		fn(ev)
	}
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

// WatchReports implements Bus.
func (f *Fake) WatchReports(ctx context.Context, fn func(ReportEvent)) error {
	return fakeWatch(ctx, &f.mu, f.reportKV, &f.reports, fn)
}

// WatchNodes implements Bus.
func (f *Fake) WatchNodes(ctx context.Context, fn func(NodeEvent)) error {
	return fakeWatch(ctx, &f.mu, f.nodeKV, &f.nodes, fn)
}

// fakeWatch delivers the current state, registers fn for changes until ctx is
// done. Callbacks run under the lock, like a watch's single goroutine.
func fakeWatch[E any](ctx context.Context, mu *sync.Mutex, state map[string]E, watchers *[]func(E), fn func(E)) error {
	mu.Lock()
	for _, e := range state {
		fn(e)
	}
	*watchers = append(*watchers, fn)
	i := len(*watchers) - 1
	mu.Unlock()
	<-ctx.Done()
	mu.Lock()
	defer mu.Unlock()
	(*watchers)[i] = func(E) {}
	return nil
}
