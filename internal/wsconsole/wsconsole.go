// Package wsconsole carries a guest console over a WebSocket, as KubeVirt's
// virt-api (subprotocol plain.kubevirt.io) and Nova's console proxies
// (websockify, subprotocol binary) serve one: each message holds a run of
// the console's bytes, in order, both ways. Dial opens such a WebSocket and
// Stream is the io.ReadWriteCloser driver.Consoler returns for it.
package wsconsole

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gorilla/websocket"
)

// handshakeTimeout bounds the opening handshake when ctx ends later.
const handshakeTimeout = 30 * time.Second

// closeTimeout bounds the sending of the close message: a peer that reads
// nothing any more must not hold Close.
const closeTimeout = time.Second

// Options say how to open a console's WebSocket.
type Options struct {
	// Subprotocol is offered to the server; empty offers none.
	Subprotocol string
	// TLS configures a wss connection; nil trusts the system's roots.
	TLS *tls.Config
	// Header goes with the opening handshake: the credentials.
	Header http.Header
	// Proxy picks the HTTP proxy to go through, as http.Transport's
	// does; nil goes direct.
	Proxy func(*http.Request) (*url.URL, error)
}

// RefusedError is a server's answer other than the upgrade: its status and
// the start of its body, where the caller finds the server's reason.
type RefusedError struct {
	StatusCode int
	Status     string
	Body       []byte
}

func (e *RefusedError) Error() string {
	return "the server refused the WebSocket: " + e.Status
}

// Dial opens the WebSocket at u (ws or wss) and returns its stream. ctx
// bounds the opening only. No error quotes u, whose query may hold a
// credential (a Nova console's token): they name its host at most.
func Dial(ctx context.Context, u *url.URL, o Options) (*Stream, error) {
	d := websocket.Dialer{TLSClientConfig: o.TLS, Proxy: o.Proxy, HandshakeTimeout: handshakeTimeout}
	if o.Subprotocol != "" {
		d.Subprotocols = []string{o.Subprotocol}
	}
	conn, resp, err := d.DialContext(ctx, u.String(), o.Header)
	switch {
	case err == nil:
		return New(conn), nil
	case resp != nil && resp.StatusCode != http.StatusSwitchingProtocols:
		defer resp.Body.Close() //nolint:errcheck // read in full already
		// The dialer keeps the body's first KiB: enough for an API status.
		body, _ := io.ReadAll(resp.Body)
		return nil, &RefusedError{StatusCode: resp.StatusCode, Status: resp.Status, Body: body}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		// url.Error quotes the whole URL.
		return nil, errors.Errorf("cannot open the WebSocket at %s: %s: %v", u.Host, ue.Op, ue.Err)
	}
	return nil, errors.Wrapf(err, "cannot open the WebSocket at %s", u.Host)
}

// Stream is a WebSocket as a byte stream: Read returns the payloads of the
// messages received, in order, however p cuts them; Write sends p as one
// binary message; Close sends a close message and closes the connection,
// which ends a Read or Write under way. One Read and one Write may run at
// a time, alongside Close.
type Stream struct {
	conn *websocket.Conn

	readMu sync.Mutex
	// message is what is left to read of the message being read.
	message io.Reader
	// readErr is why reading ended: the connection is not read again
	// after a failure (gorilla/websocket panics on many such reads).
	readErr error

	writeMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
}

// New adapts an open WebSocket.
func New(conn *websocket.Conn) *Stream { return &Stream{conn: conn} }

// Subprotocol is the subprotocol the server chose; empty for none.
func (s *Stream) Subprotocol() string { return s.conn.Subprotocol() }

// Read implements io.Reader. A close message with a normal status (normal
// closure, going away, none given) reads as io.EOF.
func (s *Stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.readMu.Lock()
	defer s.readMu.Unlock()
	for s.readErr == nil {
		if s.message == nil {
			_, r, err := s.conn.NextReader()
			if err != nil {
				s.readErr = readError(err)
				break
			}
			s.message = r
		}
		n, err := s.message.Read(p)
		if errors.Is(err, io.EOF) {
			s.message, err = nil, nil
		}
		if err != nil {
			s.readErr = err
		}
		if n > 0 {
			return n, nil
		}
	}
	return 0, s.readErr
}

func readError(err error) error {
	if websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived) {
		return io.EOF
	}
	return err
}

// Write implements io.Writer.
func (s *Stream) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.conn.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite sends the close message and leaves the stream open for
// reading: what the peer sent before it closes in turn is still read, and
// then Read returns io.EOF.
func (s *Stream) CloseWrite() error {
	return s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(closeTimeout))
}

// Close implements io.Closer. Closing again returns the first Close's
// error.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		// Best effort: the peer may be gone already.
		_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(closeTimeout))
		s.closeErr = s.conn.Close()
	})
	return s.closeErr
}
