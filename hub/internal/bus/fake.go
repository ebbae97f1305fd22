package bus

import (
	"context"
	"io"
	"reflect"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Fake is an in-memory Bus for unit tests of code above the bus. It keeps the
// Bus contract (idempotent writes, key validation, current state first on
// watch) and lets a test play the agents with SetReport and SetNode.
type Fake struct {
	// Consoles plays the node's agent answering OpenConsole: it gets
	// the node and the open (with its session and protocol version set)
	// and returns the stream, or a *natswire.ConsoleRefusedError. Nil
	// refuses every console. Set it before the Fake is in use.
	Consoles func(node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error)

	mu       sync.Mutex
	rev      uint64
	intents  map[string]wire.Intent       // by "<node>.<uid>"
	volumes  map[string]wire.VolumeIntent // by "<node>.volume.<uid>"
	fabrics  map[string]wire.Fabric       // by FabricKey
	reports  []func(ReportEvent)
	nodes    []func(NodeEvent)
	reportKV map[string]ReportEvent
	nodeKV   map[string]NodeEvent
	// down, when set, is what every intent write returns: the server is
	// away (SetDown).
	down error
}

var _ Bus = &Fake{}

// NewFake returns an empty Fake.
func NewFake() *Fake {
	return &Fake{intents: map[string]wire.Intent{}, volumes: map[string]wire.VolumeIntent{}, fabrics: map[string]wire.Fabric{}, reportKV: map[string]ReportEvent{}, nodeKV: map[string]NodeEvent{}}
}

// Intent returns the stored intent of uid on node.
func (f *Fake) Intent(node, uid string) (wire.Intent, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.intents[node+"."+uid]
	return in, ok
}

// VolumeIntent returns the stored intent of Volume uid on node.
func (f *Fake) VolumeIntent(node, uid string) (wire.VolumeIntent, bool) {
	key, _ := wire.VolumeIntentKey(node, uid)
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.volumes[key]
	return v, ok
}

// SetDown plays the NATS server going away (err set: every intent write
// fails with it) and coming back (nil: the report watches catch up again,
// as a watch resumed after a reconnect does, and say Synced).
func (f *Fake) SetDown(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = err
	if err != nil {
		return
	}
	for _, fn := range f.reports {
		fn(ReportEvent{Synced: true})
	}
}

func (f *Fake) isDown() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

// PutIntent implements Bus.
func (f *Fake) PutIntent(_ context.Context, node string, in wire.Intent) (uint64, error) {
	if err := f.isDown(); err != nil {
		return 0, err
	}
	key, err := wire.IntentKey(node, in.UID)
	if err != nil {
		return 0, err
	}
	if err := in.Validate(); err != nil {
		return 0, err
	}
	in.ProtocolVersion = wire.ProtocolVersion
	return fakePut(f, f.intents, key, in)
}

// PutVolumeIntent implements Bus.
func (f *Fake) PutVolumeIntent(_ context.Context, node string, v wire.VolumeIntent) (uint64, error) {
	key, err := wire.VolumeIntentKey(node, v.UID)
	if err != nil {
		return 0, err
	}
	if err := v.Validate(); err != nil {
		return 0, err
	}
	v.ProtocolVersion = wire.ProtocolVersion
	return fakePut(f, f.volumes, key, v)
}

// PutFabric implements Bus.
func (f *Fake) PutFabric(_ context.Context, node string, fab wire.Fabric) (uint64, error) {
	if err := f.isDown(); err != nil {
		return 0, err
	}
	key, err := wire.FabricKey(node)
	if err != nil {
		return 0, err
	}
	if err := fab.Validate(); err != nil {
		return 0, err
	}
	fab.ProtocolVersion = wire.ProtocolVersion
	return fakePut(f, f.fabrics, key, fab)
}

// Revision is the revision of the last write that changed something.
func (f *Fake) Revision() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rev
}

