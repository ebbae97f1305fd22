// Package apiwrites is the one place where the hub economises on API
// writes. The hub's throughput is bounded by the API server's write rate,
// so every mechanism here saves writes, and each says what it saves:
//
//   - Unchanged status writes are skipped (Client.Status().Update).
//     crossplane-runtime's managed reconciler ends every reconcile with a
//     status update, changed or not; the API server answers an unchanged
//     one without touching etcd, but it still counts against the client's
//     rate limit and the server's load. In a burst most reconciles end
//     with a status unchanged, so most of these updates are skipped here.
//
//   - Read your writes (awaitCache): after a write, the writer waits until
//     the informer cache holds what it wrote. The cache-backed client
//     cannot read its own writes (controller-runtime issue 3320), and a
//     reconcile queued meanwhile for the same object (a node's report
//     arrives) would otherwise read the version before the write and end
//     in a conflict, a lost write plus a retry.
//
//   - Coalescing report-driven status writes (Hold): a status that the
//     node's report will replace within seconds (a VM just published to
//     its node, phase Scheduled) is not written, and the report's status
//     is. The caller says by a comparison which content may be dropped; a
//     status with anything else in it (a reconcile error) is written. It
//     saves one status write per VM whose node reports within the hold,
//     so the hold is sized to cover a node's report in a burst.
//
//   - Writes that can only conflict are not sent (superseded): a write
//     from a copy of an object that this client has itself written over
//     since (the copy's resourceVersion is the one its last write was made
//     from) is refused here with the Conflict the API server would answer.
//     That happens when the cache lags behind the hub's own writes by more
//     than awaitCache waits, and the retry (ControllerRateLimiter: 50 ms,
//     doubling) reads the same stale copy again. When the cache lags, a
//     burst otherwise sends many such writes, each one a request the API
//     server decodes only to answer 409.
//
//   - Normal events within a budget (ForManager's events): a burst of
//     creates would otherwise cost several event writes per VM, each
//     saying what the VM's status says; Warnings are always recorded.
//
// And ControllerRateLimiter sets how soon a reconcile that lost a conflict
// is retried.
package apiwrites

import (
	"context"
	"math"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// ForManager returns mgr with the Client of this package in place of its
// own; GetClient returns a *Client whose memory of each object memory owns.
// When events is not nil, every event recorder the manager hands out
// (GetEventRecorderFor) records Normal events only within that budget
// (NewEventBudget), shared by all of them.
func ForManager(mgr ctrl.Manager, memory *perobject.Owner, events *EventBudget) ctrl.Manager {
	return &manager{Manager: mgr, client: NewClient(mgr.GetClient(), mgr.GetCache(), memory), events: events}
}

type manager struct {
	ctrl.Manager
	client client.Client
	events *EventBudget
}

func (m *manager) GetClient() client.Client { return m.client }

func (m *manager) GetEventRecorderFor(name string) record.EventRecorder {
	return Budget(m.Manager.GetEventRecorderFor(name), m.events) //nolint:staticcheck // crossplane-runtime still records through the old events API
}

// NewClient wraps c so that Status().Update skips a write when cache holds
// the object at the same resourceVersion with an equal status, or when the
// status is one a Hold lets drop.
//
// The comparison is only safe against the version the caller read: a cache
// that lags behind this client's own last write would otherwise make a
// write that reverts it look like a no-op. So a status update is skipped
// only when the object's resourceVersion is the one this client's last
// status write produced (or it has made none), and the cache holds exactly
// that version. Anything else is written, and a stale write fails with a
// conflict as it would have anyway.
func NewClient(c client.Client, cache client.Reader, memory *perobject.Owner) *Client {
	return &Client{Client: c, cache: cache, memory: memory, written: perobject.NewMap[write](memory), holds: perobject.NewMap[*hold](memory)}
}

// Client is a client.Client that spares the writes described in the
// package's documentation.
type Client struct {
	client.Client
	cache  client.Reader
	memory *perobject.Owner
	// written is each object's last write by this client (see write).
	written *perobject.Map[write]
	// holds are the objects whose next status write may be dropped.
	holds *perobject.Map[*hold]
}

// Direct is c without the wait for the cache, for writers that never read
// their own writes back (the placement loop: a VM it bound leaves its
// queue), so waiting would only hold them up. Their writes still count as
// this client's for superseded. A client that is no *Client is returned as
// it is.
func Direct(c client.Client) client.Client {
	if k, ok := c.(*Client); ok {
		return &direct{Client: k.Client, s: k}
	}
	return c
}

// direct is Direct's client, and the writes of the Client's Update and
// Patch before their wait: each is refused if it can only conflict, and
// recorded.
type direct struct {
	client.Client
	s *Client
}

// Update forgets an object whose last finalizer it removes, once the
// update landed: the object is gone then (the memory's owner forgets the
// objects that go without such a write once its informer sees them go).
// One that did not land leaves the object as it was, and what the hub
// remembers of it stands: forgotten, the object could not be recorded
// again within perobject.GoneFor, and a deletion whose progress is
// remembered (a VM's deleted guest) would wait that long.
func (d *direct) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if obj.GetDeletionTimestamp() != nil && len(obj.GetFinalizers()) == 0 {
		uid := obj.GetUID()
		err := d.Client.Update(ctx, obj, opts...)
		if err == nil || kerrors.IsNotFound(err) {
			d.s.memory.Forget(uid)
		}
		return err
	}
	if d.s.superseded(obj) {
		return d.s.conflict(obj)
	}
	from := obj.GetResourceVersion()
	if err := d.Client.Update(ctx, obj, opts...); err != nil {
		return err
	}
	d.s.wrote(obj, from)
	return nil
}

