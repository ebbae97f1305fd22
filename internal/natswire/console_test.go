package natswire_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// TestMain shortens the console timings once, before any session reads
// them: a vanished side is then noticed within seconds.
func TestMain(m *testing.M) {
	natswire.ConsolePingInterval = 100 * time.Millisecond
	natswire.ConsoleTimeout = 3 * time.Second
	natswire.ConsoleOpenTimeout = 3 * time.Second
	os.Exit(m.Run())
}

// waitFor bounds every wait on a condition; generous, for a busy machine.
const waitFor = 15 * time.Second

// consoleFleet is a real nats-server with the hub and the agents of node1
// and node2 as users.
type consoleFleet struct {
	srv    *natstest.Server
	hubID  natswire.Identity
	hub    *nats.Conn
	agents map[string]natswire.Identity
}

func newConsoleFleet(t testing.TB) *consoleFleet {
	t.Helper()
	hub, agents, users := natstest.Identities(t, "node1", "node2")
	srv := natstest.New(t, users...)
	nc, _ := natstest.Connect(t, srv, hub)
	return &consoleFleet{srv: srv, hubID: hub, hub: nc, agents: agents}
}

// guest is one console the fake backend opened: the test holds the guest's
// end; the agent got the other.
type guest struct {
	open   wire.ConsoleOpen
	end    net.Conn
	closed chan struct{} // closed when the agent closes its stream
}

// backend plays a driver's OpenConsole.
type backend struct {
	// err, when set, is what every open returns.
	err    error
	opened chan *guest
	opens  atomic.Int32
}

func newBackend() *backend { return &backend{opened: make(chan *guest, 64)} }

func (b *backend) open(_ context.Context, o wire.ConsoleOpen) (io.ReadWriteCloser, error) {
	b.opens.Add(1)
	if b.err != nil {
		return nil, b.err
	}
	agentEnd, guestEnd := net.Pipe()
	g := &guest{open: o, end: guestEnd, closed: make(chan struct{})}
	b.opened <- g
	return &recordClose{Conn: agentEnd, closed: g.closed}, nil
}

// next is the guest of the next console opened.
func (b *backend) next(t testing.TB) *guest {
	t.Helper()
	select {
	case g := <-b.opened:
		t.Cleanup(func() { _ = g.end.Close() })
		return g
	case <-time.After(waitFor):
		t.Fatal("the backend was not asked for a console")
		return nil
	}
}

type recordClose struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (r *recordClose) Close() error {
	r.once.Do(func() { close(r.closed) })
	return r.Conn.Close()
}

// serve runs node's agent's console server on a connection of its own until
// the test ends, and returns once it receives opens. stop ends it early; it
// returns what ServeConsoles returned.
func (f *consoleFleet) serve(t testing.TB, node string, limits natswire.ConsoleLimits, b *backend) (agent *nats.Conn, stop func() error) {
	t.Helper()
	nc, _ := natstest.Connect(t, f.srv, f.agents[node])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- natswire.ServeConsoles(ctx, nc, node, limits, logging.NewNopLogger(), b.open) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(waitFor):
				err = errors.New("ServeConsoles did not return")
			}
		})
		return err
	}
	t.Cleanup(func() { require.NoError(t, stop()) })
	// The subscription is in place once the server has answered a flush
	// sent after it.
	require.Eventually(t, func() bool { return nc.NumSubscriptions() > 0 }, waitFor, 5*time.Millisecond)
	require.NoError(t, nc.Flush())
	return nc, stop
}

