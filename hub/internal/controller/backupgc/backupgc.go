// Package backupgc collects the garbage of BackupLocations: the chunks no
// backup in a location references any longer, left by backups deleted
// with deletionPolicy Delete (a pruned scheduled backup, say), which free
// their space only then. The hub collects each location every
// garbageCollectionInterval, and soon after a backup's data was deleted
// from it, and shows what it freed in the location's status.
//
// A collection and a backup being written exclude each other in the
// store (internal/backupstore's locks): a backup that starts during a
// collection fails. So the hub collects only while no backup to the
// location is in progress, and holds backups back while it collects
// (backuplocation.Collections).
package backupgc

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/backuplocation"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/backupstore"
)

// DefaultInterval is how often a location's garbage is collected when its
// spec does not say.
const DefaultInterval = 24 * time.Hour

// DefaultAfterDelete is how soon after a backup's data was deleted from a
// location the hub collects it: long enough for one pruning's deletions
// to make one collection.
const DefaultAfterDelete = time.Minute

// retry is how soon a collection put off or failed is tried again.
const retry = time.Minute

// clockSkew is how much older than the hub's clock a chunk or a writer's
// lock must be, by the store's clock, for a collection to take it as
// garbage or dead: the store's times are its own.
const clockSkew = 10 * time.Minute

// Event reasons, on the location.
const (
	ReasonCollected event.Reason = "GarbageCollected"
	ReasonFailed    event.Reason = "GarbageCollectionFailed"
)

// Options of the garbage collector.
type Options struct {
	// Clock tells the time and wakes each location at its next
	// collection.
	Clock clock.WithDelayedExecution
	// Memory owns the controller's alarm and request of each location.
	Memory *perobject.Owner
	// Collections holds backups back while a location is collected; the
	// backup controller's must be the same.
	Collections *backuplocation.Collections
	// AfterDelete is how soon after a backup's data was deleted from a
	// location it is collected, so that the deletions of one pruning
	// make one collection.
	AfterDelete time.Duration
}

// Reconciler collects the garbage of BackupLocations.
type Reconciler struct {
	kube client.Client
	// backups reads backups from the API server itself: a backup the
	// cache does not show started yet may be writing.
	backups  client.Reader
	opts     Options
	alarms   *wake.Alarms
	recorder event.Recorder
	// requested are the locations a deletion asked a collection of.
	requested *perobject.Map[bool]
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, gop Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, gop); err != nil {
			panic(errors.Wrap(err, "cannot set up the BackupLocation garbage collector"))
		}
	}, v1alpha1.BackupLocationGroupVersionKind, v1alpha1.VirtualMachineBackupGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, gop Options) error {
	name := "backuplocation-gc"
	r := NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), gop, event.NewAPIRecorder(mgr.GetEventRecorderFor(name))) //nolint:staticcheck // as the other controllers
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.BackupLocation{}).
		Watches(&v1alpha1.VirtualMachineBackup{}, handler.Funcs{DeleteFunc: r.backupDeleted}).
		WatchesRawSource(r.alarms.Source()).
		Complete(r)
}

// NewReconciler returns a Reconciler writing with kube, which must read
// Secrets from the API server, and reading backups with backups, which
// must too.
func NewReconciler(kube client.Client, backups client.Reader, o Options, recorder event.Recorder) *Reconciler {
	return &Reconciler{
		kube: kube, backups: backups, opts: o, recorder: recorder,
		alarms: wake.NewAlarms(o.Memory, o.Clock), requested: perobject.NewMap[bool](o.Memory),
	}
}