func (d *direct) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	from := obj.GetResourceVersion()
	if err := d.Client.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	d.s.wrote(obj, from)
	return nil
}

// write is what this client's last write of an object did: the
// resourceVersion it was made from (the copy the writer held) and the one
// it made.
type write struct{ from, made string }

// wrote records a write of obj, which now holds the version it made, from
// the version from.
// A write that returns after its object went is not recorded (see
// perobject.Map.Store).
func (s *Client) wrote(obj client.Object, from string) {
	s.written.Store(obj.GetUID(), write{from: from, made: obj.GetResourceVersion()})
}

// superseded reports whether obj is the very copy this client's last write
// of it was made from, and that write changed the object. Its
// resourceVersion is then no longer the object's, and a write that carries
// it can only be refused with a conflict. A write that changed nothing (an
// Update of what is stored, an empty patch) leaves the resourceVersion as
// it was, and the copy current.
func (s *Client) superseded(obj client.Object) bool {
	rv := obj.GetResourceVersion()
	if rv == "" {
		return false
	}
	w, ok := s.written.Load(obj.GetUID())
	return ok && w.from == rv && w.made != rv
}

// conflict is the error the API server answers a write from a superseded
// copy with.
func (s *Client) conflict(obj client.Object) error {
	gr := schema.GroupResource{}
	if gvk, err := apiutil.GVKForObject(obj, s.Scheme()); err == nil {
		gr.Group, gr.Resource = gvk.Group, gvk.Kind
		if m, err := s.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err == nil {
			gr.Resource = m.Resource.Resource
		}
	}
	return kerrors.NewConflict(gr, obj.GetName(), errSuperseded)
}

// errSuperseded says why a write was refused without a request.
var errSuperseded = errors.New("the object has been modified since this copy was read (by the hub itself; its cache is behind); not sent")

// hold is a Hold not yet used.
type hold struct {
	until time.Time
	drop  func(client.Object) bool
}

// Hold lets the status updates of obj within d be dropped as long as drop,
// given the object about to be written, says its status is only the
// transitional one the caller expects to be replaced. The first status
// write for which drop says false is written and ends the hold. The caller
// makes sure a reconcile writes the status after d in case nothing replaced
// it by then.
//
// Every such write is dropped, not only the first: a VM is reconciled again
// before its node's report for other reasons (its Volume's binding), and
// that reconcile would write the Scheduled status the first one had
// dropped.
func (s *Client) Hold(obj client.Object, d time.Duration, drop func(client.Object) bool) {
	s.holds.Store(obj.GetUID(), &hold{until: time.Now().Add(d), drop: drop})
}

// held reports whether the status write of obj is to be dropped; the hold
// ends when it is not.
func (s *Client) held(obj client.Object) bool {
	h, ok := s.holds.Load(obj.GetUID())
	if !ok {
		return false
	}
	if time.Now().Before(h.until) && h.drop(obj) {
		return true
	}
	s.holds.CompareAndDelete(obj.GetUID(), h)
	return false
}

func (s *Client) Status() client.SubResourceWriter {
	return &statusWriter{SubResourceWriter: s.Client.Status(), s: s}
}

type statusWriter struct {
	client.SubResourceWriter
	s *Client
}

