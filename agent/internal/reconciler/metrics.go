package reconciler

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Operations are the operation label of AgentMetrics.DriverCalls: one per
// driver method the agent calls, so the label stays bounded. Events, Close
// and TunnelAddress do no work on the backend and are not timed.
const (
	OpEnsure        = "ensure"
	OpObserve       = "observe"
	OpDelete        = "delete"
	OpList          = "list"
	OpImages        = "images"
	OpCapacity      = "capacity"
	OpDeleteVolume  = "delete-volume"
	OpObserveVolume = "observe-volume"
	OpRelease       = "release"
	OpOrphans       = "orphans"
	OpClaim         = "claim"
	OpObserveRef    = "observe-ref"
	OpSetPeers      = "set-peers"
	// The driver.Snapshotter's.
	OpTakeSnapshot   = "take-snapshot"
	OpSnapshots      = "snapshots"
	OpDeleteSnapshot = "delete-snapshot"
	OpRevertSnapshot = "revert-snapshot"
	// The driver.Backuper's.
	OpBackUp       = "back-up"
	OpCommitBackup = "commit-backup"
)

// DriverCall makes one call into the driver, f, and observes it in m as op:
// how long it took, and whether it returned an error. Every call the agent
// makes into its driver goes through it, at the call site, so the optional
// interfaces (driver.Adopter, driver.Overlay, ...) stay visible on the
// driver itself.
func DriverCall[T any](m *metrics.AgentMetrics, op string, f func() (T, error)) (T, error) {
	start := time.Now()
	v, err := f()
	m.DriverCalls.WithLabelValues(op, result(err)).Observe(time.Since(start).Seconds())
	return v, err
}

// call is DriverCall for a method that returns only an error.
func (r *Reconciler) call(op string, f func() error) error {
	_, err := DriverCall(r.metrics, op, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// ensure is the driver's Ensure, observed.
func (r *Reconciler) ensure(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	return DriverCall(r.metrics, OpEnsure, func() (driver.Observation, error) { return r.driver.Ensure(ctx, m) })
}

func result(err error) string {
	if err != nil {
		return metrics.ResultFailure
	}
	return metrics.ResultSuccess
}

// countGuests sets the guest gauge from the reports last written, every
// phase each time, so a phase no guest has any more drops to 0.
func (r *Reconciler) countGuests(written map[string]wire.Report) {
	counts := make(map[wire.Phase]int, len(wire.Phases))
	for _, p := range wire.Phases {
		counts[p] = 0
	}
	for _, rep := range written {
		counts[rep.Phase]++
	}
	for p, n := range counts {
		r.metrics.Guests.WithLabelValues(string(p)).Set(float64(n))
	}
}

// observeImport counts an import of st the driver finished, once: the
// driver keeps saying when the last one finished until the image is gone,
// and the image loop reads that every few seconds. Only the image loop
// calls it, so imports needs no lock.
func (r *Reconciler) observeImport(st driver.ImageStatus) {
	// An image Importing again is counted when that import ends.
	ended := st.Phase == driver.ImagePhaseReady || st.Phase == driver.ImagePhaseFailed
	if !ended || st.ImportFinished.IsZero() || !st.ImportFinished.After(r.imports[st.UID]) {
		return
	}
	r.imports[st.UID] = st.ImportFinished
	res := metrics.ResultFailure
	if st.Phase == driver.ImagePhaseReady {
		res = metrics.ResultSuccess
		r.metrics.ImageImportBytes.WithLabelValues().Add(float64(max(st.SizeBytes, 0)))
	}
	r.metrics.ImageImports.WithLabelValues(res).Inc()
	r.metrics.ImageImportDuration.WithLabelValues(res).Observe(st.ImportFinished.Sub(st.ImportStarted).Seconds())
}

// logImage logs a failed import when its reason first appears or changes,
// and the import that ends a failure.
func (r *Reconciler) logImage(st driver.ImageStatus) {
	switch st.Phase {
	case driver.ImagePhaseFailed:
		if !r.imageErrors.changed(st.UID, st.Message) {
			return
		}
		name, host := r.imageSource(st)
		r.log.Info("Cannot import image; the driver retries it with backoff unless the node refused it",
			"image", name, "uid", st.UID, "host", host, "error", redactURLs(st.Message))
	case driver.ImagePhaseReady:
		if r.imageErrors.forget(st.UID) {
			name, host := r.imageSource(st)
			r.log.Info("Image imported after failing", "image", name, "uid", st.UID, "host", host, "bytes", st.SizeBytes)
		}
	}
}

// imageSource is the name of the image st is and the host of its URL, as
// the intents give them; the host only, since the rest of a URL may carry a
// credential (a signed query, a user and password).
func (r *Reconciler) imageSource(st driver.ImageStatus) (name, host string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, in := range r.intents {
		for _, d := range in.Machine.Disks {
			if d.Image != nil && d.Image.UID == st.UID {
				return d.Image.Name, urlHost(d.Image.URL)
			}
		}
	}
	return st.Name, ""
}

// guestError logs err, the error of a driver call about a guest, when it
// first appears or differs from the one last logged for the guest: a retry
// that fails the same way logs nothing. An error of a stopping agent is
// not the guest's.
func (r *Reconciler) guestError(ctx context.Context, uid, namespace, name string, err error) {
	if ctx.Err() != nil || !r.guestErrors.changed(uid, err.Error()) {
		return
	}
	kv := []any{"uid", uid}
	if namespace != "" {
		kv = append(kv, "namespace", namespace, "name", name)
	}
	r.log.Info("Cannot converge guest", append(kv, "retrying", !driver.IsTerminal(err), "error", redactURLs(err.Error()))...)
}

// guestOK forgets the guest's last error, saying so when there was one.
func (r *Reconciler) guestOK(uid, namespace, name string) {
	if r.guestErrors.forget(uid) {
		r.log.Info("Guest converges again", "uid", uid, "namespace", namespace, "name", name)
	}
}

// errorLog remembers the error last logged per key, so that each cause is
// logged once however often it is retried.
type errorLog struct {
	mu   sync.Mutex
	last map[string]string
}

// changed records msg as key's error and reports whether it differs from
// the last one recorded.
func (l *errorLog) changed(key, msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, ok := l.last[key]; ok && last == msg {
		return false
	}
	if l.last == nil {
		l.last = map[string]string{}
	}
	l.last[key] = msg
	return true
}

// forget drops key's error and reports whether it had one.
func (l *errorLog) forget(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.last[key]
	delete(l.last, key)
	return ok
}

// retain forgets the errors of the keys keep refuses.
func (l *errorLog) retain(keep func(string) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.last {
		if !keep(k) {
			delete(l.last, k)
		}
	}
}

// urls are the http and https URLs in a message, up to what ends them when
// quoted or written out: whitespace or a quote.
var urls = regexp.MustCompile(`(?i)\bhttps?://[^\s"'<>]+`)

// redactURLs cuts every URL in msg down to its scheme and host: drivers'
// errors quote image URLs whole, and a URL may carry a credential that has
// no place in the node's log.
func redactURLs(msg string) string {
	return urls.ReplaceAllStringFunc(msg, func(u string) string {
		scheme, _, _ := strings.Cut(u, "://")
		return scheme + "://" + urlHost(u)
	})
}

// urlHost is the host (and port) of an absolute URL, without a user or
// password; empty for anything else.
func urlHost(u string) string {
	_, rest, ok := strings.Cut(u, "://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	return rest
}
