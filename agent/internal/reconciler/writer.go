package reconciler

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// writer writes one kind of report, each only when it says something other
// than the one last written (the kind's Equal), and remembers what it
// wrote. Its lock guards only what it remembers and is taken last: a writer
// never waits for the Reconciler's.
type writer[R any] struct {
	kind    wire.Kind[R]
	reports bus.Reports
	// changed, if set, is called with what is written whenever that
	// changes, the writer's lock held.
	changed func(written map[string]R)

	mu      sync.Mutex
	written map[string]R
}

func newWriter[R any](k wire.Kind[R], reports bus.Reports, changed func(map[string]R)) *writer[R] {
	w := &writer[R]{kind: k, reports: reports, changed: changed, written: map[string]R{}}
	w.update(func(map[string]R) {})
	return w
}

// put writes v as the report of uid unless it says what the last one
// written said.
func (w *writer[R]) put(ctx context.Context, uid string, v R) error {
	if last, ok := w.last(uid); ok && w.kind.Equal(last, v) {
		return nil
	}
	if _, err := bus.PutReport(ctx, w.reports, w.kind, uid, v); err != nil {
		return errors.Wrapf(err, "cannot put %s %s", w.kind.Name, uid)
	}
	w.update(func(written map[string]R) { written[uid] = v })
	return nil
}

// delete removes the report of uid.
func (w *writer[R]) delete(ctx context.Context, uid string) error {
	if err := bus.DeleteReport(ctx, w.reports, w.kind, uid); err != nil {
		return errors.Wrapf(err, "cannot delete %s %s", w.kind.Name, uid)
	}
	w.update(func(written map[string]R) { delete(written, uid) })
	return nil
}

// last is the report of uid last written.
func (w *writer[R]) last(uid string) (R, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v, ok := w.written[uid]
	return v, ok
}

// lastOrStored is the report of uid this process last wrote or, when it
// wrote none, the one stored on the bus (stored): what an earlier agent of
// the node said. Zero when there is neither.
func (w *writer[R]) lastOrStored(ctx context.Context, uid string) (v R, stored bool, err error) {
	if v, ok := w.last(uid); ok {
		return v, false, nil
	}
	v, stored, err = bus.GetReport(ctx, w.reports, w.kind, uid)
	if unreadable(err) {
		// A newer agent's, or a forgery: nothing to go by, and the next
		// put replaces it.
		var zero R
		return zero, false, nil
	}
	return v, stored, errors.Wrapf(err, "cannot read the %s %s stored before", w.kind.Name, uid)
}

// unreadable says whether err refuses a value as it is, which no retry
// mends.
func unreadable(err error) bool {
	var (
		decode   *wire.DecodeError
		version  *wire.VersionError
		mismatch *wire.MismatchError
	)
	return errors.As(err, &decode) || errors.As(err, &version) || errors.As(err, &mismatch)
}

// uids are the uids of the reports written.
func (w *writer[R]) uids() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Collect(maps.Keys(w.written))
}

func (w *writer[R]) update(fn func(written map[string]R)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fn(w.written)
	if w.changed != nil {
		w.changed(w.written)
	}
}
