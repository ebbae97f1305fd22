package natswire

// Console sessions: a guest's serial console or display, carried between the
// agent of its node and the hub over core NATS on the subjects of
// wire.ConsoleOpen. On them:
//
//   - The agent's first message on the out subject answers the open: header
//     Virtfleet-Console "opened", with Virtfleet-Console-Rate the bytes per
//     second it passes on of the session's input, so that the hub paces its
//     writes instead of overflowing the agent; or "refused", with
//     Virtfleet-Console-Reason a wire.ConsoleRefusal and the message as body.
//   - Then both sides send data: messages without that header, the stream's
//     bytes as body, numbered from 1 in Virtfleet-Console-Seq. Core NATS
//     delivers at most once (a reconnect or a slow consumer drops messages);
//     a gap ends the session rather than corrupting a terminal or a VNC
//     stream.
//   - A side that has sent nothing for a while sends "ping"; a side that has
//     heard nothing from the other for ConsoleTimeout ends the session, so a
//     hub that died never leaves a guest's console held on the node.
//   - Either side ends the session with "closed": without a body the stream
//     ended, and the other side reads io.EOF; with one, the body says what
//     went wrong.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Defaults of ConsoleLimits.
const (
	DefaultConsoleSessions = 8
	// DefaultConsoleBytesPerSecond keeps the VNC display of a small
	// framebuffer usable while a node's sessions together stay a small
	// share of its link.
	DefaultConsoleBytesPerSecond = 1 << 20
)

// ConsoleChunkBytes is the most of a stream one message carries, well under
// NATS's smallest usual max payload (1 MiB), so a console never competes
// with intents for it.
const ConsoleChunkBytes = 32 << 10

// Timings and bounds of every console session. Each session reads them when
// it starts; tests shorten them before starting any.
var (
	// ConsolePingInterval is the longest a side stays silent: it pings when
	// it has sent nothing for half of it.
	ConsolePingInterval = 5 * time.Second
	// ConsoleTimeout is how long a side waits to hear from the other before
	// it ends the session. Several ping intervals, so that a busy server or
	// a short reconnect does not end a session that is alive.
	ConsoleTimeout = 20 * time.Second
	// ConsoleOpenTimeout is how long DialConsole waits for the node's
	// answer, and the agent for its backend to open the console: Nova and
	// KubeVirt connect to a proxy of their own first.
	ConsoleOpenTimeout = 10 * time.Second
	// ConsoleBufferBytes bounds what a side holds of the stream it
	// received and was not read yet. A reader that falls that far behind
	// ends the session with an error rather than growing without bound.
	ConsoleBufferBytes = 4 << 20
)

// consolePendingMsgs bounds the messages a console subscription queues
// before its handler (which never blocks) takes them; ConsoleBufferBytes
// bounds their bytes.
const consolePendingMsgs = 64 << 10

// Headers of console messages.
const (
	consoleHeader       = "Virtfleet-Console"
	consoleSeqHeader    = "Virtfleet-Console-Seq"
	consoleReasonHeader = "Virtfleet-Console-Reason"
	consoleRateHeader   = "Virtfleet-Console-Rate"
)

// Values of consoleHeader; data messages have none.
const (
	consoleOpened  = "opened"
	consoleRefused = "refused"
	consoleClosed  = "closed"
	consolePing    = "ping"
)

// ConsoleLimits bound what consoles may take of a node.
type ConsoleLimits struct {
	// Sessions open at once on the node; 0 means DefaultConsoleSessions.
	// An open beyond them is refused with wire.ConsoleBusy, and so is one
	// beyond half of them (one, at the least) for the VMs of one
	// namespace (wire.ConsoleOpen.Namespace): the hub bounds a
	// namespace's sessions across the fleet, but that share could still
	// be every session of one node.
	Sessions int
	// BytesPerSecond of each session in each direction; 0 means
	// DefaultConsoleBytesPerSecond.
	BytesPerSecond int
}

func (l ConsoleLimits) withDefaults() ConsoleLimits {
	if l.Sessions <= 0 {
		l.Sessions = DefaultConsoleSessions
	}
	if l.BytesPerSecond <= 0 {
		l.BytesPerSecond = DefaultConsoleBytesPerSecond
	}
	return l
}

// ConsoleRefusedError is a console the node did not open, and why. The
// agent's open function returns it to refuse for a reason of its own; the
// hub's DialConsole returns the node's refusal as one.
type ConsoleRefusedError struct {
	Reason  wire.ConsoleRefusal
	Message string
}

