// Package writes keeps the hub's controllers from sending API writes that
// change nothing or are bound to fail. crossplane-runtime's managed
// reconciler ends every reconcile with a status update, changed or not; the
// API server answers an unchanged one without touching etcd, but it still
// counts against the hub's client-side rate limit and the server's load, and
// at scale it was the larger part of the hub's writes. And a reconcile that
// reads an object from a cache that has not caught up with the previous
// reconcile's write makes writes that only end in conflicts; so after each
// write the writer waits, briefly, until the cache holds what it wrote.
package writes

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SkipUnchangedStatus returns mgr with a client whose status updates are
// skipped when they would not change the object's status.
func SkipUnchangedStatus(mgr ctrl.Manager) ctrl.Manager {
	return &manager{Manager: mgr, client: NewClient(mgr.GetClient(), mgr.GetCache())}
}

type manager struct {
	ctrl.Manager
	client client.Client
}

func (m *manager) GetClient() client.Client { return m.client }

// NewClient wraps c so that Status().Update skips a write when cache holds
// the object at the same resourceVersion with an equal status.
//
// The comparison is only safe against the version the caller read: a cache
// that lags behind this client's own last write would otherwise make a
// write that reverts it look like a no-op. So a status update is skipped
// only when the object's resourceVersion is the one this client's last
// status write produced (or it has made none), and the cache holds exactly
// that version. Anything else is written, and a stale write fails with a
// conflict as it would have anyway.
func NewClient(c client.Client, cache client.Reader) client.Client {
	return &skipping{Client: c, cache: cache}
}

type skipping struct {
	client.Client
	cache client.Reader
	// written is the resourceVersion each object's last status write made.
	written sync.Map // types.UID -> resourceVersion
	// deferred are the objects whose next status write is dropped.
	deferred sync.Map // types.UID -> time.Time: until when
}

// StatusDeferrer is implemented by the client of the manager that
// SkipUnchangedStatus returns.
type StatusDeferrer interface {
	// DeferStatus drops obj's next status update if it comes within d. The
	// caller knows a newer status follows shortly, and makes sure a
	// reconcile writes the status after d in case it does not: a status
	// that would be replaced within d is not worth an API write.
	DeferStatus(obj client.Object, d time.Duration)
}

// DeferStatus implements StatusDeferrer.
func (s *skipping) DeferStatus(obj client.Object, d time.Duration) {
	s.deferred.Store(obj.GetUID(), time.Now().Add(d))
}

// isDeferred reports whether the status write of obj is to be dropped, and
// forgets the deferral either way: it drops one write at most.
func (s *skipping) isDeferred(obj client.Object) bool {
	until, ok := s.deferred.LoadAndDelete(obj.GetUID())
	return ok && time.Now().Before(until.(time.Time)) //nolint:forcetypeassert // only DeferStatus stores here
}

func (s *skipping) Status() client.SubResourceWriter {
	return &statusWriter{SubResourceWriter: s.Client.Status(), s: s}
}

type statusWriter struct {
	client.SubResourceWriter
	s *skipping
}

func (w *statusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if len(opts) == 0 && (w.s.isDeferred(obj) || w.s.unchanged(ctx, obj)) {
		return nil
	}
	if err := w.SubResourceWriter.Update(ctx, obj, opts...); err != nil {
		return err
	}
	w.s.written.Store(obj.GetUID(), obj.GetResourceVersion())
	w.s.awaitCache(ctx, obj)
	return nil
}

// cacheWait bounds how long a writer waits for the cache to show its write:
// the cache is normally milliseconds behind, and a write by someone else
// right after this one would otherwise keep it waiting for a version it
// will never see.
const cacheWait = time.Second

// awaitCache waits until the cache holds obj at the resourceVersion the
// write just gave it, or no longer holds obj at all. A controller never
// reconciles one object twice at once, so the next reconcile of obj, which
// may already be queued, then reads what this one wrote instead of making
// writes from a stale copy that can only end in conflicts.
func (s *skipping) awaitCache(ctx context.Context, obj client.Object) {
	cached, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return
	}
	want, key := obj.GetResourceVersion(), client.ObjectKeyFromObject(obj)
	ctx, cancel := context.WithTimeout(ctx, cacheWait)
	defer cancel()
	_ = wait.PollUntilContextCancel(ctx, cachePoll, true, func(ctx context.Context) (bool, error) {
		err := s.cache.Get(ctx, key, cached)
		return kerrors.IsNotFound(err) || (err == nil && cached.GetResourceVersion() == want), nil
	})
}

// cachePoll is how often awaitCache looks; a cache read is a map lookup and
// a deep copy.
const cachePoll = 2 * time.Millisecond

// unchanged reports whether obj's status equals that of the version of obj
// the cache holds, and that version is the newest this client knows of.
func (s *skipping) unchanged(ctx context.Context, obj client.Object) bool {
	if rv, ok := s.written.Load(obj.GetUID()); ok && rv != obj.GetResourceVersion() {
		return false
	}
	cached, ok := obj.DeepCopyObject().(client.Object)
	if !ok || s.cache.Get(ctx, client.ObjectKeyFromObject(obj), cached) != nil {
		return false
	}
	if cached.GetResourceVersion() != obj.GetResourceVersion() || cached.GetUID() != obj.GetUID() {
		return false
	}
	return equalStatus(obj, cached)
}

func equalStatus(a, b runtime.Object) bool {
	ua, err := runtime.DefaultUnstructuredConverter.ToUnstructured(a)
	if err != nil {
		return false
	}
	ub, err := runtime.DefaultUnstructuredConverter.ToUnstructured(b)
	if err != nil {
		return false
	}
	return equality.Semantic.DeepEqual(ua["status"], ub["status"])
}

// Update forgets an object whose last finalizer it removes: the object is
// gone once the update lands, and the hub must not remember every object it
// ever saw.
func (s *skipping) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if obj.GetDeletionTimestamp() != nil && len(obj.GetFinalizers()) == 0 {
		s.written.Delete(obj.GetUID())
		s.deferred.Delete(obj.GetUID())
	}
	if err := s.Client.Update(ctx, obj, opts...); err != nil {
		return err
	}
	s.awaitCache(ctx, obj)
	return nil
}

// Patch waits, like Update, for the cache to show the patched object.
func (s *skipping) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := s.Client.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	s.awaitCache(ctx, obj)
	return nil
}

// lastWritten is the resourceVersion of uid's last status write, or "".
func (s *skipping) lastWritten(uid types.UID) string {
	rv, _ := s.written.Load(uid)
	v, _ := rv.(string)
	return v
}
