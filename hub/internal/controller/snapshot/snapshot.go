// Package snapshot reconciles VirtualMachineSnapshots: it asks the node of
// the snapshot's VM to take it (a wire.SnapshotIntent under
// "<node>.snapshot.<uid>"), shows what that node reports of it, and has
// the node delete it when the snapshot is deleted.
//
// The status is what the hub observes, never what it hopes: a snapshot is
// ReadyToUse only while its node reports it Ready, and it shows Lost while
// its node is lost, reports it no more, or no longer runs its VM. Only a
// failure is final; the node keeps nothing of a failed snapshot.
//
// The order of writes lets a restarted hub resume anywhere: the finalizer
// (with an owner reference to the VM when the snapshot goes with it), then
// the status naming the node, then the intent to that node.
package snapshot

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
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
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// Finalizer holds a snapshot until its node has deleted it, or has been
// lost for longer than the fencing timeout.
const Finalizer = v1alpha1.Group + "/snapshot"

// Event reasons, on the snapshot and, where it is a fact about the VM, on
// its VM.
const (
	ReasonTaken  event.Reason = "SnapshotTaken"
	ReasonFailed event.Reason = "SnapshotFailed"
	// ReasonLost: the snapshot cannot be restored: its node is lost, no
	// longer has it, or no longer runs its VM.
	ReasonLost event.Reason = "SnapshotLost"
	// ReasonNodeLost: the snapshot was let go without its node confirming
	// that it deleted it.
	ReasonNodeLost event.Reason = "NodeLost"
)

// waitRetry is how soon a snapshot that waits (for its VM to be placed,
// to stop moving, for its node) is looked at again when nothing else wakes
// it.
const waitRetry = 5 * time.Second

// Fleets finds the fleet of a NATS server, and lists those open; a
// snapshot whose VM is gone has no ProviderConfig left to name its fleet,
// and is found in the one that hears from its node. *fleet.Pool is one.
type Fleets interface {
	Get(ctx context.Context, t fleet.Target) (*fleet.Fleet, error)
	Fleets() []*fleet.Fleet
}

// Options of the snapshot controller.
type Options struct {
	Pool Fleets
	// Notifier wakes a snapshot when its node's report of it changes, or
	// the node is lost or comes back; every fleet's Snapshots must feed it
	// (Fleet.Snapshots.Subscribe).
	Notifier *wake.Notifier
	// FencingTimeout is how long a snapshot deleted while its node is
	// lost waits for the node before it goes anyway: the VMs' own.
	FencingTimeout time.Duration
	// Memory owns what the controller remembers of each snapshot.
	Memory *perobject.Owner
	// Quotas admits each snapshot before its node is asked for it; nil
	// admits every one.
	Quotas *quota.Counter
}

// Reconciler reconciles VirtualMachineSnapshots.
type Reconciler struct {
	kube     client.Client
	configs  *providerconfig.Resolver
	opts     Options
	recorder event.Recorder
	now      func() time.Time
	// published is the intent last put for each snapshot, and its node:
	// a reconcile that would put the same again sends nothing.
	published *perobject.Map[publishedIntent]
}

