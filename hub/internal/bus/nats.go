package bus

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// DefaultTimeout bounds each write or delete (its read and its
// compare-and-set) when nothing else does. A request in flight when the
// connection is lost is never answered: such requests fail as soon as the
// client notices the loss (see connection). The timeout is the last resort
// for a connection that is broken without the client noticing. It is long
// because a slow answer is not a lost one: a write that times out is retried
// with backoff, and a NATS server on a machine saturated by a burst may take
// seconds to answer.
const DefaultTimeout = 30 * time.Second

// Config of a NATS bus.
type Config struct {
	Buckets natswire.BucketConfig
	// Timeout of each write or delete; 0 means DefaultTimeout.
	Timeout time.Duration
	// Log receives rejections and watch restarts; nil discards them.
	Log logging.Logger
	// Rejections counts refused values; nil allocates one (see NATS.Rejections).
	Rejections *natswire.Rejections
	// RetryInterval between attempts to re-establish a failed watch; 0 means 1s.
	RetryInterval time.Duration
	// ReportingRecheck is how old what the hub knows of the nodes' reports
	// streams may grow before a heartbeat has it checked again; 0 means
	// DefaultReportingRecheck.
	ReportingRecheck time.Duration
}

// DefaultReportingRecheck bounds how long a node's reports are refused
// after its reports stream was lost (deleted, or a JetStream store wiped)
// while the hub went on believing it there: the next heartbeat after that
// makes it again.
const DefaultReportingRecheck = time.Minute

// NATS is the Bus over JetStream key-value buckets.
type NATS struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	cfg     natswire.BucketConfig
	buckets map[string]jetstream.KeyValue

	// reporting are the nodes whose own reports stream the reports bucket
	// sources (natswire.EnsureNodeReports), by stream name, as last seen.
	reporting sync.Map
	// recheck is how often reporting is checked against JetStream;
	// checked is when it was last.
	recheck time.Duration
	checkMu sync.Mutex
	checked time.Time

	log     logging.Logger
	rej     *natswire.Rejections
	retry   time.Duration
	timeout time.Duration
	conn    *connection
}

var _ Bus = &NATS{}

// New creates the buckets if needed and binds to them. nc should reconnect
// forever (nats.MaxReconnects(-1)); watches resume on their own after it does.
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*NATS, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, errors.Wrap(err, "cannot open JetStream")
	}
	if err := natswire.EnsureBuckets(ctx, js, cfg.Buckets); err != nil {
		return nil, err
	}
	n := &NATS{nc: nc, js: js, cfg: cfg.Buckets, log: cfg.Log, rej: cfg.Rejections, retry: cfg.RetryInterval, timeout: cfg.Timeout, conn: watchConnection(nc)}
	n.recheck = cmp.Or(cfg.ReportingRecheck, DefaultReportingRecheck)
	if n.log == nil {
		n.log = logging.NewNopLogger()
	}
	if n.rej == nil {
		n.rej = &natswire.Rejections{}
	}
	if n.retry == 0 {
		n.retry = time.Second
	}
	if n.timeout == 0 {
		n.timeout = DefaultTimeout
	}
	n.buckets = map[string]jetstream.KeyValue{}
	for _, name := range []string{wire.BucketIntents, wire.BucketReports, wire.BucketNodes} {
		if n.buckets[name], err = js.KeyValue(ctx, name); err != nil {
			return nil, errors.Wrapf(err, "cannot bind bucket %s", name)
		}
	}
	reports, err := js.Stream(ctx, wire.Stream(wire.BucketReports))
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read bucket %s", wire.BucketReports)
	}
	for _, src := range reports.CachedInfo().Config.Sources {
		n.reporting.Store(src.Name, true)
	}
	n.checked = time.Now()
	return n, nil
}

// connection is a context for the requests sent over the current
// connection to the server: it is cancelled when that connection is lost.
// A request sent on it will not be answered then, and crossplane-runtime's
// managed reconciler gives a reconcile a minute: a VM whose write was sent
// just before NATS went away would wait that whole minute after NATS is
// back (make chaos kills NATS to check it). A request made while the client
// is reconnecting is buffered and sent on the next connection, which
// answers.
type connection struct {
	mu   sync.Mutex
	ctx  context.Context
	lost context.CancelFunc
}

