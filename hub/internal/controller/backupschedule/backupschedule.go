// Package backupschedule reconciles VirtualMachineBackupSchedules: at each
// time its cron schedule names it creates one VirtualMachineBackup, and
// once a backup of the schedule finishes it deletes those the schedule's
// retention no longer keeps. The backup controller takes each backup;
// this one only makes and prunes them.
//
// It is CronJob with concurrencyPolicy Forbid and no startingDeadline:
//   - A backup is named after its schedule and its time
//     (<schedule>-<yyyymmddhhmm>, UTC), so a hub that restarts after
//     creating one, before it recorded so, finds it instead of making a
//     second for the same time.
//   - A time that comes due while the schedule's last backup still runs,
//     or while the schedule is suspended, is skipped and counted; the next
//     backup is at the next time.
//   - After an outage of the hub only the latest of the times missed is
//     made up, at once, however late: one backup late is worth more than
//     none, and several in a row would be the same backup.
//
// The times come from an injected clock (k8s.io/utils/clock), whose
// timers wake each schedule at its next time, so tests step time instead
// of waiting for it.
package backupschedule

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/robfig/cron/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"

	// Time zones for spec.timeZone where the hub's image has none.
	_ "time/tzdata"
)

// ScheduledAtAnnotation holds, on each backup a schedule made, the time it
// was made for (RFC 3339): the time retention sorts and groups it by.
const ScheduledAtAnnotation = v1alpha1.Group + "/scheduled-at"

// Event reasons, on the schedule.
const (
	ReasonCreated event.Reason = "BackupCreated"
	ReasonSkipped event.Reason = "BackupSkipped"
	ReasonPruned  event.Reason = "BackupPruned"
	// ReasonCannotPrune: the hub may not delete the schedule's backups.
	ReasonCannotPrune event.Reason = "CannotPrune"
	ReasonInvalid     event.Reason = "InvalidSchedule"
)

// nameLayout is the time in a backup's name: minutes are the finest a
// cron schedule names.
const nameLayout = "200601021504"

// Options of the schedule controller.
type Options struct {
	// Clock tells the time and wakes each schedule at its next one.
	Clock clock.WithDelayedExecution
	// Memory owns the controller's alarm of each schedule.
	Memory *perobject.Owner
}

// Reconciler reconciles VirtualMachineBackupSchedules.
type Reconciler struct {
	kube     client.Client
	clock    clock.PassiveClock
	alarms   *wake.Alarms
	recorder event.Recorder
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, so Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, so); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachineBackupSchedule controller"))
		}
	}, v1alpha1.VirtualMachineBackupScheduleGroupVersionKind, v1alpha1.VirtualMachineBackupGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, so Options) error {
	name := "virtualmachinebackupschedule"
	r := NewReconciler(mgr.GetClient(), so, event.NewAPIRecorder(mgr.GetEventRecorderFor(name))) //nolint:staticcheck // as the other controllers
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.VirtualMachineBackupSchedule{}).
		Owns(&v1alpha1.VirtualMachineBackup{}).
		WatchesRawSource(r.alarms.Source()).
		Complete(r)
}

