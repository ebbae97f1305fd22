// Package stack runs the whole virtfleet system on one machine: a control
// plane (etcd + kube-apiserver) with the CRDs, an embedded NATS server with
// per-node credentials, the hub, and one agent per simulated node, each on
// its own private libvirtd. `make run`, the hub's integration tests and the
// benchmarks use it. The hub and the agents run as real processes of the
// binaries built from this tree, each with its own log file, so a test can
// kill one (SIGKILL, as a crash would) and start it again.
package stack

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Options configure a Stack. Zero values take the defaults.
type Options struct {
	// Dir holds the kubeconfig, logs/ and the NATS store. Required.
	Dir string
	// Nodes are the simulated hypervisor nodes; default node1..node3.
	Nodes []string
	// NATSPort is the NATS server's port; 0 picks a free one.
	NATSPort int
	// NodeTTL is the heartbeat TTL; 0 means the production default (10 s).
	NodeTTL time.Duration
	// FencingTimeout for deleting VMs on lost nodes; 0 means 60 s.
	FencingTimeout time.Duration
	// CPUAllocationRatio of the agents, given on every start (a restarted
	// agent offers what the first one did); 0 means theirs.
	CPUAllocationRatio float64
	// MemoryAllocationRatio of the agents; the test driver's host has only
	// 3 GiB, so the default here is 8 (room for dozens of small VMs).
	MemoryAllocationRatio float64
	// ImagePruneInterval of the agents; 0 means theirs (1 m).
	ImagePruneInterval time.Duration
	// PollInterval of the hub's controllers; 0 means 30 s.
	PollInterval time.Duration
	// ResyncInterval of the agents' full resyncs; 0 means theirs (60 s).
	ResyncInterval time.Duration
	// Progress receives a line per component as it starts.
	Progress io.Writer
	// Binaries, if set, is a directory holding hub and agent binaries built
	// from this tree (make run builds them with bin/local); empty builds
	// them into Dir/bin.
	Binaries string
	// Debug makes the hub and agents log at debug level.
	Debug bool
	// Pprof makes the hub and each agent serve Go's profiles, each on a
	// port of its own: see PprofAddress.
	Pprof bool
	// Backends names the backend of a node's agent: libvirt (the default, on
	// a private libvirtd), nova (Debian's real OpenStack services, the test
	// binary's shared cloud of internal/harness/openstack; its TestMain must
	// run openstack.Main) or kubevirt (a second kube-apiserver with
	// KubeVirt's CRDs and a test controller playing virt-controller).
	Backends map[string]string
	// LibvirtHosts are libvirt nodes whose daemon the caller runs (a real
	// hypervisor, see internal/harness/guesthost) instead of a private
	// test-driver libvirtd the stack starts.
	LibvirtHosts map[string]LibvirtHost
	// Labels are extra agent labels per node.
	Labels map[string]map[string]string
	// DefaultNodeSelector is the default ClusterProviderConfig's
	// nodeSelector: VMs without their own land only on nodes it matches.
	DefaultNodeSelector map[string]string
	// Grants are the default ClusterProviderConfig's tenant grants: what
	// namespaces may reach beyond what they own (imports, a node of their
	// choosing, host bridges, image servers on private addresses); nil
	// means DefaultGrants.
	Grants []apisv1alpha1.TenantGrant
	// NATSProcess runs NATS as a nats-server process of its own (built from
	// the module in go.mod) instead of in-process, so it can be killed with
	// SIGKILL (KillNATS) and started again (StartNATS). NATS is then nil.
	NATSProcess bool
	// NATSCluster runs that many nats-server processes (implies
	// NATSProcess when above 1) as one NATS cluster, every bucket
	// replicated on each (ProviderConfig replicas); KillNATSServer and
	// StartNATSServer take one down and back.
	NATSCluster int
	// CRDDirs, when set, are the CRDs the control plane starts with instead
	// of virtfleet's, such as Crossplane's own when Install installs
	// virtfleet as a Crossplane package.
	CRDDirs []string
	// Install, when set, runs once the control plane and NATS are up and
	// before the provider is configured and the hub started: it installs
	// virtfleet's CRDs (as Crossplane's package manager does) and returns
	// the kubeconfig the hub runs with instead of cluster/deploy's identity.
	Install func(ctx context.Context, s *Stack) (hubKubeconfig string, err error)
	// Subresources serves the hub's aggregated API through the API server
	// (kubectl virtfleet console, vnc, start, stop, …): aggregation on, and
	// cluster/deploy's APIService routed to the hub on this machine.
	Subresources bool
	// SharedPool, when set, is a pool of that name every private libvirtd
	// of the stack defines (at Dir/shared) and every agent announces as
	// shared storage (--shared-pools), as an administrator declares one
	// on NFS. The test driver keeps each daemon's volumes in memory: the
	// pool has the shared pool's name and role, not its files. The caller
	// defines it on LibvirtHosts.
	SharedPool string
	// FenceAfter is the agents' lease (--fence-after); 0 means theirs.
	FenceAfter time.Duration
	// FencingMargin is what the hub adds to a lost node's lease before it
	// restarts the node's VMs elsewhere (--fencing-margin); 0 means its.
	FencingMargin time.Duration
	// StraySweep is how often the hub deletes the intents no VM binds
	// (--stray-sweep-interval); 0 means its.
	StraySweep time.Duration
	// NATSProxies connects each agent to NATS through a proxy of its own,
	// so that CutAgent can cut one node off NATS while its agent and its
	// guests run on: a partition, not a crash.
	NATSProxies bool
	// Simulated serves every node from one simnodes process (agent/
	// simnodes) over the in-memory driver instead of an agent and a
	// libvirtd each: the real wire, credentials and reconciler per node,
	// for fleets larger than this machine runs agents for. Each node's
	// host has SimulatedHost's CPUs and memory; the allocation ratios
	// apply. Backends, LibvirtHosts, SharedPool and NATSProxies do not.
	// A single simulated node serves its agent's metrics at
	// AgentMetricsURL, and under Pprof its profiles, as a real agent does;
	// its process is SimulatedPID.
	Simulated bool
	// SimulatedHost is each simulated node's host; zero means 16 CPUs and
	// 64 GiB.
	SimulatedHost SimulatedHost
	// FleetFirst runs the simulated nodes and the nats-server processes
	// at a higher CPU priority (fleetNice) than the control plane and the
	// hub. They stand for a fleet's own machines and NATS's own servers,
	// which share no cores with the API server: on one machine, a busy API
	// server would otherwise starve a thousand agents of the CPU their
	// heartbeats and watches need, and the hub would see a fleet fail
	// that in a cluster would not.
	FleetFirst bool
	// HubMemoryLimit, when set, is the hub's --memory-limit in bytes, as
	// cluster/deploy gives the hub its container's memory limit: Go's
	// garbage collector then works to keep the hub's memory under 90% of
	// it instead of letting the heap grow to twice what is live.
	HubMemoryLimit int64
	// ObjectStore starts a real S3 server (SeaweedFS, built once per
	// machine) and declares it as the BackupLocation LocationName.
	ObjectStore bool
}

