package kubevirt

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// growDisks grows the PVCs of m's disks that are smaller than asked
// (driver.Driver's Ensure). It returns why a disk is not as big as asked
// yet, for the Observation's message.
func (d *Driver) growDisks(ctx context.Context, c client.Client, m driver.Machine) string {
	return d.grown.Grow(m, func(disk driver.Disk) string { return d.growDisk(ctx, c, disk) })
}

// growDisk raises the storage request of disk's PVC to the disk's size, as
// Kubernetes expands a volume: the storage class's resizer grows the
// volume and then the PVC's capacity, and KubeVirt (its ExpandDisks
// feature gate) the disk of the running guest. A DataVolume's PVC is
// raised the same way; CDI leaves an imported PVC's size to it. A request
// is never lowered. The PVC is as big as asked once its capacity is, or,
// while it is not bound yet, once its request is: it is then provisioned
// at that size.
func (d *Driver) growDisk(ctx context.Context, c client.Client, disk driver.Disk) string {
	key := types.NamespacedName{Namespace: d.namespace, Name: ObjectName(disk.Name)}
	pvc := &corev1.PersistentVolumeClaim{}
	switch err := d.live.Get(ctx, key, pvc); {
	case kerrors.IsNotFound(err):
		// Not made yet (its DataVolume's import has not begun): it is
		// made at the disk's size.
		return ""
	case err != nil:
		return fmt.Sprintf("cannot grow disk %s: cannot get PVC %s: %v", disk.Name, key.Name, err)
	}
	want := resource.NewQuantity(disk.SizeBytes, resource.BinarySI)
	if asked := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; asked.Cmp(*want) < 0 {
		next := pvc.DeepCopy()
		if next.Spec.Resources.Requests == nil {
			next.Spec.Resources.Requests = corev1.ResourceList{}
		}
		next.Spec.Resources.Requests[corev1.ResourceStorage] = *want
		if err := c.Patch(ctx, next, client.MergeFrom(pvc)); err != nil {
			return fmt.Sprintf("cannot grow disk %s to %s: the KubeVirt cluster refused to expand PVC %s: %v", disk.Name, want, key.Name, err)
		}
		pvc = next
	}
	if capacity, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok && capacity.Cmp(*want) < 0 {
		return fmt.Sprintf("PVC %s of disk %s is growing from %s to %s", key.Name, disk.Name, &capacity, want)
	}
	return ""
}
