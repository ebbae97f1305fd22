package natstest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// BlackHole listens on the loopback and accepts connections that it never
// says a word on, as an address named to stall a NATS client would: the
// client waits for the server's INFO until its own timeout. It returns the
// address (host:port) and how many connections it accepted; t's cleanup
// closes them.
func BlackHole(t testing.TB) (addr string, accepted *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = &atomic.Int32{}
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range held {
			_ = c.Close()
		}
	})
	return l.Addr().String(), accepted
}