// SimulatedHost is the host a simulated node pretends to be.
type SimulatedHost struct {
	VCPUs       int64
	MemoryBytes int64
}

// DefaultGrants are what the stack's administrator grants when
// Options.Grants is nil: the namespaces where make run, the examples and the
// suites keep their resources (default, and guests for the real-guest
// suite) may import, choose nodes and download images from this machine's
// loopback, where the stack's image servers listen. Every other namespace
// is an ordinary tenant.
var DefaultGrants = []apisv1alpha1.TenantGrant{{
	Namespaces:   []string{"default", "guests"},
	Import:       true,
	ChooseNode:   true,
	ImageSources: []string{"127.0.0.0/8"},
	// The stack's own location, where Options.ObjectStore starts it.
	BackupLocations: []string{LocationName},
}}

// LibvirtHost is a libvirtd the agent of a node talks to.
type LibvirtHost struct {
	Socket string
	URI    string
	Pool   string
	// DomainType of the agent's guests; empty means the agent's default
	// (kvm where the host offers it).
	DomainType string
	// ShutdownGrace of the agent; 0 means the agent's default.
	ShutdownGrace time.Duration
	// TunnelAddress is the node's address on the underlay its overlays
	// run on; empty means the agent's default.
	TunnelAddress string
	// Netns is the path of the network namespace that holds libvirtd's
	// bridges, where the agent puts the overlay's devices; empty means the
	// agent's own.
	Netns string
	// MigrationURI is where the other hosts' libvirtds reach this one's to
	// migrate guests here; empty means the node receives none.
	MigrationURI string
	// ConsoleLocalDir is libvirt's QEMU directory, where the guests'
	// console sockets are, as the agent sees it; empty means where
	// libvirtd sees it.
	ConsoleLocalDir string
	// Capabilities, when set, are all the agent's process keeps (Linux
	// capability names, such as DAC_OVERRIDE), as cluster/deploy's
	// DaemonSet runs it: uid 0, every other capability dropped. Nil runs
	// it with the test's own.
	Capabilities []string
}

