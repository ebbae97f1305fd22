package kubevirt

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Delete implements driver.Driver. The VM is deleted and KubeVirt stops its
// VMI; Delete reports success only once the VM is gone, so the caller keeps
// calling while KubeVirt's finalizer holds it. PVCs stay. A guest uid
// released, or that another VM manages now, is left alone.
func (d *Driver) Delete(ctx context.Context, uid string) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	d.grown.Forget(uid)
	// Read from the API server, not the informers, and delete only the
	// version read: a VM released a moment ago may still look managed in
	// the informers, and deleting it would destroy the orphan.
	vm, err := d.lookup(ctx, d.live, uid)
	switch {
	case driver.IsNotFound(err): // also a *NotOursError
		// Gone, maybe since the last call: so may be its instance type.
		return d.pruneInstancetypes(ctx, c)
	case err != nil:
		return err
	}
	if vm.DeletionTimestamp == nil {
		err := c.Delete(ctx, vm, client.Preconditions{UID: &vm.UID, ResourceVersion: &vm.ResourceVersion})
		switch {
		case kerrors.IsNotFound(err):
			return nil
		case kerrors.IsConflict(err):
			return errors.Wrap(err, "the KubeVirt VirtualMachine changed while being deleted")
		case err != nil:
			return errors.Wrap(err, "cannot delete the KubeVirt VirtualMachine")
		}
	}
	left := &kubevirtv1.VirtualMachine{}
	err = d.live.Get(ctx, client.ObjectKeyFromObject(vm), left)
	switch {
	case kerrors.IsNotFound(err), err == nil && left.UID != vm.UID:
		// Its instance type, if no other VM names it, goes with it.
		return d.pruneInstancetypes(ctx, c)
	case err != nil:
		return errors.Wrap(err, "cannot get the KubeVirt VirtualMachine")
	}
	return errors.Errorf("waiting for KubeVirt to remove VirtualMachine %s/%s", d.namespace, vm.Name)
}

// DeleteVolume implements driver.Driver: it deletes the disk's
// DataVolume and PVC once no VirtualMachine of this driver names it, as a
// persistentVolumeClaim or a dataVolume. A PVC or DataVolume virtfleet did
// not create (no managed-by label) is left alone, as the site's own. The
// PVC of a DataVolume is its garbage, which the cluster's garbage
// collector deletes with it; the driver deletes it too, so the disk is
// gone however CDI left it (a DataVolume CDI removed once it had
// succeeded leaves its PVC behind, unowned).
func (d *Driver) DeleteVolume(ctx context.Context, disk driver.Disk) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	name := ObjectName(disk.Name)
	vms := &kubevirtv1.VirtualMachineList{}
	if err := c.List(ctx, vms, client.InNamespace(d.namespace)); err != nil {
		return errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
	}
	for _, vm := range vms.Items {
		if vm.Spec.Template == nil {
			continue
		}
		for _, v := range vm.Spec.Template.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == name {
				return driver.InUsef("PVC %s is used by KubeVirt VirtualMachine %s", name, vm.Name)
			}
			if v.DataVolume != nil && v.DataVolume.Name == name {
				return driver.InUsef("DataVolume %s is used by KubeVirt VirtualMachine %s", name, vm.Name)
			}
		}
	}
	dv := &cdiv1.DataVolume{}
	err = d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: name}, dv)
	switch {
	case kerrors.IsNotFound(err), meta.IsNoMatchError(err):
		// None; a cluster without CDI has none.
	case err != nil:
		return errors.Wrapf(err, "cannot get DataVolume %s", name)
	case dv.Labels[labelManagedBy] == managedBy:
		err := c.Delete(ctx, dv, client.Preconditions{UID: &dv.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err != nil && !kerrors.IsNotFound(err) {
			return errors.Wrapf(err, "cannot delete DataVolume %s", name)
		}
	}
	pvc := &corev1.PersistentVolumeClaim{}
	err = d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: name}, pvc)
	switch {
	case kerrors.IsNotFound(err):
		return nil
	case err != nil:
		return errors.Wrapf(err, "cannot get PVC %s", name)
	case pvc.Labels[labelManagedBy] != managedBy:
		return nil
	}
	err = c.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID})
	if err != nil && !kerrors.IsNotFound(err) {
		return errors.Wrapf(err, "cannot delete PVC %s", name)
	}
	return nil
}
