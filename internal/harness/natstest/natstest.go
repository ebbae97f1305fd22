// Package natstest runs an in-process nats-server with JetStream for tests and
// for `make run`. It listens on 127.0.0.1 only, always has authorization on,
// and is configured through the same configuration file a stock nats-server
// would read (rendered by natsauth), so what passes here passes there.
package natstest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Options configure a Server.
type Options struct {
	// StoreDir holds JetStream's files; a Server started again on the same
	// directory sees the same streams. Required.
	StoreDir string
	// Port to listen on; 0 picks a free one.
	Port int
	// Users allowed to connect. There is no anonymous access.
	Users []natswire.User
}

// Server is a running embedded nats-server.
type Server struct {
	opts Options
	srv  *server.Server
}

// Start starts a server and waits until it accepts connections.
func Start(o Options) (*Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("natstest: StoreDir is required")
	}
	if len(o.Users) == 0 {
		return nil, errors.New("natstest: at least one user is required; auth is always on")
	}
	if o.Port == 0 {
		// Kept for a restart, which comes back where clients reconnect
		// to: a port outside the ephemeral range stays free meanwhile.
		p, err := freeport.Pick()
		if err != nil {
			return nil, err
		}
		o.Port = p
	}
	s := &Server{opts: o}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	conf := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream { store_dir: %q }\n%s",
		s.opts.Port, s.opts.StoreDir, natswire.ServerConfig(s.opts.Users...))
	path := filepath.Join(s.opts.StoreDir, "nats-server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return errors.Wrap(err, "cannot write nats-server configuration")
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return errors.Wrap(err, "cannot parse nats-server configuration")
	}
	opts.NoSigs = true
	opts.NoLog = true
	srv, err := server.NewServer(opts)
	if err != nil {
		return errors.Wrap(err, "cannot create nats-server")
	}
	srv.Start()
	if !srv.ReadyForConnections(readyWithin) {
		srv.Shutdown()
		// Its log is off; say whether its port was the reason.
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", s.opts.Port))
		if err != nil {
			return errors.Wrapf(err, "nats-server did not become ready within %s: port %d", readyWithin, s.opts.Port)
		}
		_ = l.Close()
		return errors.Errorf("nats-server did not become ready within %s", readyWithin)
	}
	s.srv = srv
	return nil
}

// readyWithin bounds the server's start. Generous: on a small machine
// running the whole test suite in parallel, a JetStream start can take many
// times as long as on an idle one.
const readyWithin = 60 * time.Second

// URL clients connect to.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and waits until it has stopped.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Restart starts a server that was shut down again, on the same port and
// store directory.
func (s *Server) Restart() error {
	return s.start()
}

// New starts a server for a test on a temporary store directory and shuts it
// down when the test ends.
func New(t testing.TB, users ...natswire.User) *Server {
	t.Helper()
	s, err := Start(Options{StoreDir: t.TempDir(), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Identities mints a hub identity and one agent identity per node, for tests.
func Identities(t testing.TB, nodes ...string) (hub natswire.Identity, agents map[string]natswire.Identity, users []natswire.User) {
	t.Helper()
	hub, err := natswire.NewHubIdentity()
	if err != nil {
		t.Fatal(err)
	}
	agents = map[string]natswire.Identity{}
	users = []natswire.User{hub.User}
	for _, n := range nodes {
		id, err := natswire.NewAgentIdentity(n)
		if err != nil {
			t.Fatal(err)
		}
		agents[n] = id
		users = append(users, id.User)
	}
	return hub, agents, users
}

// NewFleet starts a server for a test with a hub identity and one agent
// identity per node, and creates the wire's buckets as the hub does (cfg),
// over the hub's connection, with each node's reports stream as the hub
// makes it at the node's first heartbeat. It returns the server, the hub's JetStream
// and the nodes' identities.
func NewFleet(t testing.TB, cfg natswire.BucketConfig, nodes ...string) (*Server, jetstream.JetStream, map[string]natswire.Identity) {
	t.Helper()
	hub, agents, users := Identities(t, nodes...)
	srv := New(t, users...)
	nc, _ := Connect(t, srv, hub)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := natswire.EnsureBuckets(context.Background(), js, cfg); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := natswire.EnsureNodeReports(context.Background(), js, cfg, n); err != nil {
			t.Fatal(err)
		}
	}
	return srv, js, agents
}