// watchConnection follows nc's status until nc is closed.
func watchConnection(nc *nats.Conn) *connection {
	c := &connection{}
	c.ctx, c.lost = context.WithCancel(context.Background())
	changes := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	go func() {
		defer nc.RemoveStatusListener(changes)
		for status := range changes {
			c.mu.Lock()
			c.lost()
			c.ctx, c.lost = context.WithCancel(context.Background())
			c.mu.Unlock()
			if status == nats.CLOSED {
				return
			}
		}
	}()
	return c
}

func (c *connection) current() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctx
}

// request bounds one write or delete by the bus's timeout and by the
// connection it is sent on.
func (n *NATS) request(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	stop := context.AfterFunc(n.conn.current(), cancel)
	return ctx, func() { stop(); cancel() }
}

// Rejections counts the values this bus's watches refused.
func (n *NATS) Rejections() *natswire.Rejections { return n.rej }

// Put implements Bus: it stores value under key, compare-and-set against
// the revision read just before.
func (n *NATS) Put(ctx context.Context, bucket, key string, value []byte) (uint64, error) {
	if bucket == wire.BucketReports {
		return 0, errReportsAreTheNodes
	}
	kv, err := n.bucket(bucket)
	if err != nil {
		return 0, err
	}
	ctx, done := n.request(ctx)
	defer done()
	cur, err := kv.Get(ctx, key)
	var rev uint64
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err = kv.Create(ctx, key, value)
	case err != nil:
		return 0, errors.Wrapf(err, "cannot get %s", key)
	case bytes.Equal(cur.Value(), value):
		// A replayed write must not bump the revision: watchers would
		// see a change that is not one.
		return cur.Revision(), nil
	default:
		rev, err = kv.Update(ctx, key, value, cur.Revision())
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, &ConflictError{Key: key, Err: err}
	}
	return rev, errors.Wrapf(err, "cannot put %s", key)
}

// errReportsAreTheNodes refuses a write of a report by revision: the
// reports bucket's revisions are not those of the node's stream a write
// lands in (natswire.EnsureNodeReports), and the hub writes no report.
var errReportsAreTheNodes = errors.New("the hub writes no report and deletes one only by key: the bucket's revisions are not its node's stream's")

// Delete implements Bus: it removes key if present, compare-and-set.
func (n *NATS) Delete(ctx context.Context, bucket, key string) error {
	if bucket == wire.BucketReports {
		return n.deleteReport(ctx, key)
	}
	kv, err := n.bucket(bucket)
	if err != nil {
		return err
	}
	rctx, done := n.request(ctx)
	cur, err := kv.Get(rctx, key)
	done()
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return errors.Wrapf(err, "cannot get %s", key)
	}
	return n.DeleteAt(ctx, bucket, key, cur.Revision())
}

// deleteReport removes the report key if present, compare-and-set in the
// node's own stream, where the key lives; its marker expires as the
// agent's do (natswire.ReportDeletedTTL).
func (n *NATS) deleteReport(ctx context.Context, key string) error {
	stream, err := natswire.NodeReportsStreamOfKey(key)
	if err != nil {
		return err
	}
	ctx, done := n.request(ctx)
	defer done()
	s, err := n.js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // the node never reported
	}
	if err != nil {
		return errors.Wrapf(err, "cannot get %s", key)
	}
	subject := wire.Subject(wire.BucketReports, key)
	m, err := s.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil
	case err != nil:
		return errors.Wrapf(err, "cannot get %s", key)
	case m.Header.Get("KV-Operation") != "":
		return nil // deleted already
	}
	_, err = n.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: nats.Header{
		"KV-Operation":     []string{"DEL"},
		natswire.HeaderTTL: []string{natswire.ReportDeletedTTL.String()},
	}}, jetstream.WithExpectLastSequencePerSubject(m.Sequence))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return &ConflictError{Key: key, Err: err}
	}
	return errors.Wrapf(err, "cannot delete %s", key)
}

// DeleteAt implements Bus.
func (n *NATS) DeleteAt(ctx context.Context, bucket, key string, revision uint64) error {
	if bucket == wire.BucketReports {
		return errReportsAreTheNodes
	}
	kv, err := n.bucket(bucket)
	if err != nil {
		return err
	}
	ctx, done := n.request(ctx)
	defer done()
	err = kv.Delete(ctx, key, jetstream.LastRevision(revision))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return &ConflictError{Key: key, Err: err}
	}
	return errors.Wrapf(err, "cannot delete %s", key)
}

