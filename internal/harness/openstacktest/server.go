// Package openstacktest is an in-process OpenStack API server for tests: the
// parts of Keystone v3, Nova, Cinder v3 and Neutron the nova driver uses,
// modelled on their API references, served over HTTP on 127.0.0.1. It keeps
// its state in memory, moves servers through their statuses on its own clock
// (BUILD → ACTIVE after Options.TransitionDelay, a live migration to its new
// host, and so on), and lets a test inject faults (409, 413 with
// Retry-After, 500), expire tokens, fail a live migration and force a
// server into any status. Remote consoles come with console proxies of
// their own (see consoles.go).
//
// It is deliberately not built from gophercloud's types: the wire shapes here
// follow the API references, so a driver test against it checks gophercloud's
// use as well as the driver's.
package openstacktest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"
)

// requestIDHeader carries the id of the request a service answered.
const requestIDHeader = "X-Openstack-Request-Id"

// Where each service is served under URL(), as the catalog lists it. The
// block-storage endpoint carries the project id, as Cinder's does.
const (
	IdentityPath = "/identity"
	ComputePath  = "/compute/v2.1"
	VolumePath   = "/volume/v3"
	NetworkPath  = "/network"
)

// Defaults for an empty Options.
const (
	DefaultRegion          = "RegionOne"
	DefaultUsername        = "virtfleet"
	DefaultProject         = "virtfleet"
	DefaultDomain          = "Default"
	DefaultTokenLifetime   = time.Hour
	DefaultTransitionDelay = 100 * time.Millisecond
	DefaultHostVCPUs       = 64
	DefaultHostMemoryMB    = 256 * 1024
)

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// Region the catalog's endpoints are in; default RegionOne.
	Region string
	// Username, Password, Project and Domain are the one user's credentials;
	// Password is required.
	Username, Password, Project, Domain string
	// TokenLifetime is how long a token is valid; default one hour.
	TokenLifetime time.Duration
	// TransitionDelay is how long a server stays in a transitional status
	// (BUILD, REBOOT, powering off, RESIZE) and a volume in creating;
	// default 100 ms.
	TransitionDelay time.Duration
	// Hosts are the compute hosts servers are scheduled to, in turn;
	// default one host, compute-1.
	Hosts []string
	// HostVCPUs and HostMemoryMB are each host's resources.
	HostVCPUs, HostMemoryMB int
	// Member makes the user a plain project member, as on most public
	// clouds: Nova's default policy then hides a server's host, refuses
	// os-hypervisors and flavor management (403), and lists only the
	// flavors the project may use.
	Member bool
	// TLS serves HTTPS with a certificate of its own; CACertPEM is what a
	// client must trust.
	TLS bool
	// QuotaCores and QuotaRAMMB are the project's compute quota, shown by
	// GET /limits; defaults 20 and 51200, Nova's.
	QuotaCores, QuotaRAMMB int
}

// Request is one request the server answered. It holds no header, so no
// token.
type Request struct {
	Method string
	Path   string
	Query  string
	Status int
}

// Server is a running OpenStack API test server.
type Server struct {
	opts      Options
	projectID string
	userID    string
	http      *httptest.Server

	mu       sync.Mutex
	tokens   map[string]time.Time
	issued   int
	servers  map[string]*server
	flavors  map[string]*flavor
	keypairs map[string]*keypair
	volumes  map[string]*volume
	networks map[string]*network
	subnets  map[string]*subnet
	faults   []*fault
	requests []Request
	nextHost int
	// migrations are Nova's live migration records, oldest first;
	// migrationSeq numbers them.
	migrations   []*liveMigration
	migrationSeq int
	// failMigration, when set, fails the next live migration with it.
	failMigration string
	// consoles are the console proxies and the consoles made for them.
	consoles *consoleProxies
}

// Start starts a server on 127.0.0.1.
func Start(o Options) (*Server, error) {
	if o.Password == "" {
		return nil, fmt.Errorf("openstacktest: a password is required")
	}
	if o.Region == "" {
		o.Region = DefaultRegion
	}
	if o.Username == "" {
		o.Username = DefaultUsername
	}
	if o.Project == "" {
		o.Project = DefaultProject
	}
	if o.Domain == "" {
		o.Domain = DefaultDomain
	}
	if o.TokenLifetime <= 0 {
		o.TokenLifetime = DefaultTokenLifetime
	}
	if o.TransitionDelay <= 0 {
		o.TransitionDelay = DefaultTransitionDelay
	}
	if len(o.Hosts) == 0 {
		o.Hosts = []string{"compute-1"}
	}
	if o.HostVCPUs <= 0 {
		o.HostVCPUs = DefaultHostVCPUs
	}
	if o.HostMemoryMB <= 0 {
		o.HostMemoryMB = DefaultHostMemoryMB
	}
	if o.QuotaCores <= 0 {
		o.QuotaCores = 20
	}
	if o.QuotaRAMMB <= 0 {
		o.QuotaRAMMB = 51200
	}
	s := &Server{
		opts:      o,
		projectID: hexID(),
		userID:    hexID(),
		tokens:    map[string]time.Time{},
		servers:   map[string]*server{},
		flavors:   map[string]*flavor{},
		keypairs:  map[string]*keypair{},
		volumes:   map[string]*volume{},
		networks:  map[string]*network{},
		subnets:   map[string]*subnet{},
	}
	s.seedFlavors()
	s.consoles = s.startConsoleProxies()
	mux := http.NewServeMux()
	s.routeIdentity(mux)
	s.routeCompute(mux)
	s.routeVolumes(mux)
	s.routeNetwork(mux)
	if o.TLS {
		s.http = httptest.NewTLSServer(s.serve(mux))
	} else {
		s.http = httptest.NewServer(s.serve(mux))
	}
	return s, nil
}