// publishedIntent is an intent as put on one node.
type publishedIntent struct {
	node   string
	intent wire.SnapshotIntent
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, so Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, so); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachineSnapshot controller"))
		}
	}, v1alpha1.VirtualMachineSnapshotGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind, v1alpha1.VirtualMachineRestoreGroupVersionKind,
		v1alpha1.VirtualMachineCloneGroupVersionKind, v1alpha1.DiskImageGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, so Options) error {
	name := "virtualmachinesnapshot"
	r := NewReconciler(mgr.GetClient(), so, event.NewAPIRecorder(mgr.GetEventRecorderFor(name))) //nolint:staticcheck // as the other controllers
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.VirtualMachineSnapshot{}).
		Watches(&v1alpha1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, vm client.Object) []reconcile.Request {
			return r.snapshotsOf(ctx, vm.GetNamespace(), vm.GetName())
		}), builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e ctrlevent.UpdateEvent) bool { return concernsSnapshots(e.ObjectOld, e.ObjectNew) }})).
		// A restore that ends lets its snapshot be deleted.
		Watches(&v1alpha1.VirtualMachineRestore{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			rs, ok := o.(*v1alpha1.VirtualMachineRestore)
			if !ok {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: rs.Namespace, Name: string(rs.Spec.SnapshotName)}}}
		})).
		// So does a clone that ends, or an image made from it.
		Watches(&v1alpha1.VirtualMachineClone{}, handler.EnqueueRequestsFromMapFunc(snapshotsUsedBy(index.ClonesOfSnapshot))).
		Watches(&v1alpha1.DiskImage{}, handler.EnqueueRequestsFromMapFunc(snapshotsUsedBy(index.ImagesOfSnapshot))).
		WatchesRawSource(so.Notifier.Source()).
		Complete(r)
}

// snapshotsUsedBy maps an object of u's kind to the snapshots it reads.
func snapshotsUsedBy(u inuse.User) handler.MapFunc {
	return func(_ context.Context, o client.Object) []reconcile.Request {
		var out []reconcile.Request
		for _, name := range u.Uses(o) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}})
		}
		return out
	}
}

// NewReconciler returns a Reconciler writing with kube.
func NewReconciler(kube client.Client, so Options, recorder event.Recorder) *Reconciler {
	return &Reconciler{
		kube:      kube,
		configs:   providerconfig.NewResolver(kube),
		opts:      so,
		recorder:  recorder,
		now:       time.Now,
		published: perobject.NewMap[publishedIntent](so.Memory),
	}
}

// vmAnnotations are the VM's annotations its snapshots act on.
var vmAnnotations = []string{
	v1alpha1.AnnotationNode, v1alpha1.AnnotationSeal, v1alpha1.AnnotationBindingEpoch,
	v1alpha1.AnnotationMigration, v1alpha1.AnnotationMigrationSeal,
	v1alpha1.AnnotationRestore, v1alpha1.AnnotationRestoreSeal,
}

// concernsSnapshots says whether a VM's update concerns its snapshots: its
// node, migration or restore, its phase (a guest exists), or its deletion
// changed; a burst's status writes do not.
func concernsSnapshots(before, after client.Object) bool {
	b, ok1 := before.(*v1alpha1.VirtualMachine)
	a, ok2 := after.(*v1alpha1.VirtualMachine)
	if !ok1 || !ok2 {
		return true
	}
	for _, k := range vmAnnotations {
		if b.GetAnnotations()[k] != a.GetAnnotations()[k] {
			return true
		}
	}
	return b.Status.AtProvider.Phase != a.Status.AtProvider.Phase || meta.WasDeleted(b) != meta.WasDeleted(a)
}

// snapshotsOf are the snapshots of the VM namespace/name.
func (r *Reconciler) snapshotsOf(ctx context.Context, namespace, name string) []reconcile.Request {
	l := &v1alpha1.VirtualMachineSnapshotList{}
	if err := r.kube.List(ctx, l, client.InNamespace(namespace), client.MatchingFields{index.SnapshotsOfVM.Index: name}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	s := &v1alpha1.VirtualMachineSnapshot{}
	if err := r.kube.Get(ctx, req.NamespacedName, s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	vm, err := r.vmOf(ctx, s)
	if err != nil {
		return reconcile.Result{}, err
	}
	if meta.WasDeleted(s) {
		return r.deleted(ctx, s, vm)
	}
	if vm == nil {
		return r.vmGone(ctx, s)
	}
	f, err := r.fleetOf(ctx, vm)
	if err != nil {
		return reconcile.Result{}, err
	}
	r.opts.Notifier.Remember(s)
	if err := r.hold(ctx, s, vm); err != nil {
		return reconcile.Result{}, err
	}
	if s.Status.Node == "" {
		return r.take(ctx, s, vm, f)
	}
	return r.follow(ctx, s, vm, f)
}

// vmOf is the snapshot's VM, or nil when it is gone: not found, or a VM
// made since under the same name, which is another VM.
func (r *Reconciler) vmOf(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot) (*v1alpha1.VirtualMachine, error) {
	vm := &v1alpha1.VirtualMachine{}
	err := r.kube.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: string(s.Spec.VMName)}, vm)
	switch {
	case kerrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the snapshot's VM")
	case s.Status.SourceUID != "" && s.Status.SourceUID != string(vm.UID):
		return nil, nil
	}
	return vm, nil
}

