// Package stack runs the whole virtfleet system on one machine: a control
// plane (etcd + kube-apiserver) with the CRDs, an embedded NATS server with
// per-node credentials, the hub, and one agent per simulated node, each on
// its own private libvirtd. `make run`, the hub's integration tests and the
// benchmarks use it. The hub and the agents run as real processes of the
// binaries built from this tree, each with its own log file, so a test can
// kill one (SIGKILL, as a crash would) and start it again.
package stack

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/agent/driver"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Where the hub's NATS credentials live, as examples/providerconfig names them.
const (
	SystemNamespace = "virtfleet-system"
	HubSecretName   = "hub-nats-credentials"
	HubSecretKey    = "hub.nk"
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
	Simulated bool
	// SimulatedHost is each simulated node's host; zero means 16 CPUs and
	// 64 GiB.
	SimulatedHost SimulatedHost
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

// component is a running hub or agent process.
type component struct {
	name string
	cmd  *exec.Cmd
	done chan error
	// exited is closed once the process is gone, with its error in err;
	// unlike done it can be asked any number of times.
	exited chan struct{}
	err    error
	log    *os.File
	// grace is how long it has to stop after SIGTERM; zero is stopGrace.
	grace time.Duration
}

// How long a component has to stop after SIGTERM (Kubernetes' default grace
// period), and then to print its goroutines after SIGQUIT.
const (
	stopGrace = 30 * time.Second
	dumpGrace = 10 * time.Second
)

// stop sends sig and waits for the process; SIGTERM is a clean stop, SIGKILL
// a crash. A process still there its grace after SIGTERM gets SIGQUIT, on
// which Go prints every goroutine into its log and exits, so the log says
// where it hung; then it is killed.
func (c *component) stop(sig syscall.Signal) error {
	_ = c.cmd.Process.Signal(sig)
	grace := cmp.Or(c.grace, stopGrace)
	var err error
	select {
	case err = <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-c.done:
		case <-time.After(dumpGrace):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		err = errors.Errorf("still running %s after %s; its goroutines are in %s (SIGQUIT)", grace, sig, c.log.Name())
	}
	_ = c.log.Close()
	if sig == syscall.SIGKILL {
		return nil // the point was to crash it
	}
	return errors.Wrapf(err, "%s did not stop cleanly", c.name)
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

// awaitHeartbeats waits until every node's agent has put a heartbeat. Only
// then does the hub see every node, so that a workload created right after
// the start is spread over all of them, not over those whose agents came up
// first. Nothing here creates the buckets: the hub does, as it connects to
// the default ClusterProviderConfig's NATS at its start, as on a fresh
// install.
func (s *Stack) awaitHeartbeats(ctx context.Context) error {
	opts, err := s.hubID.ConnectOptions()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(s.NATSURL(), opts...)
	if err != nil {
		return errors.Wrap(err, "cannot connect to NATS as the hub")
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return errors.Wrap(err, "cannot use JetStream")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var (
		last    error  // why the last look was not enough
		missing string // the node without a heartbeat in the last look
	)
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		// A NATS cluster still electing its meta leader answers no request:
		// each look gets a few seconds, not the whole minute.
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, wire.BucketNodes)
		if err != nil {
			last = errors.Wrap(err, "no heartbeat bucket")
			return false, nil
		}
		for _, n := range s.opts.Nodes {
			key, err := wire.NodeKey(n)
			if err != nil {
				return false, err
			}
			if _, err := kv.Get(ctx, key); err != nil {
				if gone := s.serverOf(n).gone(); gone != nil {
					// No heartbeat will come: say so now, not in a minute.
					return false, gone
				}
				last = errors.Wrapf(err, "no heartbeat of %s", n)
				missing = n
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		err = errors.Wrapf(errors.Join(err, last), "not every agent put a heartbeat within a minute")
		if missing != "" {
			err = errors.Errorf("%v\n%s", err, s.describeNode(missing))
		}
		return err
	}
	return nil
}

// serverOf is the process that serves node: its agent, or the simulated
// nodes' process.
func (s *Stack) serverOf(node string) *component {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.simulated != nil {
		return s.simulated
	}
	return s.agents[node]
}

// describeNode is what the logs of node's agent and libvirtd end with, for
// an error that node's agent cannot be heard: the test's logs are gone
// with the machine that ran it, its output is not.
func (s *Stack) describeNode(node string) string {
	var b strings.Builder
	if c := s.serverOf(node); c != nil {
		fmt.Fprintf(&b, "the end of the log of %s:\n%s\n", c.name, tail(c.log.Name(), 20))
	}
	if n := s.Nodes[node]; n != nil {
		fmt.Fprintf(&b, "the end of the log of %s's libvirtd (%s):\n%s\n", node, n.State(), tail(n.LogPath(), 10))
	}
	return b.String()
}

// Heartbeat is node's last heartbeat, read as the hub reads it.
func (s *Stack) Heartbeat(ctx context.Context, node string) (wire.NodeHeartbeat, error) {
	opts, err := s.hubID.ConnectOptions()
	if err != nil {
		return wire.NodeHeartbeat{}, err
	}
	nc, err := nats.Connect(s.NATSURL(), opts...)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrap(err, "cannot connect to NATS as the hub")
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrap(err, "cannot use JetStream")
	}
	kv, err := js.KeyValue(ctx, wire.BucketNodes)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrap(err, "no heartbeat bucket")
	}
	e, err := kv.Get(ctx, node)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrapf(err, "no heartbeat of %s", node)
	}
	return wire.DecodeNodeHeartbeat(e.Value())
}

