package relay

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A relay carries bytes both ways; Cut closes what it carries and refuses
// what comes after.
func TestRelay(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = echo.Close() }()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("echo " + line))
			}()
		}
	}()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := New(func() (net.Conn, error) { return net.Dial("tcp", echo.Addr().String()) })
	r.Serve(ln)
	require.True(t, r.Serving())

	// The echo server answers one line and keeps the connection open:
	// only the cut closes it.
	held, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer func() { _ = held.Close() }()
	_, err = held.Write([]byte("hello\n"))
	require.NoError(t, err)
	got, err := bufio.NewReader(held).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "echo hello\n", got)

	r.Cut()
	assert.False(t, r.Serving())
	require.NoError(t, held.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = held.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "a relayed connection outlived the cut")
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "the relay listens after the cut")
}
