package stack

import (
	"io"
	"net"
	"net/url"
	"strings"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// natsProxy relays one agent's connections to NATS, so that the agent can
// be cut off NATS while it and its guests run on: cut closes every relayed
// connection and stops listening (the agent's reconnects are refused, as
// across a partition), heal listens again on the same address.
type natsProxy struct {
	// targets are the servers' host:port, tried in turn.
	targets []string
	addr    string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
}

// newNATSProxy relays to the NATS servers at natsURLs (comma-separated),
// to the first that answers, from a free port of the loopback. A cluster's
// servers must not advertise their own addresses to clients (no_advertise),
// or the agent would reach them around the proxy.
func newNATSProxy(natsURLs string) (*natsProxy, error) {
	p := &natsProxy{conns: map[net.Conn]struct{}{}}
	for _, s := range strings.Split(natsURLs, ",") {
		u, err := url.Parse(s)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot parse the NATS URL %q", s)
		}
		p.targets = append(p.targets, u.Host)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Wrap(err, "cannot listen for the NATS proxy")
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	return p, nil
}

// URL is the proxy's NATS URL, the same across cuts.
func (p *natsProxy) URL() string { return "nats://" + p.addr }

func (p *natsProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.relay(c)
		}
	}()
}

// relay copies both ways between c and a new connection to the server
// until either side closes or the proxy cuts them.
func (p *natsProxy) relay(c net.Conn) {
	var s net.Conn
	err := errors.New("no NATS server to relay to")
	for _, target := range p.targets {
		if s, err = net.Dial("tcp", target); err == nil {
			break
		}
	}
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, s) {
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
	p.untrack(c, s)
}

// track records a relayed pair, or closes it when the proxy was cut
// meanwhile.
func (p *natsProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *natsProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// cut closes every relayed connection and stops listening.
func (p *natsProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// heal listens on the proxy's address again.
func (p *natsProxy) heal() error {
	p.mu.Lock()
	cut := p.ln == nil
	p.mu.Unlock()
	if !cut {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return errors.Wrapf(err, "cannot listen on %s again", p.addr)
	}
	p.serve(ln)
	return nil
}

// agentNATSURL is the NATS URL node's agent connects to: its own proxy's
// with Options.NATSProxies, else the servers'.
func (s *Stack) agentNATSURL(node string) (string, error) {
	if !s.opts.NATSProxies {
		return s.NATSURL(), nil
	}
	if p, ok := s.proxies[node]; ok {
		return p.URL(), nil
	}
	p, err := newNATSProxy(s.NATSURL())
	if err != nil {
		return "", err
	}
	if s.proxies == nil {
		s.proxies = map[string]*natsProxy{}
	}
	s.proxies[node] = p
	return p.URL(), nil
}

// CutAgent cuts node's agent off NATS (Options.NATSProxies): its
// connections close and its reconnects are refused, while it and its
// guests run on.
func (s *Stack) CutAgent(node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.proxies[node]
	if !ok {
		return errors.Errorf("node %s's agent does not reach NATS through a proxy (Options.NATSProxies)", node)
	}
	p.cut()
	return nil
}

// HealAgent lets node's agent reach NATS again after CutAgent.
func (s *Stack) HealAgent(node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.proxies[node]
	if !ok {
		return errors.Errorf("node %s's agent does not reach NATS through a proxy (Options.NATSProxies)", node)
	}
	return p.heal()
}
