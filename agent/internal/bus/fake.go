package bus

import (
	"context"
	"sync"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Fake is an in-memory Bus for unit tests of code above the bus. A test plays
// the hub with SetIntent and reads what the agent wrote with Report and
// Heartbeat.
type Fake struct {
	mu        sync.Mutex
	rev       uint64
	intents   map[string]IntentEvent // by uid, or "volume.<uid>"
	watchers  []func(IntentEvent)
	reports   map[string]wire.Report
	volumes   map[string]wire.VolumeReport
	images    map[string]wire.ImageReport
	heartbeat *wire.NodeHeartbeat
}

var _ Bus = &Fake{}

// NewFake returns an empty Fake.
func NewFake() *Fake {
	return &Fake{intents: map[string]IntentEvent{}, reports: map[string]wire.Report{}, volumes: map[string]wire.VolumeReport{}, images: map[string]wire.ImageReport{}}
}

// SetIntent plays the hub writing (or, with ev.Deleted, removing) an intent.
func (f *Fake) SetIntent(ev IntentEvent) {
	f.setIntent(ev.UID, func(rev uint64) IntentEvent { ev.Revision = rev; return ev })
}

// SetFabric plays the hub writing (or, with ev.Deleted, removing) the
// node's Fabric.
func (f *Fake) SetFabric(ev FabricEvent) {
	f.setIntent("fabric.peers", func(rev uint64) IntentEvent { ev.Revision = rev; return IntentEvent{Fabric: &ev} })
}

// SetVolumeIntent plays the hub writing (or, with ev.Deleted, removing) a
// Volume's intent.
func (f *Fake) SetVolumeIntent(ev VolumeIntentEvent) {
	f.setIntent("volume."+ev.UID, func(rev uint64) IntentEvent { ev.Revision = rev; return IntentEvent{Volume: &ev} })
}

func (f *Fake) setIntent(key string, at func(rev uint64) IntentEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	ev := at(f.rev)
	f.intents[key] = ev
	for _, fn := range f.watchers {
		fn(ev)
	}
}

// Report returns the report last written for uid.
func (f *Fake) Report(uid string) (wire.Report, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.reports[uid]
	return r, ok
}

// VolumeReport returns the report last written for Volume uid.
func (f *Fake) VolumeReport(uid string) (wire.VolumeReport, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.volumes[uid]
	return r, ok
}

// ImageReport returns the report last written for image uid.
func (f *Fake) ImageReport(uid string) (wire.ImageReport, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.images[uid]
	return r, ok
}

// Heartbeat returns the heartbeat last written.
func (f *Fake) Heartbeat() (wire.NodeHeartbeat, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.heartbeat == nil {
		return wire.NodeHeartbeat{}, false
	}
	return *f.heartbeat, true
}

// WatchIntents implements Bus.
func (f *Fake) WatchIntents(ctx context.Context, fn func(IntentEvent)) error {
	f.mu.Lock()
	for _, ev := range f.intents {
		fn(ev)
	}
	fn(IntentEvent{Synced: true})
	f.watchers = append(f.watchers, fn)
	i := len(f.watchers) - 1
	f.mu.Unlock()
	<-ctx.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watchers[i] = func(IntentEvent) {}
	return nil
}

// PutReport implements Bus.
func (f *Fake) PutReport(_ context.Context, r wire.Report) (uint64, error) {
	if err := wire.ValidateToken("uid", r.UID); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	f.reports[r.UID] = r
	return f.rev, nil
}

// DeleteReport implements Bus.
func (f *Fake) DeleteReport(_ context.Context, uid string) error {
	if err := wire.ValidateToken("uid", uid); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reports, uid)
	return nil
}

// PutVolumeReport implements Bus.
func (f *Fake) PutVolumeReport(_ context.Context, r wire.VolumeReport) (uint64, error) {
	if err := wire.ValidateToken("uid", r.UID); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	f.volumes[r.UID] = r
	return f.rev, nil
}

// DeleteVolumeReport implements Bus.
func (f *Fake) DeleteVolumeReport(_ context.Context, uid string) error {
	if err := wire.ValidateToken("uid", uid); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.volumes, uid)
	return nil
}

// PutImageReport implements Bus.
func (f *Fake) PutImageReport(_ context.Context, r wire.ImageReport) (uint64, error) {
	if err := wire.ValidateToken("uid", r.UID); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	f.images[r.UID] = r
	return f.rev, nil
}

// DeleteImageReport implements Bus.
func (f *Fake) DeleteImageReport(_ context.Context, uid string) error {
	if err := wire.ValidateToken("uid", uid); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.images, uid)
	return nil
}

// PutHeartbeat implements Bus.
func (f *Fake) PutHeartbeat(_ context.Context, h wire.NodeHeartbeat) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heartbeat = &h
	return nil
}
