// Package backupverification reconciles VirtualMachineBackupVerifications:
// the hub reads a backup back from its location, with the location's
// credentials, which only the hub holds, and reports every range of the
// backup's disks whose chunk is missing or does not match its name.
//
// A verification runs once, off the reconcile workers: a job goroutine
// reads the chunks while the reconciler writes its progress to status at
// most every Options.Progress, and its outcome once it ends. At most
// Options.Slots verifications show InProgress at once; the others wait,
// Pending, for a slot. The status says InProgress before a job starts, so a hub
// that restarts (or a new leader) finds an InProgress verification no job
// of its own reads and starts it again from the beginning: reading is
// idempotent.
//
// A namespace verifies only its own backups: a backup is named by its
// VirtualMachineBackup in the verification's namespace, or by a location
// the namespace is granted and an ID, which is looked up among that
// namespace's backups in the location only.
package backupverification

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/backuplocation"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Event reasons, on the verification and on the backup verified.
const (
	ReasonIntact  event.Reason = "BackupIntact"
	ReasonCorrupt event.Reason = "BackupCorrupt"
	// ReasonFailed: the backup could not be read at all.
	ReasonFailed event.Reason = "VerificationFailed"
)

// resultLabel is the metrics' label of each result.
var resultLabel = map[v1alpha1.BackupVerificationResult]string{
	v1alpha1.BackupIntact:  metrics.ResultIntact,
	v1alpha1.BackupCorrupt: metrics.ResultCorrupt,
}

// Defaults of Options.
const (
	DefaultSlots    = 2
	DefaultProgress = 2 * time.Second
)

// waitRetry is how soon a verification that waits (for its backup, its
// location or grant, or a slot) is looked at again.
const waitRetry = 5 * time.Second

// Options of the verification controller.
type Options struct {
	// Notifier wakes a verification when its job ends.
	Notifier *wake.Notifier
	// Memory owns what the controller remembers of each verification: a
	// verification that goes stops its job.
	Memory *perobject.Owner
	// Slots is how many verifications read at once (DefaultSlots if 0).
	Slots int
	// Progress is how often, at most, a running verification's status is
	// written (DefaultProgress if 0).
	Progress time.Duration
}

// Reconciler reconciles VirtualMachineBackupVerifications.
type Reconciler struct {
	kube     client.Client
	opts     Options
	recorder event.Recorder
	jobs     *jobs
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, vo Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, vo); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachineBackupVerification controller"))
		}
	}, v1alpha1.VirtualMachineBackupVerificationGroupVersionKind, v1alpha1.VirtualMachineBackupGroupVersionKind, v1alpha1.BackupLocationGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, vo Options) error {
	name := "virtualmachinebackupverification"
	r := NewReconciler(mgr.GetClient(), vo, event.NewAPIRecorder(mgr.GetEventRecorderFor(name))) //nolint:staticcheck // as the other controllers
	// The jobs end with the manager.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		r.jobs.stopAll()
		return nil
	})); err != nil {
		return errors.Wrap(err, "cannot stop verifications with the hub")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.VirtualMachineBackupVerification{}).
		Watches(&v1alpha1.VirtualMachineBackup{}, handler.EnqueueRequestsFromMapFunc(r.waitingFor)).
		WatchesRawSource(vo.Notifier.Source()).
		Complete(r)
}

// waitingFor are the verifications not done yet that name backup o: one
// that waits for it to succeed starts the moment it has.
func (r *Reconciler) waitingFor(ctx context.Context, o client.Object) []reconcile.Request {
	l := &v1alpha1.VirtualMachineBackupVerificationList{}
	if err := r.kube.List(ctx, l, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range l.Items {
		if v := &l.Items[i]; !v.Done() && string(v.Spec.BackupName) == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(v)})
		}
	}
	return out
}

// NewReconciler returns a Reconciler writing with kube, which must read
// Secrets from the API server, not a cache.
func NewReconciler(kube client.Client, vo Options, recorder event.Recorder) *Reconciler {
	vo.Slots = cmp.Or(vo.Slots, DefaultSlots)
	vo.Progress = cmp.Or(vo.Progress, DefaultProgress)
	return &Reconciler{kube: kube, opts: vo, recorder: recorder, jobs: newJobs(vo.Memory, vo.Slots)}
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	v := &v1alpha1.VirtualMachineBackupVerification{}
	if err := r.kube.Get(ctx, req.NamespacedName, v); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.opts.Notifier.Remember(v)
	if v.Done() {
		return reconcile.Result{}, nil
	}
	if j, ok := r.jobs.get(v.UID); ok {
		return r.follow(ctx, v, j)
	}
	return r.start(ctx, v)
}