// NewReconciler returns a Reconciler writing with kube.
func NewReconciler(kube client.Client, so Options, recorder event.Recorder) *Reconciler {
	return &Reconciler{kube: kube, clock: so.Clock, alarms: wake.NewAlarms(so.Memory, so.Clock), recorder: recorder}
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	s := &v1alpha1.VirtualMachineBackupSchedule{}
	if err := r.kube.Get(ctx, req.NamespacedName, s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if meta.WasDeleted(s) {
		// Its backups go with it, through their owner references.
		return reconcile.Result{}, nil
	}
	st := s.Status.DeepCopy()
	sched, tz, err := Parse(s.Spec)
	if err != nil {
		st.NextScheduleTime, st.Message = nil, err.Error()
		st.SetConditions(xpv2.ReconcileError(err))
		if !equality.Semantic.DeepEqual(&s.Status, st) {
			r.recorder.Event(s, event.Warning(ReasonInvalid, err))
		}
		return reconcile.Result{}, r.setStatus(ctx, s, st)
	}
	backups, err := r.backupsOf(ctx, s)
	if err != nil {
		return reconcile.Result{}, err
	}
	now := r.clock.Now()
	if s.Status.GetCondition(xpv2.TypeSynced).Status == corev1.ConditionFalse {
		// The message was the error, which is over.
		st.Message = ""
	}
	st.SetConditions(xpv2.ReconcileSuccess())

	backups, made, err := r.due(ctx, s, st, sched, backups, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	pruneErr := r.prune(ctx, s, st, backups, tz)
	if pruneErr != nil {
		st.SetConditions(xpv2.ReconcileError(pruneErr))
		st.Message = pruneErr.Error()
	}
	summarize(st, backups)
	next := sched.Next(now)
	st.NextScheduleTime = ptrTime(next)
	if made != "" && pruneErr == nil {
		st.Message = made
	}
	if err := r.setStatus(ctx, s, st); err != nil {
		return reconcile.Result{}, err
	}
	r.alarms.Set(s, next)
	if pruneErr != nil && !kerrors.IsForbidden(errors.Cause(pruneErr)) {
		return reconcile.Result{}, pruneErr
	}
	return reconcile.Result{}, nil
}

// Parse is spec's schedule, read in its time zone, and that zone; the
// error names the field at fault.
func Parse(spec v1alpha1.VirtualMachineBackupScheduleSpec) (cron.Schedule, *time.Location, error) {
	tz := time.UTC
	if spec.TimeZone != nil {
		l, err := time.LoadLocation(*spec.TimeZone)
		if err != nil {
			return nil, nil, errors.Errorf("spec.timeZone %q is not a time zone: %v", *spec.TimeZone, err)
		}
		tz = l
	}
	sched, err := cron.ParseStandard(spec.Schedule)
	if err != nil {
		return nil, nil, errors.Errorf("spec.schedule %q is not a cron schedule (minute hour day-of-month month day-of-week, or a macro such as @daily): %v", spec.Schedule, err)
	}
	if s, ok := sched.(*cron.SpecSchedule); ok {
		s.Location = tz
	}
	return sched, tz, nil
}

// backupsOf lists the backups s made.
func (r *Reconciler) backupsOf(ctx context.Context, s *v1alpha1.VirtualMachineBackupSchedule) ([]v1alpha1.VirtualMachineBackup, error) {
	l := &v1alpha1.VirtualMachineBackupList{}
	if err := r.kube.List(ctx, l, client.InNamespace(s.Namespace), client.MatchingLabels{v1alpha1.BackupScheduleLabel: s.Name}); err != nil {
		return nil, errors.Wrap(err, "cannot list the schedule's backups")
	}
	return slices.DeleteFunc(l.Items, func(b v1alpha1.VirtualMachineBackup) bool { return !metav1.IsControlledBy(&b, s) }), nil
}

// due makes the backup of the latest time due that s has not acted on,
// or skips that time, and records which in st; it returns s's backups
// with any it made, and what it did.
func (r *Reconciler) due(ctx context.Context, s *v1alpha1.VirtualMachineBackupSchedule, st *v1alpha1.VirtualMachineBackupScheduleStatus, sched cron.Schedule, backups []v1alpha1.VirtualMachineBackup, now time.Time) ([]v1alpha1.VirtualMachineBackup, string, error) {
	since := s.CreationTimestamp.Time
	for _, t := range []*metav1.Time{st.LastScheduleTime, st.LastSkippedTime} {
		if t != nil && t.After(since) {
			since = t.Time
		}
	}
	at, missed := latest(sched, since, now)
	if at.IsZero() {
		return backups, "", nil
	}
	name := BackupName(s, at)
	late := ""
	if missed > 0 {
		late = fmt.Sprintf(" (%d earlier times since %s were missed while the hub was away; only the latest is made up)", missed, since.UTC().Format(time.RFC3339))
	}
	if i := slices.IndexFunc(backups, func(b v1alpha1.VirtualMachineBackup) bool { return b.Name == name }); i >= 0 {
		st.LastScheduleTime = ptrTime(at)
		return backups, "", nil
	}
	if why := skip(s, backups); why != "" {
		st.LastSkippedTime = ptrTime(at)
		st.Skipped++
		msg := fmt.Sprintf("skipped the backup due at %s: %s", at.UTC().Format(time.RFC3339), why)
		r.recorder.Event(s, event.Normal(ReasonSkipped, msg))
		return backups, msg, nil
	}
	b := r.backupFor(s, backups, at, name)
	if err := controllerutil.SetControllerReference(s, b, r.kube.Scheme()); err != nil {
		return nil, "", errors.Wrap(err, "cannot make the schedule the backup's owner")
	}
	err := r.kube.Create(ctx, b)
	switch {
	case kerrors.IsAlreadyExists(err):
		// Made by this hub before a restart, and not yet in its cache.
		if err := r.kube.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
			return nil, "", errors.Wrapf(err, "cannot get backup %s", name)
		}
		if !metav1.IsControlledBy(b, s) {
			return nil, "", errors.Errorf("cannot create backup %s: a VirtualMachineBackup of that name exists and is not this schedule's", name)
		}
	case err != nil:
		return nil, "", errors.Wrapf(err, "cannot create backup %s", name)
	default:
		r.recorder.Event(s, event.Normal(ReasonCreated, fmt.Sprintf("Created backup %s of VirtualMachine %s, due at %s%s", name, s.Spec.VMName, at.UTC().Format(time.RFC3339), late)))
	}
	st.LastScheduleTime = ptrTime(at)
	return append(backups, *b), "created backup " + name + late, nil
}

// skip is why the time due makes no backup, if it makes none.
func skip(s *v1alpha1.VirtualMachineBackupSchedule, backups []v1alpha1.VirtualMachineBackup) string {
	if s.Spec.Suspend {
		return "the schedule is suspended"
	}
	for _, b := range backups {
		if !b.Done() && !meta.WasDeleted(&b) {
			return fmt.Sprintf("backup %s still runs", b.Name)
		}
	}
	return ""
}

// backupFor is the backup s makes for time at.
func (r *Reconciler) backupFor(s *v1alpha1.VirtualMachineBackupSchedule, backups []v1alpha1.VirtualMachineBackup, at time.Time, name string) *v1alpha1.VirtualMachineBackup {
	return &v1alpha1.VirtualMachineBackup{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   s.Namespace,
			Name:        name,
			Labels:      map[string]string{v1alpha1.BackupScheduleLabel: s.Name},
			Annotations: map[string]string{ScheduledAtAnnotation: at.UTC().Format(time.RFC3339)},
		},
		Spec: v1alpha1.VirtualMachineBackupSpec{
			VMName: s.Spec.VMName, Location: s.Spec.Location, DeletionPolicy: s.Spec.DeletionPolicy,
			Full: fullDue(s.Spec.FullEvery, taken(backups)),
		},
	}
}