// configureProvider stores the hub's NATS credentials and the
// ClusterProviderConfig named default that points at this stack's NATS. Both
// are updated when a kept run directory already has them.
func (s *Stack) configureProvider(ctx context.Context) error {
	kube := s.ControlPlane.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: SystemNamespace}}
	if err := kube.Create(ctx, ns); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot create the system namespace")
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: HubSecretName}}
	if _, err := controllerutil.CreateOrUpdate(ctx, kube, secret, func() error {
		secret.Data = map[string][]byte{HubSecretKey: s.hubID.Seed}
		return nil
	}); err != nil {
		return errors.Wrap(err, "cannot store the hub's NATS credentials")
	}
	cpc := &apisv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	_, err := controllerutil.CreateOrUpdate(ctx, kube, cpc, func() error {
		cpc.Spec.Grants = s.opts.Grants
		if cpc.Spec.Grants == nil {
			cpc.Spec.Grants = DefaultGrants
		}
		cpc.Spec.ProviderConfigSpec = apisv1alpha1.ProviderConfigSpec{
			NATSURL:      s.NATSURL(),
			Replicas:     max(s.opts.NATSCluster, 1),
			NodeSelector: s.opts.DefaultNodeSelector,
			Credentials: apisv1alpha1.NATSCredentials{
				Source: xpv2.CredentialsSourceSecret,
				CommonCredentialSelectors: xpv2.CommonCredentialSelectors{SecretRef: &xpv2.SecretKeySelector{
					SecretReference: xpv2.SecretReference{Namespace: SystemNamespace, Name: HubSecretName},
					Key:             HubSecretKey,
				}},
			},
		}
		return nil
	})
	return errors.Wrap(err, "cannot configure the default ClusterProviderConfig")
}

// HubServiceAccount is the ServiceAccount cluster/deploy runs the hub as.
const HubServiceAccount = "system:serviceaccount:" + SystemNamespace + ":virtfleet-hub"

// hubIdentity applies the hub's ClusterRole and ClusterRoleBinding from
// cluster/deploy and returns a kubeconfig that authenticates as the
// ServiceAccount they bind, so every test of the stack also proves the
// deployed hub's RBAC is enough (and the hub asks for nothing more).
func (s *Stack) hubIdentity(ctx context.Context) (string, error) {
	dir := filepath.Join(controlplane.RepoRoot(), "cluster", "deploy", "hub")
	if _, err := s.ControlPlane.Apply(ctx, filepath.Join(dir, "clusterrole.yaml"), filepath.Join(dir, "clusterrolebinding.yaml")); err != nil {
		return "", errors.Wrap(err, "cannot grant the hub its RBAC")
	}
	return s.ControlPlane.AddUser(HubServiceAccount, "system:serviceaccounts", "system:serviceaccounts:"+SystemNamespace, "system:authenticated")
}

// HubIdentity is the hub's NATS identity, for tests that read the buckets
// as the hub does.
func (s *Stack) HubIdentity() natswire.Identity { return s.hubID }

// HubKubeconfig is the kubeconfig the hub runs with.
func (s *Stack) HubKubeconfig() string { return s.hubKubeconfig }

// LogPath is the log file of a component: "hub", "agent-<node>".
func (s *Stack) LogPath(name string) string {
	return filepath.Join(s.opts.Dir, "logs", name+".log")
}

// build compiles the hub and the agent from this tree into Dir/bin, in one
// go command, which compiles what they share once and links both at once.
func (s *Stack) build(ctx context.Context) error {
	if s.opts.Binaries != "" {
		s.bin = s.opts.Binaries
		return nil
	}
	s.bin = filepath.Join(s.opts.Dir, "bin")
	pkgs := []string{"./hub", "./agent", "./kubectl-virtfleet"}
	if s.opts.Simulated {
		pkgs = append(pkgs, "./agent/simnodes")
	}
	build := exec.CommandContext(ctx, "go", append([]string{"build", "-o", s.bin + string(filepath.Separator)}, pkgs...)...) //nolint:gosec // our own packages
	build.Dir = controlplane.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return errors.Errorf("cannot build the hub, the agent and the kubectl plugin: %v\n%s", err, out)
	}
	return nil
}