func (f *consoleFleet) dial(t testing.TB, nc *nats.Conn, node string, o wire.ConsoleOpen) io.ReadWriteCloser {
	t.Helper()
	s, err := natswire.DialConsole(context.Background(), nc, node, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func vnc(uid string) wire.ConsoleOpen { return wire.ConsoleOpen{UID: uid, Kind: wire.ConsoleVNC} }

func vncIn(namespace, uid string) wire.ConsoleOpen {
	open := vnc(uid)
	open.Namespace = namespace
	return open
}

// readN reads exactly n bytes of r, or fails the test after waitFor.
func readN(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		ch <- result{b, err}
	}()
	select {
	case res := <-ch:
		require.NoError(t, res.err)
		return res.b
	case <-time.After(waitFor):
		t.Fatalf("did not read %d bytes in time", n)
		return nil
	}
}

// readErr reads r to its end and returns the error it ends with.
func readErr(t *testing.T, r io.Reader) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		if err == nil {
			err = io.EOF // io.Copy reports a clean end as nil
		}
		ch <- err
	}()
	select {
	case err := <-ch:
		return err
	case <-time.After(waitFor):
		t.Fatal("the stream did not end")
		return nil
	}
}

func waitClosed(t *testing.T, g *guest, within time.Duration) {
	t.Helper()
	select {
	case <-g.closed:
	case <-time.After(within):
		t.Fatalf("the agent did not close the console of %s within %s", g.open.UID, within)
	}
}

func write(t *testing.T, w io.Writer, b []byte) {
	t.Helper()
	go func() { _, _ = w.Write(b) }()
}

func TestConsoleRoundTrip(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{}, b)

	s := f.dial(t, f.hub, "node1", wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleSerial})
	g := b.next(t)
	assert.Equal(t, "vm-a", g.open.UID)
	assert.Equal(t, wire.ConsoleSerial, g.open.Kind)
	assert.NoError(t, wire.ValidateToken("session", g.open.Session), "the hub made a session id")

	// Many small writes each way, as keystrokes and screen updates are:
	// they arrive whole and in order.
	var in, out bytes.Buffer
	for i := range 200 {
		fmt.Fprintf(&in, "key %d;", i)
		fmt.Fprintf(&out, "line %d\r\n", i)
	}
	go func() {
		for _, l := range bytes.SplitAfter(in.Bytes(), []byte(";")) {
			if _, err := s.Write(l); err != nil {
				return
			}
		}
	}()
	go func() {
		for _, l := range bytes.SplitAfter(out.Bytes(), []byte("\n")) {
			if _, err := g.end.Write(l); err != nil {
				return
			}
		}
	}()
	assert.Equal(t, in.String(), string(readN(t, g.end, in.Len())), "input reaches the guest in order")
	assert.Equal(t, out.String(), string(readN(t, s, out.Len())), "output reaches the hub in order")
}

func TestConsoleCarriesALargePayloadIntact(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{BytesPerSecond: 256 << 20}, b)
	s := f.dial(t, f.hub, "node1", vnc("vm-a"))
	g := b.next(t)

	// Less than a side holds unread (ConsoleBufferBytes), as the readers
	// here may fall behind on a busy machine.
	in, out := make([]byte, 3<<20+123), make([]byte, 3<<20+7)
	_, _ = rand.Read(in)
	_, _ = rand.Read(out)
	write(t, s, in)
	write(t, g.end, out)
	var wg sync.WaitGroup
	var gotIn, gotOut []byte
	wg.Go(func() { gotIn = readN(t, g.end, len(in)) })
	wg.Go(func() { gotOut = readN(t, s, len(out)) })
	wg.Wait()
	assert.True(t, bytes.Equal(in, gotIn), "the input arrives intact")
	assert.True(t, bytes.Equal(out, gotOut), "the output arrives intact")
}

