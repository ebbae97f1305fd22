package driver

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Backend names.
const (
	BackendLibvirt  = "libvirt"
	BackendNova     = "nova"
	BackendKubeVirt = "kubevirt"
)

// Config selects and configures a backend.
type Config struct {
	// Backend is libvirt, nova or kubevirt.
	Backend string
	// Node is the name of the node the agent runs on, reported in
	// Observation.Node.
	Node    string
	Libvirt LibvirtConfig
}

// LibvirtConfig configures the libvirt backend.
type LibvirtConfig struct {
	// Socket is libvirtd's unix socket; empty means /run/libvirt/libvirt-sock.
	Socket string
	// URI is the libvirt connection URI; empty means qemu:///system.
	URI string
	// Pool is the storage pool for volumes without one, the cloud-init seed
	// and swap; empty means "default".
	Pool string
	// ShutdownGrace is how long a guest may take to shut down on ACPI before
	// it is forced off; zero means two minutes.
	ShutdownGrace time.Duration
	// ImageDir holds image downloads until they are verified and imported.
	// It belongs to this agent alone: at start, downloads an earlier agent
	// left behind when it was killed are removed. Empty means a directory of
	// the system's temporary directory, which is not cleaned.
	ImageDir string
}

// Factory builds a Driver from its Config.
type Factory func(ctx context.Context, cfg Config) (Driver, error)

// Registry maps backend names to their factories. The agent's wiring fills it:
// this package cannot import the backends, which import it.
type Registry map[string]Factory

// New builds the Driver cfg.Backend names.
func (r Registry) New(ctx context.Context, cfg Config) (Driver, error) {
	if f, ok := r[cfg.Backend]; ok {
		return f(ctx, cfg)
	}
	switch cfg.Backend {
	case BackendNova, BackendKubeVirt:
		return nil, errors.Errorf("backend %q is not built yet; this agent supports %s", cfg.Backend, BackendLibvirt)
	default:
		return nil, errors.Errorf("unknown backend %q; want one of %s, %s, %s", cfg.Backend, BackendLibvirt, BackendNova, BackendKubeVirt)
	}
}
