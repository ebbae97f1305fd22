// Package restore reconciles VirtualMachineRestores: once the snapshot is
// ready on the node its VM runs on, it marks the VM with a sealed
// AnnotationRestore, follows the node's progress in the VM's report
// (wire.RestoreReport), and drops the mark once the node says the restore
// is over.
//
// The VM controller does the publishing (see virtualmachine.RestoreOf):
// while the VM carries the sealed mark, the intent to its node carries
// wire.Restore. This controller writes only the Kubernetes side, in an
// order a restarted hub can pick up anywhere:
//
//  1. the finalizer, then status InProgress, then the VM's mark;
//  2. on the node's word that it is over: the status (Succeeded or
//     Failed), then the VM's mark dropped, then the finalizer.
//
// Deleting a restore under way drops the mark at once: the node reverts a
// guest in one act, which it finishes or not, and drives the guest as the
// VM's spec says either way. A snapshot being restored is not deleted
// before its restores are over and let go (the snapshot controller waits).
package restore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// Finalizer holds a restore that marked its VM until the mark is dropped.
const Finalizer = v1alpha1.Group + "/restore"

// Event reasons, on the restore and on its VM.
const (
	ReasonStarted   event.Reason = "RestoreStarted"
	ReasonSucceeded event.Reason = "RestoreSucceeded"
	ReasonFailed    event.Reason = "RestoreFailed"
)

// waitRetry is how soon a restore that waits (for its snapshot, its VM,
// its node) is looked at again when nothing else wakes it.
const waitRetry = 5 * time.Second

// Options of the restore controller.
type Options struct {
	Pool providerconfig.Fleets
	// Notifier wakes a restore when its VM's reports change, and when the
	// VM's node is lost or comes back; every fleet's Guests must feed it
	// (Fleet.Guests.Subscribe).
	Notifier *wake.Notifier
}

// Reconciler reconciles VirtualMachineRestores.
type Reconciler struct {
	kube     client.Client
	configs  *providerconfig.Resolver
	opts     Options
	recorder event.Recorder
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, ro Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, ro); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachineRestore controller"))
		}
	}, v1alpha1.VirtualMachineRestoreGroupVersionKind, v1alpha1.VirtualMachineSnapshotGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, ro Options) error {
	name := "virtualmachinerestore"
	r := NewReconciler(mgr.GetClient(), ro, event.NewAPIRecorder(mgr.GetEventRecorderFor(name))) //nolint:staticcheck // as the other controllers
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.VirtualMachineRestore{}).
		// A snapshot that becomes ready, or goes, wakes its restores.
		Watches(&v1alpha1.VirtualMachineSnapshot{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, s client.Object) []reconcile.Request {
			return r.restores(ctx, s.GetNamespace(), client.MatchingFields{index.RestoresOfSnapshot.Index: s.GetName()})
		})).
		// A VM whose node, migration or restore changes may let a waiting
		// restore start; its status writes do not.
		Watches(&v1alpha1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, vm client.Object) []reconcile.Request {
			return r.restores(ctx, vm.GetNamespace())
		}), builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e ctrlevent.UpdateEvent) bool { return concernsRestores(e.ObjectOld, e.ObjectNew) }})).
		WatchesRawSource(ro.Notifier.Source()).
		Complete(r)
}

// NewReconciler returns a Reconciler writing with kube.
func NewReconciler(kube client.Client, ro Options, recorder event.Recorder) *Reconciler {
	return &Reconciler{kube: kube, configs: providerconfig.NewResolver(kube), opts: ro, recorder: recorder}
}

// concernsRestores says whether a VM's update may let a restore waiting
// for it go on.
func concernsRestores(before, after client.Object) bool {
	for _, k := range []string{v1alpha1.AnnotationNode, v1alpha1.AnnotationMigration, v1alpha1.AnnotationRestore} {
		if before.GetAnnotations()[k] != after.GetAnnotations()[k] {
			return true
		}
	}
	return meta.WasDeleted(before) != meta.WasDeleted(after)
}

