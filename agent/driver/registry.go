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
	Node     string
	Libvirt  LibvirtConfig
	Nova     NovaConfig
	KubeVirt KubeVirtConfig
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
	// ImagePruneInterval is how often unused images are looked for and
	// pruned once past their PruneAfter; zero means one minute. An image
	// thus goes at most one interval after its PruneAfter.
	ImagePruneInterval time.Duration
}

// NovaConfig configures the nova backend: the agent fronts one region of an
// OpenStack cloud, and its guests are Nova servers.
type NovaConfig struct {
	// CloudsFile is a clouds.yaml; empty means the standard locations
	// (./clouds.yaml, ~/.config/openstack, /etc/openstack) and, when none
	// names Cloud, the OS_* environment variables.
	CloudsFile string
	// Cloud is the entry of CloudsFile to use; empty means OS_CLOUD.
	Cloud string
	// Region overrides the cloud's region_name.
	Region string
	// PollInterval between changes-since list calls; zero means 5 s.
	PollInterval time.Duration
}

// KubeVirtConfig configures the kubevirt backend: the agent fronts one
// namespace of a Kubernetes cluster running KubeVirt, and its guests are
// KubeVirt VirtualMachines.
type KubeVirtConfig struct {
	// Kubeconfig is the target cluster's kubeconfig; empty means the
	// in-cluster configuration.
	Kubeconfig string
	// Namespace the VirtualMachines are created in; empty means default.
	Namespace string
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
	return nil, errors.Errorf("unknown backend %q; want one of %s, %s, %s", cfg.Backend, BackendLibvirt, BackendNova, BackendKubeVirt)
}
