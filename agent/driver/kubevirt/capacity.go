package kubevirt

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Capacity implements driver.Driver: the allocatable CPUs and memory of the
// Nodes KubeVirt can schedule on (not cordoned, Ready), and what the VMs
// virtfleet made in the namespace ask for, running or not, orphans
// included: a released VM runs on in the cluster as before.
func (d *Driver) Capacity(ctx context.Context) (driver.Capacity, error) {
	c, err := d.client()
	if err != nil {
		return driver.Capacity{}, err
	}
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return driver.Capacity{}, errors.Wrap(err, "cannot list Nodes")
	}
	var cp driver.Capacity
	for _, n := range nodes.Items {
		if !schedulable(n) {
			continue
		}
		cp.VCPU += n.Status.Allocatable.Cpu().Value()
		cp.MemoryBytes += n.Status.Allocatable.Memory().Value()
	}
	vms, err := d.guests(ctx, c)
	if err != nil {
		return driver.Capacity{}, err
	}
	for _, vm := range vms {
		if vm.Spec.Template == nil {
			continue
		}
		vcpu, memory := size(&template(vm).Spec)
		cp.AllocatedVCPU += int64(vcpu)
		cp.AllocatedMemoryBytes += memory
	}
	return cp, nil
}

// schedulable reports whether KubeVirt can place guests on n.
func schedulable(n corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