// target is a backup to read: where it is, and its object if it has one.
type target struct {
	location string
	id       string
	backup   *v1alpha1.VirtualMachineBackup
}

// start starts reading the backup once it is known, granted and
// readable, and a slot is free; else it says what it waits for.
func (r *Reconciler) start(ctx context.Context, v *v1alpha1.VirtualMachineBackupVerification) (reconcile.Result, error) {
	t, why, final, err := r.targetOf(ctx, v)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case final:
		return reconcile.Result{}, r.fail(ctx, v, why)
	case why != "":
		return r.wait(ctx, v, why)
	}
	grant, err := providerconfig.GrantOf(ctx, r.kube, v.Namespace)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := grant.CheckBackupLocation(t.location); err != nil {
		return r.wait(ctx, v, err.Error())
	}
	loc, why, err := backuplocation.Resolve(ctx, r.kube, t.location)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case why != "":
		return r.wait(ctx, v, why)
	}
	if !r.jobs.acquire() {
		return r.wait(ctx, v, fmt.Sprintf("waiting for one of the hub's %d verification slots", r.opts.Slots))
	}
	now := metav1.Now()
	st := v1alpha1.VirtualMachineBackupVerificationStatus{
		Phase: v1alpha1.VerificationInProgress, Location: t.location, BackupID: t.id, StartTime: &now,
		Message: fmt.Sprintf("the hub is reading backup %s from BackupLocation %s", t.id, t.location),
	}
	if err := r.setStatus(ctx, v, st); err != nil {
		r.jobs.release()
		return reconcile.Result{}, err
	}
	r.jobs.start(v, func(ctx context.Context, j *job) {
		r.run(ctx, j, v.Namespace, t.id, loc)
		r.opts.Notifier.Notify(string(v.UID))
	})
	return reconcile.Result{RequeueAfter: r.opts.Progress}, nil
}

// targetOf is the backup v names, or why not yet, or (final) ever.
func (r *Reconciler) targetOf(ctx context.Context, v *v1alpha1.VirtualMachineBackupVerification) (t target, why string, final bool, err error) {
	if ref := v.Spec.Backup; ref != nil {
		t = target{location: ref.Location, id: ref.ID}
		t.backup, err = r.backupWithUID(ctx, v.Namespace, ref.ID)
		return t, "", false, err
	}
	b := &v1alpha1.VirtualMachineBackup{}
	err = r.kube.Get(ctx, types.NamespacedName{Namespace: v.Namespace, Name: string(v.Spec.BackupName)}, b)
	switch {
	case kerrors.IsNotFound(err):
		return t, fmt.Sprintf("VirtualMachineBackup %s does not exist", v.Spec.BackupName), false, nil
	case err != nil:
		return t, "", false, errors.Wrap(err, "cannot get the VirtualMachineBackup to verify")
	}
	switch b.Status.Phase {
	case v1alpha1.BackupSucceeded:
		return target{location: b.Spec.Location, id: string(b.UID), backup: b}, "", false, nil
	case v1alpha1.BackupFailed:
		return t, fmt.Sprintf("VirtualMachineBackup %s failed: nothing of it is in its location to verify", b.Name), true, nil
	}
	return t, fmt.Sprintf("VirtualMachineBackup %s is %s; it is verified once it has succeeded", b.Name, cmp.Or(string(b.Status.Phase), string(v1alpha1.BackupPending))), false, nil
}

// backupWithUID is the VirtualMachineBackup of namespace whose uid is id,
// nil if it is gone.
func (r *Reconciler) backupWithUID(ctx context.Context, namespace, id string) (*v1alpha1.VirtualMachineBackup, error) {
	l := &v1alpha1.VirtualMachineBackupList{}
	if err := r.kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return nil, errors.Wrap(err, "cannot list the namespace's backups")
	}
	for i := range l.Items {
		if string(l.Items[i].UID) == id {
			return &l.Items[i], nil
		}
	}
	return nil, nil
}

// run reads backup id of namespace from loc into j.
func (r *Reconciler) run(ctx context.Context, j *job, namespace, id string, loc wire.BackupLocation) {
	store, err := backupstore.Open(ctx, backupstore.LocationOf(loc))
	if err != nil {
		j.end(nil, backupstore.VerifyResult{}, errors.Wrap(err, "cannot open the backup's location"))
		return
	}
	m, err := store.Manifest(ctx, namespace, id)
	if err != nil {
		if errors.Is(err, backupstore.ErrNotFound) {
			err = errors.Errorf("namespace %s has no backup %s in its location", namespace, id)
		}
		j.end(nil, backupstore.VerifyResult{}, err)
		return
	}
	j.total.Store(int64(len(m.Chunks())))
	res, err := store.Verify(ctx, m, func(chunks int, bytes int64) {
		j.chunks.Store(int64(chunks))
		j.bytes.Store(bytes)
	})
	j.end(&m, res, err)
}