// Fabric is the stored Fabric of node, if any.
func (f *Fake) Fabric(node string) (wire.Fabric, bool) {
	key, err := wire.FabricKey(node)
	if err != nil {
		return wire.Fabric{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fab, ok := f.fabrics[key]
	return fab, ok
}

// fakePut stores v under key unless it is stored already.
func fakePut[V any](f *Fake, m map[string]V, key string, v V) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := m[key]; ok && reflect.DeepEqual(cur, v) {
		return f.rev, nil
	}
	f.rev++
	m[key] = v
	return f.rev, nil
}

// DeleteIntent implements Bus.
func (f *Fake) DeleteIntent(_ context.Context, node, uid string) error {
	if err := f.isDown(); err != nil {
		return err
	}
	key, err := wire.IntentKey(node, uid)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.intents, key)
	return nil
}

// DeleteVolumeIntent implements Bus.
func (f *Fake) DeleteVolumeIntent(_ context.Context, node, uid string) error {
	key, err := wire.VolumeIntentKey(node, uid)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.volumes, key)
	return nil
}

// DeleteVolumeReport implements Bus: watchers see the report deleted.
func (f *Fake) DeleteVolumeReport(_ context.Context, node, uid string) error {
	key, err := wire.VolumeReportKey(node, uid)
	if err != nil {
		return err
	}
	f.mu.Lock()
	cur, ok := f.reportKV[key]
	f.mu.Unlock()
	if !ok || cur.Volume == nil || cur.Volume.Deleted {
		return nil
	}
	f.SetVolumeReport(VolumeReportEvent{Node: node, UID: uid, Deleted: true})
	return nil
}

// SetReport plays node's agent writing (or, with deleted, removing) a report.
func (f *Fake) SetReport(ev ReportEvent) {
	f.setReport(ev.Node+"."+ev.UID, func(rev uint64) ReportEvent { ev.Revision = rev; return ev })
}

// SetVolumeReport plays node's agent writing (or, with deleted, removing) a
// Volume's report.
func (f *Fake) SetVolumeReport(ev VolumeReportEvent) {
	key, _ := wire.VolumeReportKey(ev.Node, ev.UID)
	f.setReport(key, func(rev uint64) ReportEvent { ev.Revision = rev; return ReportEvent{Volume: &ev} })
}

// SetImageReport plays node's agent writing (or, with deleted, removing) an
// image's report.
func (f *Fake) SetImageReport(ev ImageReportEvent) {
	key, _ := wire.ImageReportKey(ev.Node, ev.UID)
	f.setReport(key, func(rev uint64) ReportEvent { ev.Revision = rev; return ReportEvent{Image: &ev} })
}

// setReport stores the event at the next revision under key and tells the
// watchers.
func (f *Fake) setReport(key string, at func(rev uint64) ReportEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	ev := at(f.rev)
	f.reportKV[key] = ev
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
	return fakeWatch(ctx, &f.mu, f.reportKV, &f.reports, fn, &ReportEvent{Synced: true})
}

// WatchNodes implements Bus.
func (f *Fake) WatchNodes(ctx context.Context, fn func(NodeEvent)) error {
	return fakeWatch(ctx, &f.mu, f.nodeKV, &f.nodes, fn, nil)
}

// OpenConsole implements Bus: it checks node and open as the NATS bus does,
// then asks Consoles.
func (f *Fake) OpenConsole(_ context.Context, node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error) {
	if err := f.isDown(); err != nil {
		return nil, err
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

// fakeWatch delivers the current state, then synced if set, registers fn for changes until ctx is
// done. Callbacks run under the lock, like a watch's single goroutine.
func fakeWatch[E any](ctx context.Context, mu *sync.Mutex, state map[string]E, watchers *[]func(E), fn func(E), synced *E) error {
	mu.Lock()
	for _, e := range state {
		fn(e)
	}
	if synced != nil {
		fn(*synced)
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
