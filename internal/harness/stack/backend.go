package stack

import (
	"context"
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Backend is the simulated cloud a nova or kubevirt node's agent fronts. It
// outlives the agent: killing and restarting the agent leaves it and its
// guests as they are, as a real cloud would.
type Backend interface {
	// AgentArgs are the agent flags that point it at this backend.
	AgentArgs() []string
	// Guests counts the backend's guests by virtfleet uid, read behind
	// virtfleet's back (not through the driver under test).
	Guests(ctx context.Context) (map[string]int, error)
	// String says where the backend serves, for the progress line.
	fmt.Stringer
	// Stop stops it.
	Stop()
}

// startBackend starts the simulated cloud of a nova or kubevirt node; dir
// holds its files and logs.
func startBackend(ctx context.Context, backend, node, dir string) (Backend, error) {
	switch backend {
	case driver.BackendNova:
		return startNova(ctx, node, dir)
	case driver.BackendKubeVirt:
		return startKubeVirt(ctx, node, dir)
	default:
		return nil, errors.Errorf("node %s: unknown backend %q", node, backend)
	}
}

// Guests counts node's guests by virtfleet uid, read from the node's backend
// directly: libvirt domains by UUID (the VM's uid), or the simulated cloud's
// servers or VirtualMachines by their virtfleet uid.
func (s *Stack) Guests(ctx context.Context, node string) (map[string]int, error) {
	if b, ok := s.Backends[node]; ok {
		return b.Guests(ctx)
	}
	return s.libvirtGuests(ctx, node, 0)
}

// RunningGuests counts a libvirt node's running guests by virtfleet uid,
// behind virtfleet's back, as Guests does all of them.
func (s *Stack) RunningGuests(ctx context.Context, node string) (map[string]int, error) {
	return s.libvirtGuests(ctx, node, libvirt.ConnectListDomainsActive)
}

// libvirtGuests counts the guests of node's libvirtd that flags select.
func (s *Stack) libvirtGuests(_ context.Context, node string, flags libvirt.ConnectListAllDomainsFlags) (map[string]int, error) {
	n, ok := s.Nodes[node]
	if !ok {
		return nil, errors.Errorf("no node %s in this stack", node)
	}
	l, err := n.Dial()
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Disconnect() }()
	doms, _, err := l.ConnectListAllDomains(1, flags)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list domains")
	}
	out := map[string]int{}
	for _, d := range doms {
		out[uuid.UUID(d.UUID).String()]++
	}
	return out, nil
}