// fleetOf is the fleet of vm's ProviderConfig.
func (r *Reconciler) fleetOf(ctx context.Context, vm *v1alpha1.VirtualMachine) (*fleet.Fleet, error) {
	pc, err := r.configs.Resolve(ctx, vm)
	if err != nil {
		return nil, err
	}
	return r.opts.Pool.Get(ctx, pc.Target)
}

// hold adds the finalizer, and keeps the owner reference to the VM that
// has Kubernetes' garbage collector delete a snapshot whose
// vmDeletionPolicy is Delete with its VM: the hub deletes it itself where
// it may (vmGone), but a hub installed by Crossplane's package manager may
// not delete its own kinds, and a hub that was down when the VM went would
// not see it go.
func (r *Reconciler) hold(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine) error {
	owned := slices.IndexFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == vm.UID })
	wantOwned := s.Spec.VMDeletionPolicy == v1alpha1.SnapshotDelete
	if meta.FinalizerExists(s, Finalizer) && (owned >= 0) == wantOwned {
		return nil
	}
	meta.AddFinalizer(s, Finalizer)
	switch {
	case wantOwned && owned < 0:
		s.OwnerReferences = append(s.OwnerReferences, metav1.OwnerReference{
			APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineKind, Name: vm.Name, UID: vm.UID,
			Controller: ptr.To(false), BlockOwnerDeletion: ptr.To(false),
		})
	case !wantOwned && owned >= 0:
		s.OwnerReferences = slices.Delete(s.OwnerReferences, owned, owned+1)
	}
	return errors.Wrap(r.kube.Update(ctx, s), "cannot hold the snapshot with its finalizer")
}

