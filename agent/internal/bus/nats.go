package bus

import (
	"bytes"
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// DefaultTimeout bounds each request. A request the server refuses for lack
// of permission gets no reply, only an asynchronous error, so a short timeout
// is what keeps a misconfigured agent from hanging.
const DefaultTimeout = 2 * time.Second

// KV headers of the JetStream key-value convention.
const (
	hdrOperation    = "KV-Operation"
	hdrMarkerReason = "Nats-Marker-Reason"
	hdrSequence     = "Nats-Sequence"
	opDelete        = "DEL"
)

// Config of a NATS bus.
type Config struct {
	Node string
	// Timeout of each request; 0 means DefaultTimeout.
	Timeout time.Duration
	// Log receives rejections and watch restarts; nil discards them.
	Log logging.Logger
	// Rejections counts refused intents; nil allocates one.
	Rejections *natswire.Rejections
	// RetryInterval is the first wait before re-establishing a failed
	// watch, growing with each failure in a row (see retryBackoff); 0 means
	// 1s.
	RetryInterval time.Duration
}

// NATS is the Bus over JetStream. It never binds a key-value handle: that
// needs STREAM.INFO, which can list every node's keys and so is not granted
// to agents (see internal/natswire). It uses only what an agent's permissions
// allow: an ordered consumer filtered to its intents, direct gets of its own
// keys, and publishes to its own keys.
type NATS struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	legacy nats.JetStreamContext

	// resume asks the running watch to resume (ResumeIntents).
	resume chan struct{}

	// reportsStream is the node's own reports stream
	// (natswire.NodeReportsStream).
	reportsStream string

	mu      sync.Mutex
	reports map[string]stored // by key: what this agent last read or wrote
}

type stored struct {
	revision uint64
	value    []byte
}

var _ Bus = &NATS{}

// New returns a bus for cfg.Node over nc, which must be connected with the
// node's identity (natswire.Identity.ConnectOptions) and should reconnect
// forever (nats.MaxReconnects(-1)).
func New(nc *nats.Conn, cfg Config) (*NATS, error) {
	if err := wire.ValidateNodeName(cfg.Node); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Log == nil {
		cfg.Log = logging.NewNopLogger()
	}
	if cfg.Rejections == nil {
		cfg.Rejections = &natswire.Rejections{}
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = time.Second
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, errors.Wrap(err, "cannot open JetStream")
	}
	legacy, err := nc.JetStream(nats.MaxWait(cfg.Timeout))
	if err != nil {
		return nil, errors.Wrap(err, "cannot open JetStream")
	}
	return &NATS{
		cfg: cfg, nc: nc, js: js, legacy: legacy, resume: make(chan struct{}, 1),
		reportsStream: natswire.NodeReportsStream(wire.NodeToken(cfg.Node)), reports: map[string]stored{},
	}, nil
}

// Rejections counts the intents this bus's watches refused.
func (n *NATS) Rejections() *natswire.Rejections { return n.cfg.Rejections }

// Node implements Reports.
func (n *NATS) Node() string { return n.cfg.Node }

// Put implements Reports.
func (n *NATS) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	if err := ownKey(n.cfg.Node, key); err != nil {
		return 0, err
	}
	return n.write(ctx, key, &nats.Msg{Data: value})
}

// Delete implements Reports.
func (n *NATS) Delete(ctx context.Context, key string) error {
	if err := ownKey(n.cfg.Node, key); err != nil {
		return err
	}
	// The marker expires: it holds one of the node's keys (see
	// natswire.ReportDeletedTTL).
	_, err := n.write(ctx, key, &nats.Msg{Header: nats.Header{
		hdrOperation:       []string{opDelete},
		natswire.HeaderTTL: []string{natswire.ReportDeletedTTL.String()},
	}})
	return err
}

// Get implements Reports, through the report this agent last read or
// wrote: the bus reads a key at most once.
func (n *NATS) Get(ctx context.Context, key string) ([]byte, error) {
	if err := ownKey(n.cfg.Node, key); err != nil {
		return nil, err
	}
	cur, err := n.lastReport(ctx, key)
	return cur.value, err
}

// Keys implements Reports: one look at the last message of each of this
// node's report subjects, headers only, through a consumer of the node's
// own reports stream whose filter is the node's prefix (the only one its
// permissions let it make).
func (n *NATS) Keys(ctx context.Context) ([]string, error) {
	prefix, err := wire.NodeKeyPrefix(n.cfg.Node)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	subjects := wire.Subject(wire.BucketReports, "")
	sub, err := n.legacy.SubscribeSync(subjects+prefix+">",
		nats.BindStream(n.reportsStream), nats.OrderedConsumer(), nats.DeliverLastPerSubject(), nats.HeadersOnly())
	if err != nil {
		return nil, errors.Wrap(err, "cannot list this node's reports")
	}
	defer func() { _ = sub.Unsubscribe() }()
	pending, err := sub.InitialConsumerPending()
	if err != nil {
		return nil, errors.Wrap(err, "cannot list this node's reports")
	}
	var keys []string
	for pending > 0 {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, errors.Wrap(err, "cannot list this node's reports")
		}
		meta, err := m.Metadata()
		if err != nil {
			return nil, errors.Wrap(err, "cannot list this node's reports")
		}
		pending = meta.NumPending
		if !isDeletion(m.Header) {
			keys = append(keys, strings.TrimPrefix(m.Subject, subjects))
		}
	}
	return keys, nil
}

