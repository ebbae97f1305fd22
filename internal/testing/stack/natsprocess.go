package stack

// With Options.NATSProcess the stack runs a stock nats-server binary, built
// from the nats-server module in go.mod, as a process of its own: a chaos
// run can then kill it with SIGKILL the way a crashed NATS pod dies, which an
// in-process server cannot show. It reads the configuration file natstest
// writes (natswire.ServerConfig + listen + JetStream store_dir), on a port
// fixed at the first start so clients reconnect to where it comes back.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/testing/controlplane"
)

// natsReadyTimeout bounds how long nats-server may take to accept
// connections; recovering a JetStream store is part of it.
const natsReadyTimeout = 30 * time.Second

type natsProcess struct {
	port int
	conf string
	proc *component
}

// NATSURL is the URL the hub and the agents connect to, whichever way NATS
// runs.
func (s *Stack) NATSURL() string {
	if s.natsProc != nil {
		return fmt.Sprintf("nats://127.0.0.1:%d", s.natsProc.port)
	}
	if s.NATS != nil {
		return s.NATS.URL()
	}
	return ""
}

// NATSPID is the nats-server process's id, or 0 when NATS runs in-process or
// is not running.
func (s *Stack) NATSPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.natsProc == nil {
		return 0
	}
	return pid(s.natsProc.proc)
}

func (s *Stack) startNATSProcess(ctx context.Context, users []natswire.User) error {
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(s.bin, "nats-server"), "github.com/nats-io/nats-server/v2")
	build.Dir = controlplane.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return errors.Errorf("cannot build nats-server: %v\n%s", err, out)
	}
	port := s.opts.NATSPort
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return errors.Wrap(err, "cannot pick a port for nats-server")
		}
		port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	store := filepath.Join(s.opts.Dir, "nats")
	conf := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream { store_dir: %q }\n%s", port, store, natswire.ServerConfig(users...))
	path := filepath.Join(store, "nats-server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return errors.Wrap(err, "cannot write nats-server configuration")
	}
	s.natsProc = &natsProcess{port: port, conf: path}
	return s.StartNATS()
}

// StartNATS starts the nats-server process (Options.NATSProcess) and waits
// until it accepts connections.
func (s *Stack) StartNATS() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.natsProc
	if p == nil {
		return errors.New("NATS runs in-process; set Options.NATSProcess to start and kill it")
	}
	if p.proc != nil {
		return errors.New("nats-server is already running")
	}
	c, err := s.run("nats-server", "nats-server", nil, "-c", p.conf)
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
			return errors.Errorf("nats-server exited: %v; see %s", err, s.logPath("nats-server"))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.Errorf("nats-server did not accept connections within %s; see %s", natsReadyTimeout, s.logPath("nats-server"))
		}
	}
}

// KillNATS kills the nats-server process with SIGKILL, as a crash would. Its
// JetStream store stays on disk for StartNATS.
func (s *Stack) KillNATS() { _ = s.stopNATS(syscall.SIGKILL) }

func (s *Stack) stopNATS(sig syscall.Signal) error {
	s.mu.Lock()
	var c *component
	if s.natsProc != nil {
		c, s.natsProc.proc = s.natsProc.proc, nil
	}
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.stop(sig)
}

func (s *Stack) stopNATSProcess() { _ = s.stopNATS(syscall.SIGTERM) }
