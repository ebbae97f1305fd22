package stack

import (
	"cmp"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// startSimulated starts the one process that serves every node
// (Options.Simulated), each with the credentials the stack minted for it.
func (s *Stack) startSimulated() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.simulated != nil {
		return errors.New("the simulated nodes are already running")
	}
	var creds string
	for _, n := range s.opts.Nodes {
		f, err := s.writeCredentials(n)
		if err != nil {
			return err
		}
		creds = filepath.Dir(f)
	}
	h := s.opts.SimulatedHost
	args := []string{
		"--nodes=" + strings.Join(s.opts.Nodes, ","),
		"--credentials-dir=" + creds,
		"--nats-url=" + s.NATSURL(),
		"--host-vcpus=" + strconv.FormatInt(cmp.Or(h.VCPUs, 16), 10),
		"--host-memory=" + strconv.FormatInt(cmp.Or(h.MemoryBytes, 64<<30), 10),
		"--memory-allocation-ratio=" + strconv.FormatFloat(s.opts.MemoryAllocationRatio, 'f', -1, 64),
		"--debug=" + strconv.FormatBool(s.opts.Debug),
	}
	if s.opts.CPUAllocationRatio > 0 {
		args = append(args, "--cpu-allocation-ratio="+strconv.FormatFloat(s.opts.CPUAllocationRatio, 'f', -1, 64))
	}
	if s.opts.ResyncInterval > 0 {
		args = append(args, "--resync-interval="+s.opts.ResyncInterval.String())
	}
	// A single node is one agent: its metrics and profiles are served as
	// a real agent's are (AgentMetricsURL, PprofAddress of agent-NODE).
	if len(s.opts.Nodes) == 1 {
		port, err := s.keptPort(metricsPort, "agent-"+s.opts.Nodes[0])
		if err != nil {
			return err
		}
		args = append(args, "--metrics-bind-address=127.0.0.1:"+strconv.Itoa(port))
		if s.opts.Pprof {
			arg, err := s.pprofArg("agent-" + s.opts.Nodes[0])
			if err != nil {
				return err
			}
			args = append(args, arg)
		}
	}
	c, err := s.runCommand("simnodes", s.fleetArgv(append([]string{s.Binary("simnodes")}, args...)), nil)
	s.simulated = c
	return err
}

// StopSimulated stops the simulated nodes cleanly (SIGTERM) and waits for
// them; it does nothing when the stack has none.
func (s *Stack) StopSimulated() error {
	s.mu.Lock()
	c := s.simulated
	s.simulated = nil
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.stop(syscall.SIGTERM)
}

// SimulatedPID is the process id of the simulated nodes' process, or 0 when
// it is not running.
func (s *Stack) SimulatedPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return pid(s.simulated)
}
