// Package writes keeps the hub's controllers from sending API writes that
// change nothing. crossplane-runtime's managed reconciler ends every
// reconcile with a status update, changed or not; the API server answers an
// unchanged one without touching etcd, but it still counts against the hub's
// client-side rate limit and the server's load, and at scale it was the
// larger part of the hub's writes.
package writes

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
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
}

func (s *skipping) Status() client.SubResourceWriter {
	return &statusWriter{SubResourceWriter: s.Client.Status(), s: s}
}

type statusWriter struct {
	client.SubResourceWriter
	s *skipping
}

func (w *statusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if len(opts) == 0 && w.s.unchanged(ctx, obj) {
		return nil
	}
	if err := w.SubResourceWriter.Update(ctx, obj, opts...); err != nil {
		return err
	}
	w.s.written.Store(obj.GetUID(), obj.GetResourceVersion())
	return nil
}

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
	}
	return s.Client.Update(ctx, obj, opts...)
}

// lastWritten is the resourceVersion of uid's last status write, or "".
func (s *skipping) lastWritten(uid types.UID) string {
	rv, _ := s.written.Load(uid)
	v, _ := rv.(string)
	return v
}