// take asks the VM's node for the snapshot, once the VM is where a
// snapshot can be taken: placed, admitted there, its guest made, not
// moving or being restored, on a live node that keeps snapshots. A node
// that keeps none fails the snapshot at once: no wait would change that.
// Nor would a wait mend a snapshot past its namespace's quota, which the
// tenant asked for knowing the limit: it fails before any node is asked,
// as Kubernetes refuses an object past a ResourceQuota.
func (r *Reconciler) take(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (reconcile.Result, error) {
	if s.Done() {
		return reconcile.Result{}, nil
	}
	st := s.Status
	st.SourceUID = string(vm.UID)
	if st.VM == nil {
		st.VM = vm.Spec.ForProvider.DeepCopy()
	}
	node, why, terminal, err := r.ready(ctx, vm, f)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case terminal:
		return reconcile.Result{}, r.fail(ctx, s, vm, st, why)
	case why != "":
		st.Phase, st.Message = v1alpha1.SnapshotPending, why
		return reconcile.Result{RequeueAfter: waitRetry}, r.setStatus(ctx, s, st)
	}
	// Admitted last, when nothing but the quota stands between the
	// snapshot and its node: one that waits holds nothing of the quota.
	if r.opts.Quotas != nil {
		var exceeded *quota.ExceededError
		switch err := r.opts.Quotas.AdmitSnapshot(ctx, s, vm); {
		case errors.As(err, &exceeded):
			return reconcile.Result{}, r.fail(ctx, s, vm, st, err.Error())
		case err != nil:
			return reconcile.Result{}, err
		}
	}
	// The spec as it is at the moment the node is asked.
	st.VM = vm.Spec.ForProvider.DeepCopy()
	st.Node, st.Phase, st.Message = node, v1alpha1.SnapshotInProgress, fmt.Sprintf("node %s is taking the snapshot", node)
	if err := r.setStatus(ctx, s, st); err != nil {
		if r.opts.Quotas != nil {
			r.opts.Quotas.Forget(s.UID)
		}
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.publish(ctx, f, node, intentOf(s, vm.UID))
}

// ready is the node vm is on, when a snapshot of it can be taken now, or
// why not; terminal says the snapshot can never be taken.
func (r *Reconciler) ready(ctx context.Context, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (node, why string, terminal bool, err error) {
	if meta.WasDeleted(vm) {
		return "", fmt.Sprintf("VirtualMachine %s is being deleted", vm.Name), true, nil
	}
	node, err = virtualmachine.AdmittedNode(ctx, r.kube, vm, f)
	var refused *tenancy.RefusedError
	switch {
	case errors.As(err, &refused):
		// The VM itself fails with the same reason; nothing of it is on
		// that node.
		return "", err.Error(), false, nil
	case err != nil:
		return "", "", false, err
	case node == "":
		return "", fmt.Sprintf("VirtualMachine %s is on no node yet", vm.Name), false, nil
	}
	if m, moving := virtualmachine.MigrationOf(vm, f); moving {
		return "", fmt.Sprintf("VirtualMachine %s is moving to node %s; the snapshot is taken once it is there", vm.Name, m.Target), false, nil
	}
	if _, restoring := virtualmachine.RestoreOf(vm, f); restoring {
		return "", fmt.Sprintf("VirtualMachine %s is being restored; the snapshot is taken once that is over", vm.Name), false, nil
	}
	switch p := vm.Status.AtProvider.Phase; p {
	case v1alpha1.PhaseRunning, v1alpha1.PhasePaused, v1alpha1.PhaseStopped:
	default:
		return "", fmt.Sprintf("VirtualMachine %s is %s; a snapshot is taken of a guest that is Running, Paused or Stopped", vm.Name, phaseOrNone(p)), false, nil
	}
	if why, final := virtualmachine.KeepsSnapshots(f, node); why != "" {
		return "", why, final, nil
	}
	return node, "", false, nil
}

func phaseOrNone(p v1alpha1.Phase) string {
	if p == "" {
		return "not observed yet"
	}
	return string(p)
}

// intentOf is the intent that asks for s, of the guest vm.
func intentOf(s *v1alpha1.VirtualMachineSnapshot, vm types.UID) wire.SnapshotIntent {
	return wire.SnapshotIntent{UID: string(s.UID), Namespace: s.Namespace, Name: s.Name, VM: string(vm), Memory: s.Spec.IncludeMemory}
}

// follow shows what the snapshot's node reports of it, keeps the intent
// there, and has the node delete what a failed snapshot left.
func (r *Reconciler) follow(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (reconcile.Result, error) {
	node, uid := s.Status.Node, string(s.UID)
	f.Snapshots.FlagForeign(s, node)
	rep, reported := f.Snapshots.Report(node, uid)
	if s.Status.Phase == v1alpha1.SnapshotFailed {
		return reconcile.Result{}, r.clear(ctx, s, f, rep, reported)
	}
	if !reported && !f.Synced() {
		// Its report may be among those not read yet.
		return reconcile.Result{RequeueAfter: waitRetry}, nil
	}
	st := observe(s.Status, rep.Report, reported)
	if vm != nil {
		if moved := r.movedFrom(ctx, vm, f, node); moved != "" {
			st = lost(st, moved)
		}
	}
	if n := f.Node(node); n.Lost && st.Phase != v1alpha1.SnapshotFailed {
		st = lost(st, fmt.Sprintf("node %s has sent no heartbeat since %s; the snapshot cannot be restored until it is back", node, n.LostSince.UTC().Format(time.RFC3339)))
	}
	if vm == nil {
		kept := fmt.Sprintf("VirtualMachine %s is gone and the snapshot is kept (vmDeletionPolicy Retain)", s.Spec.VMName)
		st.Message = strings.TrimPrefix(st.Message+"; "+kept, "; ")
	}
	before := s.Status
	if err := r.setStatus(ctx, s, st); err != nil {
		return reconcile.Result{}, err
	}
	r.recordTransition(s, vm, before, st)
	if st.Phase == v1alpha1.SnapshotFailed {
		return reconcile.Result{}, r.clear(ctx, s, f, rep, reported)
	}
	vmUID := types.UID(st.SourceUID)
	return reconcile.Result{}, r.publish(ctx, f, node, intentOf(s, vmUID))
}

// observe is status st as node's report rep (if reported) shows it.
func observe(st v1alpha1.VirtualMachineSnapshotStatus, rep wire.SnapshotReport, reported bool) v1alpha1.VirtualMachineSnapshotStatus {
	node := st.Node
	st.ReadyToUse = false
	taken := st.CreationTime != nil
	switch {
	case !reported && taken:
		st.Phase, st.Message = v1alpha1.SnapshotLost, fmt.Sprintf("node %s no longer reports the snapshot", node)
	case !reported, rep.Phase == wire.SnapshotPhaseTaking:
		st.Phase, st.Message = v1alpha1.SnapshotInProgress, fmt.Sprintf("node %s is taking the snapshot", node)
	case rep.Phase == wire.SnapshotPhaseReady:
		st.Phase, st.ReadyToUse, st.Message = v1alpha1.SnapshotSucceeded, true, ""
		withFigures(&st, rep)
	case rep.Phase == wire.SnapshotPhaseFailed:
		st.Phase, st.Message = v1alpha1.SnapshotFailed, fmt.Sprintf("node %s could not take the snapshot: %s", node, rep.Message)
	case rep.Phase == wire.SnapshotPhaseGone && taken:
		st.Phase, st.Message = v1alpha1.SnapshotLost, withReason(fmt.Sprintf("node %s no longer has the snapshot", node), rep.Message)
	case rep.Phase == wire.SnapshotPhaseGone:
		st.Phase, st.Message = v1alpha1.SnapshotFailed, withReason(fmt.Sprintf("node %s has no such snapshot", node), rep.Message)
	}
	return st
}

func withReason(msg, reason string) string {
	if reason == "" {
		return msg
	}
	return msg + ": " + reason
}

// withFigures copies what a Ready report says of the snapshot into st.
func withFigures(st *v1alpha1.VirtualMachineSnapshotStatus, rep wire.SnapshotReport) {
	if rep.CreatedAt != nil {
		t := metav1.NewTime(*rep.CreatedAt)
		st.CreationTime = &t
	} else if st.CreationTime == nil {
		// A node that does not say when still took it by now.
		t := metav1.Now()
		st.CreationTime = &t
	}
	st.DurationMilliseconds = rep.DurationMilliseconds
	st.Size = nil
	if rep.SizeBytes > 0 {
		st.Size = resource.NewQuantity(rep.SizeBytes, resource.BinarySI)
	}
	st.Memory, st.Frozen = rep.Memory, rep.Frozen
	st.Indications = indications(rep)
}

// indications name what the snapshot is, as KubeVirt's do.
func indications(rep wire.SnapshotReport) []string {
	var out []string
	if rep.Online {
		out = append(out, v1alpha1.IndicationOnline)
	}
	if rep.Memory {
		out = append(out, v1alpha1.IndicationMemory)
	}
	switch {
	case rep.Frozen:
		out = append(out, v1alpha1.IndicationGuestAgent)
	case rep.Online:
		out = append(out, v1alpha1.IndicationNoGuestAgent)
	}
	return out
}

// lost is st of a snapshot that cannot be restored now, for why. One not
// taken yet waits: it is taken, or fails, when its node says so.
func lost(st v1alpha1.VirtualMachineSnapshotStatus, why string) v1alpha1.VirtualMachineSnapshotStatus {
	st.ReadyToUse = false
	if st.CreationTime == nil {
		st.Message = why
		return st
	}
	st.Phase, st.Message = v1alpha1.SnapshotLost, why
	return st
}

// movedFrom says, when vm no longer runs on node, the snapshot's node,
// where it is now: its snapshot stayed behind (an HA restart took it
// away from its lost node).
func (r *Reconciler) movedFrom(ctx context.Context, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, node string) string {
	now, err := virtualmachine.AdmittedNode(ctx, r.kube, vm, f)
	if err != nil || now == "" || now == node {
		return ""
	}
	return fmt.Sprintf("VirtualMachine %s runs on node %s now; the snapshot stayed on node %s", vm.Name, now, node)
}

// recordTransition records the events a change of phase is worth, on the
// snapshot and, for what it took or failed to take, on its VM.
func (r *Reconciler) recordTransition(s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, before, after v1alpha1.VirtualMachineSnapshotStatus) {
	var e event.Event
	switch {
	case before.Phase == after.Phase:
		return
	case after.Phase == v1alpha1.SnapshotSucceeded && before.CreationTime == nil:
		e = event.Normal(ReasonTaken, taken(s, after))
	case after.Phase == v1alpha1.SnapshotFailed:
		e = event.Warning(ReasonFailed, errors.New(after.Message))
	case after.Phase == v1alpha1.SnapshotLost:
		r.recorder.Event(s, event.Warning(ReasonLost, errors.New(after.Message)))
		return
	default:
		return
	}
	r.recorder.Event(s, e)
	if vm != nil {
		r.recorder.Event(vm, e)
	}
}

// taken says what snapshot s, now Succeeded with status st, holds.
func taken(s *v1alpha1.VirtualMachineSnapshot, st v1alpha1.VirtualMachineSnapshotStatus) string {
	what := "disks"
	if st.Memory {
		what = "disks and memory"
	}
	msg := fmt.Sprintf("Snapshot %s of the VM's %s taken on node %s", s.Name, what, st.Node)
	if st.DurationMilliseconds > 0 {
		msg += fmt.Sprintf(" in %d ms", st.DurationMilliseconds)
	}
	return msg
}

// fail ends the snapshot as Failed with why, on the snapshot and its VM.
func (r *Reconciler) fail(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine, st v1alpha1.VirtualMachineSnapshotStatus, why string) error {
	st.Phase, st.Message, st.ReadyToUse = v1alpha1.SnapshotFailed, why, false
	if err := r.setStatus(ctx, s, st); err != nil {
		return err
	}
	e := event.Warning(ReasonFailed, errors.New(why))
	r.recorder.Event(s, e)
	if vm != nil {
		r.recorder.Event(vm, e)
	}
	return nil
}

// setStatus writes st unless it is what the snapshot shows.
func (r *Reconciler) setStatus(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, st v1alpha1.VirtualMachineSnapshotStatus) error {
	if equality.Semantic.DeepEqual(s.Status, st) {
		return nil
	}
	s.Status = st
	return errors.Wrap(r.kube.Status().Update(ctx, s), "cannot update the snapshot's status")
}

// publish puts in on node, unless this hub put that very intent there
// last.
func (r *Reconciler) publish(ctx context.Context, f *fleet.Fleet, node string, in wire.SnapshotIntent) error {
	uid := types.UID(in.UID)
	p := publishedIntent{node: node, intent: in}
	if last, ok := r.published.Load(uid); ok && last == p {
		return nil
	}
	if _, err := bus.Put(ctx, f.Bus, wire.SnapshotIntents, node, in.UID, in); err != nil {
		r.opts.Notifier.NotifyOnSync(f, in.UID)
		what := "take"
		if in.Absent {
			what = "delete"
		}
		return errors.Wrapf(err, "cannot ask node %s to %s the snapshot", node, what)
	}
	r.published.Store(uid, p)
	return nil
}
