package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/nats-io/nats.go"

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
}

func (t Target) key() string {
	h := sha256.Sum256(t.Seed)
	return t.URL + "#" + hex.EncodeToString(h[:8])
}

// Pool keeps one Fleet per Target for the hub's lifetime: many
// ProviderConfigs usually name the same NATS server, and each Fleet holds
// long-lived watches that must not be restarted per reconcile.
type Pool struct {
	ctx     context.Context
	log     logging.Logger
	buckets natswire.BucketConfig
	onNew   func(*Fleet)
	// recorder shows the fleets' foreign reports as events.
	recorder event.Recorder

	mu     sync.Mutex
	fleets map[string]*Fleet
}

// NewPool returns a Pool whose fleets live until ctx is done and record
// events with recorder. onNew is called with each new Fleet before its
// watches start, to subscribe to it.
func NewPool(ctx context.Context, log logging.Logger, recorder event.Recorder, b natswire.BucketConfig, onNew func(*Fleet)) *Pool {
	return &Pool{ctx: ctx, log: log, recorder: recorder, buckets: b, onNew: onNew, fleets: map[string]*Fleet{}}
}

// Fleets returns every Fleet opened so far.
func (p *Pool) Fleets() []*Fleet {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*Fleet, 0, len(p.fleets))
	for _, f := range p.fleets {
		out = append(out, f)
	}
	return out
}

// Get returns the Fleet of t, connecting and creating the buckets on first use.
func (p *Pool) Get(ctx context.Context, t Target) (*Fleet, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.fleets[t.key()]; ok {
		return f, nil
	}
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.Name(natswire.HubName)}
	if len(t.Seed) > 0 {
		id := natswire.Identity{User: natswire.User{Name: natswire.HubName}, InboxPrefix: natswire.InboxPrefix(natswire.HubName), Seed: t.Seed}
		auth, err := id.ConnectOptions()
		if err != nil {
			return nil, errors.Wrap(err, "cannot use the hub's NATS credentials")
		}
		opts = append(opts, auth...)
	}
	nc, err := nats.Connect(t.URL, opts...)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot connect to NATS at %s", t.URL)
	}
	buckets := p.buckets
	buckets.Replicas = t.Replicas
	b, err := bus.New(ctx, nc, bus.Config{Buckets: buckets, Log: p.log, Rejections: &natswire.Rejections{Counter: metrics.ReportsIgnored}})
	if err != nil {
		nc.Close()
		return nil, err
	}
	f := New(b, p.log.WithValues("nats", t.URL)).WithRecorder(p.recorder).WithSealKey(sealKey(t))
	if p.onNew != nil {
		p.onNew(f)
	}
	go func() {
		f.Run(p.ctx)
		nc.Close()
	}()
	p.fleets[t.key()] = f
	return f, nil
}
