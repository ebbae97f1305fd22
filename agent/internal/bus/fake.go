package bus

import (
	"context"
	"maps"
	"slices"
	"sync"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Fake is an in-memory Bus for unit tests of code above the bus. A test plays
// the hub with SetIntent and DeleteIntent and reads what the agent wrote with
// Written, Writes and Heartbeat. Intents reach the watch's handlers as they
// do over NATS: encoded, under their keys, and dispatched by kind.
type Fake struct {
	node       string
	rejections natswire.Rejections

	mu        sync.Mutex
	rev       uint64
	intents   map[string]entry // by key
	watchers  map[int]Handlers
	watches   int
	reports   map[string][]byte // by key
	writes    map[string]int    // by key
	heartbeat *wire.NodeHeartbeat
	// heartbeatErr fails every heartbeat put while set.
	heartbeatErr error
	// resumes counts ResumeIntents; a pending one has not had its Synced
	// yet, held back while resumesPaused.
	resumes                      int
	resumePending, resumesPaused bool
}

var _ Bus = &Fake{}

// NewFake returns an empty Fake for node.
func NewFake(node string) *Fake {
	return &Fake{node: node, intents: map[string]entry{}, watchers: map[int]Handlers{}, reports: map[string][]byte{}, writes: map[string]int{}}
}

// Rejections counts the intents the watches refused.
func (f *Fake) Rejections() *natswire.Rejections { return &f.rejections }

// SetIntent plays the hub writing v as the intent of kind k of uid.
func SetIntent[V any](f *Fake, k wire.Kind[V], uid string, v V) error {
	key, err := k.Key(f.node, uid)
	if err != nil {
		return err
	}
	value, err := k.Encode(v)
	if err != nil {
		return err
	}
	f.setIntent(entry{key: key, value: value})
	return nil
}

// DeleteIntent plays the hub removing the intent of kind k of uid.
func DeleteIntent[V any](f *Fake, k wire.Kind[V], uid string) error {
	key, err := k.Key(f.node, uid)
	if err != nil {
		return err
	}
	f.setIntent(entry{key: key, deleted: true})
	return nil
}

func (f *Fake) setIntent(e entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	e.revision = f.rev
	f.intents[e.key] = e
	for _, hs := range f.watchers {
		f.deliver(hs, e)
	}
}

// deliver hands e to hs as WatchIntents does. f.mu must be held.
func (f *Fake) deliver(hs Handlers, e entry) {
	if err := hs.deliver(f.node, e); err != nil {
		f.rejections.Add(err)
	}
}

// Written returns the report of kind k of uid last written, if any.
func Written[V any](f *Fake, k wire.Kind[V], uid string) (V, bool) {
	var v V
	key, err := k.Key(f.node, uid)
	if err != nil {
		return v, false
	}
	f.mu.Lock()
	value, ok := f.reports[key]
	f.mu.Unlock()
	if !ok {
		return v, false
	}
	v, err = k.Decode(value)
	return v, err == nil
}

// Writes returns how many times a value was put under key.
func (f *Fake) Writes(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes[key]
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
func (f *Fake) WatchIntents(ctx context.Context, hs Handlers) error {
	f.mu.Lock()
	for _, e := range f.intents {
		f.deliver(hs, e)
	}
	hs.synced()
	i := f.watches
	f.watches++
	f.watchers[i] = hs
	f.mu.Unlock()
	<-ctx.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.watchers, i)
	return nil
}

// Node implements Reports.
func (f *Fake) Node() string { return f.node }

// Put implements Reports.
func (f *Fake) Put(_ context.Context, key string, value []byte) (uint64, error) {
	if err := ownKey(f.node, key); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	f.reports[key] = value
	f.writes[key]++
	return f.rev, nil
}

// Delete implements Reports.
func (f *Fake) Delete(_ context.Context, key string) error {
	if err := ownKey(f.node, key); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reports, key)
	return nil
}

// Get implements Reports.
func (f *Fake) Get(_ context.Context, key string) ([]byte, error) {
	if err := ownKey(f.node, key); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reports[key], nil
}

// Keys implements Reports.
func (f *Fake) Keys(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.reports)), nil
}

// PutHeartbeat implements Bus.
func (f *Fake) PutHeartbeat(_ context.Context, h wire.NodeHeartbeat) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.heartbeatErr != nil {
		return f.heartbeatErr
	}
	f.heartbeat = &h
	return nil
}

// FailHeartbeats makes every heartbeat put fail with err, as when the node
// is cut off from NATS; nil lets them succeed again.
func (f *Fake) FailHeartbeats(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heartbeatErr = err
}

// ResumeIntents implements Bus: every running watch, which has missed
// nothing, calls Synced again; while resumes are paused, only once they
// are not.
func (f *Fake) ResumeIntents() {
	f.mu.Lock()
	f.resumes++
	f.resumePending = true
	paused := f.resumesPaused
	f.mu.Unlock()
	if !paused {
		f.resume()
	}
}

// PauseResumes holds back the Synced of ResumeIntents while paused is
// true, as a watch that takes long to catch up would; false delivers the
// Synced of any held back.
func (f *Fake) PauseResumes(paused bool) {
	f.mu.Lock()
	f.resumesPaused = paused
	f.mu.Unlock()
	if !paused {
		f.resume()
	}
}

// resume has every watch call Synced if a resume is pending.
func (f *Fake) resume() {
	f.mu.Lock()
	pending := f.resumePending
	f.resumePending = false
	watchers := slices.Collect(maps.Values(f.watchers))
	f.mu.Unlock()
	if !pending {
		return
	}
	for _, hs := range watchers {
		hs.synced()
	}
}

// Resumes is how many times ResumeIntents was called.
func (f *Fake) Resumes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resumes
}
