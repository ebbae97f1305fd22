package virtualmachine

import (
	"context"
	"sync"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
)

// heldGrowths are the VMs whose Volumes' growth a TenantQuota of their
// namespace holds (sizeVolumes). Nothing such a VM watches changes when
// its namespace has room again, so without them the growth would wait for
// the VM's next poll.
type heldGrowths struct {
	vms sync.Map // types.NamespacedName -> struct{}
}

// note records whether vm holds a growth, as its Observe found.
func (h *heldGrowths) note(vm *v1alpha1.VirtualMachine, held bool) {
	k := client.ObjectKeyFromObject(vm)
	if held {
		h.vms.Store(k, struct{}{})
		return
	}
	h.vms.Delete(k)
}

// in is the reconciles of namespace's VMs that hold a growth; one gone
// from kube is forgotten, as its Observe will never run again.
func (h *heldGrowths) in(ctx context.Context, kube client.Reader, namespace string) []reconcile.Request {
	var out []reconcile.Request
	h.vms.Range(func(k, _ any) bool {
		key := k.(types.NamespacedName) //nolint:forcetypeassert // only keys are stored
		if key.Namespace != namespace {
			return true
		}
		if err := kube.Get(ctx, key, &v1alpha1.VirtualMachine{}); kerrors.IsNotFound(err) {
			h.vms.Delete(key)
			return true
		}
		out = append(out, reconcile.Request{NamespacedName: key})
		return true
	})
	return out
}

// onQuota queues the VMs holding a growth in the namespace of a
// TenantQuota created, changed or deleted: its limits may take the growth
// now.
func (h *heldGrowths) onQuota(kube client.Reader) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		q, ok := o.(*apisv1alpha1.TenantQuota)
		if !ok {
			return nil
		}
		return h.in(ctx, kube, q.Spec.Namespace)
	})
}

// onVolumeGone queues the VMs holding a growth in the namespace of a
// Volume deleted: the quota counts its size no more.
func (h *heldGrowths) onVolumeGone(kube client.Reader) handler.EventHandler {
	return handler.Funcs{DeleteFunc: func(ctx context.Context, e ctrlevent.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, r := range h.in(ctx, kube, e.Object.GetNamespace()) {
			q.Add(r)
		}
	}}
}
