package app

import (
	"os"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/nats-io/nkeys"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/kubevirt"
	"github.com/virtfleet/virtfleet/agent/driver/libvirt"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Default overcommit. vCPUs are time-shared, so a node offers four per host
// CPU (OpenStack Nova's historic default is higher, 16; four keeps latency
// sane for general workloads). Memory is not overcommitted by default: a
// guest that touches all of it would push the host into swap or the OOM
// killer. Development hosts on libvirt's test driver (3 GiB) raise it.
const (
	DefaultCPUAllocationRatio    = 4.0
	DefaultMemoryAllocationRatio = 1.0
)

// DefaultFenceAfter is the lease --fence-after gives a node: ten heartbeats
// at the default interval, so a node fences itself only after a real outage,
// and the hub restarts its guests elsewhere within a minute of losing it.
const DefaultFenceAfter = 20 * time.Second

// Config of one agent. Zero values take the defaults documented per field.
type Config struct {
	// Node is the name of this hypervisor node, a single NATS subject token.
	// Required.
	Node string
	// Labels are matched by VirtualMachines' nodeSelector.
	Labels map[string]string

	// NATSURLs are the servers of one NATS cluster. Required.
	NATSURLs []string
	// Seed is the node's nkey seed (see ReadSeed). Required. It is a secret:
	// never log it.
	Seed []byte
	// RequestTimeout bounds each NATS request; default bus.DefaultTimeout.
	// Short, because a request the server refuses gets no answer at all.
	RequestTimeout time.Duration

	// Backend is the driver to run; default libvirt. Only the named
	// backend's configuration is read.
	Backend  string
	Libvirt  libvirt.Config
	Nova     nova.Config
	KubeVirt kubevirt.Config
	// Driver, when set, is the node's driver instead of one made from
	// Backend's configuration: a simulated node of a scale test runs the
	// real wire, credentials and reconciler over an in-memory driver
	// (agent/simnodes). Run closes it when it stops.
	Driver driver.Driver

	// HeartbeatInterval between heartbeats; default 2 s. It must stay well
	// within the nodes bucket's TTL (10 s by default).
	HeartbeatInterval time.Duration
	// FenceAfter is the node's lease, announced in its heartbeat: when no
	// heartbeat put has succeeded for this long the node is fenced, and
	// destroys every guest whose intent sets Fence and starts none until it
	// has stored a heartbeat and read its intents afresh (package lease).
	// 0 means the node never fences itself, and the hub then never restarts
	// its guests elsewhere; otherwise it must be at least twice
	// HeartbeatInterval, or one slow put would fence the node.
	FenceAfter time.Duration
	// SharedPools are the storage pools on shared storage this node reaches
	// (libvirt pools on NFS, say), by their names, which are the same on
	// every node that reaches them; announced in the heartbeat, so the hub
	// places a guest with disks in one of them only on such nodes.
	SharedPools []string
	// ResyncInterval between full resyncs of every guest; default 60 s.
	ResyncInterval time.Duration
	// Workers reconcile different guests in parallel; default 8.
	Workers int

	// CPUAllocationRatio and MemoryAllocationRatio multiply the host's CPUs
	// and memory into the capacity the heartbeat offers to the hub's
	// placement; defaults DefaultCPUAllocationRatio and
	// DefaultMemoryAllocationRatio.
	CPUAllocationRatio    float64
	MemoryAllocationRatio float64

	// MetricsAddress is the host:port the agent serves its Prometheus
	// metrics on, at /metrics; empty or "0" serves none.
	MetricsAddress string
	// PprofAddress is the host:port the agent serves Go's profiles on, at
	// /debug/pprof/; empty serves none.
	PprofAddress string
	// MigrationURI is where other nodes' hypervisors reach this node's to
	// migrate a guest here live, announced in the heartbeat when the
	// backend can receive one (driver.Migrator); empty announces none, and
	// the hub then never migrates a guest to or from this node.
	MigrationURI string
	// ConsoleSessions is how many console sessions the node serves at
	// once; 0 means natswire.DefaultConsoleSessions.
	ConsoleSessions int
	// ConsoleBytesPerSecond bounds each console session in each direction;
	// 0 means natswire.DefaultConsoleBytesPerSecond.
	ConsoleBytesPerSecond int
	// Metrics are the agent's metrics; nil means the process's
	// (metrics.DefaultAgent). A test that runs several agents in one
	// process gives each its own, or their guest counts mix.
	Metrics *metrics.AgentMetrics

	// Log receives the agent's logs; nil discards them.
	Log logging.Logger
}

func (c *Config) defaults() {
	if c.Backend == "" {
		c.Backend = driver.BackendLibvirt
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = bus.DefaultTimeout
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = natswire.DefaultHeartbeatInterval
	}
	if c.ResyncInterval <= 0 {
		c.ResyncInterval = 60 * time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.CPUAllocationRatio == 0 {
		c.CPUAllocationRatio = DefaultCPUAllocationRatio
	}
	if c.MemoryAllocationRatio == 0 {
		c.MemoryAllocationRatio = DefaultMemoryAllocationRatio
	}
	if c.Log == nil {
		c.Log = logging.NewNopLogger()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.DefaultAgent()
	}
}

// validate reports the first setting the agent cannot start with, naming it
// as the flag that sets it.
func (c *Config) validate() error {
	if err := wire.ValidateNodeName(c.Node); err != nil {
		return errors.Wrap(err, "--node")
	}
	if len(c.NATSURLs) == 0 {
		return errors.New("--nats-url: at least one NATS server URL is required")
	}
	if len(c.Seed) == 0 {
		return errors.New("--nats-credentials: the node's nkey seed is required")
	}
	if c.CPUAllocationRatio < 0 || c.MemoryAllocationRatio < 0 {
		return errors.New("allocation ratios must be positive")
	}
	if c.FenceAfter < 0 {
		return errors.Errorf("--fence-after must not be negative, got %s", c.FenceAfter)
	}
	if c.FenceAfter > 0 && c.FenceAfter < 2*c.HeartbeatInterval {
		return errors.Errorf("--fence-after %s is shorter than twice --heartbeat-interval %s: one slow heartbeat would fence the node; raise it, or set 0 to never fence", c.FenceAfter, c.HeartbeatInterval)
	}
	for _, p := range c.SharedPools {
		if err := wire.ValidateToken("pool", p); err != nil {
			return errors.Wrap(err, "--shared-pools")
		}
	}
	if c.ConsoleSessions < 0 {
		return errors.Errorf("--console-sessions must not be negative, got %d", c.ConsoleSessions)
	}
	if c.ConsoleBytesPerSecond < 0 {
		return errors.Errorf("--console-bytes-per-second must not be negative, got %d", c.ConsoleBytesPerSecond)
	}
	return nil
}

// ReadSeed reads the node's nkey seed from path: the file
// hack/mint-agent-credentials writes (the bare seed), or a decorated NATS
// credentials file. Errors never quote the file's content.
func ReadSeed(path string) ([]byte, error) {
	b, err := os.ReadFile(path) //nolint:gosec // the operator names the file
	if err != nil {
		return nil, errors.Wrap(err, "cannot read NATS credentials")
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return nil, errors.Errorf("%s holds no user nkey seed (want the file hack/mint-agent-credentials writes)", path)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, errors.Errorf("%s holds no user nkey seed", path)
	}
	return seed, nil
}

// ParseLabels parses "k=v,k2=v2". Empty input is no labels.
//
// It is not labels.ConvertSelectorToLabelsMap (k8s.io/apimachinery), which
// differs where an operator would notice: there a key given twice silently
// takes its last value (here it is an error), an empty entry such as a
// trailing comma is an error (here it is skipped), and a value holding "="
// is refused (here it is kept).
func ParseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, errors.Errorf("label %q is not key=value", kv)
		}
		if _, dup := labels[k]; dup {
			return nil, errors.Errorf("label %q is given twice", k)
		}
		labels[k] = strings.TrimSpace(v)
	}
	return labels, nil
}

// ParseList parses "a,b": the entries, each trimmed of spaces, with empty
// ones (a trailing comma) skipped. Empty input is no entries.
func ParseList(s string) []string {
	var out []string
	for e := range strings.SplitSeq(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
