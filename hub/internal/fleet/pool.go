package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/nats-io/nats.go"

	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/internal/metrics"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Target is a NATS server as a ProviderConfig names it.
type Target struct {
	// URL is one or more NATS URLs, comma separated.
	URL string
	// Seed is the hub's nkey seed; nil connects without authentication.
	Seed []byte
	// Replicas of the buckets the hub creates; 0 means 1. It does not tell
	// Targets apart: the first to connect creates the buckets.
	Replicas int
	// Namespace is the namespace of the ProviderConfig that names the
	// server, empty for a ClusterProviderConfig. It does not tell Targets
	// apart either: it bounds how many a namespace may open.
	Namespace string
}

func (t Target) key() string {
	h := sha256.Sum256(t.Seed)
	return t.URL + "#" + hex.EncodeToString(h[:8])
}

// FleetsPerNamespace is how many NATS connections the ProviderConfigs of
// one namespace may have the hub open or opening at once, besides those of
// ClusterProviderConfigs: each holds a connection and watches for the
// hub's lifetime.
const FleetsPerNamespace = 4

// How the pool connects: no attempt takes longer than connectTimeout, a
// caller waits for one at most joinWait (one that takes longer is
// finished in the background, and the caller is told to come back), and a
// target that failed is tried again only after a backoff that grows with
// each failure, up to a few minutes.
const (
	connectTimeout = 10 * time.Second
	joinWait       = 500 * time.Millisecond
)

var retryBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 3 * time.Minute}

// Pool keeps one Fleet per Target for the hub's lifetime: many
// ProviderConfigs usually name the same NATS server, and each Fleet holds
// long-lived watches that must not be restarted per reconcile.
//
// Connecting to one target never delays another: the pool's lock is held
// only to look a target up, and each target is connected by one attempt
// of its own, which callers join for at most joinWait. A server that
// accepts and never answers, or does not exist, costs its own callers
// that wait once, and then, until its backoff ends, an error at once.
type Pool struct {
	ctx     context.Context
	log     logging.Logger
	buckets natswire.BucketConfig
	onNew   func(*Fleet)
	// recorder shows the fleets' foreign reports as events.
	recorder event.Recorder
	// connect opens a target's bus (dial), in at most timeout.
	connect func(ctx context.Context, t Target) (bus.Bus, func(), error)
	timeout time.Duration

	mu      sync.Mutex
	targets map[string]*target
}

// target is one Target's connection: a fleet once connected, else the
// attempt under way (attempt not nil) or the last one's error.
type target struct {
	namespace string
	fleet     *Fleet
	attempt   chan struct{} // closed when the attempt under way ends
	err       error
	failures  int
	retryAt   time.Time
}

// NewPool returns a Pool whose fleets live until ctx is done and record
// events with recorder. onNew is called with each new Fleet before its
// watches start, to subscribe to it.
func NewPool(ctx context.Context, log logging.Logger, recorder event.Recorder, b natswire.BucketConfig, onNew func(*Fleet)) *Pool {
	p := &Pool{ctx: ctx, log: log, recorder: recorder, buckets: b, onNew: onNew, targets: map[string]*target{}}
	p.connect, p.timeout = p.dial, connectTimeout
	return p
}

// Fleets returns every Fleet opened so far.
func (p *Pool) Fleets() []*Fleet {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*Fleet, 0, len(p.targets))
	for _, t := range p.targets {
		if t.fleet != nil {
			out = append(out, t.fleet)
		}
	}
	return out
}

// ConnectingError is a target not connected yet: an attempt is under way,
// or the last one failed and the next waits for its backoff. A retry
// mends it.
type ConnectingError struct {
	URL string
	// Last is the last attempt's error; nil while the first is under way.
	Last error
	// RetryIn is how long until the next attempt; 0 while one is under
	// way.
	RetryIn time.Duration
}

func (e *ConnectingError) Error() string {
	if e.Last == nil {
		return fmt.Sprintf("connecting to NATS at %s", e.URL)
	}
	return fmt.Sprintf("cannot connect to NATS at %s (next try in %s): %v", e.URL, e.RetryIn.Round(time.Second), e.Last)
}

func (e *ConnectingError) Unwrap() error { return e.Last }

// QuietWhileStarting returns err, or, when it says only that the hub is
// still reading a fleet (Starting), err made a retry the managed
// reconciler does not tell the user of (apiwrites.RetryQuietly): a
// restarted hub's first pass would otherwise mark the first resources it
// reconciles not Synced, with a Warning each, and Synced again a moment
// later.
func QuietWhileStarting(err error) error {
	if Starting(err) {
		return apiwrites.RetryQuietly(err)
	}
	return err
}

// Starting says whether err says only that the hub is still reading a
// fleet: connecting to its NATS server with no attempt failed yet
// (ConnectingError), or its records not read yet (ErrRecordsNotSynced). A
// retry soon mends it, and nobody need act on it.
func Starting(err error) bool {
	var c *ConnectingError
	return errors.Is(err, ErrRecordsNotSynced) || (errors.As(err, &c) && c.Last == nil)
}