// List implements Bus: a watch of the bucket's metadata, stopped once it
// delivered the keys present when it began.
func (n *NATS) List(ctx context.Context, bucket string) ([]Entry, error) {
	kv, err := n.bucket(bucket)
	if err != nil {
		return nil, err
	}
	ctx, done := n.request(ctx)
	defer done()
	w, err := kv.WatchAll(ctx, jetstream.MetaOnly(), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, errors.Wrapf(err, "cannot list bucket %s", bucket)
	}
	defer func() { _ = w.Stop() }()
	var out []Entry
	for {
		select {
		case <-ctx.Done():
			return nil, errors.Wrapf(ctx.Err(), "cannot list bucket %s", bucket)
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil, errors.Errorf("cannot list bucket %s: the watch closed", bucket)
			case e == nil:
				return out, nil
			}
			out = append(out, Entry{Key: e.Key(), Revision: e.Revision()})
		}
	}
}

// Watch implements Bus.
func (n *NATS) Watch(ctx context.Context, bucket string, fn func(Entry) error) error {
	kv, err := n.bucket(bucket)
	if err != nil {
		return err
	}
	return n.watch(ctx, kv, func(e jetstream.KeyValueEntry) error {
		if e == nil {
			return fn(Entry{Synced: true})
		}
		deleted := e.Operation() != jetstream.KeyValuePut
		entry := Entry{Key: e.Key(), Revision: e.Revision(), Deleted: deleted}
		if !deleted {
			entry.Value = e.Value()
		}
		return fn(entry)
	})
}

// ensureReporting gives node its own reports stream, once; a failure is
// tried again at its next heartbeat.
func (n *NATS) ensureReporting(ctx context.Context, node string) error {
	stream := natswire.NodeReportsStream(wire.NodeToken(node))
	if _, ok := n.reporting.Load(stream); ok {
		return nil
	}
	ctx, done := n.request(ctx)
	defer done()
	if err := natswire.EnsureNodeReports(ctx, n.js, n.cfg, node); err != nil {
		return err
	}
	n.reporting.Store(stream, true)
	return nil
}

// DropNode implements Bus.
func (n *NATS) DropNode(ctx context.Context, node string) error {
	ctx, done := n.request(ctx)
	defer done()
	if err := natswire.DropNodeReports(ctx, n.js, node); err != nil {
		return err
	}
	n.reporting.Delete(natswire.NodeReportsStream(wire.NodeToken(node)))
	return nil
}

// recheckReporting forgets the nodes' reports streams that are no longer
// there or no longer sourced, once their cached fact is older than
// n.recheck, so that each node's next heartbeat makes its stream again. A
// stream can be lost behind the hub's back: deleted by an operator, or gone
// with a JetStream store wiped or a server restarted without it. Asking
// JetStream at each heartbeat would cost a request per node per heartbeat;
// this costs one listing per period for the whole fleet. A failed check is
// tried again at the next heartbeat.
func (n *NATS) recheckReporting(ctx context.Context) {
	n.checkMu.Lock()
	defer n.checkMu.Unlock()
	if time.Since(n.checked) < n.recheck {
		return
	}
	ctx, done := n.request(ctx)
	defer done()
	taken, err := natswire.CheckNodeReports(ctx, n.js)
	if err != nil {
		n.log.Info("Cannot check that the nodes' reports are taken", "error", err)
		return
	}
	n.checked = time.Now()
	n.reporting.Range(func(stream, _ any) bool {
		if name, _ := stream.(string); !taken[name] {
			n.reporting.Delete(stream)
			n.log.Info("A node's reports stream was lost; its next heartbeat makes it again", "stream", stream)
		}
		return true
	})
}

// bucket is the bound bucket of that name.
func (n *NATS) bucket(name string) (jetstream.KeyValue, error) {
	kv, ok := n.buckets[name]
	if !ok {
		return nil, errors.Errorf("no bucket %s", name)
	}
	return kv, nil
}