// restores are the restores of namespace not yet over that opts select.
// A VM's are all of its namespace's: which VM a restore is of depends on
// its snapshot, and a namespace restores few VMs at once.
func (r *Reconciler) restores(ctx context.Context, namespace string, opts ...client.ListOption) []reconcile.Request {
	l := &v1alpha1.VirtualMachineRestoreList{}
	if err := r.kube.List(ctx, l, append(opts, client.InNamespace(namespace))...); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range l.Items {
		if !l.Items[i].Done() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	rs := &v1alpha1.VirtualMachineRestore{}
	if err := r.kube.Get(ctx, req.NamespacedName, rs); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	snap := &v1alpha1.VirtualMachineSnapshot{}
	if err := r.kube.Get(ctx, types.NamespacedName{Namespace: rs.Namespace, Name: string(rs.Spec.SnapshotName)}, snap); err != nil {
		if !kerrors.IsNotFound(err) {
			return reconcile.Result{}, errors.Wrap(err, "cannot get the snapshot")
		}
		snap = nil
	}
	vm, f, err := r.vmOf(ctx, rs, snap)
	if err != nil {
		return reconcile.Result{}, err
	}
	var mine bool
	if vm != nil {
		cur, marked := virtualmachine.RestoreOf(vm, f)
		mine = marked && cur.ID == string(rs.UID)
	}
	switch {
	case meta.WasDeleted(rs) || rs.Done():
		if mine {
			if err := r.unmark(ctx, vm); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{}, r.release(ctx, rs)
	case mine:
		r.opts.Notifier.RememberAs(string(vm.UID), rs)
		return r.follow(ctx, rs, snap, vm, f)
	}
	return r.start(ctx, rs, snap, vm, f)
}

// vmOf is the VM the restore writes into, and its fleet; nil when it does
// not exist or the snapshot that names it is gone.
func (r *Reconciler) vmOf(ctx context.Context, rs *v1alpha1.VirtualMachineRestore, snap *v1alpha1.VirtualMachineSnapshot) (*v1alpha1.VirtualMachine, *fleet.Fleet, error) {
	name := rs.Spec.VMName
	if snap != nil {
		name = rs.Target(snap)
	}
	if name == "" {
		return nil, nil, nil
	}
	vm := &v1alpha1.VirtualMachine{}
	if err := r.kube.Get(ctx, types.NamespacedName{Namespace: rs.Namespace, Name: string(name)}, vm); err != nil {
		return nil, nil, errors.Wrap(client.IgnoreNotFound(err), "cannot get the VM")
	}
	pc, err := r.configs.Resolve(ctx, vm)
	if err != nil {
		return nil, nil, err
	}
	f, err := r.opts.Pool.Get(ctx, pc.Target)
	if err != nil {
		return nil, nil, err
	}
	return vm, f, nil
}

// start marks the VM for the restore once the snapshot and the VM allow
// it, or says why the restore waits or cannot be.
func (r *Reconciler) start(ctx context.Context, rs *v1alpha1.VirtualMachineRestore, snap *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (reconcile.Result, error) {
	why, terminal, err := r.blocked(ctx, rs, snap, vm, f)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case terminal:
		return reconcile.Result{}, r.fail(ctx, rs, vm, f, why)
	case why != "":
		st := rs.Status
		st.Phase, st.Message = v1alpha1.RestorePending, why
		return reconcile.Result{RequeueAfter: waitRetry}, r.setStatus(ctx, rs, st)
	}
	if !meta.FinalizerExists(rs, Finalizer) {
		meta.AddFinalizer(rs, Finalizer)
		if err := r.kube.Update(ctx, rs); err != nil {
			return reconcile.Result{}, errors.Wrap(err, "cannot add the restore's finalizer")
		}
	}
	node := snap.Status.Node
	st := rs.Status
	st.Phase, st.TargetUID = v1alpha1.RestoreInProgress, string(vm.UID)
	st.Message = fmt.Sprintf("node %s restores VirtualMachine %s to snapshot %s", node, vm.Name, snap.Name)
	if err := r.setStatus(ctx, rs, st); err != nil {
		return reconcile.Result{}, err
	}
	m := virtualmachine.Restore{ID: string(rs.UID), Snapshot: string(snap.UID)}
	err = virtualmachine.Annotate(ctx, r.kube, vm, func(a map[string]string) {
		a[v1alpha1.AnnotationRestore] = m.String()
		a[v1alpha1.AnnotationRestoreSeal] = virtualmachine.RestoreSeal(f, string(vm.UID), m)
	})
	if err != nil {
		return reconcile.Result{}, errors.Wrap(err, "cannot record the restore on the VM")
	}
	r.opts.Notifier.RememberAs(string(vm.UID), rs)
	r.recorder.Event(rs, event.Normal(ReasonStarted, fmt.Sprintf("Restoring VM %s to snapshot %s on node %s", vm.Name, snap.Name, node)))
	return reconcile.Result{}, nil
}

// blocked says why the restore cannot start now, and whether it never
// can; "" when it can.
func (r *Reconciler) blocked(ctx context.Context, rs *v1alpha1.VirtualMachineRestore, snap *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (why string, terminal bool, err error) {
	switch {
	case snap == nil:
		return fmt.Sprintf("VirtualMachineSnapshot %s does not exist", rs.Spec.SnapshotName), false, nil
	case meta.WasDeleted(snap):
		return fmt.Sprintf("VirtualMachineSnapshot %s is being deleted", snap.Name), true, nil
	case snap.Status.Phase == v1alpha1.SnapshotFailed:
		return fmt.Sprintf("VirtualMachineSnapshot %s failed: %s", snap.Name, snap.Status.Message), true, nil
	case !snap.Status.ReadyToUse:
		return fmt.Sprintf("waiting for VirtualMachineSnapshot %s to be ready to use (it is %s)", snap.Name, orNotObserved(string(snap.Status.Phase))), false, nil
	case vm == nil:
		return fmt.Sprintf("VirtualMachine %s does not exist", rs.Target(snap)), true, nil
	case string(vm.UID) != snap.Status.SourceUID:
		return fmt.Sprintf("snapshot %s is of VM uid %s, not of VM %s (uid %s)", snap.Name, snap.Status.SourceUID, vm.Name, vm.UID), true, nil
	case meta.WasDeleted(vm):
		return fmt.Sprintf("VirtualMachine %s is being deleted", vm.Name), true, nil
	}
	if other, restoring := virtualmachine.RestoreOf(vm, f); restoring {
		return fmt.Sprintf("VirtualMachine %s is being restored by %s; this restore waits for it", vm.Name, r.nameOf(ctx, vm.Namespace, other.ID)), false, nil
	}
	if m, moving := virtualmachine.MigrationOf(vm, f); moving {
		return fmt.Sprintf("VirtualMachine %s is moving to node %s", vm.Name, m.Target), false, nil
	}
	node, err := virtualmachine.AdmittedNode(ctx, r.kube, vm, f)
	var refused *tenancy.RefusedError
	switch {
	case errors.As(err, &refused):
		return err.Error(), true, nil
	case err != nil:
		return "", false, err
	case node == "":
		return fmt.Sprintf("VirtualMachine %s is on no node", vm.Name), false, nil
	case node != snap.Status.Node:
		return fmt.Sprintf("VirtualMachine %s is on node %s and snapshot %s on node %s: a snapshot is restored on its own node only", vm.Name, node, snap.Name, snap.Status.Node), true, nil
	}
	if why, final := virtualmachine.KeepsSnapshots(f, node); why != "" {
		return why, final, nil
	}
	taking, err := r.taking(ctx, vm)
	if err != nil || taking == "" {
		return "", false, err
	}
	return fmt.Sprintf("snapshot %s of VirtualMachine %s is being taken; the restore starts once it is over", taking, vm.Name), false, nil
}

// taking is the name of a snapshot of vm its node is taking now, or "":
// a guest is either snapshotted or reverted at one time.
func (r *Reconciler) taking(ctx context.Context, vm *v1alpha1.VirtualMachine) (string, error) {
	l := &v1alpha1.VirtualMachineSnapshotList{}
	if err := r.kube.List(ctx, l, client.InNamespace(vm.Namespace), client.MatchingFields{index.SnapshotsOfVM.Index: vm.Name}); err != nil {
		return "", errors.Wrap(err, "cannot list the VM's snapshots")
	}
	var names []string
	for i := range l.Items {
		if st := l.Items[i].Status; st.Phase == v1alpha1.SnapshotInProgress && st.SourceUID == string(vm.UID) {
			names = append(names, l.Items[i].Name)
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	return slices.Min(names), nil
}

// nameOf names the restore of uid in namespace for a message; its uid
// where the cache does not show it.
func (r *Reconciler) nameOf(ctx context.Context, namespace, uid string) string {
	l := &v1alpha1.VirtualMachineRestoreList{}
	if err := r.kube.List(ctx, l, client.InNamespace(namespace)); err == nil {
		for i := range l.Items {
			if string(l.Items[i].UID) == uid {
				return "VirtualMachineRestore " + l.Items[i].Name
			}
		}
	}
	return "the VirtualMachineRestore of uid " + uid
}

func orNotObserved(s string) string {
	if s == "" {
		return "not observed yet"
	}
	return s
}

// follow mirrors the node's progress and ends the restore once the node
// says it is over. A VM that left the snapshot's node (restarted
// elsewhere after its node was lost) cannot be restored there.
func (r *Reconciler) follow(ctx context.Context, rs *v1alpha1.VirtualMachineRestore, snap *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (reconcile.Result, error) {
	node, err := virtualmachine.AdmittedNode(ctx, r.kube, vm, f)
	var refused *tenancy.RefusedError
	if err != nil && !errors.As(err, &refused) {
		return reconcile.Result{}, err
	}
	if snap != nil && node != snap.Status.Node {
		return reconcile.Result{}, r.fail(ctx, rs, vm, f, fmt.Sprintf("VirtualMachine %s is no longer on node %s, where its snapshot %s is", vm.Name, snap.Status.Node, snap.Name))
	}
	f.Guests.FlagForeign(vm, node)
	var progress *wire.RestoreReport
	if rep, ok := f.Guests.Report(node, string(vm.UID)); ok && rep.Report.Restore != nil && rep.Report.Restore.ID == string(rs.UID) {
		progress = rep.Report.Restore
	}
	st := rs.Status
	switch {
	case progress != nil && progress.Phase == wire.RestoreSucceeded:
		return reconcile.Result{}, r.succeed(ctx, rs, vm, progress)
	case progress != nil && progress.Phase == wire.RestoreFailed:
		return reconcile.Result{}, r.fail(ctx, rs, vm, f, fmt.Sprintf("node %s could not restore the VM: %s", node, progress.Message))
	case f.Node(node).Lost:
		st.Message = fmt.Sprintf("node %s sends no heartbeat; the restore goes on once it is back", node)
	case progress != nil:
		st.Message = fmt.Sprintf("node %s is restoring VirtualMachine %s", node, vm.Name)
	}
	return reconcile.Result{}, r.setStatus(ctx, rs, st)
}

// succeed ends the restore as Succeeded with the node's figures, then
// drops the VM's mark.
func (r *Reconciler) succeed(ctx context.Context, rs *v1alpha1.VirtualMachineRestore, vm *v1alpha1.VirtualMachine, p *wire.RestoreReport) error {
	st := rs.Status
	st.Phase, st.Complete, st.Message = v1alpha1.RestoreSucceeded, true, ""
	end := metav1.Now()
	if p.FinishedAt != nil {
		end = metav1.NewTime(*p.FinishedAt)
	}
	st.RestoreTime = &end
	if p.StartedAt != nil && p.FinishedAt != nil {
		st.DurationMilliseconds = p.FinishedAt.Sub(*p.StartedAt).Milliseconds()
	}
	if err := r.setStatus(ctx, rs, st); err != nil {
		return err
	}
	msg := fmt.Sprintf("VM %s restored to snapshot %s", vm.Name, rs.Spec.SnapshotName)
	if st.DurationMilliseconds > 0 {
		msg += fmt.Sprintf(" in %d ms", st.DurationMilliseconds)
	}
	e := event.Normal(ReasonSucceeded, msg)
	r.recorder.Event(rs, e)
	r.recorder.Event(vm, e)
	return r.unmark(ctx, vm)
}

// fail ends the restore as Failed with why, on the restore and on its VM
// (of fleet f), and drops the VM's mark if the restore made it.
func (r *Reconciler) fail(ctx context.Context, rs *v1alpha1.VirtualMachineRestore, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, why string) error {
	st := rs.Status
	st.Phase, st.Complete, st.Message = v1alpha1.RestoreFailed, false, why
	if err := r.setStatus(ctx, rs, st); err != nil {
		return err
	}
	e := event.Warning(ReasonFailed, errors.New(why))
	r.recorder.Event(rs, e)
	if vm == nil {
		return nil
	}
	r.recorder.Event(vm, e)
	if m, ok := virtualmachine.RestoreOf(vm, f); ok && m.ID == string(rs.UID) {
		return r.unmark(ctx, vm)
	}
	return nil
}

// unmark drops the restore from the VM; the VM controller then publishes
// its intent without it.
func (r *Reconciler) unmark(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	err := virtualmachine.Annotate(ctx, r.kube, vm, func(a map[string]string) {
		delete(a, v1alpha1.AnnotationRestore)
		delete(a, v1alpha1.AnnotationRestoreSeal)
	})
	return errors.Wrap(client.IgnoreNotFound(err), "cannot drop the restore from the VM")
}

// release removes the restore's finalizer.
func (r *Reconciler) release(ctx context.Context, rs *v1alpha1.VirtualMachineRestore) error {
	if !meta.FinalizerExists(rs, Finalizer) {
		return nil
	}
	meta.RemoveFinalizer(rs, Finalizer)
	return errors.Wrap(client.IgnoreNotFound(r.kube.Update(ctx, rs)), "cannot remove the restore's finalizer")
}

// setStatus writes st unless it is what the restore shows.
func (r *Reconciler) setStatus(ctx context.Context, rs *v1alpha1.VirtualMachineRestore, st v1alpha1.VirtualMachineRestoreStatus) error {
	if equality.Semantic.DeepEqual(rs.Status, st) {
		return nil
	}
	rs.Status = st
	return errors.Wrap(r.kube.Status().Update(ctx, rs), "cannot update the restore's status")
}