// write publishes m to the report key, expecting the revision last seen. A
// delete is stored as an empty value, so an empty value means "absent".
func (n *NATS) write(ctx context.Context, key string, m *nats.Msg) (uint64, error) {
	cur, err := n.lastReport(ctx, key)
	if err != nil {
		return 0, err
	}
	if cur.revision > 0 && bytes.Equal(cur.value, m.Data) || cur.revision == 0 && len(m.Data) == 0 {
		return cur.revision, nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	m.Subject = wire.Subject(wire.BucketReports, key)
	ack, err := n.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(cur.revision))
	if err != nil {
		n.forget(key)
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return 0, &ConflictError{Key: key, Err: err}
		}
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeStoreFailed && atBound(apiErr.Description) {
			return 0, &BoundError{Node: n.cfg.Node, Key: key, Err: err}
		}
		return 0, errors.Wrap(err, "cannot put report")
	}
	n.remember(key, stored{revision: ack.Sequence, value: m.Data})
	return ack.Sequence, nil
}

// lastReport is the report as last written by this agent, read from the
// bucket the first time (e.g. after a restart).
func (n *NATS) lastReport(ctx context.Context, key string) (stored, error) {
	n.mu.Lock()
	cur, ok := n.reports[key]
	n.mu.Unlock()
	if ok {
		return cur, nil
	}
	// From the node's own stream: the revisions the agent compares and
	// sets against are that stream's, not the bucket's that sources it.
	m, err := n.directGet(ctx, n.reportsStream, wire.Subject(wire.BucketReports, key))
	if err != nil {
		return stored{}, errors.Wrap(err, "cannot get report")
	}
	if m != nil {
		cur.revision, err = strconv.ParseUint(m.Header.Get(hdrSequence), 10, 64)
		if err != nil {
			return stored{}, errors.Wrap(err, "cannot parse report revision")
		}
		if !isDeletion(m.Header) {
			cur.value = m.Data
		}
	}
	n.remember(key, cur)
	return cur, nil
}

func (n *NATS) remember(key string, s stored) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.reports[key] = s
}

func (n *NATS) forget(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.reports, key)
}

// directGet reads the last message of stream on subject, or nil if there
// is none.
func (n *NATS) directGet(ctx context.Context, stream, subject string) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	subj := "$JS.API.DIRECT.GET." + stream + "." + subject
	m, err := n.nc.RequestWithContext(ctx, subj, nil)
	if err != nil {
		return nil, err
	}
	switch status := m.Header.Get("Status"); status {
	case "":
		return m, nil
	case "404":
		return nil, nil
	default:
		return nil, errors.Errorf("direct get status %s: %s", status, m.Header.Get("Description"))
	}
}

// PutHeartbeat implements Bus.
func (n *NATS) PutHeartbeat(ctx context.Context, h wire.NodeHeartbeat) error {
	h.Node = n.cfg.Node
	b, err := wire.EncodeNodeHeartbeat(h)
	if err != nil {
		return errors.Wrap(err, "cannot encode heartbeat")
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	key, err := wire.NodeKey(n.cfg.Node)
	if err != nil {
		return err
	}
	_, err = n.js.Publish(ctx, wire.Subject(wire.BucketNodes, key), b)
	return errors.Wrap(err, "cannot put heartbeat")
}

// WatchIntents implements Bus.
func (n *NATS) WatchIntents(ctx context.Context, hs Handlers) error {
	w := &intentWatch{n: n, hs: hs}
	// The ordered consumer would notice a lost server only after missing
	// heartbeats for several seconds; resubscribing on reconnect resumes at once.
	reconnected := n.nc.StatusChanged(nats.CONNECTED)
	defer n.nc.RemoveStatusListener(reconnected)
	retry := n.retryBackoff()
	for {
		sub, closed, err := w.subscribe(ctx)
		if err != nil {
			n.cfg.Log.Info("Cannot watch intents; retrying", "error", err)
			if !pause(ctx, retry.Step()) {
				return nil
			}
			continue
		}
		subscribed, closedByServer := time.Now(), false
		select {
		case <-ctx.Done():
			_ = sub.Unsubscribe()
			return nil
		case <-closed:
			n.cfg.Log.Info("Intent watch closed; resuming", "revision", w.lastRevision())
			w.resumed()
			closedByServer = true
		case <-reconnected:
			n.cfg.Log.Debug("Reconnected; resuming intent watch", "revision", w.lastRevision())
			_ = sub.Unsubscribe()
			w.resumed()
		case <-n.resume:
			n.cfg.Log.Debug("Resuming intent watch on request", "revision", w.lastRevision())
			_ = sub.Unsubscribe()
			w.resumed()
		}
		// Failures before a subscription that served a while are forgotten.
		if time.Since(subscribed) > retry.Cap {
			retry = n.retryBackoff()
		}
		// A server that refuses every new consumer closes each one at
		// once: wait, longer each time. A thousand agents resubscribing
		// in step would keep the server too busy to serve any of them.
		if closedByServer && !pause(ctx, retry.Step()) {
			return nil
		}
	}
}

// retryBackoff is how long WatchIntents waits before each attempt after a
// failed one: RetryInterval, doubling to thirty times it, each wait drawn
// from up to twice its length so agents that failed together do not retry
// together.
func (n *NATS) retryBackoff() wait.Backoff {
	return wait.Backoff{Duration: n.cfg.RetryInterval, Factor: 2, Jitter: 1, Steps: math.MaxInt32, Cap: 30 * n.cfg.RetryInterval}
}

// pause waits d, or until ctx is done, which it reports as false.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ResumeIntents implements Bus. A request made while the watch is not
// subscribed (between attempts) is kept for when it is; requests made
// before it acted are one.
func (n *NATS) ResumeIntents() {
	select {
	case n.resume <- struct{}{}:
	default:
	}
}

// intentHeartbeat is how often the server tells an idle intent watch it is
// still there (see subscribe).
const intentHeartbeat = time.Second

// intentWatch is one WatchIntents call. Its ordered consumer recreates itself
// after a gap or reconnect; if it is torn down anyway, the next subscription
// starts after the last revision seen.
type intentWatch struct {
	n  *NATS
	hs Handlers

	mu     sync.Mutex
	last   uint64
	synced bool
	// catchingUp is set after a reconnect until the resumed watch has
	// caught up, when Synced is sent again.
	catchingUp bool
}

// resumed makes the watch send Synced again once it has caught up after a
// reconnect: what the agent wrote or tried while NATS was away may have
// failed, and its per-guest retries back off for as long as the outage
// lasted; the Synced marker has the agent look at every guest at once.
func (w *intentWatch) resumed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.catchingUp = w.synced
}