// follow writes a running job's progress, or its outcome once it ended.
func (r *Reconciler) follow(ctx context.Context, v *v1alpha1.VirtualMachineBackupVerification, j *job) (reconcile.Result, error) {
	st := v.Status
	st.ChunksTotal, st.ChunksChecked, st.BytesChecked = j.total.Load(), j.chunks.Load(), j.bytes.Load()
	out, ended := j.outcome()
	if !ended {
		// Each write wakes the verification again (its watch), so the
		// interval is kept here, not only by the requeue.
		if wait := r.opts.Progress - time.Since(time.Unix(0, j.written.Load())); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		if err := r.setStatus(ctx, v, st); err != nil {
			return reconcile.Result{}, err
		}
		j.written.Store(time.Now().UnixNano())
		return reconcile.Result{RequeueAfter: r.opts.Progress}, nil
	}
	now := metav1.Now()
	st.CompletionTime = &now
	if out.err != nil {
		st.Phase, st.Message = v1alpha1.VerificationFailed, fmt.Sprintf("cannot read backup %s from BackupLocation %s: %s", st.BackupID, st.Location, out.err)
		if err := r.setStatus(ctx, v, st); err != nil {
			return reconcile.Result{}, err
		}
		r.jobs.remove(v.UID, j)
		metrics.BackupVerifications.WithLabelValues(metrics.ResultError).Inc()
		r.recorder.Event(v, event.Warning(ReasonFailed, errors.New(st.Message)))
		return reconcile.Result{}, nil
	}
	ranges := out.res.BadRanges(*out.manifest)
	st.CorruptChunks, st.CorruptRanges = int64(len(out.res.Bad)), int64(len(ranges))
	st.Corrupt = nil
	for _, b := range ranges[:min(len(ranges), v1alpha1.MaxCorruptListed)] {
		st.Corrupt = append(st.Corrupt, v1alpha1.CorruptRange{Disk: b.Disk, Offset: b.Extent.Offset, Length: b.Extent.Length, Chunk: b.Extent.Chunk, Reason: b.Reason})
	}
	result, e := v1alpha1.BackupIntact, event.Normal(ReasonIntact, "")
	if len(out.res.Bad) == 0 {
		st.Phase = v1alpha1.VerificationSucceeded
		st.Message = fmt.Sprintf("all %d chunks (%d bytes) of backup %s read back as written", st.ChunksChecked, st.BytesChecked, st.BackupID)
		e.Message = st.Message
	} else {
		result = v1alpha1.BackupCorrupt
		st.Phase = v1alpha1.VerificationFailed
		st.Message = fmt.Sprintf("%d of %d chunks of backup %s are missing or do not match, holding %d ranges of its disks", st.CorruptChunks, st.ChunksChecked, st.BackupID, st.CorruptRanges)
		if len(ranges) > len(st.Corrupt) {
			st.Message += fmt.Sprintf("; the first %d are listed", len(st.Corrupt))
		}
		e = event.Warning(ReasonCorrupt, errors.New(st.Message))
	}
	// The backup first: were the verification's own write lost, it is
	// made again, and this one with it.
	b, err := r.backupWithUID(ctx, v.Namespace, st.BackupID)
	if err != nil {
		return reconcile.Result{}, err
	}
	if b != nil {
		last := &v1alpha1.LastVerification{Name: v.Name, Time: now, Result: result, CorruptChunks: st.CorruptChunks}
		if err := r.setLastVerification(ctx, b, last); err != nil {
			return reconcile.Result{}, err
		}
	}
	if err := r.setStatus(ctx, v, st); err != nil {
		return reconcile.Result{}, err
	}
	r.jobs.remove(v.UID, j)
	metrics.BackupVerifications.WithLabelValues(resultLabel[result]).Inc()
	metrics.BackupVerificationCorruptChunks.WithLabelValues().Add(float64(st.CorruptChunks))
	r.recorder.Event(v, e)
	if b != nil {
		r.recorder.Event(b, e)
	}
	return reconcile.Result{}, nil
}

// setLastVerification shows last on backup b, unless a later
// verification's outcome is shown there already.
func (r *Reconciler) setLastVerification(ctx context.Context, b *v1alpha1.VirtualMachineBackup, last *v1alpha1.LastVerification) error {
	if cur := b.Status.LastVerification; cur != nil && (cur.Name == last.Name || cur.Time.After(last.Time.Time)) {
		return nil
	}
	b.Status.LastVerification = last
	return errors.Wrap(r.kube.Status().Update(ctx, b), "cannot show the verification on the backup")
}

