// Package backup reconciles VirtualMachineBackups: it asks the node of
// the backup's VM to copy the VM's disks to the backup's location (a
// wire.BackupIntent under "<node>.backup.<uid>", carrying the location's
// credentials to that node alone), shows what the node reports of it, and
// deletes the backup from its location when the object goes and its
// deletionPolicy says so.
//
// A backup is taken once: Succeeded and Failed are final, and the intent
// is deleted once the node's report is. Each backup names, in its intent,
// the last backup of the same VM that Succeeded in the same location, so
// the node reads only what changed since; the node falls back to a full
// backup where that one or its checkpoint is gone.
//
// The order of writes lets a restarted hub resume anywhere: the
// finalizer, then the status naming the node, then the intent to that
// node.
package backup

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/backuplocation"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Finalizer holds a backup until its intent is gone from its node and,
// with deletionPolicy Delete, its data from its location.
const Finalizer = v1alpha1.Group + "/backup"

// Event reasons, on the backup and on its VM.
const (
	ReasonTaken   event.Reason = "BackupTaken"
	ReasonFailed  event.Reason = "BackupFailed"
	ReasonDeleted event.Reason = "BackupDeleted"
	// ReasonKept: the backup's data could not be deleted from a location
	// that is gone or unreadable, and stays there.
	ReasonKept event.Reason = "BackupKept"
)

// waitRetry is how soon a backup that waits (for its VM, its node, its
// location or grant) is looked at again when nothing else wakes it.
const waitRetry = 5 * time.Second

// Fleets finds the fleet of a NATS server, and lists those open.
// *fleet.Pool is one.
type Fleets interface {
	Get(ctx context.Context, t fleet.Target) (*fleet.Fleet, error)
	Fleets() []*fleet.Fleet
}

// Options of the backup controller.
type Options struct {
	Pool Fleets
	// Notifier wakes a backup when its node's report of it changes, or
	// the node is lost or comes back; every fleet's Backups must feed it.
	Notifier *wake.Notifier
	// Memory owns what the controller remembers of each backup.
	Memory *perobject.Owner
	// FencingTimeout is how long a backup whose node is lost waits for it
	// before it fails: the VMs' own. 0 waits for the node for good.
	FencingTimeout time.Duration
	// Collections holds a backup back while the hub collects the garbage
	// of its location; nil holds none back.
	Collections *backuplocation.Collections
}

// Reconciler reconciles VirtualMachineBackups.
type Reconciler struct {
	kube     client.Client
	configs  *providerconfig.Resolver
	opts     Options
	recorder event.Recorder
	// published is the intent last put for each backup, and its node.
	published *perobject.Map[publishedIntent]
}

type publishedIntent struct {
	node   string
	intent wire.BackupIntent
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, bo Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, bo); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachineBackup controller"))
		}
	}, v1alpha1.VirtualMachineBackupGroupVersionKind, v1alpha1.BackupLocationGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, bo Options) error {
	name := "virtualmachinebackup"
	r := NewReconciler(mgr.GetClient(), bo, event.NewAPIRecorder(mgr.GetEventRecorderFor(name))) //nolint:staticcheck // as the other controllers
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.VirtualMachineBackup{}).
		WatchesRawSource(bo.Notifier.Source()).
		Complete(r)
}

// NewReconciler returns a Reconciler writing with kube, which must read
// Secrets from the API server, not a cache.
func NewReconciler(kube client.Client, bo Options, recorder event.Recorder) *Reconciler {
	return &Reconciler{
		kube:      kube,
		configs:   providerconfig.NewResolver(kube),
		opts:      bo,
		recorder:  recorder,
		published: perobject.NewMap[publishedIntent](bo.Memory),
	}
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	b := &v1alpha1.VirtualMachineBackup{}
	if err := r.kube.Get(ctx, req.NamespacedName, b); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if meta.WasDeleted(b) {
		return reconcile.Result{}, r.deleted(ctx, b)
	}
	r.opts.Notifier.Remember(b)
	if !meta.FinalizerExists(b, Finalizer) {
		meta.AddFinalizer(b, Finalizer)
		if err := r.kube.Update(ctx, b); err != nil {
			return reconcile.Result{}, errors.Wrap(err, "cannot hold the backup with its finalizer")
		}
	}
	if b.Status.Node == "" {
		return r.start(ctx, b)
	}
	return r.follow(ctx, b)
}

