package kubevirt

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// Config configures the kubevirt backend: the agent fronts one
// namespace of a Kubernetes cluster running KubeVirt, and its guests are
// KubeVirt VirtualMachines.
//
// The kubeconfig's account needs, in Namespace (a Role):
//   - kubevirt.io virtualmachines: get, list, watch, create, patch, delete;
//     virtualmachineinstances: get, list, watch, delete;
//     virtualmachineinstancemigrations: get, list, create;
//   - persistentvolumeclaims: get, create, delete; events: list (why a
//     migration failed);
//   - cdi.kubevirt.io datavolumes: get, create, delete (disks made from
//     images only);
//   - instancetype.kubevirt.io virtualmachineinstancetypes: list, create,
//     delete (VMs of an instance type, see instancetype.go);
//   - snapshot.kubevirt.io virtualmachinesnapshots: get, list, create,
//     delete; virtualmachinerestores: get, create, delete (snapshots and
//     reverts, see snapshot.go);
//   - subresources.kubevirt.io virtualmachineinstances/pause and
//     virtualmachineinstances/unpause: update (pausing a guest);
//     virtualmachines/addvolume and virtualmachines/removevolume: update
//     (data disks of a running guest, see hotplug.go);
//     virtualmachineinstances/console and virtualmachineinstances/vnc: get
//     (the guest's serial console and display, see Driver.OpenConsole);
//
// and, cluster-wide (a ClusterRole), nodes: get, list, watch (capacity and
// migration targets).
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
	// Images are the limits of the downloads with which the agent checks
	// an image's SHA256 before CDI imports it.
	Images imageimport.Config
}