// wait shows why the verification waits, and looks again later.
func (r *Reconciler) wait(ctx context.Context, v *v1alpha1.VirtualMachineBackupVerification, why string) (reconcile.Result, error) {
	st := v.Status
	st.Phase, st.Message = v1alpha1.VerificationPending, why
	return reconcile.Result{RequeueAfter: waitRetry}, r.setStatus(ctx, v, st)
}

// fail ends the verification as Failed with why, before reading.
func (r *Reconciler) fail(ctx context.Context, v *v1alpha1.VirtualMachineBackupVerification, why string) error {
	st := v.Status
	now := metav1.Now()
	st.Phase, st.Message, st.CompletionTime = v1alpha1.VerificationFailed, why, &now
	if err := r.setStatus(ctx, v, st); err != nil {
		return err
	}
	metrics.BackupVerifications.WithLabelValues(metrics.ResultError).Inc()
	r.recorder.Event(v, event.Warning(ReasonFailed, errors.New(why)))
	return nil
}

// setStatus writes st unless it is what the verification shows.
func (r *Reconciler) setStatus(ctx context.Context, v *v1alpha1.VirtualMachineBackupVerification, st v1alpha1.VirtualMachineBackupVerificationStatus) error {
	if equality.Semantic.DeepEqual(v.Status, st) {
		return nil
	}
	v.Status = st
	return errors.Wrap(r.kube.Status().Update(ctx, v), "cannot update the verification's status")
}

// job is one verification being read: its progress, written by the
// reading goroutine, and its outcome once it ends.
type job struct {
	cancel               context.CancelFunc
	total, chunks, bytes atomic.Int64
	// written is when its status was last written (Unix nanoseconds).
	written atomic.Int64
	mu      sync.Mutex
	ended   bool
	out     outcome
}

type outcome struct {
	manifest *backupstore.Manifest
	res      backupstore.VerifyResult
	err      error
}

func (j *job) end(m *backupstore.Manifest, res backupstore.VerifyResult, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ended, j.out = true, outcome{manifest: m, res: res, err: err}
	if err == nil {
		j.chunks.Store(int64(res.Chunks))
		j.bytes.Store(res.Bytes)
	}
}

func (j *job) outcome() (outcome, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.out, j.ended
}

// jobs are the verifications this hub reads, by uid, each holding one of
// its slots from before its status says InProgress until its outcome is
// written or it is forgotten. It is a memory of objects that is no
// perobject.Map because forgetting a verification must also stop its job
// and free its slot.
type jobs struct {
	slots   chan struct{}
	mu      sync.Mutex
	running map[types.UID]*job
	stopped bool
}

func newJobs(memory *perobject.Owner, slots int) *jobs {
	js := &jobs{slots: make(chan struct{}, slots), running: map[types.UID]*job{}}
	memory.OnForget(func(uid types.UID) {
		js.mu.Lock()
		defer js.mu.Unlock()
		if j, ok := js.running[uid]; ok {
			j.cancel()
			delete(js.running, uid)
			js.release()
		}
	})
	return js
}

// acquire takes a slot for a job about to start, if one is free.
func (js *jobs) acquire() bool {
	select {
	case js.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// release frees a slot acquire took.
func (js *jobs) release() { <-js.slots }

func (js *jobs) get(uid types.UID) (*job, bool) {
	js.mu.Lock()
	defer js.mu.Unlock()
	j, ok := js.running[uid]
	return j, ok
}

// start runs read for v in a goroutine of its own, until it returns or
// the job is stopped; the job holds the slot the caller acquired.
func (js *jobs) start(v *v1alpha1.VirtualMachineBackupVerification, read func(context.Context, *job)) {
	ctx, cancel := context.WithCancel(context.Background())
	j := &job{cancel: cancel}
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.stopped {
		cancel()
	}
	j.written.Store(time.Now().UnixNano()) // the start, InProgress
	js.running[v.UID] = j
	go func() {
		defer cancel()
		read(ctx, j)
	}()
}

// remove forgets j, the job of uid, once its outcome is written, and
// frees its slot.
func (js *jobs) remove(uid types.UID, j *job) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.running[uid] == j {
		delete(js.running, uid)
		js.release()
	}
}

// stopAll stops every job, and those started later: the hub stops.
func (js *jobs) stopAll() {
	js.mu.Lock()
	defer js.mu.Unlock()
	js.stopped = true
	for _, j := range js.running {
		j.cancel()
	}
}
