// Package tenantquota shows in each TenantQuota's status what its namespace
// holds against its limits, so `kubectl get tenantquota` shows a
// namespace's use; the placement loop enforces the limits (package quota).
package tenantquota

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
)

const (
	// settle is how long a VM's change waits before its namespace's
	// quotas are counted again: a burst of placements in one namespace
	// costs each of its quotas one status write, not one per VM.
	settle = time.Second
	// recount is how often a quota is counted regardless: orphaned guests
	// come and go with the nodes' reports, which wake no reconcile here.
	recount = 30 * time.Second
)

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, quotas *quota.Counter) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, quotas); err != nil {
			panic(errors.Wrap(err, "cannot set up the TenantQuota controller"))
		}
	}, apisv1alpha1.TenantQuotaGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind, v1alpha1.VolumeGroupVersionKind,
		v1alpha1.VirtualMachineSnapshotGroupVersionKind, v1alpha1.NetworkAddressGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, quotas *quota.Counter) error {
	r := &Reconciler{kube: mgr.GetClient(), quotas: quotas, log: o.Logger.WithValues("controller", "tenantquota")}
	return ctrl.NewControllerManagedBy(mgr).
		Named("tenantquota").
		For(&apisv1alpha1.TenantQuota{}).
		Watches(&v1alpha1.VirtualMachine{}, r.namespaceChanged()).
		Watches(&v1alpha1.Volume{}, r.namespaceChanged()).
		Watches(&v1alpha1.VirtualMachineSnapshot{}, r.namespaceChanged()).
		Watches(&v1alpha1.NetworkAddress{}, r.namespaceChanged()).
		WithOptions(o.ForControllerRuntime()).
		Complete(r)
}

// Reconciler writes a TenantQuota's status.
type Reconciler struct {
	kube   client.Client
	quotas *quota.Counter
	log    logging.Logger
}

// Reconcile counts what the quota's namespace holds and writes it when it
// changed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	q := &apisv1alpha1.TenantQuota{}
	if err := r.kube.Get(ctx, req.NamespacedName, q); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(errors.Wrap(err, "cannot read the TenantQuota"))
	}
	used, err := r.quotas.Used(ctx, q.Spec.Namespace)
	if err != nil {
		return reconcile.Result{}, err
	}
	want := apisv1alpha1.TenantQuotaStatus{Used: used.API(), Summary: quota.Summary(q, used)}
	if equality.Semantic.DeepEqual(q.Status, want) {
		return reconcile.Result{RequeueAfter: recount}, nil
	}
	q.Status = want
	if err := r.kube.Status().Update(ctx, q); err != nil && !kerrors.IsConflict(err) {
		return reconcile.Result{}, errors.Wrap(err, "cannot show the namespace's use")
	}
	r.log.Debug("Counted", "quota", q.Name, "namespace", q.Spec.Namespace, "used", want.Summary)
	return reconcile.Result{RequeueAfter: recount}, nil
}

// counted is what of o a quota counts: of a VM whether it is bound, the
// orphan it adopted and its shape; of a Volume whether it is bound and its
// size; of a snapshot its node, phase and size. Status writes of a VM's or
// Volume's phase change none of them. A NetworkAddress counts as it is.
func counted(o client.Object) [3]any {
	switch o := o.(type) {
	case *v1alpha1.VirtualMachine:
		a := o.GetAnnotations()
		return [3]any{a[v1alpha1.AnnotationNode], a[v1alpha1.AnnotationAdopted], quota.Of(o)}
	case *v1alpha1.Volume:
		return [3]any{o.GetAnnotations()[v1alpha1.AnnotationNode], quota.OfVolume(o)}
	case *v1alpha1.VirtualMachineSnapshot:
		return [3]any{o.Status.Node, o.Status.Phase, o.Status.Size.String()}
	}
	return [3]any{}
}

// namespaceChanged queues, settle later, the TenantQuotas of the namespace
// of an object counted that was created, changed or deleted.
func (r *Reconciler) namespaceChanged() handler.EventHandler {
	later := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		qs, err := quota.For(ctx, r.kube, o.GetNamespace())
		if err != nil {
			r.log.Info("Cannot find the namespace's TenantQuotas", "namespace", o.GetNamespace(), "error", err)
			return
		}
		for _, tq := range qs {
			q.AddAfter(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&tq)}, settle)
		}
	}
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { later(ctx, e.Object, q) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			if counted(e.ObjectOld) != counted(e.ObjectNew) {
				later(ctx, e.ObjectNew, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) { later(ctx, e.Object, q) },
	}
}
