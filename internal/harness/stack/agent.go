package stack

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// StartAgent starts node's agent.
func (s *Stack) StartAgent(node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agents[node] != nil {
		return errors.Errorf("the agent of %s is already running", node)
	}
	backendArgs, err := s.agentBackendArgs(node)
	if err != nil {
		return err
	}
	metrics, err := s.keptPort(metricsPort, "agent-"+node)
	if err != nil {
		return err
	}
	creds, err := s.writeCredentials(node)
	if err != nil {
		return err
	}
	natsURL, err := s.agentNATSURL(node)
	if err != nil {
		return err
	}
	args := append([]string{
		"--node=" + node,
		"--labels=" + s.labels(node),
		"--nats-url=" + natsURL,
		"--nats-credentials=" + creds,
		"--backend=" + s.backend(node),
		"--debug=" + strconv.FormatBool(s.opts.Debug),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics),
	}, backendArgs...)
	if s.opts.ResyncInterval > 0 {
		args = append(args, "--resync-interval="+s.opts.ResyncInterval.String())
	}
	if s.opts.Pprof {
		arg, err := s.pprofArg("agent-" + node)
		if err != nil {
			return err
		}
		args = append(args, arg)
	}
	if s.opts.FenceAfter > 0 {
		args = append(args, "--fence-after="+s.opts.FenceAfter.String())
	}
	argv := append([]string{filepath.Join(s.bin, "agent")}, args...)
	if h, ok := s.opts.LibvirtHosts[node]; ok && h.Capabilities != nil {
		// uid 0 with the bounding set cut to Capabilities: what the
		// agent's own process can do, as in cluster/deploy's DaemonSet.
		bounding := "-all"
		for _, c := range h.Capabilities {
			bounding += ",+" + strings.ToLower(c)
		}
		argv = append([]string{"setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--"}, argv...)
	}
	c, err := s.runCommand("agent-"+node, argv, nil)
	s.agents[node] = c
	return err
}

// writeCredentials writes node's nkey seed where its agent reads it,
// Dir/credentials/<node>.nk, and returns that path.
func (s *Stack) writeCredentials(node string) (string, error) {
	creds := filepath.Join(s.opts.Dir, "credentials", node+".nk")
	if err := os.MkdirAll(filepath.Dir(creds), 0o700); err != nil {
		return "", errors.Wrap(err, "cannot create the credentials directory")
	}
	if err := os.WriteFile(creds, s.AgentIdentities[node].Seed, 0o600); err != nil {
		return "", errors.Wrap(err, "cannot write the agent's credentials")
	}
	return creds, nil
}

// labels is the agent's --labels value for node.
func (s *Stack) labels(node string) string {
	l := []string{"kubernetes.io/hostname=" + node}
	for k, v := range s.opts.Labels[node] {
		l = append(l, k+"="+v)
	}
	sort.Strings(l[1:])
	return strings.Join(l, ",")
}

// backend is node's backend name.
func (s *Stack) backend(node string) string {
	if b := s.opts.Backends[node]; b != "" {
		return b
	}
	return driver.BackendLibvirt
}

// agentBackendArgs are the flags that point node's agent at its backend.
func (s *Stack) agentBackendArgs(node string) ([]string, error) {
	if b, ok := s.Backends[node]; ok {
		return append(b.AgentArgs(), s.imageArgs(filepath.Join(s.opts.Dir, "images-"+node))...), nil
	}
	if h, ok := s.opts.LibvirtHosts[node]; ok {
		args := []string{
			"--libvirt-socket=" + h.Socket,
			"--libvirt-uri=" + h.URI,
			"--libvirt-pool=" + h.Pool,
			"--image-dir=" + filepath.Join(s.opts.Dir, "images-"+node),
		}
		if h.DomainType != "" {
			args = append(args, "--libvirt-domain-type="+h.DomainType)
		}
		if h.ShutdownGrace > 0 {
			args = append(args, "--shutdown-grace="+h.ShutdownGrace.String())
		}
		if h.TunnelAddress != "" {
			args = append(args, "--tunnel-address="+h.TunnelAddress)
		}
		if h.Netns != "" {
			args = append(args, "--netns="+h.Netns)
		}
		if h.MigrationURI != "" {
			args = append(args, "--migration-uri="+h.MigrationURI)
		}
		if h.ConsoleLocalDir != "" {
			args = append(args, "--libvirt-console-local-dir="+h.ConsoleLocalDir)
		}
		if s.opts.SharedPool != "" {
			args = append(args, "--shared-pools="+s.opts.SharedPool)
		}
		return args, nil
	}
	n, ok := s.Nodes[node]
	if !ok {
		return nil, errors.Errorf("no node %s in this stack", node)
	}
	args := []string{
		"--libvirt-socket=" + n.Socket,
		"--libvirt-uri=" + n.URI,
		"--libvirt-pool=" + libvirttest.Pool,
		"--memory-allocation-ratio=" + strconv.FormatFloat(s.opts.MemoryAllocationRatio, 'f', -1, 64),
	}
	args = append(args, s.imageArgs(filepath.Join(n.Dir, "images"))...)
	if s.opts.CPUAllocationRatio > 0 {
		args = append(args, "--cpu-allocation-ratio="+strconv.FormatFloat(s.opts.CPUAllocationRatio, 'f', -1, 64))
	}
	if s.opts.SharedPool != "" {
		args = append(args, "--shared-pools="+s.opts.SharedPool)
	}
	return args, nil
}

// imageArgs are the flags of an agent's image downloads, kept in dir,
// whatever its backend.
func (s *Stack) imageArgs(dir string) []string {
	args := []string{"--image-dir=" + dir}
	if s.opts.ImagePruneInterval > 0 {
		args = append(args, "--image-prune-interval="+s.opts.ImagePruneInterval.String())
	}
	return args
}

// StopAgent stops node's agent cleanly; its guests keep running.
func (s *Stack) StopAgent(node string) error { return s.stopAgent(node, syscall.SIGTERM) }

// KillAgent kills node's agent with SIGKILL, as a crash would.
func (s *Stack) KillAgent(node string) { _ = s.stopAgent(node, syscall.SIGKILL) }

// Dump stops every agent and the hub with SIGQUIT, on which the Go runtime
// writes the stack of every goroutine into each one's log before it exits:
// where each was waiting, for a run that failed.
func (s *Stack) Dump() {
	for _, n := range s.agentNodes() {
		_ = s.stopAgent(n, syscall.SIGQUIT)
	}
	_ = s.stopHub(syscall.SIGQUIT)
}

// agentNodes are the nodes whose agent runs.
func (s *Stack) agentNodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.agents))
}

func (s *Stack) stopAgent(node string, sig syscall.Signal) error {
	s.mu.Lock()
	c := s.agents[node]
	delete(s.agents, node)
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.stop(sig)
}
