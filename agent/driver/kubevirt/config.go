package kubevirt

// Config configures the kubevirt backend: the agent fronts one
// namespace of a Kubernetes cluster running KubeVirt, and its guests are
// KubeVirt VirtualMachines.
type Config struct {
	// Kubeconfig is the target cluster's kubeconfig; empty means the
	// in-cluster configuration.
	Kubeconfig string
	// Namespace the VirtualMachines are created in; empty means default.
	Namespace string
}