func TestConsoleRefusals(t *testing.T) {
	cases := map[string]struct {
		err         error
		wantReason  wire.ConsoleRefusal
		wantMessage string
	}{
		"NotFound": {
			err:        &natswire.ConsoleRefusedError{Reason: wire.ConsoleNotFound, Message: "no guest vm-a on node1"},
			wantReason: wire.ConsoleNotFound, wantMessage: "no guest vm-a on node1",
		},
		"Unavailable": {
			err:        fmt.Errorf("libvirt: %w", &natswire.ConsoleRefusedError{Reason: wire.ConsoleUnavailable, Message: "guest is not running"}),
			wantReason: wire.ConsoleUnavailable, wantMessage: "guest is not running",
		},
		"AnyOtherErrorFails": {
			err:        errors.New("cannot reach libvirtd"),
			wantReason: wire.ConsoleFailed, wantMessage: "cannot reach libvirtd",
		},
		"AnUnknownReasonFails": {
			err:        &natswire.ConsoleRefusedError{Reason: "Sleepy", Message: "later"},
			wantReason: wire.ConsoleFailed, wantMessage: "later",
		},
	}
	f := newConsoleFleet(t)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := newBackend()
			b.err = tc.err
			_, stop := f.serve(t, "node1", natswire.ConsoleLimits{}, b)
			defer func() { require.NoError(t, stop()) }()

			_, err := natswire.DialConsole(context.Background(), f.hub, "node1", vnc("vm-a"))
			var re *natswire.ConsoleRefusedError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, tc.wantReason, re.Reason)
			assert.Equal(t, tc.wantMessage, re.Message)
		})
	}
}

func TestConsoleRefusesOpensItCannotRead(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{}, b)

	cases := map[string]struct {
		open        string
		wantMessage string
	}{
		"ANewerProtocolVersion": {open: `{"protocolVersion":2,"session":"s-new","uid":"vm-a","kind":"vnc"}`, wantMessage: "upgrade"},
		"AnUnknownKind":         {open: `{"protocolVersion":1,"session":"s-kind","uid":"vm-a","kind":"spice"}`, wantMessage: "spice"},
		"AnUnsafeUID":           {open: `{"protocolVersion":1,"session":"s-uid","uid":"vm.a","kind":"vnc"}`, wantMessage: "vm.a"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var o struct{ Session string }
			require.NoError(t, json.Unmarshal([]byte(tc.open), &o))
			out, err := wire.ConsoleOutSubject("node1", o.Session)
			require.NoError(t, err)
			sub, err := f.hub.SubscribeSync(out)
			require.NoError(t, err)
			defer func() { _ = sub.Unsubscribe() }()
			open, err := wire.ConsoleOpenSubject("node1")
			require.NoError(t, err)
			require.NoError(t, f.hub.Publish(open, []byte(tc.open)))

			m, err := sub.NextMsg(waitFor)
			require.NoError(t, err)
			assert.Equal(t, "refused", m.Header.Get("Virtfleet-Console"))
			assert.Equal(t, string(wire.ConsoleFailed), m.Header.Get("Virtfleet-Console-Reason"))
			assert.Contains(t, string(m.Data), tc.wantMessage)
		})
	}
	assert.Zero(t, b.opens.Load(), "the backend is never asked for an open that cannot be read")

	f.dial(t, f.hub, "node1", vnc("vm-a"))
	b.next(t)
}

func TestConsoleSessionLimit(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{Sessions: 2}, b)

	first := f.dial(t, f.hub, "node1", vncIn("team-a", "vm-a"))
	g := b.next(t)
	f.dial(t, f.hub, "node1", vncIn("team-b", "vm-b"))
	b.next(t)

	_, err := natswire.DialConsole(context.Background(), f.hub, "node1", vncIn("team-c", "vm-c"))
	var re *natswire.ConsoleRefusedError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, wire.ConsoleBusy, re.Reason)
	assert.Equal(t, int32(2), b.opens.Load(), "a refused session never reaches the backend")

	require.NoError(t, first.Close())
	waitClosed(t, g, waitFor)
	// The slot is free once the agent is done with the session, just after
	// it closed the stream.
	require.Eventually(t, func() bool {
		s, err := natswire.DialConsole(context.Background(), f.hub, "node1", vncIn("team-c", "vm-c"))
		if err != nil {
			return false
		}
		t.Cleanup(func() { _ = s.Close() })
		return true
	}, waitFor, 10*time.Millisecond)
}

