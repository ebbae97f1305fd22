package nova

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/remoteconsoles"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/wsconsole"
)

var _ driver.Consoler = (*Driver)(nil)

// proxySubprotocol is the WebSocket subprotocol Nova's console proxies
// (websockify) carry raw bytes with, in binary messages.
const proxySubprotocol = "binary"

// remoteConsoles are the remote console each console kind is.
var remoteConsoles = map[driver.ConsoleKind]remoteconsoles.CreateOpts{
	driver.ConsoleSerial: {Protocol: remoteconsoles.ConsoleProtocolSerial, Type: remoteconsoles.ConsoleTypeSerial},
	driver.ConsoleVNC:    {Protocol: remoteconsoles.ConsoleProtocolVNC, Type: remoteconsoles.ConsoleTypeNoVNC},
}

// OpenConsole implements driver.Consoler with Nova's remote consoles
// (compute API 2.6 and later): a serial console is nova-serialproxy's
// WebSocket of the server's serial port, a display nova-novncproxy's
// WebSocket of its VNC server, both websockify carrying raw bytes. Each
// session gets a console of its own, since a console's token is good for
// one connection and expires. The token is a credential: no error and no
// log line quotes the console's URL.
//
// A server not in the view (not this node's) is NotFound. One that is not
// ACTIVE or PAUSED, and a console Nova refuses (400: the compute host has
// that console turned off; 409: the server is not in a state to have one;
// 403: Nova's policy does not allow it; 501: the hypervisor has none), are
// Terminal, with Nova's message. Other failures are transient. A proxy
// that refuses the token does so once the WebSocket is open, by closing it:
// the session then ends at its first read.
func (d *Driver) OpenConsole(ctx context.Context, uid string, kind driver.ConsoleKind) (io.ReadWriteCloser, error) {
	opts, ok := remoteConsoles[kind]
	if !ok {
		return nil, driver.Terminalf("no console of kind %q: a server has a %s console and a %s display", kind, driver.ConsoleSerial, driver.ConsoleVNC)
	}
	s, ok := d.cached(uid)
	if !ok {
		return nil, driver.NotFoundf("no server with %s %s", MetaUID, uid)
	}
	switch s.Status {
	case "ACTIVE", "PAUSED":
	default:
		return nil, driver.Terminalf("server is %s: Nova serves the consoles of an ACTIVE or PAUSED server only", s.Status)
	}
	rc, err := remoteconsoles.Create(ctx, d.c.compute, s.ID, opts).Extract()
	what := "cannot create a " + string(opts.Protocol) + " console of server " + s.ID
	switch statusOf(err) {
	case 0:
	case http.StatusNotFound:
		return nil, driver.NotFound(errors.New(what + ": " + describe(err)))
	case http.StatusBadRequest, http.StatusForbidden, http.StatusConflict, http.StatusNotImplemented:
		return nil, driver.Terminal(errors.New(what + ": " + describe(err)))
	}
	if err != nil {
		return nil, classify(err, what)
	}
	u, err := proxyWebSocket(rc.URL, kind)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot open the %s console of server %s", opts.Protocol, s.ID)
	}
	stream, err := wsconsole.Dial(ctx, u, wsconsole.Options{Subprotocol: proxySubprotocol, TLS: d.proxyTLS(), Proxy: d.proxyProxy()})
	if err != nil {
		return nil, errors.Wrapf(err, "cannot connect to the %s console of server %s", opts.Protocol, s.ID)
	}
	return stream, nil
}

// proxyWebSocket is the WebSocket of the remote console at raw: the URL
// itself for a serial console (ws or wss); for a VNC console, whose URL is
// the noVNC page, where noVNC opens it: the page's host, path "/" and then
// the page's path parameter (where Nova puts the token), or "/" with the
// page's token parameter (as Nova's URLs had it before). Errors never
// quote raw, which holds the token.
func proxyWebSocket(raw string, kind driver.ConsoleKind) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("Nova answered a console URL that does not parse")
	}
	switch u.Scheme {
	case "ws", "http":
		u.Scheme = "ws"
	case "wss", "https":
		u.Scheme = "wss"
	default:
		return nil, errors.Errorf("Nova answered a console URL of scheme %q", u.Scheme)
	}
	if kind != driver.ConsoleVNC {
		return u, nil
	}
	q := u.Query()
	switch path, token := q.Get("path"), q.Get("token"); {
	case path != "":
		ws, err := url.Parse("/" + strings.TrimPrefix(path, "/"))
		if err != nil {
			return nil, errors.Errorf("the noVNC page of Nova's VNC console at %s has a path that does not parse", u.Host)
		}
		u.Path, u.RawPath, u.RawQuery = ws.Path, ws.RawPath, ws.RawQuery
	case token != "":
		u.Path, u.RawPath, u.RawQuery = "/", "", url.Values{"token": {token}}.Encode()
	default:
		return nil, errors.Errorf("the noVNC page of Nova's VNC console at %s names no token", u.Host)
	}
	return u, nil
}

// proxyTLS is the cloud's TLS configuration (cacert, cert and key, verify)
// for the console proxies, which are the cloud's too: connect gave it to the
// provider client's transport. Nil when the cloud sets none.
func (d *Driver) proxyTLS() *tls.Config {
	if t, ok := d.c.compute.ProviderClient.HTTPClient.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
		return t.TLSClientConfig.Clone()
	}
	return nil
}

// proxyProxy is the HTTP proxy the cloud's APIs are reached through, used
// for its console proxies as well.
func (d *Driver) proxyProxy() func(*http.Request) (*url.URL, error) {
	if t, ok := d.c.compute.ProviderClient.HTTPClient.Transport.(*http.Transport); ok && t.Proxy != nil {
		return t.Proxy
	}
	return http.ProxyFromEnvironment
}
