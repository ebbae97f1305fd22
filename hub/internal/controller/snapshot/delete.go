package snapshot

import (
	"context"
	"fmt"
	"slices"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/restore"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// vmGone reconciles a snapshot whose VM is gone. With vmDeletionPolicy
// Delete the snapshot goes too; a snapshot kept (Retain) goes on showing
// what its node reports of it; one never taken can no longer be.
func (r *Reconciler) vmGone(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot) (reconcile.Result, error) {
	switch {
	case s.Status.SourceUID != "" && s.Spec.VMDeletionPolicy == v1alpha1.SnapshotDelete:
		return reconcile.Result{}, r.deleteWithVM(ctx, s)
	case s.Status.Node != "":
		f, err := r.fleetOfNode(s.Status.Node)
		if err != nil {
			return reconcile.Result{}, err
		}
		r.opts.Notifier.Remember(s)
		return r.follow(ctx, s, nil, f)
	case s.Done():
		return reconcile.Result{}, nil
	case s.Status.SourceUID != "":
		return reconcile.Result{}, r.fail(ctx, s, nil, s.Status, fmt.Sprintf("VirtualMachine %s was deleted before the snapshot was taken", s.Spec.VMName))
	}
	st := s.Status
	st.Phase, st.Message = v1alpha1.SnapshotPending, fmt.Sprintf("VirtualMachine %s does not exist", s.Spec.VMName)
	return reconcile.Result{}, r.setStatus(ctx, s, st)
}

// deleteWithVM deletes s, whose VM was deleted. A hub that may not delete
// its own kinds (Crossplane's RBAC manager grants a provider none, and
// package/api was not applied) leaves it to the garbage collector, which
// follows the owner reference hold gave it.
func (r *Reconciler) deleteWithVM(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot) error {
	err := r.kube.Delete(ctx, s, client.Preconditions{UID: &s.UID})
	if kerrors.IsForbidden(err) || kerrors.IsConflict(err) {
		return nil
	}
	return errors.Wrap(client.IgnoreNotFound(err), "cannot delete the snapshot with its VM")
}

// fleetOfNode is the fleet that hears from node: with its VM gone, a
// snapshot has no ProviderConfig to name it.
func (r *Reconciler) fleetOfNode(node string) (*fleet.Fleet, error) {
	return fleet.HearingFrom(r.opts.Pool.Fleets(), node)
}

// deleted deletes the snapshot on its node, once no restore, clone or
// DiskImage reads it, and lets it go once the node reports it gone, or
// once the node has been lost for longer than the fencing timeout: a
// deletion never hangs forever.
func (r *Reconciler) deleted(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine) (reconcile.Result, error) {
	if !meta.FinalizerExists(s, Finalizer) {
		return reconcile.Result{}, nil
	}
	why, err := r.heldBy(ctx, s)
	if err != nil {
		return reconcile.Result{}, err
	}
	if why != "" {
		st := s.Status
		st.Message = why
		return reconcile.Result{}, r.setStatus(ctx, s, st)
	}
	node := s.Status.Node
	if node == "" {
		// Never asked of a node.
		return reconcile.Result{}, r.release(ctx, s)
	}
	var f *fleet.Fleet
	if vm != nil {
		f, err = r.fleetOf(ctx, vm)
	} else {
		f, err = r.fleetOfNode(node)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	r.opts.Notifier.Remember(s)
	gone, err := r.deleteOnNode(ctx, s, f)
	if err != nil || !gone {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.release(ctx, s)
}

// heldBy says what reads s and holds its deletion, or "". A restore
// holds it until it is over; a pending one counts too: it may start at
// any moment, and then fails seeing the snapshot deleted. So does one
// over that has not let go of its VM yet: the snapshot names the VM it
// drops its mark from. A clone made before the deletion holds it until it
// is over, and a DiskImage made before it until a node made the image
// (or failed to), while the snapshot is ready to use: the node reads the
// snapshot only then. One made after is refused the snapshot (Serves) and
// holds nothing.
func (r *Reconciler) heldBy(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot) (string, error) {
	restores := &v1alpha1.VirtualMachineRestoreList{}
	if err := r.kube.List(ctx, restores, client.InNamespace(s.Namespace), client.MatchingFields{index.RestoresOfSnapshot.Index: s.Name}); err != nil {
		return "", errors.Wrap(err, "cannot list the restores of the snapshot")
	}
	var names []string
	for i := range restores.Items {
		if !restores.Items[i].Done() || meta.FinalizerExists(&restores.Items[i], restore.Finalizer) {
			names = append(names, restores.Items[i].Name)
		}
	}
	if len(names) > 0 {
		return fmt.Sprintf("VirtualMachineRestore %s restores from the snapshot; it is deleted once the restore is over", slices.Min(names)), nil
	}
	if !s.Status.ReadyToUse {
		// Clones and images wait for a snapshot ready to use, and a
		// deleted one is no longer followed to become so: they are
		// refused it.
		return "", nil
	}
	clones := &v1alpha1.VirtualMachineCloneList{}
	if err := r.kube.List(ctx, clones, client.InNamespace(s.Namespace), client.MatchingFields{index.ClonesOfSnapshot.Index: s.Name}); err != nil {
		return "", errors.Wrap(err, "cannot list the clones of the snapshot")
	}
	for i := range clones.Items {
		if c := &clones.Items[i]; !c.Done() && s.Serves(c) {
			names = append(names, c.Name)
		}
	}
	if len(names) > 0 {
		return fmt.Sprintf("VirtualMachineClone %s copies the snapshot; it is deleted once the clone is over", slices.Min(names)), nil
	}
	images := &v1alpha1.DiskImageList{}
	if err := r.kube.List(ctx, images, client.InNamespace(s.Namespace), client.MatchingFields{index.ImagesOfSnapshot.Index: s.Name}); err != nil {
		return "", errors.Wrap(err, "cannot list the DiskImages of the snapshot")
	}
	for i := range images.Items {
		img := &images.Items[i]
		switch img.Status.AtProvider.Phase {
		case v1alpha1.ImagePhaseReady, v1alpha1.ImagePhaseFailed:
			continue
		}
		if !meta.WasDeleted(img) && s.Serves(img) {
			names = append(names, img.Name)
		}
	}
	if len(names) > 0 {
		return fmt.Sprintf("DiskImage %s copies a disk as the snapshot holds it; it is deleted once the image is made", slices.Min(names)), nil
	}
	return "", nil
}

// deleteOnNode asks the snapshot's node to delete it and says whether it
// is gone: the node reported it so, or it has been lost for longer than
// the fencing timeout, when the intent is left for the node to act on
// once its agent is back.
func (r *Reconciler) deleteOnNode(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, f *fleet.Fleet) (bool, error) {
	node, uid := s.Status.Node, string(s.UID)
	f.Snapshots.FlagForeign(s, node)
	rep, reported := f.Snapshots.Report(node, uid)
	if gone, err := r.absent(ctx, s, f, rep.Report, reported); err != nil || gone {
		return gone, err
	}
	if n := f.Node(node); n.Lost {
		lost := r.now().Sub(n.LostSince)
		if lost >= r.opts.FencingTimeout {
			r.recorder.Event(s, event.Warning(ReasonNodeLost, errors.Errorf(
				"node %s has been lost since %s; the snapshot is deleted after the fencing timeout (%s) without the node confirming it deleted it; the node deletes it when its agent comes back",
				node, n.LostSince.UTC().Format(time.RFC3339), r.opts.FencingTimeout)))
			return true, nil
		}
		// Come back when the timeout is up, not at the next backoff.
		r.opts.Notifier.NotifyAfter(uid, r.opts.FencingTimeout-lost)
	}
	if reported && rep.Report.Message != "" {
		st := s.Status
		st.Message = fmt.Sprintf("node %s cannot delete the snapshot yet: %s", node, rep.Report.Message)
		return false, r.setStatus(ctx, s, st)
	}
	return false, nil
}

// absent has the snapshot's node delete it: the intent asks so until the
// node reports it gone, and is then deleted itself (the node deletes its
// report when it sees the intent go). It says whether the node reported
// it gone.
func (r *Reconciler) absent(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, f *fleet.Fleet, rep wire.SnapshotReport, reported bool) (bool, error) {
	node, uid := s.Status.Node, string(s.UID)
	if reported && rep.Phase == wire.SnapshotPhaseGone {
		if err := bus.Delete(ctx, f.Bus, wire.SnapshotIntents, node, uid); err != nil {
			r.opts.Notifier.NotifyOnSync(f, uid)
			return false, errors.Wrapf(err, "cannot delete the snapshot intent on node %s", node)
		}
		r.published.Delete(s.UID)
		return true, nil
	}
	in := intentOf(s, types.UID(s.Status.SourceUID))
	in.Absent = true
	return false, r.publish(ctx, f, node, in)
}

// clear has the node delete what a failed snapshot left. It acts only on
// the node's report: a node that reports nothing of the snapshot keeps
// nothing of it, and is asked nothing again once it has cleared all.
func (r *Reconciler) clear(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, f *fleet.Fleet, rep fleet.Report[wire.SnapshotReport], reported bool) error {
	if !reported {
		return nil
	}
	_, err := r.absent(ctx, s, f, rep.Report, reported)
	return err
}

// release removes the snapshot's finalizer.
func (r *Reconciler) release(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot) error {
	if !meta.FinalizerExists(s, Finalizer) {
		return nil
	}
	meta.RemoveFinalizer(s, Finalizer)
	return errors.Wrap(client.IgnoreNotFound(r.kube.Update(ctx, s)), "cannot remove the snapshot's finalizer")
}