func (e *ConsoleRefusedError) Error() string {
	return "console refused (" + string(e.Reason) + "): " + e.Message
}

// refusal is the reason and message an open error is refused with: its
// own, or wire.ConsoleFailed with the error's message for any other.
func refusal(err error) (wire.ConsoleRefusal, string) {
	var re *ConsoleRefusedError
	if !errors.As(err, &re) {
		return wire.ConsoleFailed, err.Error()
	}
	return knownRefusal(re.Reason), re.Message
}

// knownRefusal reads a reason this version does not know as
// wire.ConsoleFailed, so callers can switch on the four.
func knownRefusal(r wire.ConsoleRefusal) wire.ConsoleRefusal {
	switch r {
	case wire.ConsoleNotFound, wire.ConsoleUnavailable, wire.ConsoleBusy, wire.ConsoleFailed:
		return r
	}
	return wire.ConsoleFailed
}

// NewConsoleSession is a fresh, random session id: 128 bits, one subject
// token.
func NewConsoleSession() string {
	return rand.Text()
}

// ServeConsoles serves node's console sessions until ctx is done, then ends
// every session it holds and returns nil. It returns an error only when it
// cannot subscribe to node's opens.
//
// For every open the hub publishes for node it calls open, which returns the
// guest's console stream, or a *ConsoleRefusedError to refuse for a reason
// of its own; any other error refuses with wire.ConsoleFailed. An open that
// cannot be read is logged and skipped, and refused when its session can
// still be told. Beyond limits.Sessions sessions it refuses with
// wire.ConsoleBusy without calling open. The stream open returns is Closed
// when the session ends, whichever side ends it.
//
// It only ever subscribes to node's own open and input subjects and
// publishes on node's output subjects, as AgentPermissions allows.
func ServeConsoles(ctx context.Context, nc *nats.Conn, node string, limits ConsoleLimits, log logging.Logger, open func(context.Context, wire.ConsoleOpen) (io.ReadWriteCloser, error)) error {
	subject, err := wire.ConsoleOpenSubject(node)
	if err != nil {
		return err
	}
	if log == nil {
		log = logging.NewNopLogger()
	}
	s := &consoleServer{nc: nc, node: node, limits: limits.withDefaults(), log: log, open: open, active: map[string]*consoleLink{}, namespaces: map[string]int{}}
	sub, err := nc.Subscribe(subject, s.handleOpen)
	if err != nil {
		return errors.Wrapf(err, "cannot subscribe to %s", subject)
	}
	<-ctx.Done()
	if err := sub.Unsubscribe(); err != nil {
		log.Debug("Cannot unsubscribe from console opens", "error", err)
	}
	s.mu.Lock()
	s.stopped = true
	links := make([]*consoleLink, 0, len(s.active))
	for _, l := range s.active {
		links = append(links, l)
	}
	s.mu.Unlock()
	for _, l := range links {
		l.end(errors.New("the agent is stopping"), true)
	}
	s.wg.Wait()
	return nil
}

// consoleServer is the agent's side of one node's console sessions.
type consoleServer struct {
	nc     *nats.Conn
	node   string
	limits ConsoleLimits
	log    logging.Logger
	open   func(context.Context, wire.ConsoleOpen) (io.ReadWriteCloser, error)

	mu sync.Mutex
	// active are the sessions that hold a slot, by session id, from the
	// open until their stream is closed.
	active map[string]*consoleLink
	// namespaces counts the active sessions by the namespace they opened
	// for.
	namespaces map[string]int
	stopped    bool
	wg         sync.WaitGroup
}