// TestConsoleSessionsOfOneNamespaceLeaveTheNodeToOthers is an attack by a
// tenant with the console verb in its own namespace, through the hub (which
// names each open's namespace) to a node's agent on a real nats-server:
//
//  1. mallory, in tenant-a, has VMs on node1 and opens their consoles one
//     after another, holding each open;
//  2. alice, in tenant-b, opens the console of her VM on node1.
//
// The hub's share per namespace spans the fleet, so without a share of
// each node mallory's sessions took all of node1's, and alice's open was
// refused as Busy. Now the node refuses mallory's beyond half of its
// sessions, naming her namespace, and alice's opens.
func TestConsoleSessionsOfOneNamespaceLeaveTheNodeToOthers(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{Sessions: 4}, b)

	for _, uid := range []string{"vm-m1", "vm-m2"} {
		f.dial(t, f.hub, "node1", vncIn("tenant-a", uid))
		b.next(t)
	}
	for _, uid := range []string{"vm-m3", "vm-m4"} {
		_, err := natswire.DialConsole(context.Background(), f.hub, "node1", vncIn("tenant-a", uid))
		var re *natswire.ConsoleRefusedError
		require.ErrorAs(t, err, &re, "tenant-a's session beyond its share of the node")
		assert.Equal(t, wire.ConsoleBusy, re.Reason)
		assert.Equal(t, "namespace tenant-a has 2 console sessions open on the node, as many as one namespace may", re.Message)
	}
	f.dial(t, f.hub, "node1", vncIn("tenant-b", "vm-alice"))
	b.next(t)
	assert.Equal(t, int32(3), b.opens.Load(), "a refused session never reaches the backend")
}

func TestConsoleEnds(t *testing.T) {
	cases := map[string]struct {
		// end ends the session from one side.
		end func(t *testing.T, hub io.ReadWriteCloser, g *guest)
		// wantHubErr is what the hub's reads end with, after "bye".
		wantHubErr error
		// guestEOF: the guest, which did not end it, reads io.EOF.
		guestEOF bool
	}{
		"TheHubCloses": {
			end:        func(t *testing.T, hub io.ReadWriteCloser, _ *guest) { require.NoError(t, hub.Close()) },
			wantHubErr: net.ErrClosed,
			guestEOF:   true,
		},
		"TheGuestsConsoleEnds": {
			end:        func(t *testing.T, _ io.ReadWriteCloser, g *guest) { require.NoError(t, g.end.Close()) },
			wantHubErr: io.EOF,
		},
	}
	f := newConsoleFleet(t)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := newBackend()
			_, stop := f.serve(t, "node1", natswire.ConsoleLimits{}, b)
			defer func() { require.NoError(t, stop()) }()
			s := f.dial(t, f.hub, "node1", vnc("vm-a"))
			g := b.next(t)

			// What was sent before the end arrives before it.
			_, err := s.Write([]byte("hi"))
			require.NoError(t, err)
			assert.Equal(t, "hi", string(readN(t, g.end, 2)))
			write(t, g.end, []byte("bye"))
			assert.Equal(t, "bye", string(readN(t, s, 3)))

			tc.end(t, s, g)
			waitClosed(t, g, waitFor)
			if tc.guestEOF {
				assert.ErrorIs(t, readErr(t, g.end), io.EOF, "the guest's side ends")
			}
			assert.ErrorIs(t, readErr(t, s), tc.wantHubErr, "the hub's side ends")
			_, err = s.Write([]byte("more"))
			assert.Error(t, err, "a write after the end fails")
		})
	}
}

