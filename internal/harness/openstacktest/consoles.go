package openstacktest

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"github.com/virtfleet/virtfleet/internal/harness/guestconsole"
)

// Nova's remote consoles (POST /servers/{id}/remote-consoles, microversion
// 2.6 and later) and the console proxies their URLs point at.
//
// A console is a URL with a token of its own, valid for ConsoleTokenTTL:
// a serial console's is nova-serialproxy's WebSocket
// (ws://host:port/?token=...), a VNC console's (type novnc) the noVNC page
// of nova-novncproxy, whose WebSocket is at the same host and port, path
// "/" with the token in the query (noVNC's path parameter). Each proxy is a
// listener of its own and, like websockify, chooses the subprotocol binary
// when the client offers it and checks the token only after the upgrade:
// an unknown, expired or used token, or one whose server is gone or does
// not run, has the connection dropped without a close message. Behind a
// proxy there is no guest but what one would say: a serial console
// prompts for a login (guestconsole.LoginPrompt) when the session opens and after each
// carriage return or line feed it receives; a display sends its
// ProtocolVersion (guestconsole.RFBVersion) and reads on.
//
// The cloud serves serial and VNC consoles; a test turns them off per
// protocol with DisableConsole, as a compute host with [serial_console] or
// [vnc] enabled = false. Every other console (spice, rdp, mks, xvpvnc) is
// off.

// Console protocols, as a remote console's protocol names them.
const (
	ConsoleProtocolSerial = "serial"
	ConsoleProtocolVNC    = "vnc"
)

// ConsoleTokenTTL is how long a console's token is valid: Nova's
// [consoleauth] token_ttl default.
const ConsoleTokenTTL = 10 * time.Minute

// consoleTypes are the types of each protocol the compute API's schema
// accepts, by the first microversion accepting them; served are the
// protocol and type pairs this cloud serves.
var (
	consoleTypes = map[string]struct {
		since int
		types []string
	}{
		"vnc":    {6, []string{"novnc", "xvpvnc"}},
		"spice":  {6, []string{"spice-html5"}},
		"rdp":    {6, []string{"rdp-html5"}},
		"serial": {6, []string{"serial"}},
		"mks":    {8, []string{"webmks"}},
	}
	served = map[string]string{ConsoleProtocolVNC: "novnc", ConsoleProtocolSerial: "serial"}
)

// consoleToken is what a console's token grants.
type consoleToken struct {
	server, protocol string
	expires          time.Time
	used             bool
}

// consoleProxies are nova-serialproxy and nova-novncproxy, and the consoles
// they serve.
type consoleProxies struct {
	serial, novnc *httptest.Server

	// tokens and disabled are guarded by the Server's mu.
	tokens   map[string]*consoleToken
	disabled map[string]bool

	mu sync.Mutex
	// sessions are the WebSockets open; closed with the proxies, so none
	// outlives the Server.
	sessions map[*websocket.Conn]struct{}
	closed   bool
}

// startConsoleProxies starts the two proxies, with TLS when the APIs have
// it.
func (s *Server) startConsoleProxies() *consoleProxies {
	p := &consoleProxies{tokens: map[string]*consoleToken{}, disabled: map[string]bool{}, sessions: map[*websocket.Conn]struct{}{}}
	start := httptest.NewServer
	if s.opts.TLS {
		start = httptest.NewTLSServer
	}
	p.serial = start(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.proxy(w, r, ConsoleProtocolSerial) }))
	p.novnc = start(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.proxy(w, r, ConsoleProtocolVNC) }))
	return p
}

// close ends the sessions and stops the proxies.
func (p *consoleProxies) close() {
	p.mu.Lock()
	p.closed = true
	for conn := range p.sessions {
		_ = conn.Close()
	}
	p.mu.Unlock()
	p.serial.Close()
	p.novnc.Close()
}

func (s *Server) routeConsoles(mux *http.ServeMux) {
	mux.HandleFunc("POST "+ComputePath+"/servers/{id}/remote-consoles", s.compute(s.createConsole))
}

// DisableConsole makes the cloud refuse consoles of protocol (serial,
// vnc) as Nova does when the compute host has them turned off.
func (s *Server) DisableConsole(protocol string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.consoles.disabled[protocol] = true
}

