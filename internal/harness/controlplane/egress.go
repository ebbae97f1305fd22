package controlplane

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	apiserverv1beta1 "k8s.io/apiserver/pkg/apis/apiserver/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/relay"
)

// Dialer reaches an address (host:port) of the cluster's network.
type Dialer func(addr string) (net.Conn, error)

// egress is how the API server reaches the cluster's network when
// Options.ClusterEgress is set: its egress selector sends what it dials in
// the cluster (the endpoints of an APIService's Service, kubelets) to a
// proxy here, HTTP CONNECT over a unix socket, as a cluster whose control
// plane is off the pod network sends it to a konnectivity server. The proxy
// dials an address of a routed prefix (a kubenode's pods and node address,
// in its own network namespace) with that prefix's Dialer, and any other
// from this machine.
type egress struct {
	relay *relay.Relay

	mu     sync.Mutex
	routes map[netip.Prefix]Dialer
}

// startEgress serves the proxy on a unix socket in dir and points s's
// egress selector at it. The API server then reaches an APIService's
// Service through its endpoints (--enable-aggregator-routing), which the
// proxy can route, rather than its ClusterIP, which needs a Service proxy
// on the API server's machine.
func startEgress(s *envtest.APIServer, dir string) (*egress, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errors.Wrap(err, "cannot create the egress proxy's directory")
	}
	sock := filepath.Join(dir, "egress.sock")
	_ = os.Remove(sock) // a killed run's
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, errors.Wrap(err, "cannot listen for the API server's egress")
	}
	cfg := apiserverv1beta1.EgressSelectorConfiguration{
		EgressSelections: []apiserverv1beta1.EgressSelection{{
			Name: "cluster",
			Connection: apiserverv1beta1.Connection{
				ProxyProtocol: apiserverv1beta1.ProtocolHTTPConnect,
				Transport:     &apiserverv1beta1.Transport{UDS: &apiserverv1beta1.UDSTransport{UDSName: sock}},
			},
		}},
	}
	cfg.APIVersion, cfg.Kind = apiserverv1beta1.SchemeGroupVersion.String(), "EgressSelectorConfiguration"
	b, err := yaml.Marshal(cfg)
	if err != nil {
		_ = l.Close()
		return nil, errors.Wrap(err, "cannot encode the egress selector's configuration")
	}
	file := filepath.Join(dir, "egress-selector.yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		_ = l.Close()
		return nil, errors.Wrap(err, "cannot write the egress selector's configuration")
	}
	args := s.Configure()
	args.Set("egress-selector-config-file", file)
	args.Set("enable-aggregator-routing", "true")

	e := &egress{routes: map[netip.Prefix]Dialer{}}
	e.relay = relay.NewTunnel(e.open)
	e.relay.Serve(l)
	return e, nil
}

// open answers the API server's CONNECT with a connection to the address it
// names. The API server's client refuses bytes that arrive with the answer,
// so a server that spoke first could fail it; those it dials (TLS) do not.
func (e *egress) open(c net.Conn) (net.Conn, error) {
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the API server's CONNECT")
	}
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return nil, errors.Errorf("the API server asked %s, not CONNECT", req.Method)
	}
	// The API server sends nothing before the answer; anything read past
	// the request would be lost to the server.
	if br.Buffered() > 0 {
		return nil, errors.New("the API server wrote past its CONNECT")
	}
	s, err := e.dial(req.Host)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return nil, err
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		_ = s.Close()
		return nil, errors.Wrap(err, "cannot answer the API server's CONNECT")
	}
	return s, nil
}

// dial reaches addr through its prefix's Dialer, or from this machine.
func (e *egress) dial(addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, errors.Wrapf(err, "the API server asked for %q", addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		e.mu.Lock()
		var through Dialer
		for p, d := range e.routes {
			if p.Contains(ip) {
				through = d
			}
		}
		e.mu.Unlock()
		if through != nil {
			return through(addr)
		}
	}
	c, err := net.Dial("tcp", addr)
	return c, errors.Wrapf(err, "cannot dial %s", addr)
}

// route sends the addresses of prefixes through dial until the returned
// function is called. A prefix that overlaps one routed already is
// refused: the proxy could not tell which network an address is in.
func (e *egress) route(dial Dialer, prefixes ...netip.Prefix) (func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range prefixes {
		for q := range e.routes {
			if p.Overlaps(q) {
				return nil, errors.Errorf("%s overlaps %s, which the API server's egress routes already", p, q)
			}
		}
	}
	for _, p := range prefixes {
		e.routes[p] = dial
	}
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for p := range e.routes {
			if slices.Contains(prefixes, p) {
				delete(e.routes, p)
			}
		}
	}, nil
}