func (w *intentWatch) lastRevision() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

func (w *intentWatch) subscribe(ctx context.Context) (*nats.Subscription, <-chan struct{}, error) {
	prefix, err := wire.NodeKeyPrefix(w.n.cfg.Node)
	if err != nil {
		return nil, nil, err
	}
	subj := wire.Subject(wire.BucketIntents, prefix+">")
	opts := []nats.SubOpt{
		nats.BindStream(wire.Stream(wire.BucketIntents)), nats.OrderedConsumer(), nats.DeliverLastPerSubject(),
		// The consumer lives on one server. When that server goes and the
		// agent's connection stays on another, only missing heartbeats
		// tell, and nats.go checks every two intervals: a short interval
		// makes the consumer again within seconds, for one small message
		// per interval.
		nats.IdleHeartbeat(intentHeartbeat),
	}
	if last := w.lastRevision(); last > 0 {
		opts = append(opts, nats.StartSequence(last+1))
	}
	// Hold the lock so no message is handled before the initial-pending
	// count decides whether the watch is already synced.
	w.mu.Lock()
	defer w.mu.Unlock()
	sub, err := w.n.legacy.Subscribe(subj, w.handle, opts...)
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot subscribe to intents")
	}
	closed := make(chan struct{})
	sub.SetClosedHandler(func(string) { close(closed) })
	if pending, err := sub.InitialConsumerPending(); err == nil && pending == 0 {
		w.markSynced()
	}
	return sub, closed, nil
}

// markSynced calls Synced once, and once more after each reconnect. w.mu
// must be held.
func (w *intentWatch) markSynced() {
	if !w.synced || w.catchingUp {
		w.synced, w.catchingUp = true, false
		w.hs.synced()
	}
}

func (w *intentWatch) handle(m *nats.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return // not a stream message: nothing to resume from
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = meta.Sequence.Stream
	e := entry{
		key:      strings.TrimPrefix(m.Subject, wire.Subject(wire.BucketIntents, "")),
		revision: meta.Sequence.Stream,
		deleted:  isDeletion(m.Header),
		value:    m.Data,
	}
	if err := w.hs.deliver(w.n.cfg.Node, e); err != nil {
		reason := w.n.cfg.Rejections.Add(err)
		w.n.cfg.Log.Info("Rejected intent", "subject", m.Subject, "revision", meta.Sequence.Stream, "reason", reason, "error", err)
	}
	if meta.NumPending == 0 {
		w.markSynced()
	}
}

// jsErrCodeStoreFailed is nats-server's JSStreamStoreFailedF, which it
// answers a message past a stream's limits with; nats.go names no constant
// for it.
const jsErrCodeStoreFailed jetstream.ErrorCode = 10077

// atBound says whether a store failure's description is a stream's limit
// on messages or bytes (nats-server's ErrMaxMsgs and ErrMaxBytes).
func atBound(description string) bool {
	return strings.Contains(description, "maximum messages exceeded") || strings.Contains(description, "maximum bytes exceeded")
}

// isDeletion reports a KV delete or purge, or a server marker for a key that
// aged out or was removed.
func isDeletion(h nats.Header) bool {
	return h.Get(hdrOperation) != "" || h.Get(hdrMarkerReason) != ""
}