// ConsoleTokens lists the console tokens issued so far, for tests that
// check none leaks.
func (s *Server) ConsoleTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.consoles.tokens))
	for t := range s.consoles.tokens {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

type remoteConsoleJSON struct {
	Protocol string `json:"protocol"`
	Type     string `json:"type"`
	URL      string `json:"url,omitempty"`
}

// createConsole creates a remote console as the compute API does: the
// request's schema, the server, its state (ACTIVE or PAUSED, else 409),
// then whether the type fits the protocol and the cloud serves it (400).
func (s *Server) createConsole(w http.ResponseWriter, r *http.Request, mv int) {
	if mv < 6 {
		writeError(w, http.StatusNotFound, "itemNotFound", "The resource could not be found.")
		return
	}
	var req struct {
		RemoteConsole *remoteConsoleJSON `json:"remote_console"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	rc := req.RemoteConsole
	if rc == nil {
		badRequest(w, "Invalid input for field/attribute remote_console. Value: None. 'remote_console' is a required property")
		return
	}
	var protocols, types []string
	for p, t := range consoleTypes {
		if mv >= t.since {
			protocols = append(protocols, p)
			types = append(types, t.types...)
		}
	}
	switch {
	case !slices.Contains(protocols, rc.Protocol):
		badRequest(w, "Invalid input for field/attribute protocol. Value: %s. '%s' is not one of %s", rc.Protocol, rc.Protocol, pyList(protocols))
		return
	case !slices.Contains(types, rc.Type):
		badRequest(w, "Invalid input for field/attribute type. Value: %s. '%s' is not one of %s", rc.Type, rc.Type, pyList(types))
		return
	}
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	if sv.Status != StatusActive && sv.Status != StatusPaused {
		conflict(w, sv, "create")
		return
	}
	switch {
	case !slices.Contains(consoleTypes[rc.Protocol].types, rc.Type):
		badRequest(w, "Invalid console type %s", rc.Type)
		return
	case served[rc.Protocol] != rc.Type || s.consoles.disabled[rc.Protocol]:
		badRequest(w, "Unavailable console type %s.", rc.Type)
		return
	}
	token := uuid.NewString()
	s.consoles.tokens[token] = &consoleToken{server: sv.ID, protocol: rc.Protocol, expires: time.Now().Add(ConsoleTokenTTL)}
	switch rc.Protocol {
	case ConsoleProtocolSerial:
		// [serial_console] base_url, ws or wss.
		rc.URL = "ws" + strings.TrimPrefix(s.consoles.serial.URL, "http") + "/?token=" + token
	case ConsoleProtocolVNC:
		// [vnc] novncproxy_base_url, the noVNC page, http or https.
		rc.URL = s.consoles.novnc.URL + "/vnc_auto.html?path=" + url.QueryEscape("?token="+token)
	}
	writeJSON(w, http.StatusOK, map[string]any{"remote_console": rc})
}

// pyList renders list sorted, as Python prints a list of strings in the
// schema's messages.
func pyList(list []string) string {
	out := slices.Clone(list)
	slices.Sort(out)
	for i, v := range out {
		out[i] = "'" + v + "'"
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// proxyUpgrader upgrades as websockify does: the subprotocol binary when
// offered, no origin check for clients that send none.
var proxyUpgrader = websocket.Upgrader{
	Subprotocols: []string{"binary"},
	CheckOrigin:  func(*http.Request) bool { return true },
}

// proxy serves a console WebSocket of protocol: upgraded first, then the
// token checked and used up, then the guest's side of the console.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, protocol string) {
	conn, err := proxyUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	defer conn.Close() //nolint:errcheck // the session is over
	p := s.consoles
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.sessions[conn] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.sessions, conn)
		p.mu.Unlock()
	}()
	name, ok := s.useToken(r.URL.Query().Get("token"), protocol)
	if !ok {
		// Nova's proxy raises after the upgrade; websockify drops the
		// connection.
		return
	}
	if protocol == ConsoleProtocolVNC {
		guestconsole.Display(conn)
		return
	}
	guestconsole.Serial(conn, name)
}

// useToken checks a token presented to the proxy of protocol and uses it
// up: it must be one of that protocol's, unused and unexpired, of a server
// that still runs. It returns the server's name.
func (s *Server) useToken(token, protocol string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	t, ok := s.consoles.tokens[token]
	if !ok || t.used || t.protocol != protocol || time.Now().After(t.expires) {
		return "", false
	}
	t.used = true
	sv, ok := s.servers[t.server]
	if !ok || (sv.Status != StatusActive && sv.Status != StatusPaused) {
		return "", false
	}
	return sv.Name, true
}
