package virtualmachine

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// heldGrowths are the VMs whose Volumes' growth a TenantQuota of their
// namespace holds (sizeVolumes), by uid. Nothing such a VM watches changes
// when its namespace has room again, so without them the growth would
// wait for the VM's next poll. They are few (a tenant past its quota), so
// finding a namespace's among them all is cheap; the hub's perobject.Owner
// forgets a VM once it is gone.
type heldGrowths struct {
	vms *perobject.Map[types.NamespacedName]
}

// note records whether vm holds a growth, as its Observe found.
func (h heldGrowths) note(vm *v1alpha1.VirtualMachine, held bool) {
	if held {
		h.vms.Store(vm.UID, client.ObjectKeyFromObject(vm))
		return
	}
	h.vms.Delete(vm.UID)
}

// in is the reconciles of namespace's VMs that hold a growth.
func (h heldGrowths) in(namespace string) []reconcile.Request {
	var out []reconcile.Request
	h.vms.Range(func(_ types.UID, key types.NamespacedName) bool {
		if key.Namespace == namespace {
			out = append(out, reconcile.Request{NamespacedName: key})
		}
		return true
	})
	return out
}

// onQuota queues the VMs holding a growth in the namespace of a
// TenantQuota created, changed or deleted: its limits may take the growth
// now.
func (h heldGrowths) onQuota() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		q, ok := o.(*apisv1alpha1.TenantQuota)
		if !ok {
			return nil
		}
		return h.in(q.Spec.Namespace)
	})
}

// onVolumeGone queues the VMs holding a growth in the namespace of a
// Volume deleted: the quota counts its size no more.
func (h heldGrowths) onVolumeGone() handler.EventHandler {
	return handler.Funcs{DeleteFunc: func(_ context.Context, e ctrlevent.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, r := range h.in(e.Object.GetNamespace()) {
			q.Add(r)
		}
	}}
}
