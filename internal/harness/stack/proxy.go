package stack

import (
	"net"
	"net/url"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/relay"
)

// natsProxy relays one agent's connections to NATS, so that the agent can
// be cut off NATS while it and its guests run on: cut closes every relayed
// connection and stops listening (the agent's reconnects are refused, as
// across a partition), heal listens again on the same address.
type natsProxy struct {
	// targets are the servers' host:port, tried in turn.
	targets []string
	addr    string
	*relay.Relay
}

// newNATSProxy relays to the NATS servers at natsURLs (comma-separated),
// to the first that answers, from a free port of the loopback. A cluster's
// servers must not advertise their own addresses to clients (no_advertise),
// or the agent would reach them around the proxy.
func newNATSProxy(natsURLs string) (*natsProxy, error) {
	p := &natsProxy{}
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
	p.Relay = relay.New(p.dial)
	p.Serve(ln)
	return p, nil
}

// URL is the proxy's NATS URL, the same across cuts.
func (p *natsProxy) URL() string { return "nats://" + p.addr }

// dial connects to the first server that answers.
func (p *natsProxy) dial() (net.Conn, error) {
	var s net.Conn
	err := errors.New("no NATS server to relay to")
	for _, target := range p.targets {
		if s, err = net.Dial("tcp", target); err == nil {
			break
		}
	}
	return s, err
}

// cut closes every relayed connection and stops listening.
func (p *natsProxy) cut() { p.Cut() }

// heal listens on the proxy's address again.
func (p *natsProxy) heal() error {
	if p.Serving() {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return errors.Wrapf(err, "cannot listen on %s again", p.addr)
	}
	p.Serve(ln)
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