func TestConsoleVanishedHubFreesTheSession(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{Sessions: 1}, b)

	hub, _ := natstest.Connect(t, f.srv, f.hubID)
	f.dial(t, hub, "node1", vnc("vm-a"))
	g := b.next(t)
	start := time.Now()
	hub.Close() // no "closed" ever reaches the node

	waitClosed(t, g, natswire.ConsoleTimeout+waitFor)
	assert.GreaterOrEqual(t, time.Since(start), natswire.ConsoleTimeout-natswire.ConsolePingInterval,
		"the session ends for the hub's silence, not before")
	require.Eventually(t, func() bool {
		s, err := natswire.DialConsole(context.Background(), f.hub, "node1", vnc("vm-b"))
		if err != nil {
			return false
		}
		t.Cleanup(func() { _ = s.Close() })
		return true
	}, waitFor, 10*time.Millisecond, "the node's only slot is free again")
}

func TestConsoleVanishedNodeEndsTheHubsSession(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	agent, _ := f.serve(t, "node1", natswire.ConsoleLimits{}, b)
	s := f.dial(t, f.hub, "node1", vnc("vm-a"))
	b.next(t)
	agent.Close()

	err := readErr(t, s)
	require.Error(t, err)
	assert.NotErrorIs(t, err, io.EOF, "silence is not the end of the stream")
	assert.Contains(t, err.Error(), "not heard from")
}

func TestConsoleStoppingTheAgentEndsItsSessions(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	_, stop := f.serve(t, "node1", natswire.ConsoleLimits{}, b)
	s := f.dial(t, f.hub, "node1", vnc("vm-a"))
	g := b.next(t)

	require.NoError(t, stop())
	select {
	case <-g.closed:
	default:
		t.Fatal("ServeConsoles returned with a console still open")
	}
	err := readErr(t, s)
	assert.NotErrorIs(t, err, io.EOF)
	assert.Contains(t, err.Error(), "the agent is stopping")
}

func TestConsoleSlowReaderEndsTheSession(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{BytesPerSecond: 256 << 20}, b)
	s := f.dial(t, f.hub, "node1", vnc("vm-a"))
	g := b.next(t)

	// The hub reads nothing while the guest writes more than it may hold.
	write(t, g.end, make([]byte, natswire.ConsoleBufferBytes+(1<<20)))
	waitClosed(t, g, waitFor)
	err := readErr(t, s)
	assert.NotErrorIs(t, err, io.EOF)
	// Held by the session, or still queued by the client: either bound
	// ends it.
	assert.Condition(t, func() bool {
		return strings.Contains(err.Error(), "not read in time") || strings.Contains(err.Error(), "lost data")
	}, "the session ends for the slow reader, got %v", err)
}

// TestConsoleRateLimit measures each direction against the limit: a token
// bucket lets its burst (one chunk) through at once and the rest at the
// rate, so sending payload takes at least (payload-burst)/rate. The bound
// asserted is half of that (twice the rate): only a missing or wrong limit
// breaks it, never a slow machine.
func TestConsoleRateLimit(t *testing.T) {
	const (
		bps     = 64 << 10
		burst   = natswire.ConsoleChunkBytes
		payload = burst + bps // one second at the rate
	)
	minimum := time.Duration(float64(payload-burst) / bps / 2 * float64(time.Second))

	cases := map[string]struct {
		// send sends payload one way; recv reads it on the other side.
		send func(t *testing.T, f *consoleFleet, s io.ReadWriteCloser, g *guest, session string)
		recv func(s io.ReadWriteCloser, g *guest) io.Reader
	}{
		"Output": {
			send: func(t *testing.T, _ *consoleFleet, _ io.ReadWriteCloser, g *guest, _ string) {
				write(t, g.end, make([]byte, payload))
			},
			recv: func(s io.ReadWriteCloser, _ *guest) io.Reader { return s },
		},
		"Input": {
			send: func(t *testing.T, _ *consoleFleet, s io.ReadWriteCloser, _ *guest, _ string) {
				write(t, s, make([]byte, payload))
			},
			recv: func(_ io.ReadWriteCloser, g *guest) io.Reader { return g.end },
		},
		// A hub that does not pace its writes gets no more through: the
		// node paces what it passes on to the guest.
		"InputFromAnUnpacedHub": {
			send: func(t *testing.T, f *consoleFleet, _ io.ReadWriteCloser, _ *guest, session string) {
				in, err := wire.ConsoleInSubject("node1", session)
				require.NoError(t, err)
				chunk := make([]byte, burst)
				for i := range payload / burst {
					m := nats.NewMsg(in)
					m.Header.Set("Virtfleet-Console-Seq", strconv.Itoa(i+1))
					m.Data = chunk
					require.NoError(t, f.hub.PublishMsg(m))
				}
			},
			recv: func(_ io.ReadWriteCloser, g *guest) io.Reader { return g.end },
		},
	}
	f := newConsoleFleet(t)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := newBackend()
			_, stop := f.serve(t, "node1", natswire.ConsoleLimits{BytesPerSecond: bps}, b)
			defer func() { require.NoError(t, stop()) }()
			session := natswire.NewConsoleSession()
			s := f.dial(t, f.hub, "node1", wire.ConsoleOpen{Session: session, UID: "vm-a", Kind: wire.ConsoleVNC})
			g := b.next(t)

			start := time.Now()
			tc.send(t, f, s, g, session)
			readN(t, tc.recv(s, g), payload)
			elapsed := time.Since(start)
			assert.GreaterOrEqual(t, elapsed, minimum, "%d bytes at %d bytes/s came through in %s", payload, bps, elapsed)
		})
	}
}

