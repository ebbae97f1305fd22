package kubevirt

import corev1 "k8s.io/api/core/v1"

// Config configures the kubevirt backend: the agent fronts one
// namespace of a Kubernetes cluster running KubeVirt, and its guests are
// KubeVirt VirtualMachines.
type Config struct {
	// Kubeconfig is the target cluster's kubeconfig; empty means the
	// in-cluster configuration.
	Kubeconfig string
	// Namespace the VirtualMachines are created in; empty means default.
	Namespace string
	// AccessMode of the PVCs the driver makes for disks; empty means
	// ReadWriteOnce. KubeVirt moves a guest live only when every PVC of it
	// is ReadWriteMany, so set that where the storage class is shared.
	AccessMode corev1.PersistentVolumeAccessMode
}