// run starts one of the built binaries with its output in logs/name.log.
func (s *Stack) run(name, binary string, env []string, args ...string) (*component, error) {
	return s.runCommand(name, append([]string{filepath.Join(s.bin, binary)}, args...), env)
}

// runCommand starts argv with its output in logs/name.log.
func (s *Stack) runCommand(name string, argv, env []string) (*component, error) {
	f, err := os.OpenFile(s.LogPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot open the log of %s", name)
	}
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // our own binaries
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Never outlive the stack, even if the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, errors.Wrapf(err, "cannot start %s", name)
	}
	c := &component{name: name, cmd: cmd, done: make(chan error, 1), exited: make(chan struct{}), log: f}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
		c.done <- c.err
	}()
	return c, nil
}

// gone says why c's process is no longer running, with the end of its
// log, or returns nil while it runs.
func (c *component) gone() error {
	select {
	case <-c.exited:
		return errors.Errorf("%s exited (%v); the end of its log:\n%s", c.name, c.err, tail(c.log.Name(), 20))
	default:
		return nil
	}
}

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path) //nolint:gosec // the stack's own log
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// StartHub starts the hub.
func (s *Stack) StartHub() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hub != nil {
		return errors.New("the hub is already running")
	}
	metrics, err := s.keptPort(metricsPort, "hub")
	if err != nil {
		return err
	}
	args := []string{fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics), "--health-probe-bind-address=0", "--poll=" + cmp.Or(s.opts.PollInterval, 30*time.Second).String()}
	if s.opts.Pprof {
		arg, err := s.pprofArg("hub")
		if err != nil {
			return err
		}
		args = append(args, arg)
	}
	if s.opts.NodeTTL > 0 {
		args = append(args, "--node-ttl="+s.opts.NodeTTL.String())
	}
	if s.opts.FencingTimeout > 0 {
		args = append(args, "--fencing-timeout="+s.opts.FencingTimeout.String())
	}
	if s.opts.FencingMargin > 0 {
		args = append(args, "--fencing-margin="+s.opts.FencingMargin.String())
	}
	if s.opts.Debug {
		args = append(args, "--debug")
	}
	if s.apiPort != 0 {
		args = append(args, fmt.Sprintf("--api-bind-address=127.0.0.1:%d", s.apiPort))
	}
	c, err := s.run("hub", "hub", []string{"KUBECONFIG=" + s.hubKubeconfig}, args...)
	s.hub = c
	return err
}

// StopHub stops the hub cleanly (SIGTERM) and waits for it.
func (s *Stack) StopHub() error { return s.stopHub(syscall.SIGTERM) }

// KillHub kills the hub with SIGKILL, as a crash would.
func (s *Stack) KillHub() { _ = s.stopHub(syscall.SIGKILL) }

func (s *Stack) stopHub(sig syscall.Signal) error {
	s.mu.Lock()
	c := s.hub
	s.hub = nil
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.stop(sig)
}

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

// What a component's kept port serves (keptPort).
const (
	metricsPort = "metrics"
	pprofPort   = "profiles"
)

// keptPort is component's (hub, agent-NODE) port for what, picked at its
// first start and kept across its restarts, so that whatever reads it
// finds it again; s.mu is held.
func (s *Stack) keptPort(what, component string) (int, error) {
	key := what + " " + component
	if s.ports[key] == 0 {
		port, err := freeport.Pick()
		if err != nil {
			return 0, errors.Wrapf(err, "cannot pick a port for the %s of %s", what, component)
		}
		if s.ports == nil {
			s.ports = map[string]int{}
		}
		s.ports[key] = port
	}
	return s.ports[key], nil
}

// portOf is the port keptPort picked for component's what, or 0 before
// its first start; s.mu is held.
func (s *Stack) portOf(what, component string) int { return s.ports[what+" "+component] }

// pprofArg is the --pprof-bind-address of component; s.mu is held.
func (s *Stack) pprofArg(component string) (string, error) {
	port, err := s.keptPort(pprofPort, component)
	return fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", port), err
}

// PprofAddress is where component (hub, agent-NODE) serves Go's profiles
// under Options.Pprof, or empty.
func (s *Stack) PprofAddress(component string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if port := s.portOf(pprofPort, component); port != 0 {
		return fmt.Sprintf("127.0.0.1:%d", port)
	}
	return ""
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

// Stop stops everything; state under Dir stays for inspection.
func (s *Stack) Stop() {
	s.mu.Lock()
	nodes := make([]string, 0, len(s.agents))
	for n := range s.agents {
		nodes = append(nodes, n)
	}
	s.mu.Unlock()
	for _, n := range nodes {
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