// fullDue is whether the next backup is full: every nth is, so it is
// when the n-1 newest that succeeded were all incremental.
func fullDue(n int32, backups []took) bool {
	if n <= 0 {
		return false
	}
	slices.SortFunc(backups, func(a, b took) int { return b.At.Compare(a.At) })
	incremental := 0
	for _, b := range backups {
		if b.Phase != v1alpha1.BackupSucceeded {
			continue
		}
		if b.full {
			break
		}
		incremental++
	}
	return incremental >= int(n)-1
}

// took is a backup as retention and fullDue see it.
type took struct {
	Taken
	full bool
}

func taken(backups []v1alpha1.VirtualMachineBackup) []took {
	out := make([]took, 0, len(backups))
	for _, b := range backups {
		at := b.CreationTimestamp.Time
		if t, err := time.Parse(time.RFC3339, b.Annotations[ScheduledAtAnnotation]); err == nil {
			at = t
		}
		out = append(out, took{Taken: Taken{Name: b.Name, At: at, Phase: b.Status.Phase}, full: b.Status.Full})
	}
	return out
}

// prune deletes the backups of s its retention no longer keeps.
func (r *Reconciler) prune(ctx context.Context, s *v1alpha1.VirtualMachineBackupSchedule, st *v1alpha1.VirtualMachineBackupScheduleStatus, backups []v1alpha1.VirtualMachineBackup, tz *time.Location) error {
	var ts []Taken
	for _, t := range taken(backups) {
		ts = append(ts, t.Taken)
	}
	for _, name := range Prune(ts, s.Spec.Retention, tz) {
		i := slices.IndexFunc(backups, func(b v1alpha1.VirtualMachineBackup) bool { return b.Name == name })
		b := &backups[i]
		if meta.WasDeleted(b) {
			continue
		}
		err := r.kube.Delete(ctx, b, client.Preconditions{UID: &b.UID})
		switch {
		case kerrors.IsNotFound(err) || kerrors.IsConflict(err):
			continue
		case kerrors.IsForbidden(err):
			err = errors.Wrapf(err, "cannot prune backup %s, which the schedule's retention no longer keeps: the hub may not delete VirtualMachineBackups; grant its ServiceAccount delete on virtualmachinebackups.%s (cluster/deploy/hub/clusterrole.yaml, or package/api for the provider package)", b.Name, v1alpha1.Group)
			r.recorder.Event(s, event.Warning(ReasonCannotPrune, err))
			return err
		case err != nil:
			return errors.Wrapf(err, "cannot prune backup %s", b.Name)
		}
		st.Pruned++
		r.recorder.Event(s, event.Normal(ReasonPruned, fmt.Sprintf("Deleted backup %s, which the schedule's retention no longer keeps (deletionPolicy %s)", b.Name, b.Spec.DeletionPolicy)))
	}
	return nil
}