// handleOpen runs on the open subscription's goroutine: it never waits for
// the backend, so one slow console does not hold up the next open.
func (s *consoleServer) handleOpen(m *nats.Msg) {
	o, err := wire.DecodeConsoleOpen(m.Data)
	if err != nil {
		s.log.Info("Ignoring a console open that cannot be read", "reason", Reason(err), "error", err)
		// A newer hub waits for an answer; tell it why, if it can be told.
		var loose struct {
			Session string `json:"session"`
		}
		if json.Unmarshal(m.Data, &loose) == nil && wire.ValidateToken("session", loose.Session) == nil {
			s.refuse(loose.Session, wire.ConsoleFailed, err.Error())
		}
		return
	}
	in, err := wire.ConsoleInSubject(s.node, o.Session)
	if err != nil {
		s.log.Info("Ignoring a console open with an invalid session", "error", err)
		return
	}
	out, err := wire.ConsoleOutSubject(s.node, o.Session)
	if err != nil {
		s.log.Info("Ignoring a console open with an invalid session", "error", err)
		return
	}
	log := s.log.WithValues("session", o.Session, "uid", o.UID, "kind", o.Kind)

	s.mu.Lock()
	switch {
	case s.stopped:
		s.mu.Unlock()
		s.refuse(o.Session, wire.ConsoleFailed, "the agent is stopping")
		return
	case s.active[o.Session] != nil:
		// Answering would be read as part of the live session.
		s.mu.Unlock()
		log.Info("Ignoring a second open of a console session")
		return
	case len(s.active) >= s.limits.Sessions:
		s.mu.Unlock()
		log.Info("Refusing a console session: the node's limit is reached", "sessions", s.limits.Sessions)
		s.refuse(o.Session, wire.ConsoleBusy, "the node has "+strconv.Itoa(s.limits.Sessions)+" console sessions open, as many as it allows")
		return
	case s.namespaces[o.Namespace] >= s.perNamespace():
		s.mu.Unlock()
		log.Info("Refusing a console session: the namespace's share of the node is reached", "namespace", o.Namespace, "sessions", s.perNamespace())
		s.refuse(o.Session, wire.ConsoleBusy, fmt.Sprintf("namespace %s has %d console sessions open on the node, as many as one namespace may", o.Namespace, s.perNamespace()))
		return
	}
	l := newConsoleLink(s.nc, out, "hub", s.limits.BytesPerSecond)
	s.active[o.Session] = l
	s.namespaces[o.Namespace]++
	s.wg.Add(1)
	s.mu.Unlock()

	// Subscribed before the answer, and before the backend is asked, so
	// neither the first input nor a hub that gives up is missed.
	sub, err := s.nc.Subscribe(in, l.handle)
	if err != nil {
		l.end(errors.Wrapf(err, "cannot subscribe to %s", in), false)
		s.refuse(o.Session, wire.ConsoleFailed, "the agent cannot receive the session's input")
		s.release(o)
		return
	}
	l.subscribed(sub)
	go s.serve(o, l, log)
}

// refuse answers an open that holds no slot.
func (s *consoleServer) refuse(session string, reason wire.ConsoleRefusal, msg string) {
	out, err := wire.ConsoleOutSubject(s.node, session)
	if err != nil {
		return
	}
	m := nats.NewMsg(out)
	m.Header.Set(consoleHeader, consoleRefused)
	m.Header.Set(consoleReasonHeader, string(reason))
	m.Data = []byte(msg)
	if err := s.nc.PublishMsg(m); err != nil {
		s.log.Debug("Cannot refuse a console session", "session", session, "error", err)
	}
}

// perNamespace is how many sessions the VMs of one namespace may hold.
func (s *consoleServer) perNamespace() int { return max(1, s.limits.Sessions/2) }

func (s *consoleServer) release(o wire.ConsoleOpen) {
	s.mu.Lock()
	delete(s.active, o.Session)
	if s.namespaces[o.Namespace]--; s.namespaces[o.Namespace] == 0 {
		delete(s.namespaces, o.Namespace)
	}
	s.mu.Unlock()
	s.wg.Done()
}