// Stack is a running system.
type Stack struct {
	ControlPlane *controlplane.ControlPlane
	NATS         *natstest.Server
	// Nodes are the libvirt nodes' daemons.
	Nodes map[string]*libvirttest.Node
	// Backends are the nova and kubevirt nodes' simulated clouds.
	Backends map[string]Backend
	// AgentIdentities are the nodes' NATS identities.
	AgentIdentities map[string]natswire.Identity
	// ObjectStore is the S3 server of the stack's backup location, when
	// Options.ObjectStore started one.
	ObjectStore *s3test.Server

	opts  Options
	hubID natswire.Identity
	// hubKubeconfig is the hub's Kubernetes identity: its ServiceAccount's
	// name, with only the rights cluster/deploy grants it.
	hubKubeconfig string
	nodeDirs      []string
	bin           string
	// ports are the components' ports, by what they serve and the
	// component (keptPort).
	ports map[string]int
	// apiPort is the hub's aggregated API's port (Options.Subresources),
	// apiService its APIService and apiServiceTarget the Service that
	// routes to it, as cluster/deploy names them.
	apiPort                      int
	apiService, apiServiceTarget string
	images                       *imageServer

	mu     sync.Mutex
	hub    *component
	agents map[string]*component
	// natsProcs are the nats-server processes when Options.NATSProcess or
	// NATSCluster is set.
	natsProcs []*natsProcess
	// proxies are the agents' NATS proxies, by node (Options.NATSProxies).
	proxies map[string]*natsProxy
	// simulated is the process serving every node (Options.Simulated).
	simulated *component
}