// summarize records in st what the schedule's backups are.
func summarize(st *v1alpha1.VirtualMachineBackupScheduleStatus, backups []v1alpha1.VirtualMachineBackup) {
	st.Active, st.Succeeded, st.Failed = "", 0, 0
	var newest *v1alpha1.VirtualMachineBackup
	var newestAt time.Time
	ts := taken(backups)
	for i := range backups {
		b := &backups[i]
		if meta.WasDeleted(b) {
			continue
		}
		switch b.Status.Phase {
		case v1alpha1.BackupSucceeded:
			st.Succeeded++
			// By the time it was made for: completion times are in
			// seconds, and two may fall in one.
			if newest == nil || ts[i].At.After(newestAt) {
				newest, newestAt = b, ts[i].At
			}
		case v1alpha1.BackupFailed:
			st.Failed++
		default:
			st.Active = b.Name
		}
	}
	if newest != nil {
		st.LastSuccessfulBackup, st.LastSuccessfulTime = newest.Name, newest.Status.CompletionTime
	}
}

// latest is the latest time sched names after since and at or before
// now, and how many earlier ones there were since then; zero if none.
func latest(sched cron.Schedule, since, now time.Time) (time.Time, int) {
	var at time.Time
	missed := -1
	for t := sched.Next(since); !t.IsZero() && !t.After(now); t = sched.Next(t) {
		at = t
		missed++
	}
	return at, max(missed, 0)
}

// BackupName is the name of the backup s makes for time at.
func BackupName(s *v1alpha1.VirtualMachineBackupSchedule, at time.Time) string {
	return s.Name + "-" + at.UTC().Format(nameLayout)
}

// setStatus writes st unless it is what s shows.
func (r *Reconciler) setStatus(ctx context.Context, s *v1alpha1.VirtualMachineBackupSchedule, st *v1alpha1.VirtualMachineBackupScheduleStatus) error {
	if equality.Semantic.DeepEqual(&s.Status, st) {
		return nil
	}
	s.Status = *st
	return errors.Wrap(r.kube.Status().Update(ctx, s), "cannot update the schedule's status")
}

func ptrTime(t time.Time) *metav1.Time {
	m := metav1.NewTime(t)
	return &m
}