func (w *statusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if w.s.superseded(obj) {
		return w.s.conflict(obj)
	}
	if len(opts) == 0 && (w.s.held(obj) || w.s.unchanged(ctx, obj)) {
		return nil
	}
	before := obj.GetResourceVersion()
	if err := w.SubResourceWriter.Update(ctx, obj, opts...); err != nil {
		return err
	}
	w.s.wrote(obj, before)
	w.s.awaitCache(ctx, obj, before)
	return nil
}

// cacheWait bounds how long a writer waits for the cache to show its write:
// the cache is normally milliseconds behind, and a write by someone else
// right after this one would otherwise keep it waiting for a version it
// will never see.
const cacheWait = time.Second

// awaitCache waits until the cache no longer holds obj at before, the
// resourceVersion the writer read (from this cache): it holds the version
// the write just gave obj, or a later one, or no obj at all. A controller
// never reconciles one object twice at once, so the next reconcile of obj,
// which may already be queued, then reads what this one wrote or newer
// instead of making writes from a stale copy that can only end in
// conflicts. Waiting for exactly the written version instead would hold a
// worker for the whole cacheWait whenever another controller wrote the
// object right after (a Volume's binding and its status), which in a burst
// adds up to a large share of the burst's time.
func (s *Client) awaitCache(ctx context.Context, obj client.Object, before string) {
	cached, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return
	}
	want, key := obj.GetResourceVersion(), client.ObjectKeyFromObject(obj)
	ctx, cancel := context.WithTimeout(ctx, cacheWait)
	defer cancel()
	_ = cachePoll.DelayFunc().Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		// Only the resourceVersion is read: the cache's object is not
		// copied, cached merely shares it.
		err := s.cache.Get(ctx, key, cached, client.UnsafeDisableDeepCopy)
		if kerrors.IsNotFound(err) {
			return true, nil
		}
		rv := cached.GetResourceVersion()
		return err == nil && (rv == want || (before != "" && rv != before)), nil
	})
}

// cachePoll is how often awaitCache looks: after 2 ms, then twice as long
// each time up to 32 ms, until cacheWait. A look is a cache read. An idle
// cache is barely behind; a busy one falls much
// further behind, and looking at the shortest interval throughout would
// cost a noticeable share of the hub's CPU in a burst.
var cachePoll = wait.Backoff{Duration: 2 * time.Millisecond, Factor: 2, Cap: 32 * time.Millisecond, Steps: math.MaxInt32}

// unchanged reports whether obj's status equals that of the version of obj
// the cache holds, and that version is the newest this client knows of.
func (s *Client) unchanged(ctx context.Context, obj client.Object) bool {
	if w, ok := s.written.Load(obj.GetUID()); ok && w.made != obj.GetResourceVersion() {
		return false
	}
	cached, ok := obj.DeepCopyObject().(client.Object)
	// Read, never changed: the cache's object is not copied.
	if !ok || s.cache.Get(ctx, client.ObjectKeyFromObject(obj), cached, client.UnsafeDisableDeepCopy) != nil {
		return false
	}
	if cached.GetResourceVersion() != obj.GetResourceVersion() || cached.GetUID() != obj.GetUID() {
		return false
	}
	return equalStatus(obj, cached)
}

// equalStatus reports whether a and b, objects of one kind, have the same
// status as the API server would store it: compared in their JSON form, so
// times equal to the second are equal. Only the status is converted, not
// the whole objects.
func equalStatus(a, b runtime.Object) bool {
	sa, sb := statusOf(a), statusOf(b)
	if sa == nil || sb == nil {
		return false
	}
	ua, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sa)
	if err != nil {
		return false
	}
	ub, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sb)
	if err != nil {
		return false
	}
	return equality.Semantic.DeepEqual(ua, ub)
}

// statusOf is a pointer to the Status field of the struct o points to, or
// nil when it has none.
func statusOf(o runtime.Object) any {
	v := reflect.ValueOf(o)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	f := v.Elem().FieldByName("Status")
	if !f.IsValid() || f.Kind() != reflect.Struct {
		return nil
	}
	return f.Addr().Interface()
}

// Update is Direct's Update, then the wait for the cache to show the
// updated object.
func (s *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	before := obj.GetResourceVersion()
	if err := Direct(s).Update(ctx, obj, opts...); err != nil {
		return err
	}
	s.awaitCache(ctx, obj, before)
	return nil
}

// Patch is Direct's Patch, then, like Update, the wait for the cache to
// show the patched object.
func (s *Client) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	before := obj.GetResourceVersion()
	if err := Direct(s).Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	s.awaitCache(ctx, obj, before)
	return nil
}