// start asks the VM's node for the backup once everything it needs is
// there: the VM placed and made on a live node that takes backups, the
// location granted to the namespace and its credentials readable. What
// may yet come (a VM, a location, a grant) is waited for, with the reason
// shown; what cannot (a backend without backups, a VM being deleted)
// fails the backup.
func (r *Reconciler) start(ctx context.Context, b *v1alpha1.VirtualMachineBackup) (reconcile.Result, error) {
	if b.Done() {
		return reconcile.Result{}, nil
	}
	vm := &v1alpha1.VirtualMachine{}
	err := r.kube.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: string(b.Spec.VMName)}, vm)
	switch {
	case kerrors.IsNotFound(err):
		return r.wait(ctx, b, fmt.Sprintf("VirtualMachine %s does not exist", b.Spec.VMName))
	case err != nil:
		return reconcile.Result{}, errors.Wrap(err, "cannot get the backup's VM")
	case meta.WasDeleted(vm):
		return reconcile.Result{}, r.fail(ctx, b, vm, fmt.Sprintf("VirtualMachine %s is being deleted", vm.Name))
	}
	pc, err := r.configs.Resolve(ctx, vm)
	if err != nil {
		return reconcile.Result{}, err
	}
	f, err := r.opts.Pool.Get(ctx, pc.Target)
	if err != nil {
		return reconcile.Result{}, err
	}
	node, why, final, err := r.nodeFor(ctx, vm, f)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case final:
		return reconcile.Result{}, r.fail(ctx, b, vm, why)
	case why != "":
		return r.wait(ctx, b, why)
	}
	loc, why, err := r.location(ctx, b)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case why != "":
		return r.wait(ctx, b, why)
	}
	started, ok := r.opts.Collections.Starting(b.Spec.Location)
	if !ok {
		return r.wait(ctx, b, fmt.Sprintf("the hub is collecting the garbage of BackupLocation %s; the backup starts once that is over", b.Spec.Location))
	}
	// Until the status names the node and the intent is there, which
	// the collection looks for.
	defer started()
	in, err := r.intentOf(ctx, b, vm, loc)
	if err != nil {
		return reconcile.Result{}, err
	}
	st := b.Status
	st.SourceUID, st.Node, st.Phase = string(vm.UID), node, v1alpha1.BackupInProgress
	st.Message = fmt.Sprintf("node %s is taking the backup", node)
	if err := r.setStatus(ctx, b, st); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.publish(ctx, f, node, in)
}