// Start brings everything up; the hub and every agent are running when it
// returns.
func Start(ctx context.Context, o Options) (*Stack, error) {
	if len(o.Nodes) == 0 {
		o.Nodes = []string{"node1", "node2", "node3"}
	}
	if o.MemoryAllocationRatio == 0 {
		o.MemoryAllocationRatio = 8
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, "logs"), 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create the log directory")
	}
	s := &Stack{opts: o, Nodes: map[string]*libvirttest.Node{}, Backends: map[string]Backend{}, AgentIdentities: map[string]natswire.Identity{}, agents: map[string]*component{}}
	if err := s.start(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Stack) start(ctx context.Context) error {
	o := s.opts
	if err := s.build(ctx); err != nil {
		return err
	}
	cpLog, err := os.Create(filepath.Join(o.Dir, "logs", "control-plane.log"))
	if err != nil {
		return errors.Wrap(err, "cannot create the control plane log")
	}
	// etcd's data and the NATS store live under Dir, so a Stack started on
	// the Dir of an earlier one finds its resources and intents. The
	// simulated nodes always start empty: their agents re-create the guests.
	cpOpts := controlplane.Options{Dir: o.Dir, Progress: o.Progress, Output: cpLog, EtcdDir: filepath.Join(o.Dir, "etcd"), CRDDirs: o.CRDDirs, Aggregation: o.Subresources}
	if s.ControlPlane, err = controlplane.Start(ctx, cpOpts); err != nil {
		return err
	}
	logf(o.Progress, "control plane", "kube-apiserver %s", s.ControlPlane.Config.Host)

	if s.hubID, err = natswire.NewHubIdentity(); err != nil {
		return err
	}
	users := []natswire.User{s.hubID.User}
	for _, n := range o.Nodes {
		id, err := natswire.NewAgentIdentity(n)
		if err != nil {
			return err
		}
		s.AgentIdentities[n] = id
		users = append(users, id.User)
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, "nats"), 0o700); err != nil {
		return errors.Wrap(err, "cannot create the NATS store")
	}
	if o.NATSProcess || o.NATSCluster > 1 {
		if err := s.startNATSProcess(ctx, users); err != nil {
			return err
		}
	} else if s.NATS, err = natstest.Start(natstest.Options{StoreDir: filepath.Join(o.Dir, "nats"), Port: o.NATSPort, Users: users}); err != nil {
		return err
	}
	logf(o.Progress, "nats", "%s, JetStream in %s, one identity per node", s.NATSURL(), filepath.Join(o.Dir, "nats"))

	if o.Install != nil {
		if s.hubKubeconfig, err = o.Install(ctx, s); err != nil {
			return err
		}
	}
	if err := s.configureProvider(ctx); err != nil {
		return err
	}
	if o.ObjectStore {
		if err := s.startObjectStore(ctx); err != nil {
			return err
		}
	}
	if s.hubKubeconfig == "" {
		if s.hubKubeconfig, err = s.hubIdentity(ctx); err != nil {
			return err
		}
	}
	if o.Subresources {
		if err := s.registerSubresources(ctx); err != nil {
			return err
		}
	}
	if s.images, err = startImageServer(); err != nil {
		return err
	}
	logf(o.Progress, "images", "%s (serves the examples' DiskImages)", s.images.url)
	for _, n := range o.Nodes {
		if o.Simulated {
			break
		}
		if b := s.backend(n); b != driver.BackendLibvirt {
			// Recorded only once started, as a libvirtd node: Stop after a
			// failed start must not stop a nil backend and hide the error.
			started, err := startBackend(ctx, b, n, filepath.Join(o.Dir, "backends", n))
			if err != nil {
				return err
			}
			s.Backends[n] = started
			logf(o.Progress, n, "%s: %s", b, started)
			continue
		}
		if h, ok := o.LibvirtHosts[n]; ok {
			logf(o.Progress, n, "libvirt %s at %s", h.URI, h.Socket)
			continue
		}
		// Not under Dir: a unix socket path must stay under 108 bytes.
		dir, err := os.MkdirTemp("", "vf-"+n+"-")
		if err != nil {
			return errors.Wrap(err, "cannot create a node directory")
		}
		s.nodeDirs = append(s.nodeDirs, dir)
		// Recorded only once started: Stop stops every node recorded, and a
		// nil one would panic and hide this error.
		node, err := libvirttest.StartNode(ctx, dir, n)
		if err != nil {
			return err
		}
		s.Nodes[n] = node
		if o.SharedPool != "" {
			if err := node.DefinePool(o.SharedPool, filepath.Join(o.Dir, "shared")); err != nil {
				return err
			}
		}
		// The daemon lives outside Dir; its log is found with the others.
		if err := os.Symlink(s.Nodes[n].LogPath(), s.LogPath("libvirtd-"+n)); err != nil {
			return errors.Wrap(err, "cannot link the libvirtd log into the log directory")
		}
	}
	if err := s.StartHub(); err != nil {
		return err
	}
	logf(o.Progress, "hub", "log: %s", s.LogPath("hub"))
	if o.Simulated {
		if err := s.startSimulated(); err != nil {
			return err
		}
		logf(o.Progress, "simnodes", "%d simulated nodes, log: %s", len(o.Nodes), s.LogPath("simnodes"))
	}
	for _, n := range o.Nodes {
		if o.Simulated {
			break
		}
		if err := s.StartAgent(n); err != nil {
			return err
		}
		logf(o.Progress, "agent "+n, "%s, log: %s", s.backend(n), s.LogPath("agent-"+n))
	}
	if o.Subresources {
		if err := s.AwaitSubresources(ctx); err != nil {
			return err
		}
		logf(o.Progress, "hub", "aggregated API %s served on 127.0.0.1:%d", s.apiService, s.apiPort)
	}
	return s.awaitHeartbeats(ctx)
}

