package main

import (
	"cmp"
	"context"
	"maps"
	"path/filepath"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/app"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// hostnameLabel is the label every node carries with its own name, as a
// Kubernetes node does and as the agent's deployment sets it.
const hostnameLabel = "kubernetes.io/hostname"

// fleet is what serve runs: the simulated nodes and what they share.
type fleet struct {
	// Nodes are the nodes' names.
	Nodes []string
	// CredentialsDir holds each node's seed as <node>.nk.
	CredentialsDir string
	NATSURLs       []string
	// Labels are every node's labels besides hostnameLabel.
	Labels map[string]string
	// HostVCPUs and HostMemory are each simulated host's.
	HostVCPUs, HostMemory int64
	// MetricsAddress serves the metrics of the one node, as an agent's
	// --metrics-bind-address does; empty serves none. Several nodes' counts
	// would mix on one port, so it takes a single node.
	MetricsAddress string
	// PprofAddress serves Go's profiles of the whole process; empty serves
	// none.
	PprofAddress string
	// Node is the settings every node's agent shares; serve fills in the
	// rest per node.
	Node app.Config
	Log  logging.Logger
}

// serve runs every node of f until ctx is done, then stops them and returns
// nil. A node that cannot start, or whose intent watch fails for good,
// stops them all with its error: a scale test must not go on with fewer
// nodes than it asked for.
func serve(ctx context.Context, f fleet) error {
	if len(f.Nodes) == 0 {
		return errors.New("--nodes: name at least one node")
	}
	if f.CredentialsDir == "" {
		return errors.New("--credentials-dir is required")
	}
	if f.MetricsAddress != "" && len(f.Nodes) > 1 {
		return errors.Errorf("--metrics-bind-address serves one node's metrics, and %d nodes are named", len(f.Nodes))
	}
	cfgs := make([]app.Config, 0, len(f.Nodes))
	for _, n := range f.Nodes {
		cfg, err := f.config(n)
		if err != nil {
			return err
		}
		cfgs = append(cfgs, cfg)
	}
	// The profiles are the process's, whichever node serves them.
	cfgs[0].PprofAddress = f.PprofAddress
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, cfg := range cfgs {
		wg.Go(func() {
			if err := app.Run(ctx, cfg); err != nil {
				once.Do(func() { first = errors.Wrapf(err, "node %s", cfg.Node) })
				cancel()
			}
		})
	}
	f.Log.Info("Serving simulated nodes", "nodes", len(cfgs))
	wg.Wait()
	return first
}

// config is node's agent configuration: the shared settings, the node's own
// name, labels and credentials, metrics of its own (served by no endpoint
// but MetricsAddress, which only a single node has: a hundred nodes on one
// port would mix their counts), and an empty in-memory host.
func (f fleet) config(node string) (app.Config, error) {
	seed, err := app.ReadSeed(filepath.Join(f.CredentialsDir, node+".nk"))
	if err != nil {
		return app.Config{}, errors.Wrapf(err, "node %s", node)
	}
	cfg := f.Node
	cfg.Node, cfg.Seed, cfg.NATSURLs = node, seed, f.NATSURLs
	cfg.Labels = maps.Clone(f.Labels)
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels[hostnameLabel] = node
	cfg.MetricsAddress = cmp.Or(f.MetricsAddress, "0")
	cfg.Metrics = metrics.NewAgentMetrics()
	cfg.Log = f.Log
	d := fake.New(node)
	d.Unrecorded = true
	d.Host = driver.Capacity{VCPU: f.HostVCPUs, MemoryBytes: f.HostMemory}
	cfg.Driver = d
	// The nodes pose as libvirt hosts, the backend a VirtualMachine gets
	// when it names none, so a scale test's VMs land on them.
	cfg.Backend = driver.BackendLibvirt
	return cfg, nil
}