// CACertPEM is the PEM of the certificate a TLS server serves with; nil
// without TLS.
func (s *Server) CACertPEM() []byte {
	if s.http.TLS == nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.http.Certificate().Raw})
}

// URL is the server's base URL, http://127.0.0.1:port (https with TLS).
func (s *Server) URL() string { return s.http.URL }

// AuthURL is Keystone's v3 endpoint, the auth_url of a clouds.yaml.
func (s *Server) AuthURL() string { return s.http.URL + IdentityPath + "/v3" }

// Options are the options the server runs with, defaults filled in.
func (s *Server) Options() Options { return s.opts }

// ProjectID is the id of the one project.
func (s *Server) ProjectID() string { return s.projectID }

// Close stops the server and its console proxies.
func (s *Server) Close() {
	s.http.Close()
	s.consoles.close()
}

// statusRecorder remembers the status a handler answered with.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// serve wraps the routes: it records the request, answers an injected fault
// before anything else, moves due transitions forward, and checks the token
// on everything but Keystone.
func (s *Server) serve(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			s.mu.Lock()
			s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Status: rec.status})
			s.mu.Unlock()
		}()
		if f := s.takeFault(r); f != nil {
			f.answer(rec)
			return
		}
		s.mu.Lock()
		s.advance()
		authorized := s.authorized(r)
		s.mu.Unlock()
		if !authorized && !isIdentity(r.URL.Path) {
			writeError(rec, http.StatusUnauthorized, "unauthorized", "The request you have made requires authentication.")
			return
		}
		mux.ServeHTTP(rec, r)
	})
}

// fault is an injected failure for the next requests matching it.
type fault struct {
	method, pattern string
	left            int
	status          int
	retryAfter      time.Duration
}

// answer writes the fault as the service would: Nova's error body, and a
// Retry-After header in seconds for an over-limit answer.
func (f *fault) answer(w http.ResponseWriter) {
	kind := map[int]string{
		http.StatusConflict:              "conflictingRequest",
		http.StatusRequestEntityTooLarge: "overLimit",
		http.StatusInternalServerError:   "computeFault",
		http.StatusServiceUnavailable:    "serviceUnavailable",
	}[f.status]
	if kind == "" {
		kind = "badRequest"
	}
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(f.retryAfter.Round(time.Second)/time.Second)))
	}
	writeError(w, f.status, kind, "injected fault")
}

// FailNext makes the next n requests with method whose path matches pattern
// (path.Match syntax, e.g. ComputePath+"/servers/*/action") answer status,
// with a Retry-After header when retryAfter is positive.
func (s *Server) FailNext(method, pattern string, n, status int, retryAfter time.Duration) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &fault{method: method, pattern: pattern, left: n, status: status, retryAfter: retryAfter})
}

func (s *Server) takeFault(r *http.Request) *fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.faults {
		if f.method != r.Method {
			continue
		}
		if ok, _ := path.Match(f.pattern, r.URL.Path); !ok {
			continue
		}
		f.left--
		if f.left <= 0 {
			s.faults = slices.Delete(s.faults, i, i+1)
		}
		return f
	}
	return nil
}

// Requests are the requests answered so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// CountRequests counts the requests answered so far with method whose path
// matches pattern (path.Match syntax).
func (s *Server) CountRequests(method, pattern string) int {
	n := 0
	for _, r := range s.Requests() {
		if ok, _ := path.Match(pattern, r.Path); ok && r.Method == method {
			n++
		}
	}
	return n
}

// errorBody is the error envelope Nova uses, {"<kind>": {"code", "message"}};
// Cinder and Neutron's are close enough that gophercloud reads them alike.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, kind, message string) {
	writeJSON(w, status, map[string]errorBody{kind: {Code: status, Message: message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// readJSON decodes the request body into v, answering 400 when it cannot.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "badRequest", "Malformed request body: "+err.Error())
		return false
	}
	return true
}

// timeFormat is how the APIs render timestamps: seconds, UTC.
const timeFormat = "2006-01-02T15:04:05Z"

func stamp(t time.Time) string { return t.UTC().Format(timeFormat) }

// hexID returns a random 32-hex-digit id, as Keystone's ids are.
func hexID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// link is an entry of a resource's links.
type link struct {
	Href string `json:"href"`
	Rel  string `json:"rel"`
}
