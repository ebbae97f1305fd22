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

// aroundObserve is the VM controller's reconciler: crossplane-runtime's
// managed reconciler, whose Observe only reads, with what the hub must
// write or publish outside Observe done around it. In order:
//
//   - A VM on no node that the hub may create, or that adopts an orphan,
//     is the placement loop's (Scheduler): it is skipped here, and the
//     placement loop's one write of its node wakes this controller again.
//   - A deleted VM that keeps its guest (no Delete policy, or deleted
//     with --cascade=orphan) is released here and never reaches the
//     managed reconciler, which would drop its finalizer without looking
//     at the guest: the intent is replaced by a release marker, and the
//     VM's finalizers go once the node confirmed the release.
//   - A placed VM that keeps its guest but that the placement loop did not
//     bind (an import whose node the user named, an Observe-only VM) gets
//     FinalizerKeep and the managed finalizer in one write before the
//     managed reconciler sees it; one the placement loop bound has them.
//   - After the managed reconcile, the events Observe found are recorded,
//     and the intent of an Observe-only VM with a guest to claim is
//     published: the managed reconciler never calls Update for it.
type aroundObserve struct {
	cache   client.Reader
	managed reconcile.Reconciler
	c       *connector
}

// Reconcile implements reconcile.Reconciler.
func (a *aroundObserve) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	vm := &v1alpha1.VirtualMachine{}
	if err := a.cache.Get(ctx, req.NamespacedName, vm); err != nil {
		return a.managed.Reconcile(ctx, req)
	}
	switch {
	case a.c.releases(vm):
		return a.release(ctx, vm)
	case needsPlacement(vm, a.c.policies):
		// The cache only moves forward, so the managed reconciler, which
		// reads the VM again, never sees it unplaced once this check saw
		// it placed.
		return reconcile.Result{}, nil
	}
	if err := a.c.keepFinalizer(ctx, vm); err != nil {
		return reconcile.Result{}, err
	}
	res, err := a.managed.Reconcile(ctx, req)
	a.c.flush(req.NamespacedName)
	if err != nil {
		return res, err
	}
	return res, a.publishObserveOnly(ctx, vm)
}

// releases is whether vm is deleted and its guest outlives it, or it still
// holds FinalizerKeep.
func (c *connector) releases(vm *v1alpha1.VirtualMachine) bool {
	if !meta.WasDeleted(vm) {
		return false
	}
	return meta.FinalizerExists(vm, FinalizerKeep) || (keepsGuest(vm, c.policies) && meta.FinalizerExists(vm, managed.FinalizerName))
}

// release reconciles the deletion of a VM that keeps its guest.
func (a *aroundObserve) release(ctx context.Context, vm *v1alpha1.VirtualMachine) (reconcile.Result, error) {
	if !keepsGuest(vm, a.c.policies) {
		// Its policies gained Delete after FinalizerKeep was added.
		if meta.FinalizerExists(vm, managed.FinalizerName) {
			return a.managed.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vm)}) // the guest is deleted first
		}
		return reconcile.Result{}, a.finalize(ctx, vm)
	}
	ext, err := a.c.Connect(ctx, vm)
	if err != nil {
		return reconcile.Result{}, err
	}
	obs, err := ext.(*external).observeRelease(ctx, vm, vm.GetAnnotations()[v1alpha1.AnnotationNode]) //nolint:forcetypeassert // Connect returns *external
	var releasing *ReleasingError
	switch {
	case errors.As(err, &releasing):
		return reconcile.Result{RequeueAfter: releaseRetry}, nil
	case err != nil:
		return reconcile.Result{}, err
	case obs.ResourceExists:
		return reconcile.Result{RequeueAfter: releaseRetry}, nil
	}
	// The guest runs on with its addresses: they stay held for it, and go
	// to the VM that adopts it.
	if err := a.c.opts.Addresses.Keep(ctx, vm); err != nil {
		return reconcile.Result{}, errors.Wrap(err, "cannot keep the released guest's addresses")
	}
	return reconcile.Result{}, a.finalize(ctx, vm)
}

// finalize drops the release finalizer and the managed one with it.
func (a *aroundObserve) finalize(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	meta.RemoveFinalizer(vm, FinalizerKeep)
	meta.RemoveFinalizer(vm, managed.FinalizerName)
	err := a.c.kube.Update(ctx, vm)
	return errors.Wrap(client.IgnoreNotFound(err), "cannot remove the VM's finalizers")
}

// publishObserveOnly publishes the intent of a placed Observe-only VM with
// a guest to claim, unless this hub already published that very intent.
func (a *aroundObserve) publishObserveOnly(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if node == "" || meta.WasDeleted(vm) || !ObserveOnly(vm) || claimOf(vm) == nil {
		return nil
	}
	if published, _ := a.c.state.published.Load(string(vm.UID)); published == fingerprint(intent(vm, dependencies{})) {
		return nil
	}
	ext, err := a.c.Connect(ctx, vm)
	if err != nil {
		return err
	}
	return ext.(*external).publish(ctx, vm, dependencies{}, node) //nolint:forcetypeassert // Connect returns *external
}

// keepFinalizer adds FinalizerKeep, and the managed finalizer in the same
// write, to a placed VM whose guest outlives it; the placement loop records
// both with the node of the VMs it binds, so the one extra write is for the
// VMs it does not (an import whose node the user named, an Observe-only
// VM).
func (c *connector) keepFinalizer(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if meta.WasDeleted(vm) || vm.GetAnnotations()[v1alpha1.AnnotationNode] == "" || !keepsGuest(vm, c.policies) || meta.FinalizerExists(vm, FinalizerKeep) {
		return nil
	}
	meta.AddFinalizer(vm, FinalizerKeep)
	meta.AddFinalizer(vm, managed.FinalizerName)
	err := c.kube.Update(ctx, vm)
	if kerrors.IsConflict(err) {
		return nil // the write that conflicted wakes this controller again
	}
	return errors.Wrap(err, "cannot add the finalizer that releases the guest")
}
