package guestconsole

import (
	"io"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ReadTimeout bounds a wait for what a console should say.
const ReadTimeout = 20 * time.Second

// ReadUntil reads the console stream s until it has read as much as want,
// which it must be. A console that says less within ReadTimeout is closed,
// which ends the read and fails t.
func ReadUntil(t testing.TB, s io.ReadCloser, want string) {
	t.Helper()
	timer := time.AfterFunc(ReadTimeout, func() { _ = s.Close() })
	defer timer.Stop()
	got := ""
	buf := make([]byte, 64)
	for len(got) < len(want) {
		n, err := s.Read(buf)
		got += string(buf[:n])
		require.NoError(t, err, "read so far: %q", got)
	}
	assert.Equal(t, want, got)
}

// ReadMessagesUntil reads binary messages of a console's WebSocket until
// what they carried is as long as want, and must be want.
func ReadMessagesUntil(t testing.TB, conn *websocket.Conn, want string) {
	t.Helper()
	got := ""
	for len(got) < len(want) {
		kind, data, err := conn.ReadMessage()
		require.NoError(t, err, "read so far: %q", got)
		assert.Equal(t, websocket.BinaryMessage, kind)
		got += string(data)
	}
	assert.Equal(t, want, got)
}
