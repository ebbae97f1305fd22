package wsconsole_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/wsconsole"
)

const subprotocol = "plain.test"

// serve starts a WebSocket server that runs peer on each connection it
// upgrades, and returns its ws URL.
func serve(t *testing.T, peer func(*websocket.Conn)) *url.URL {
	t.Helper()
	up := websocket.Upgrader{Subprotocols: []string{subprotocol}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close() //nolint:errcheck // the test is over
		peer(conn)
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	u.Scheme = "ws"
	return u
}

func dial(t *testing.T, u *url.URL) *wsconsole.Stream {
	t.Helper()
	s, err := wsconsole.Dial(context.Background(), u, wsconsole.Options{Subprotocol: subprotocol})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestReadReturnsThePayloadsInOrder(t *testing.T) {
	s := dial(t, serve(t, func(c *websocket.Conn) {
		for _, m := range []string{"ab", "", "cdefgh", "i"} {
			require.NoError(t, c.WriteMessage(websocket.BinaryMessage, []byte(m)))
		}
		require.NoError(t, c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")))
		_, _, _ = c.ReadMessage() // the client's answer
	}))
	assert.Equal(t, subprotocol, s.Subprotocol(), "the subprotocol offered")
	var got []string
	buf := make([]byte, 3)
	for {
		n, err := s.Read(buf)
		if err != nil {
			assert.ErrorIs(t, err, io.EOF, "a normal close ends the stream")
			break
		}
		assert.Positive(t, n, "an empty message is no read")
		got = append(got, string(buf[:n]))
	}
	assert.Equal(t, []string{"ab", "cde", "fgh", "i"}, got, "a message spans reads; a read never spans messages")
	n, err := s.Read(buf)
	assert.Zero(t, n)
	assert.ErrorIs(t, err, io.EOF, "and stays ended")
}

// TestHowAStreamEnds: a close with a normal status is the end of the
// stream; anything else is an error.
func TestHowAStreamEnds(t *testing.T) {
	cases := []struct {
		name string
		end  func(*websocket.Conn)
		eof  bool
	}{
		{name: "NormalClosure", eof: true, end: closing(websocket.CloseNormalClosure)},
		{name: "GoingAway", eof: true, end: closing(websocket.CloseGoingAway)},
		{name: "PolicyViolation", end: closing(websocket.ClosePolicyViolation)},
		{name: "DroppedWithoutACloseMessage", end: func(c *websocket.Conn) { _ = c.NetConn().Close() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := dial(t, serve(t, tc.end))
			_, err := io.ReadAll(s)
			if tc.eof {
				assert.NoError(t, err, "io.ReadAll stops at io.EOF")
				return
			}
			assert.Error(t, err)
		})
	}
}

func closing(code int) func(*websocket.Conn) {
	return func(c *websocket.Conn) {
		_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(code, "bye"))
		_, _, _ = c.ReadMessage()
	}
}

func TestWriteSendsBinaryMessagesAndCloseSaysGoodbye(t *testing.T) {
	type message struct {
		kind int
		data string
	}
	got := make(chan message, 8)
	closed := make(chan error, 1)
	s := dial(t, serve(t, func(c *websocket.Conn) {
		for {
			kind, data, err := c.ReadMessage()
			if err != nil {
				closed <- err
				return
			}
			got <- message{kind, string(data)}
		}
	}))
	for _, p := range []string{"hello", "", "world"} {
		n, err := s.Write([]byte(p))
		require.NoError(t, err)
		assert.Equal(t, len(p), n)
	}
	assert.Equal(t, message{websocket.BinaryMessage, "hello"}, <-got)
	assert.Equal(t, message{websocket.BinaryMessage, "world"}, <-got, "an empty write sends nothing")

	require.NoError(t, s.Close())
	err := <-closed
	assert.True(t, websocket.IsCloseError(err, websocket.CloseNormalClosure), "the server saw a normal close: %v", err)
	assert.NoError(t, s.Close(), "closing twice is harmless")
	_, err = s.Write([]byte("late"))
	assert.Error(t, err, "nothing is written after Close")
}

func TestCloseEndsARead(t *testing.T) {
	s := dial(t, serve(t, func(c *websocket.Conn) { _, _, _ = c.ReadMessage() }))
	read := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 8))
		read <- err
	}()
	require.NoError(t, s.Close())
	select {
	case err := <-read:
		assert.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Read still waits after Close")
	}
}

func TestARefusalCarriesTheServersAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"message":"VMI is not running"}`)
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(strings.Replace(srv.URL, "http", "ws", 1))
	require.NoError(t, err)
	_, err = wsconsole.Dial(context.Background(), u, wsconsole.Options{})
	var refused *wsconsole.RefusedError
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, http.StatusConflict, refused.StatusCode)
	assert.JSONEq(t, `{"message":"VMI is not running"}`, string(refused.Body))
}

// TestErrorsNeverQuoteTheQuery: a console URL's query may hold its token.
func TestErrorsNeverQuoteTheQuery(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there any more
	const query = "/?token=secret-token"
	cases := []struct {
		name  string
		url   string
		proxy func(*http.Request) (*url.URL, error)
	}{
		{name: "NothingListens", url: "ws://" + addr + query},
		{name: "NotAWebSocketURL", url: "http://" + addr + query},
		{name: "TheProxyFails", url: "ws://" + addr + query, proxy: func(r *http.Request) (*url.URL, error) {
			// As net/http's proxy lookups fail: quoting the URL.
			return nil, &url.Error{Op: "proxy", URL: r.URL.String(), Err: io.ErrUnexpectedEOF}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			require.NoError(t, err)
			_, err = wsconsole.Dial(context.Background(), u, wsconsole.Options{Proxy: tc.proxy})
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "secret-token")
			assert.Contains(t, err.Error(), addr, "the host is named")
		})
	}
}
