// Package relay relays a listener's TCP connections to a server, each to a
// new connection of its own, and can cut them all: the stack's agents reach
// NATS through one (a partition is a cut), and a Kubernetes node in its own
// network namespace reaches the machine's loopback through others.
package relay

import (
	"io"
	"net"
	"sync"
)

// Relay copies both ways between each connection its listener accepts and
// a connection it dials for it.
type Relay struct {
	open func(net.Conn) (net.Conn, error)

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
}

// New returns a relay that reaches its server with dial; it relays nothing
// until Serve.
func New(dial func() (net.Conn, error)) *Relay {
	return NewTunnel(func(net.Conn) (net.Conn, error) { return dial() })
}

// NewTunnel returns a relay that reaches the server for each accepted
// connection with open, which may first talk with the client on it (a
// proxy's handshake naming the server); it relays nothing until Serve.
func NewTunnel(open func(client net.Conn) (net.Conn, error)) *Relay {
	return &Relay{open: open, conns: map[net.Conn]struct{}{}}
}

// Serve relays every connection ln accepts until Cut.
func (r *Relay) Serve(ln net.Listener) {
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.relay(c)
		}
	}()
}

// Serving reports whether the relay listens (Serve was called since the
// last Cut).
func (r *Relay) Serving() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ln != nil
}

// relay copies both ways between c and a new connection to the server
// until either side closes or the relay is cut.
func (r *Relay) relay(c net.Conn) {
	s, err := r.open(c)
	if err != nil {
		_ = c.Close()
		return
	}
	if !r.track(c, s) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(s, c)
	go pipe(c, s)
	<-done
	r.untrack(c, s)
}

// track records a relayed pair, or closes it when the relay was cut
// meanwhile.
func (r *Relay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *Relay) untrack(conns ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(r.conns, c)
	}
}

// Cut closes every relayed connection and stops listening.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		_ = c.Close()
		delete(r.conns, c)
	}
}
