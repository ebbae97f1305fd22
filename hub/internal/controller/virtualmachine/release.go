package virtualmachine

import (
	"context"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// FinalizerKeep holds a VM whose management policies lack Delete until its
// node released the guest: the managed reconciler drops its own finalizer
// of such a VM without looking at the guest.
const FinalizerKeep = v1alpha1.Group + "/release-guest"

// releaseRetry is how soon a release that waits for its node is looked at
// again when no report wakes it first.
const releaseRetry = 5 * time.Second

// releaser reconciles the deletion of a VM that keeps its guest, and hands
// every other reconcile to the managed reconciler.
type releaser struct {
	inner reconcile.Reconciler
	c     *connector
}

// Reconcile implements reconcile.Reconciler.
func (r *releaser) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	vm := &v1alpha1.VirtualMachine{}
	if err := r.c.kube.Get(ctx, req.NamespacedName, vm); err != nil || !meta.WasDeleted(vm) || !meta.FinalizerExists(vm, FinalizerKeep) {
		return r.inner.Reconcile(ctx, req)
	}
	if !r.c.keepsGuest(vm) {
		if meta.FinalizerExists(vm, managed.FinalizerName) {
			return r.inner.Reconcile(ctx, req) // the guest is deleted first
		}
		return reconcile.Result{}, r.finalize(ctx, vm)
	}
	ext, err := r.c.Connect(ctx, vm)
	if err != nil {
		return reconcile.Result{}, err
	}
	obs, err := ext.(*external).observeRelease(ctx, vm, vm.GetAnnotations()[v1alpha1.AnnotationNode])
	var releasing *ReleasingError
	switch {
	case errors.As(err, &releasing):
		return reconcile.Result{RequeueAfter: releaseRetry}, nil
	case err != nil:
		return reconcile.Result{}, err
	case obs.ResourceExists:
		return reconcile.Result{RequeueAfter: releaseRetry}, nil
	}
	return reconcile.Result{}, r.finalize(ctx, vm)
}

// finalize drops the release finalizer and the managed one with it.
func (r *releaser) finalize(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	meta.RemoveFinalizer(vm, FinalizerKeep)
	meta.RemoveFinalizer(vm, managed.FinalizerName)
	err := r.c.kube.Update(ctx, vm)
	return errors.Wrap(client.IgnoreNotFound(err), "cannot remove the VM's finalizers")
}

// keepFinalizer adds FinalizerKeep to a VM whose guest outlives it, once
// it is placed; the one extra write is for such VMs alone.
func (e *external) keepFinalizer(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if !e.keepsGuest(vm) || meta.FinalizerExists(vm, FinalizerKeep) {
		return nil
	}
	meta.AddFinalizer(vm, FinalizerKeep)
	err := e.kube.Update(ctx, vm)
	if kerrors.IsConflict(err) {
		meta.RemoveFinalizer(vm, FinalizerKeep)
	}
	return errors.Wrap(err, "cannot add the finalizer that releases the guest")
}