// nodeFor is the node vm's backup is taken on now, or why not yet, or
// (final) ever.
func (r *Reconciler) nodeFor(ctx context.Context, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (node, why string, final bool, err error) {
	node, err = virtualmachine.AdmittedNode(ctx, r.kube, vm, f)
	switch {
	case err != nil:
		// A refused binding: the VM itself fails with the reason.
		return "", err.Error(), false, nil
	case node == "":
		return "", fmt.Sprintf("VirtualMachine %s is on no node yet", vm.Name), false, nil
	}
	if m, moving := virtualmachine.MigrationOf(vm, f); moving {
		return "", fmt.Sprintf("VirtualMachine %s is moving to node %s; the backup is taken once it is there", vm.Name, m.Target), false, nil
	}
	if _, restoring := virtualmachine.RestoreOf(vm, f); restoring {
		return "", fmt.Sprintf("VirtualMachine %s is being restored; the backup is taken once that is over", vm.Name), false, nil
	}
	switch p := vm.Status.AtProvider.Phase; p {
	case v1alpha1.PhaseRunning, v1alpha1.PhasePaused, v1alpha1.PhaseStopped:
	default:
		return "", fmt.Sprintf("VirtualMachine %s is %s; a backup is taken of a guest that is Running, Paused or Stopped", vm.Name, cmp.Or(string(p), "not observed yet")), false, nil
	}
	why, final = virtualmachine.TakesBackups(f, node)
	return node, why, final, nil
}

// location is the backup's location with its credentials, once the
// namespace is granted it and its Secret holds them, or why not yet.
func (r *Reconciler) location(ctx context.Context, b *v1alpha1.VirtualMachineBackup) (wire.BackupLocation, string, error) {
	grant, err := providerconfig.GrantOf(ctx, r.kube, b.Namespace)
	if err != nil {
		return wire.BackupLocation{}, "", err
	}
	if err := grant.CheckBackupLocation(b.Spec.Location); err != nil {
		return wire.BackupLocation{}, err.Error(), nil
	}
	return backuplocation.Resolve(ctx, r.kube, b.Spec.Location)
}

// intentOf is the intent that asks for b of vm, written to loc: the
// changes since the VM's last backup there that Succeeded, unless b asks
// for a full one.
func (r *Reconciler) intentOf(ctx context.Context, b *v1alpha1.VirtualMachineBackup, vm *v1alpha1.VirtualMachine, loc wire.BackupLocation) (wire.BackupIntent, error) {
	spec, err := json.Marshal(vm.Spec.ForProvider)
	if err != nil {
		return wire.BackupIntent{}, errors.Wrap(err, "cannot encode the VM's spec")
	}
	in := wire.BackupIntent{
		UID: string(b.UID), Namespace: b.Namespace, Name: b.Name, VM: string(vm.UID), VMName: vm.Name,
		Location: loc, Spec: spec,
	}
	if b.Spec.Full {
		return in, nil
	}
	l := &v1alpha1.VirtualMachineBackupList{}
	if err := r.kube.List(ctx, l, client.InNamespace(b.Namespace)); err != nil {
		return wire.BackupIntent{}, errors.Wrap(err, "cannot list the VM's backups")
	}
	var last *v1alpha1.VirtualMachineBackup
	for i := range l.Items {
		o := &l.Items[i]
		if o.Status.Phase != v1alpha1.BackupSucceeded || o.Status.SourceUID != string(vm.UID) || o.Spec.Location != b.Spec.Location || o.Status.CompletionTime == nil {
			continue
		}
		if last == nil || o.Status.CompletionTime.After(last.Status.CompletionTime.Time) {
			last = o
		}
	}
	if last != nil {
		in.Since = string(last.UID)
	}
	return in, nil
}

// follow shows what the backup's node reports of it, keeps the intent
// there until the report is final, and then deletes it.
func (r *Reconciler) follow(ctx context.Context, b *v1alpha1.VirtualMachineBackup) (reconcile.Result, error) {
	node, uid := b.Status.Node, string(b.UID)
	f, err := fleet.HearingFrom(r.opts.Pool.Fleets(), node)
	if err != nil {
		return reconcile.Result{}, err
	}
	f.Backups.FlagForeign(b, node)
	rep, reported := f.Backups.Report(node, uid)
	if b.Done() {
		return reconcile.Result{}, r.unpublish(ctx, f, b)
	}
	if !reported {
		if !f.Synced() {
			return reconcile.Result{RequeueAfter: waitRetry}, nil
		}
		return reconcile.Result{}, nil
	}
	st := observe(b.Status, rep.Report)
	var again time.Duration
	if n := f.Node(node); n.Lost && !rep.Report.Final() {
		st, again = r.nodeLost(st, node, n.LostSince)
	}
	before := b.Status
	if err := r.setStatus(ctx, b, st); err != nil {
		return reconcile.Result{}, err
	}
	r.recordTransition(ctx, b, before, st)
	if b.Done() {
		return reconcile.Result{}, r.unpublish(ctx, f, b)
	}
	return reconcile.Result{RequeueAfter: again}, nil
}

// nodeLost is status st of a backup whose node has been lost since: it
// waits for the node, and fails once the node has been lost for longer
// than the fencing timeout; again is when to look next while it waits.
// What the node wrote may be in the store by then, but never the
// backup's manifest: nothing of it can be restored.
func (r *Reconciler) nodeLost(st v1alpha1.VirtualMachineBackupStatus, node string, since time.Time) (v1alpha1.VirtualMachineBackupStatus, time.Duration) {
	at := since.UTC().Format(time.RFC3339)
	st.Message = fmt.Sprintf("node %s has sent no heartbeat since %s; the backup ends when it is back", node, at)
	if r.opts.FencingTimeout <= 0 {
		return st, 0
	}
	if wait := r.opts.FencingTimeout - time.Since(since); wait > 0 {
		return st, wait
	}
	st.Phase = v1alpha1.BackupFailed
	st.Message = fmt.Sprintf("node %s was lost while it took the backup (no heartbeat since %s, longer than the fencing timeout %s); nothing of it can be restored", node, at, r.opts.FencingTimeout)
	return st, 0
}

// observe is status st as the node's report rep shows it.
func observe(st v1alpha1.VirtualMachineBackupStatus, rep wire.BackupReport) v1alpha1.VirtualMachineBackupStatus {
	switch rep.Phase {
	case wire.BackupPhaseRunning:
		st.Phase, st.Message = v1alpha1.BackupInProgress, fmt.Sprintf("node %s is taking the backup", st.Node)
	case wire.BackupPhaseSucceeded:
		st.Phase, st.Message = v1alpha1.BackupSucceeded, ""
	case wire.BackupPhaseFailed:
		st.Phase, st.Message = v1alpha1.BackupFailed, fmt.Sprintf("node %s could not take the backup: %s", st.Node, rep.Message)
	}
	st.Full, st.Parent, st.Frozen = rep.Full, rep.Parent, rep.Frozen
	st.BytesRead, st.BytesWritten, st.ChunksWritten, st.ChunksReused = rep.BytesRead, rep.BytesWritten, rep.ChunksWritten, rep.ChunksReused
	st.StartTime, st.CompletionTime = timeOf(rep.StartedAt), nil
	if rep.Phase == wire.BackupPhaseSucceeded {
		st.CompletionTime = timeOf(rep.FinishedAt)
	}
	st.DurationMilliseconds, st.Size = 0, nil
	if rep.StartedAt != nil && rep.FinishedAt != nil {
		st.DurationMilliseconds = rep.FinishedAt.Sub(*rep.StartedAt).Milliseconds()
	}
	if rep.DiskBytes > 0 {
		st.Size = resource.NewQuantity(rep.DiskBytes, resource.BinarySI)
	}
	return st
}

func timeOf(t *time.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	m := metav1.NewTime(t.UTC())
	return &m
}

// recordTransition records a backup that ended, on it and on its VM.
func (r *Reconciler) recordTransition(ctx context.Context, b *v1alpha1.VirtualMachineBackup, before, after v1alpha1.VirtualMachineBackupStatus) {
	var e event.Event
	switch {
	case before.Phase == after.Phase:
		return
	case after.Phase == v1alpha1.BackupSucceeded:
		kind := "incremental, since backup " + after.Parent
		if after.Full {
			kind = "full"
		}
		e = event.Normal(ReasonTaken, fmt.Sprintf("Backup %s (%s) written to BackupLocation %s by node %s: %d bytes read, %d written, %d chunks reused",
			b.Name, kind, b.Spec.Location, after.Node, after.BytesRead, after.BytesWritten, after.ChunksReused))
	case after.Phase == v1alpha1.BackupFailed:
		e = event.Warning(ReasonFailed, errors.New(after.Message))
	default:
		return
	}
	countEnded(after)
	r.recorder.Event(b, e)
	vm := &v1alpha1.VirtualMachine{}
	if err := r.kube.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: string(b.Spec.VMName)}, vm); err == nil && string(vm.UID) == after.SourceUID {
		r.recorder.Event(vm, e)
	}
}