// LogPath is the log file of a component: "hub", "agent-<node>".
func (s *Stack) LogPath(name string) string {
	return filepath.Join(s.opts.Dir, "logs", name+".log")
}

// build compiles the commands the stack runs into Dir/bin, unless
// Options.Binaries holds them.
func (s *Stack) build(ctx context.Context) error {
	if s.opts.Binaries != "" {
		s.bin = s.opts.Binaries
		return nil
	}
	s.bin = filepath.Join(s.opts.Dir, "bin")
	pkgs := commands[:len(commands)-1]
	if s.opts.Simulated {
		pkgs = commands
	}
	return build(ctx, s.bin, pkgs)
}

// commands are what a stack runs, built from this tree; simnodes, last,
// only with Options.Simulated.
var commands = []string{"./hub", "./agent", "./kubectl-virtfleet", "./agent/simnodes"}

// Build compiles every command a stack may run into dir, for
// Options.Binaries: a test binary that starts many stacks links them
// once instead of once per stack.
func Build(ctx context.Context, dir string) error { return build(ctx, dir, commands) }

// build runs one go command, which compiles what the packages share once
// and links them side by side, without the debug information (DWARF) no
// one reads here and much of each link's work goes to: a panic still
// names its functions and lines.
func build(ctx context.Context, dir string, pkgs []string) error {
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-ldflags=-w", "-o", dir + string(filepath.Separator)}, pkgs...)...) //nolint:gosec // our own packages
	cmd.Dir = controlplane.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.Errorf("cannot build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}

// Stop stops everything; state under Dir stays for inspection.
func (s *Stack) Stop() {
	for _, n := range s.agentNodes() {
		_ = s.StopAgent(n)
	}
	_ = s.StopSimulated()
	for _, p := range s.proxies {
		p.cut()
	}
	_ = s.StopHub()
	for _, n := range s.Nodes {
		n.Stop()
	}
	for _, b := range s.Backends {
		b.Stop()
	}
	for _, d := range s.nodeDirs {
		_ = os.RemoveAll(d)
	}
	if s.images != nil {
		s.images.stop()
	}
	if s.NATS != nil {
		s.NATS.Shutdown()
	}
	s.stopNATSProcess()
	if s.ObjectStore != nil {
		s.ObjectStore.Stop()
	}
	if s.ControlPlane != nil {
		_ = s.ControlPlane.Stop()
	}
}

// logf writes the one-line summary of a component.
func logf(w io.Writer, component, format string, args ...any) {
	fmt.Fprintf(w, "  %-14s %s\n", component, fmt.Sprintf(format, args...))
}

// Binary is the path of the stack's build of a command: hub or agent.
func (s *Stack) Binary(name string) string { return filepath.Join(s.bin, name) }

// Dir is the stack's run directory (logs/, bin/ and the stores).
func (s *Stack) Dir() string { return s.opts.Dir }