// watch feeds every entry of kv to handle until ctx is done. The underlying
// ordered consumer already survives reconnects; if it is torn down anyway the
// watch is re-created from the revision after the last one seen.
func (n *NATS) watch(ctx context.Context, kv jetstream.KeyValue, handle func(jetstream.KeyValueEntry) error) error {
	// The ordered consumer would notice a lost server only after missing
	// heartbeats for several seconds; re-watching on reconnect resumes at once.
	reconnected := n.nc.StatusChanged(nats.CONNECTED)
	defer n.nc.RemoveStatusListener(reconnected)
	var last uint64
	for {
		var opts []jetstream.WatchOpt
		if last > 0 {
			opts = append(opts, jetstream.ResumeFromRevision(last+1))
		}
		w, err := kv.WatchAll(ctx, opts...)
		if err == nil {
			last = n.drain(ctx, kv, w, last, reconnected, handle)
			_ = w.Stop()
			if ctx.Err() != nil {
				return nil
			}
			continue
		}
		n.log.Info("Cannot watch bucket; retrying", "bucket", kv.Bucket(), "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(n.retry):
		}
	}
}

// watchCheckEvery is how often a watch checks that it is not stuck (see
// drain).
const watchCheckEvery = 2 * time.Second

// drain handles entries until the watcher closes, the connection is
// re-established, the watch is stuck or ctx is done, and returns the last
// revision seen.
//
// Stuck: at the previous check the bucket held a revision after the last one
// seen, and since then no entry at all came (a watch that is merely behind,
// say in a burst, still makes progress and is left alone). The watch's
// ordered consumer lives on one server; when that server goes and the hub's
// connection stays on another, only missing heartbeats tell, which nats.go
// checks every 10 s, and the KV API offers no shorter heartbeat. Without
// this check, after the JetStream meta leader is killed (make chaos does),
// VMs would wait several such intervals for the report their status needs,
// and VMs created meanwhile for the watch's Synced to place them.
func (n *NATS) drain(ctx context.Context, kv jetstream.KeyValue, w jetstream.KeyWatcher, last uint64, reconnected <-chan nats.Status, handle func(jetstream.KeyValueEntry) error) uint64 {
	bucket := kv.Bucket()
	check := time.NewTicker(watchCheckEvery)
	defer check.Stop()
	var pending, seen uint64 // the bucket's newest revision and the last one seen, at the previous check
	for {
		select {
		case <-ctx.Done():
			return last
		case <-check.C:
			if pending > last && seen == last {
				n.log.Info("Watch stuck behind its bucket; resuming", "bucket", bucket, "revision", last, "bucketRevision", pending)
				return last
			}
			pending, seen = n.lastRevision(ctx, kv), last
		case <-reconnected:
			n.log.Debug("Reconnected; resuming watch", "bucket", bucket, "revision", last)
			return last
		case e, ok := <-w.Updates():
			if !ok {
				n.log.Info("Watch closed; resuming", "bucket", bucket, "revision", last)
				return last
			}
			if e == nil { // the end of the initial values
				_ = handle(nil)
				continue
			}
			last = e.Revision()
			if err := handle(e); err != nil {
				reason := n.rej.Add(err)
				n.log.Info("Rejected value", "bucket", bucket, "key", e.Key(), "revision", e.Revision(), "reason", reason, "error", err)
			}
		}
	}
}

// lastRevision is the newest revision kv holds, or 0 when it holds none (the
// nodes bucket's entries expire, and an expired revision is never delivered)
// or cannot be read within a check's interval (the server is away: the
// connection's own status then resumes the watch). It is asked from the
// watch's loop, so it waits no longer than that. A bucket's entries expire
// oldest first, so while it holds any, it holds its newest.
func (n *NATS) lastRevision(ctx context.Context, kv jetstream.KeyValue) uint64 {
	ctx, cancel := context.WithTimeout(ctx, watchCheckEvery)
	defer cancel()
	info, err := streamInfo(ctx, kv)
	if err != nil {
		return 0
	}
	if state := info.State; state.Msgs > 0 {
		return state.LastSeq
	}
	return 0
}

// streamInfo is what the stream holding kv says of itself now.
func streamInfo(ctx context.Context, kv jetstream.KeyValue) (*jetstream.StreamInfo, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read the state of bucket %s", kv.Bucket())
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return nil, errors.Errorf("bucket %s has no stream to read", kv.Bucket())
	}
	return bs.StreamInfo(), nil
}