// countEnded counts a backup that ended with status st in the hub's
// metrics: what its node read and wrote, as its final report says.
func countEnded(st v1alpha1.VirtualMachineBackupStatus) {
	result := metrics.ResultFailed
	if st.Phase == v1alpha1.BackupSucceeded {
		result = metrics.ResultSucceeded
	}
	metrics.Backups.WithLabelValues(result).Inc()
	metrics.BackupReadBytes.WithLabelValues().Add(float64(st.BytesRead))
	metrics.BackupWrittenBytes.WithLabelValues().Add(float64(st.BytesWritten))
	metrics.BackupChunks.WithLabelValues(metrics.ChunkWritten).Add(float64(st.ChunksWritten))
	metrics.BackupChunks.WithLabelValues(metrics.ChunkReused).Add(float64(st.ChunksReused))
}

// wait shows why the backup waits, and looks again later.
func (r *Reconciler) wait(ctx context.Context, b *v1alpha1.VirtualMachineBackup, why string) (reconcile.Result, error) {
	st := b.Status
	st.Phase, st.Message = v1alpha1.BackupPending, why
	return reconcile.Result{RequeueAfter: waitRetry}, r.setStatus(ctx, b, st)
}

// fail ends the backup as Failed with why, on it and its VM.
func (r *Reconciler) fail(ctx context.Context, b *v1alpha1.VirtualMachineBackup, vm *v1alpha1.VirtualMachine, why string) error {
	st := b.Status
	st.Phase, st.Message = v1alpha1.BackupFailed, why
	if err := r.setStatus(ctx, b, st); err != nil {
		return err
	}
	countEnded(st)
	e := event.Warning(ReasonFailed, errors.New(why))
	r.recorder.Event(b, e)
	r.recorder.Event(vm, e)
	return nil
}