// backupDeleted asks for a collection of the location a backup's data was
// deleted from.
func (r *Reconciler) backupDeleted(ctx context.Context, e ctrlevent.TypedDeleteEvent[client.Object], _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	b, ok := e.Object.(*v1alpha1.VirtualMachineBackup)
	if !ok || b.Spec.DeletionPolicy != v1alpha1.BackupDelete || b.Status.Phase != v1alpha1.BackupSucceeded {
		return
	}
	l := &v1alpha1.BackupLocation{}
	if err := r.kube.Get(ctx, types.NamespacedName{Name: b.Spec.Location}, l); err != nil {
		return // gone: nothing to collect
	}
	r.requested.Store(l.UID, true)
	r.alarms.Set(l, r.opts.Clock.Now().Add(r.opts.AfterDelete))
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	l := &v1alpha1.BackupLocation{}
	if err := r.kube.Get(ctx, req.NamespacedName, l); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	interval := DefaultInterval
	if l.Spec.GarbageCollectionInterval != nil {
		interval = l.Spec.GarbageCollectionInterval.Duration
	}
	now := r.opts.Clock.Now()
	requested, _ := r.requested.Load(l.UID)
	if next, due := nextCollection(l.Status.LastGarbageCollection, interval, now); !due && !requested {
		if !next.IsZero() {
			r.alarms.Set(l, next)
		}
		return reconcile.Result{}, nil
	}
	if a := l.Status.LastGarbageCollectionAttempt; a != nil && now.Before(a.Time.Add(retry)) {
		// Put off or failed a moment ago: the status write that said so
		// is what woke this reconcile.
		r.alarms.Set(l, a.Time.Add(retry))
		return reconcile.Result{}, nil
	}
	gc, err := r.collect(ctx, l, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	st := l.Status.DeepCopy()
	if gc.Message != "" {
		st.LastGarbageCollectionAttempt = &gc
		r.alarms.Set(l, now.Add(retry))
	} else {
		st.LastGarbageCollection, st.LastGarbageCollectionAttempt = &gc, nil
		st.BytesFreed += gc.BytesFreed
		r.requested.Delete(l.UID)
		if interval > 0 {
			r.alarms.Set(l, now.Add(interval))
		}
	}
	if equality.Semantic.DeepEqual(&l.Status, st) {
		return reconcile.Result{}, nil
	}
	l.Status = *st
	return reconcile.Result{}, errors.Wrap(r.kube.Status().Update(ctx, l), "cannot update the location's status")
}

// nextCollection is when the next collection after last is due, zero for
// never (interval 0 and none asked for), and whether it is due at now.
func nextCollection(last *v1alpha1.GarbageCollection, interval time.Duration, now time.Time) (time.Time, bool) {
	switch {
	case interval <= 0:
		return time.Time{}, false
	case last == nil:
		return now, true
	}
	next := last.Time.Add(interval)
	return next, !now.Before(next)
}

// collect collects l's garbage, or says in the result's Message why it
// did not; err is for what a retry with backoff may mend.
func (r *Reconciler) collect(ctx context.Context, l *v1alpha1.BackupLocation, now time.Time) (v1alpha1.GarbageCollection, error) {
	gc := v1alpha1.GarbageCollection{Time: metav1.NewTime(now)}
	done, ok := r.opts.Collections.Collecting(l.Name)
	if !ok {
		gc.Message = "put off: a backup to the location is starting"
		return gc, nil
	}
	defer done()
	b, err := r.writing(ctx, l.Name)
	switch {
	case err != nil:
		return gc, err
	case b != "":
		gc.Message = fmt.Sprintf("put off: backup %s is being written to the location", b)
		return gc, nil
	}
	loc, why, err := backuplocation.Resolve(ctx, r.kube, l.Name)
	switch {
	case err != nil:
		return gc, err
	case why != "":
		gc.Message = why
		return gc, nil
	}
	store, err := backupstore.Open(ctx, backupstore.LocationOf(loc))
	var res backupstore.GCResult
	if err == nil {
		res, err = store.CollectGarbage(ctx, now.Add(-clockSkew))
	}
	gc.Backups, gc.ChunksDeleted, gc.BytesFreed, gc.ChunksKept = int64(res.Manifests), int64(res.ChunksDeleted), res.BytesDeleted, int64(res.ChunksKept)
	switch {
	case errors.Is(err, backupstore.ErrBusy):
		gc.Message = "put off: " + err.Error()
	case err != nil:
		gc.Message = "failed: " + err.Error()
		r.recorder.Event(l, event.Warning(ReasonFailed, errors.Wrapf(err, "cannot collect the garbage of BackupLocation %s", l.Name)))
	default:
		r.recorder.Event(l, event.Normal(ReasonCollected, fmt.Sprintf("Collected the garbage of BackupLocation %s: %d chunks (%d bytes) deleted, %d kept for %d backups",
			l.Name, res.ChunksDeleted, res.BytesDeleted, res.ChunksKept, res.Manifests)))
	}
	return gc, nil
}

// writing is a backup (namespace/name) to location that a node may be
// writing, if any: one the hub has asked a node for that is not over.
func (r *Reconciler) writing(ctx context.Context, location string) (string, error) {
	l := &v1alpha1.VirtualMachineBackupList{}
	if err := r.backups.List(ctx, l); err != nil {
		return "", errors.Wrap(err, "cannot list backups")
	}
	for _, b := range l.Items {
		if b.Spec.Location == location && b.Status.Node != "" && !b.Done() {
			return b.Namespace + "/" + b.Name, nil
		}
	}
	return "", nil
}
