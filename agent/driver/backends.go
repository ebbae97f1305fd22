package driver

// Backend names: the values of the agent's --backend and of a VM's
// spec.forProvider.backend. The agent's wiring (agent/internal/app) is the one
// factory that turns a name into a Driver; this package cannot import the
// backends, which import it.
const (
	BackendLibvirt  = "libvirt"
	BackendNova     = "nova"
	BackendKubeVirt = "kubevirt"
)
