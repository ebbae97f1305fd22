package stack

// With Options.NATSProcess the stack runs a stock nats-server binary, built
// from the nats-server module in go.mod, as a process of its own: a chaos
// run can then kill it with SIGKILL the way a crashed NATS pod dies, which an
// in-process server cannot show. It reads a configuration file like the one
// natstest writes (natswire.ServerConfig + listen + JetStream store_dir), on
// a port fixed at the first start so clients reconnect to where it comes
// back. With Options.NATSCluster it runs that many such processes as one
// NATS cluster (routes between them, each its own JetStream store and
// monitoring port), and the default ClusterProviderConfig names every
// server and asks for buckets replicated on all of them.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// natsReadyTimeout bounds how long nats-server may take to accept
// connections; recovering a JetStream store is part of it.
const natsReadyTimeout = 30 * time.Second

// natsProcess is one nats-server process.
type natsProcess struct {
	name                           string
	port, clusterPort, monitorPort int
	conf                           string
	proc                           *component
}

// NATSURL is the URL, or for a cluster the comma-separated URLs, the hub and
// the agents connect to, whichever way NATS runs.
func (s *Stack) NATSURL() string {
	if len(s.natsProcs) > 0 {
		urls := make([]string, 0, len(s.natsProcs))
		for _, p := range s.natsProcs {
			urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", p.port))
		}
		return strings.Join(urls, ",")
	}
	if s.NATS != nil {
		return s.NATS.URL()
	}
	return ""
}

// NATSPID is the (first) nats-server process's id, or 0 when NATS runs
// in-process or is not running.
func (s *Stack) NATSPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.natsProcs) == 0 {
		return 0
	}
	return pid(s.natsProcs[0].proc)
}

// NATSServers is how many nats-server processes the stack runs.
func (s *Stack) NATSServers() int { return len(s.natsProcs) }

// natsServer is the nats-server binary: under Dir, not beside
// Options.Binaries, which stacks running at once may share, and one must
// not overwrite a binary another runs.
func (s *Stack) natsServer() string { return filepath.Join(s.opts.Dir, "bin", "nats-server") }

func (s *Stack) startNATSProcess(ctx context.Context, users []natswire.User) error {
	build := exec.CommandContext(ctx, "go", "build", "-o", s.natsServer(), "github.com/nats-io/nats-server/v2")
	build.Dir = controlplane.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return errors.Errorf("cannot build nats-server: %v\n%s", err, out)
	}
	n := max(s.opts.NATSCluster, 1)
	for i := range n {
		p := &natsProcess{name: "nats-server"}
		if n > 1 {
			p.name = fmt.Sprintf("nats-server-%d", i)
		}
		var err error
		if p.port = s.opts.NATSPort; p.port == 0 || i > 0 {
			if p.port, err = freeport.Pick(); err != nil {
				return err
			}
		}
		if n > 1 {
			if p.clusterPort, err = freeport.Pick(); err != nil {
				return err
			}
			if p.monitorPort, err = freeport.Pick(); err != nil {
				return err
			}
		}
		s.natsProcs = append(s.natsProcs, p)
	}
	for _, p := range s.natsProcs {
		store := filepath.Join(s.opts.Dir, "nats", p.name)
		if n == 1 {
			store = filepath.Join(s.opts.Dir, "nats")
		}
		if err := os.MkdirAll(store, 0o700); err != nil {
			return errors.Wrap(err, "cannot create the NATS store")
		}
		conf := fmt.Sprintf("server_name: %q\nlisten: \"127.0.0.1:%d\"\njetstream { store_dir: %q }\n", p.name, p.port, store)
		if n > 1 {
			routes := make([]string, 0, n)
			for _, q := range s.natsProcs {
				routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", q.clusterPort)))
			}
			conf += fmt.Sprintf("http: \"127.0.0.1:%d\"\ncluster { name: \"vf-nats\", listen: \"127.0.0.1:%d\", routes: [%s], no_advertise: true }\n",
				p.monitorPort, p.clusterPort, strings.Join(routes, ", "))
		}
		conf += natswire.ServerConfig(users...)
		p.conf = filepath.Join(store, "nats-server.conf")
		if err := os.WriteFile(p.conf, []byte(conf), 0o600); err != nil {
			return errors.Wrap(err, "cannot write nats-server configuration")
		}
	}
	for i := range s.natsProcs {
		if err := s.StartNATSServer(i); err != nil {
			return err
		}
	}
	return nil
}

// StartNATS starts the nats-server process (Options.NATSProcess), or the
// first of a cluster, and waits until it accepts connections.
func (s *Stack) StartNATS() error { return s.StartNATSServer(0) }

// StartNATSServer starts nats-server i of the cluster and waits until it
// accepts connections.
func (s *Stack) StartNATSServer(i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.natsProcs) {
		return errors.New("NATS runs in-process; set Options.NATSProcess to start and kill it")
	}
	p := s.natsProcs[i]
	if p.proc != nil {
		return errors.Errorf("%s is already running", p.name)
	}
	c, err := s.runCommand(p.name, s.fleetArgv([]string{s.natsServer(), "-c", p.conf}), nil)
	if err != nil {
		return err
	}
	p.proc = c
	deadline := time.Now().Add(natsReadyTimeout)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.port), time.Second)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		select {
		case err := <-c.done:
			c.done <- err // for stop
			return errors.Errorf("%s exited: %v; see %s", p.name, err, s.LogPath(p.name))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.Errorf("%s did not accept connections within %s; see %s", p.name, natsReadyTimeout, s.LogPath(p.name))
		}
	}
}

// KillNATS kills the (first) nats-server process with SIGKILL, as a crash
// would. Its JetStream store stays on disk for StartNATS.
func (s *Stack) KillNATS() { s.KillNATSServer(0) }

// KillNATSServer kills nats-server i of the cluster with SIGKILL.
func (s *Stack) KillNATSServer(i int) { _ = s.stopNATS(i, syscall.SIGKILL) }

// NATSMetaLeader is the index of the cluster's JetStream meta leader, as
// the servers' monitoring endpoints say.
func (s *Stack) NATSMetaLeader(ctx context.Context) (int, error) {
	for _, p := range s.natsProcs {
		if p.monitorPort == 0 {
			continue
		}
		var jsz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/jsz", p.monitorPort), nil)
		if err != nil {
			return 0, errors.Wrap(err, "cannot ask for the meta leader")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue // this one is down; ask another
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		_ = resp.Body.Close()
		if err != nil || jsz.Meta.Leader == "" {
			continue
		}
		for i, q := range s.natsProcs {
			if q.name == jsz.Meta.Leader {
				return i, nil
			}
		}
	}
	return 0, errors.New("no nats-server names a JetStream meta leader")
}

func (s *Stack) stopNATS(i int, sig syscall.Signal) error {
	s.mu.Lock()
	var c *component
	if i < len(s.natsProcs) {
		c, s.natsProcs[i].proc = s.natsProcs[i].proc, nil
	}
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.stop(sig)
}

func (s *Stack) stopNATSProcess() {
	for i := range s.natsProcs {
		_ = s.stopNATS(i, syscall.SIGTERM)
	}
}

// NATSServerHealthy is whether nats-server i says it is healthy, its
// JetStream caught up with the cluster's (its /healthz).
func (s *Stack) NATSServerHealthy(ctx context.Context, i int) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/healthz", s.natsProcs[i].monitorPort), nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