func nodeEvent(key string, rev uint64, lost bool, value []byte) (NodeEvent, error) {
	node, err := wire.ParseNodeKey(key)
	if err != nil {
		return NodeEvent{}, err
	}
	ev := NodeEvent{Node: node, Revision: rev, Lost: lost}
	if lost {
		return ev, nil
	}
	if ev.Heartbeat, err = wire.DecodeNodeHeartbeat(value); err != nil {
		return NodeEvent{}, err
	}
	if ev.Heartbeat.Node != node {
		return NodeEvent{}, &natswire.MismatchError{Key: key, Want: node, Got: ev.Heartbeat.Node}
	}
	return ev, nil
}

// OpenConsole implements Bus over the bus's own connection.
func (n *NATS) OpenConsole(ctx context.Context, node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error) {
	return natswire.DialConsole(ctx, n.nc, node, open)
}

// BucketUsage is how full one of the buckets is.
type BucketUsage struct {
	// NATS names the servers holding the bucket: their JetStream
	// cluster's name, or the server's own when it is not clustered.
	NATS   string
	Bucket string
	// Bytes are what the bucket's stream stores; MaxBytes its limit (0 or
	// less: none). Past the limit JetStream refuses new values.
	Bytes, MaxBytes int64
	// Values are the messages it stores: current values, and the deletes'
	// and expiries' markers.
	Values uint64
}

// BucketUsage reads how full each bucket is, as its stream says now.
func (n *NATS) BucketUsage(ctx context.Context) ([]BucketUsage, error) {
	out := make([]BucketUsage, 0, len(n.buckets))
	server := n.nc.ConnectedServerName()
	for _, name := range slices.Sorted(maps.Keys(n.buckets)) {
		info, err := streamInfo(ctx, n.buckets[name])
		if err != nil {
			return nil, err
		}
		servers := server
		if info.Cluster != nil && info.Cluster.Name != "" {
			servers = info.Cluster.Name
		}
		out = append(out, BucketUsage{NATS: servers, Bucket: name, Bytes: int64(info.State.Bytes), MaxBytes: info.Config.MaxBytes, Values: info.State.Msgs}) //nolint:gosec // a stream's bytes fit
	}
	return out, nil
}

// NodeReportUsage is how full one node's own reports stream is
// (natswire.EnsureNodeReports).
type NodeReportUsage struct {
	// NATS names the servers holding the stream, as BucketUsage does.
	NATS string
	Node string
	// Values are the report keys the node holds (values and the markers
	// of deleted ones), Bytes what they take; past either Max the node's
	// new reports are refused.
	Values, MaxValues int64
	Bytes, MaxBytes   int64
}

// NodeReportUsage reads how full each node's reports are, in one listing
// of the streams that take reports.
func (n *NATS) NodeReportUsage(ctx context.Context) ([]NodeReportUsage, error) {
	server := n.nc.ConnectedServerName()
	var out []NodeReportUsage
	list := n.js.ListStreams(ctx, jetstream.WithStreamListSubject(wire.Subject(wire.BucketReports, ">")))
	for info := range list.Info() {
		if len(info.Config.Subjects) != 1 || !strings.HasPrefix(info.Config.Name, "REPORTS_") {
			continue
		}
		token := strings.TrimSuffix(strings.TrimPrefix(info.Config.Subjects[0], wire.Subject(wire.BucketReports, "")), ".>")
		node, err := wire.NodeFromToken(token)
		if err != nil {
			continue
		}
		servers := server
		if info.Cluster != nil && info.Cluster.Name != "" {
			servers = info.Cluster.Name
		}
		out = append(out, NodeReportUsage{
			NATS: servers, Node: node,
			Values: int64(info.State.Msgs), MaxValues: info.Config.MaxMsgs, //nolint:gosec // a stream's messages fit
			Bytes: int64(info.State.Bytes), MaxBytes: info.Config.MaxBytes, //nolint:gosec // a stream's bytes fit
		})
	}
	if err := list.Err(); err != nil {
		return nil, errors.Wrap(err, "cannot list the nodes' reports")
	}
	return out, nil
}