// setStatus writes st unless it is what the backup shows.
func (r *Reconciler) setStatus(ctx context.Context, b *v1alpha1.VirtualMachineBackup, st v1alpha1.VirtualMachineBackupStatus) error {
	if equality.Semantic.DeepEqual(b.Status, st) {
		return nil
	}
	b.Status = st
	return errors.Wrap(r.kube.Status().Update(ctx, b), "cannot update the backup's status")
}

// publish puts in on node, unless this hub put that very intent there
// last.
func (r *Reconciler) publish(ctx context.Context, f *fleet.Fleet, node string, in wire.BackupIntent) error {
	uid := types.UID(in.UID)
	p := publishedIntent{node: node, intent: in}
	if last, ok := r.published.Load(uid); ok && last.node == p.node && equality.Semantic.DeepEqual(last.intent, p.intent) {
		return nil
	}
	if _, err := bus.Put(ctx, f.Bus, wire.BackupIntents, node, in.UID, in); err != nil {
		r.opts.Notifier.NotifyOnSync(f, in.UID)
		return errors.Wrapf(err, "cannot ask node %s for the backup", node)
	}
	r.published.Store(uid, p)
	return nil
}

// unpublish deletes the backup's intent from its node: the backup is over,
// or no longer wanted.
func (r *Reconciler) unpublish(ctx context.Context, f *fleet.Fleet, b *v1alpha1.VirtualMachineBackup) error {
	if b.Status.Node == "" {
		return nil
	}
	if err := bus.Delete(ctx, f.Bus, wire.BackupIntents, b.Status.Node, string(b.UID)); err != nil {
		return errors.Wrapf(err, "cannot delete the backup's intent on node %s", b.Status.Node)
	}
	r.published.Delete(b.UID)
	return nil
}

// deleted deletes the backup's intent and, with deletionPolicy Delete, its
// data from its location, then lets the object go. A location that is
// gone, or whose Secret is, cannot be reached to delete from: the data
// stays, said in an event, rather than the object hanging for good.
func (r *Reconciler) deleted(ctx context.Context, b *v1alpha1.VirtualMachineBackup) error {
	if !meta.FinalizerExists(b, Finalizer) {
		return nil
	}
	if b.Status.Node != "" {
		f, err := fleet.HearingFrom(r.opts.Pool.Fleets(), b.Status.Node)
		if err != nil {
			return err
		}
		if err := r.unpublish(ctx, f, b); err != nil {
			return err
		}
	}
	if b.Spec.DeletionPolicy == v1alpha1.BackupDelete && b.Status.Phase == v1alpha1.BackupSucceeded {
		if err := r.deleteData(ctx, b); err != nil {
			return err
		}
	}
	meta.RemoveFinalizer(b, Finalizer)
	return errors.Wrap(client.IgnoreNotFound(r.kube.Update(ctx, b)), "cannot remove the backup's finalizer")
}

// deleteData deletes b from its location.
func (r *Reconciler) deleteData(ctx context.Context, b *v1alpha1.VirtualMachineBackup) error {
	loc, why, err := backuplocation.Resolve(ctx, r.kube, b.Spec.Location)
	if err != nil {
		return err
	}
	if why != "" {
		r.recorder.Event(b, event.Warning(ReasonKept, errors.Errorf("backup %s stays in its location: %s", b.Name, why)))
		return nil
	}
	store, err := backupstore.Open(ctx, backupstore.LocationOf(loc))
	if err == nil {
		err = store.Delete(ctx, b.Namespace, string(b.UID))
	}
	if err != nil {
		return errors.Wrapf(err, "cannot delete backup %s from BackupLocation %s", b.Name, b.Spec.Location)
	}
	r.recorder.Event(b, event.Normal(ReasonDeleted, fmt.Sprintf("Backup %s deleted from BackupLocation %s", b.Name, b.Spec.Location)))
	return nil
}