func TestConsoleDialWithoutAnAgent(t *testing.T) {
	f := newConsoleFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := natswire.DialConsole(ctx, f.hub, "node2", vnc("vm-a"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "node node2 did not answer")

	start := time.Now()
	_, err = natswire.DialConsole(context.Background(), f.hub, "node2", vnc("vm-a"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "did not answer the console open within")
	assert.GreaterOrEqual(t, time.Since(start), natswire.ConsoleOpenTimeout)
}

func TestConsoleDialRefusesWhatItCannotSend(t *testing.T) {
	f := newConsoleFleet(t)
	cases := map[string]struct {
		node string
		open wire.ConsoleOpen
	}{
		"AnUnsafeSession": {node: "node1", open: wire.ConsoleOpen{Session: "a.b", UID: "vm-a", Kind: wire.ConsoleVNC}},
		"AnUnsafeUID":     {node: "node1", open: wire.ConsoleOpen{UID: "*", Kind: wire.ConsoleVNC}},
		"AnUnknownKind":   {node: "node1", open: wire.ConsoleOpen{UID: "vm-a", Kind: "rdp"}},
		"NoNode":          {node: "", open: vnc("vm-a")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := natswire.DialConsole(context.Background(), f.hub, tc.node, tc.open)
			var (
				ke *wire.KeyError
				de *wire.DecodeError
			)
			require.True(t, errors.As(err, &ke) || errors.As(err, &de), "got %v", err)
		})
	}
}

// TestConsoleLostDataEndsTheSession: core NATS may drop a message (a
// reconnect, a slow consumer); a stream with a hole must end, not go on.
func TestConsoleLostDataEndsTheSession(t *testing.T) {
	f := newConsoleFleet(t)
	b := newBackend()
	f.serve(t, "node1", natswire.ConsoleLimits{}, b)
	session := natswire.NewConsoleSession()
	s := f.dial(t, f.hub, "node1", wire.ConsoleOpen{Session: session, UID: "vm-a", Kind: wire.ConsoleSerial})
	g := b.next(t)

	in, err := wire.ConsoleInSubject("node1", session)
	require.NoError(t, err)
	for _, seq := range []string{"1", "3"} {
		m := nats.NewMsg(in)
		m.Header.Set("Virtfleet-Console-Seq", seq)
		m.Data = []byte("message " + seq + ";")
		require.NoError(t, f.hub.PublishMsg(m))
	}
	waitClosed(t, g, waitFor)
	err = readErr(t, s)
	assert.NotErrorIs(t, err, io.EOF)
	assert.Contains(t, err.Error(), "lost data")
}