// TooManyError refuses a namespace another NATS connection.
type TooManyError struct {
	Namespace, URL string
}

func (e *TooManyError) Error() string {
	return fmt.Sprintf("refused: the hub holds %d NATS connections for the ProviderConfigs of namespace %s, the most a namespace may have; NATS at %s is not connected (name a server the namespace already uses, or a ClusterProviderConfig)", FleetsPerNamespace, e.Namespace, e.URL)
}

// Get returns the Fleet of t, connecting and creating the buckets on first
// use. While t is not connected it returns a *ConnectingError after
// waiting at most joinWait (or until ctx is done) for the attempt under
// way, and a *TooManyError when t's namespace already has
// FleetsPerNamespace targets of its own.
func (p *Pool) Get(ctx context.Context, t Target) (*Fleet, error) {
	p.mu.Lock()
	e, ok := p.targets[t.key()]
	switch {
	case ok && e.fleet != nil:
		p.mu.Unlock()
		return e.fleet, nil
	case !ok:
		e = &target{namespace: t.Namespace}
	}
	if e.attempt == nil {
		if wait := time.Until(e.retryAt); wait > 0 {
			err := &ConnectingError{URL: t.URL, Last: e.err, RetryIn: wait}
			p.mu.Unlock()
			return nil, err
		}
		if e.namespace != "" && p.namespaceTargets(e.namespace) >= FleetsPerNamespace {
			p.mu.Unlock()
			return nil, &TooManyError{Namespace: e.namespace, URL: t.URL}
		}
		p.targets[t.key()] = e
		e.attempt = make(chan struct{})
		go p.attempt(e, t)
	}
	attempt := e.attempt
	p.mu.Unlock()

	timer := time.NewTimer(joinWait)
	defer timer.Stop()
	select {
	case <-attempt:
	case <-timer.C:
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.fleet != nil {
		return e.fleet, nil
	}
	if e.attempt != nil {
		return nil, &ConnectingError{URL: t.URL}
	}
	return nil, &ConnectingError{URL: t.URL, Last: e.err, RetryIn: time.Until(e.retryAt)}
}

// namespaceTargets counts the targets namespace opened that are connected
// or being connected: one that failed holds no connection until it is
// tried again, so a namespace that named a wrong server is not held to it.
// The caller holds p.mu.
func (p *Pool) namespaceTargets(namespace string) int {
	n := 0
	for _, e := range p.targets {
		if e.namespace == namespace && (e.fleet != nil || e.attempt != nil) {
			n++
		}
	}
	return n
}

// attempt connects e, whatever became of the caller that started it, and
// records the fleet or the error and when to try again.
func (p *Pool) attempt(e *target, t Target) {
	ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
	defer cancel()
	b, closeConn, err := p.connect(ctx, t)
	var f *Fleet
	if err == nil {
		f = New(b, p.log.WithValues("nats", t.URL)).WithRecorder(p.recorder).WithSealKey(sealKey(t))
		if p.onNew != nil {
			p.onNew(f)
		}
		go func() {
			f.Run(p.ctx)
			closeConn()
		}()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	close(e.attempt)
	e.attempt = nil
	if err != nil {
		e.failures++
		delay := retryDelay(e.failures)
		e.err, e.retryAt = err, time.Now().Add(delay)
		p.log.Info("Cannot connect to NATS", "url", t.URL, "namespace", t.Namespace, "retryIn", delay.Round(time.Millisecond), "error", err)
		return
	}
	e.fleet, e.err, e.failures = f, nil, 0
}

// retryDelay is how long a target that failed failures times in a row
// waits for its next attempt.
func retryDelay(failures int) time.Duration {
	b := retryBackoff
	var d time.Duration
	for range failures {
		d = b.Step()
	}
	return d
}

// dial connects to t's NATS servers and opens its buckets.
func (p *Pool) dial(ctx context.Context, t Target) (bus.Bus, func(), error) {
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.Name(natswire.HubName)}
	if deadline, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(time.Until(deadline)))
	}
	if len(t.Seed) > 0 {
		id := natswire.Identity{User: natswire.User{Name: natswire.HubName}, InboxPrefix: natswire.InboxPrefix(natswire.HubName), Seed: t.Seed}
		auth, err := id.ConnectOptions()
		if err != nil {
			return nil, nil, errors.Wrap(err, "cannot use the hub's NATS credentials")
		}
		opts = append(opts, auth...)
	}
	nc, err := nats.Connect(t.URL, opts...)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "cannot connect to NATS at %s", t.URL)
	}
	buckets := p.buckets
	buckets.Replicas = t.Replicas
	b, err := bus.New(ctx, nc, bus.Config{Buckets: buckets, Log: p.log, Rejections: &natswire.Rejections{Counter: metrics.ReportsIgnored}})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return b, nc.Close, nil
}