// serve opens the console and carries the session until it ends.
func (s *consoleServer) serve(o wire.ConsoleOpen, l *consoleLink, log logging.Logger) {
	defer s.release(o)
	ctx, cancel := context.WithTimeout(l.ctx, l.openTimeout)
	stream, err := s.open(ctx, o)
	cancel()
	switch {
	case l.ctx.Err() != nil:
		// The hub gave up, or the agent stops, while the console opened.
		if stream != nil {
			_ = stream.Close()
		}
		return
	case err == nil && stream == nil:
		err = errors.New("the backend opened no console stream")
		fallthrough
	case err != nil:
		reason, msg := refusal(err)
		log.Info("Refusing a console session", "reason", reason, "error", err)
		l.answer(consoleRefused, func(m *nats.Msg) {
			m.Header.Set(consoleReasonHeader, string(reason))
			m.Data = []byte(msg)
		})
		l.end(&ConsoleRefusedError{Reason: reason, Message: msg}, false)
		return
	}
	log.Info("Console session opened")
	// The hub pings from its answer on; the open's own time is not silence.
	l.touch()
	l.answer(consoleOpened, func(m *nats.Msg) {
		m.Header.Set(consoleRateHeader, strconv.Itoa(s.limits.BytesPerSecond))
	})
	go l.keepalive()

	// The guest's output goes out paced by the link; its input is paced
	// here, as a hub that does not pace its writes gets no more through.
	drain, stopDrain := context.WithCancel(context.Background())
	defer stopDrain()
	outDone, inDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(outDone)
		buf := make([]byte, l.chunk)
		for {
			n, err := stream.Read(buf)
			if n > 0 {
				if _, werr := l.write(buf[:n]); werr != nil {
					return
				}
			}
			switch {
			case errors.Is(err, io.EOF):
				l.end(io.EOF, true)
				return
			case err != nil:
				l.end(errors.Wrap(err, "cannot read the guest's console"), true)
				return
			}
		}
	}()
	go func() {
		defer close(inDone)
		limit, chunk := consoleLimiter(s.limits.BytesPerSecond)
		buf := make([]byte, chunk)
		for {
			n, err := l.in.Read(buf)
			if n > 0 {
				if limit.WaitN(drain, n) != nil {
					return
				}
				if _, werr := stream.Write(buf[:n]); werr != nil {
					l.end(errors.Wrap(werr, "cannot write to the guest's console"), true)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()

	<-l.ctx.Done()
	if errors.Is(l.cause(), io.EOF) {
		// The hub closed: what it sent before goes to the guest first,
		// unless the guest does not take it.
		t := time.NewTimer(l.ping)
		select {
		case <-inDone:
		case <-t.C:
		}
		t.Stop()
	}
	stopDrain()
	if err := stream.Close(); err != nil {
		log.Debug("Cannot close a console stream", "error", err)
	}
	<-outDone
	<-inDone
	log.Info("Console session ended", "why", l.cause())
}

// DialConsole opens a session to a console of a guest on node, as the hub:
// it publishes open and waits, for ConsoleOpenTimeout at most and while ctx
// lasts, for the node's answer. An open without a session gets a fresh one
// (NewConsoleSession). ctx bounds the dial only; the session lasts until it
// is closed, as with net.Dialer.DialContext.
//
// A refusal is returned as a *ConsoleRefusedError; an open that is not
// valid, or a node name that is not, as the wire's error.
//
// Reading the stream yields the guest's output in order, then io.EOF once
// the node ends the session (or an error naming why it ended otherwise).
// Writing sends input, in chunks of ConsoleChunkBytes at most and paced to
// the rate the node takes. Close tells the node and frees the session.
// Output the caller does not read is held up to ConsoleBufferBytes; beyond
// that the session ends with an error.
func DialConsole(ctx context.Context, nc *nats.Conn, node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error) {
	if open.Session == "" {
		open.Session = NewConsoleSession()
	}
	body, err := wire.EncodeConsoleOpen(open)
	if err != nil {
		return nil, err
	}
	subject, err := wire.ConsoleOpenSubject(node)
	if err != nil {
		return nil, err
	}
	in, err := wire.ConsoleInSubject(node, open.Session)
	if err != nil {
		return nil, err
	}
	out, err := wire.ConsoleOutSubject(node, open.Session)
	if err != nil {
		return nil, err
	}

	l := newConsoleLink(nc, in, "node", 0)
	answer := make(chan error, 1)
	answered := false // only the subscription's goroutine reads it
	sub, err := nc.Subscribe(out, func(m *nats.Msg) {
		if answered {
			l.handle(m)
			return
		}
		switch m.Header.Get(consoleHeader) {
		case consoleOpened:
			answered = true
			if bps, err := strconv.Atoi(m.Header.Get(consoleRateHeader)); err == nil && bps > 0 {
				l.pace, l.chunk = consoleLimiter(bps)
			}
			l.touch()
			answer <- nil
		case consoleRefused:
			answered = true
			answer <- &ConsoleRefusedError{Reason: knownRefusal(wire.ConsoleRefusal(m.Header.Get(consoleReasonHeader))), Message: string(m.Data)}
		}
		// Nothing else comes before the answer.
	})
	if err != nil {
		return nil, errors.Wrapf(err, "cannot subscribe to %s", out)
	}
	l.subscribed(sub)
	// Subscribed first: the server takes a connection's messages in order,
	// so the subscription is in place before the node can see the open.
	if err := nc.Publish(subject, body); err != nil {
		l.end(err, false)
		return nil, errors.Wrapf(err, "cannot publish to %s", subject)
	}
	wait := time.NewTimer(l.openTimeout)
	defer wait.Stop()
	select {
	case err := <-answer:
		if err != nil {
			l.end(err, false)
			return nil, err
		}
	case <-ctx.Done():
		// Told, so that a node still opening frees the console at once.
		l.end(ctx.Err(), true)
		return nil, errors.Wrapf(ctx.Err(), "node %s did not answer the console open", node)
	case <-wait.C:
		err := errors.Errorf("node %s did not answer the console open within %s", node, l.openTimeout)
		l.end(err, true)
		return nil, err
	}
	go l.keepalive()
	return &consoleConn{l: l}, nil
}

// consoleConn is the hub's end of a session.
type consoleConn struct{ l *consoleLink }

func (c *consoleConn) Read(p []byte) (int, error)  { return c.l.in.Read(p) }
func (c *consoleConn) Write(p []byte) (int, error) { return c.l.write(p) }

// Close ends the session and tells the node; reads and writes after it fail
// with net.ErrClosed. Closing twice does nothing.
func (c *consoleConn) Close() error {
	c.l.end(net.ErrClosed, true)
	return nil
}

// consoleLimiter paces bps bytes a second, and the chunk each wait may ask
// for: a limiter refuses a wait larger than its burst.
func consoleLimiter(bps int) (*rate.Limiter, int) {
	chunk := min(ConsoleChunkBytes, bps)
	return rate.NewLimiter(rate.Limit(bps), chunk), chunk
}

// consoleLink is one side of a session: it publishes on the subject the
// other side receives on, hands what it receives on its subscription to a
// bounded buffer, pings while idle and ends the session on silence.
type consoleLink struct {
	nc      *nats.Conn
	subject string
	// peer names the other side in errors: "hub" or "node".
	peer string
	// pace, when set, paces what is sent, in chunks it allows.
	pace  *rate.Limiter
	chunk int
	in    *consolePipe

	ping, timeout, openTimeout time.Duration

	// ctx is done once the link ends.
	ctx    context.Context
	cancel context.CancelFunc

	// recvSeq is the number of the last data message received; only the
	// subscription's goroutine uses it.
	recvSeq uint64

	sendMu   sync.Mutex
	sendSeq  uint64
	lastSent time.Time

	mu    sync.Mutex
	sub   *nats.Subscription
	heard time.Time
	err   error
	ended bool
}

func newConsoleLink(nc *nats.Conn, subject, peer string, bps int) *consoleLink {
	l := &consoleLink{
		nc: nc, subject: subject, peer: peer, chunk: ConsoleChunkBytes,
		in:   &consolePipe{max: ConsoleBufferBytes},
		ping: ConsolePingInterval, timeout: ConsoleTimeout, openTimeout: ConsoleOpenTimeout,
		heard: time.Now(), lastSent: time.Now(),
	}
	if bps > 0 {
		l.pace, l.chunk = consoleLimiter(bps)
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// subscribed records the link's subscription, bounds what it may queue and
// drops it at once if the link already ended.
func (l *consoleLink) subscribed(sub *nats.Subscription) {
	_ = sub.SetPendingLimits(consolePendingMsgs, ConsoleBufferBytes)
	l.mu.Lock()
	l.sub = sub
	ended := l.ended
	l.mu.Unlock()
	if ended {
		_ = sub.Unsubscribe()
	}
}

func (l *consoleLink) touch() {
	l.mu.Lock()
	l.heard = time.Now()
	l.mu.Unlock()
}

// cause is why the link ended; nil while it runs.
func (l *consoleLink) cause() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// handle takes one message from the other side. It never blocks.
func (l *consoleLink) handle(m *nats.Msg) {
	l.touch()
	switch m.Header.Get(consoleHeader) {
	case "":
		seq, err := strconv.ParseUint(m.Header.Get(consoleSeqHeader), 10, 64)
		if err != nil || seq != l.recvSeq+1 {
			l.end(errors.Errorf("console session lost data from the %s: message %s came after %d", l.peer, m.Header.Get(consoleSeqHeader), l.recvSeq), true)
			return
		}
		l.recvSeq = seq
		if !l.in.push(m.Data) {
			l.end(errors.Errorf("console session ended: more than %d bytes from the %s were not read in time", l.in.max, l.peer), true)
		}
	case consoleClosed:
		if len(m.Data) == 0 {
			l.end(io.EOF, false)
			return
		}
		l.end(errors.Errorf("the %s ended the console session: %s", l.peer, m.Data), false)
	}
	// A ping only says the other side is there.
}

// answer sends the agent's answer to the open.
func (l *consoleLink) answer(kind string, fill func(*nats.Msg)) {
	m := nats.NewMsg(l.subject)
	m.Header.Set(consoleHeader, kind)
	fill(m)
	l.send(m)
}

// send publishes m unless the link ended.
func (l *consoleLink) send(m *nats.Msg) error {
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	if l.ctx.Err() != nil {
		return l.writeErr()
	}
	if m.Header.Get(consoleHeader) == "" {
		l.sendSeq++
		m.Header.Set(consoleSeqHeader, strconv.FormatUint(l.sendSeq, 10))
	}
	l.lastSent = time.Now()
	return l.nc.PublishMsg(m)
}

// write sends p as data, chunked and paced.
func (l *consoleLink) write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), l.chunk)
		if l.pace != nil {
			if err := l.pace.WaitN(l.ctx, c); err != nil {
				return n, l.writeErr()
			}
		}
		m := nats.NewMsg(l.subject)
		m.Data = p[:c]
		if err := l.send(m); err != nil {
			l.end(errors.Wrap(err, "cannot send console data"), true)
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

// writeErr is what a write after the end of the link returns.
func (l *consoleLink) writeErr() error {
	err := l.cause()
	if err == nil || errors.Is(err, io.EOF) {
		return io.ErrClosedPipe
	}
	return err
}

// keepalive pings while the link is idle and ends it once the other side
// has been silent for the timeout.
func (l *consoleLink) keepalive() {
	t := time.NewTicker(l.ping / 2)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		silent := time.Since(l.heard)
		l.mu.Unlock()
		if silent > l.timeout {
			l.end(errors.Errorf("the %s was not heard from for %s", l.peer, l.timeout.Round(time.Millisecond)), true)
			return
		}
		l.sendMu.Lock()
		idle := time.Since(l.lastSent) >= l.ping/2
		l.sendMu.Unlock()
		if idle {
			m := nats.NewMsg(l.subject)
			m.Header.Set(consoleHeader, consolePing)
			// A lost ping is only a ping; the timeout decides.
			_ = l.send(m)
		}
	}
}

// end ends the link once: err is what its reader reads after what it holds
// (net.ErrClosed discards that), and tell sends the other side "closed",
// with err as its body unless the stream simply ended.
func (l *consoleLink) end(err error, tell bool) {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.ended, l.err = true, err
	sub := l.sub
	l.mu.Unlock()

	// Under sendMu, so "closed" is the last message this side sends.
	l.sendMu.Lock()
	if tell {
		m := nats.NewMsg(l.subject)
		m.Header.Set(consoleHeader, consoleClosed)
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			m.Data = []byte(err.Error())
		}
		_ = l.nc.PublishMsg(m)
	}
	l.cancel()
	l.sendMu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	l.in.close(err, errors.Is(err, net.ErrClosed))
}

// consolePipe holds received bytes, up to max, until they are read.
type consolePipe struct {
	max int

	mu   sync.Mutex
	cond *sync.Cond
	buf  []byte
	err  error
}

func (p *consolePipe) init() {
	if p.cond == nil {
		p.cond = sync.NewCond(&p.mu)
	}
}

// push appends b; false if that would hold more than max.
func (p *consolePipe) push(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	if p.err != nil {
		return true
	}
	if len(p.buf)+len(b) > p.max {
		return false
	}
	p.buf = append(p.buf, b...)
	p.cond.Broadcast()
	return true
}

// Read blocks until there are bytes or the pipe is closed; once closed it
// returns what is left, then the error it was closed with.
func (p *consolePipe) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	for len(p.buf) == 0 && p.err == nil {
		p.cond.Wait()
	}
	if len(p.buf) == 0 {
		return 0, p.err
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	if len(p.buf) == 0 {
		p.buf = nil // let the array go rather than hold its peak
	}
	return n, nil
}

// close ends the pipe with err, discarding what it holds if discard.
func (p *consolePipe) close(err error, discard bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	if p.err == nil {
		p.err = err
	}
	if discard {
		p.buf = nil
	}
	p.cond.Broadcast()
}
