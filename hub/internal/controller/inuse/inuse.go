// Package inuse reconciles resources that others use — Volumes and
// VirtualNetworks used by VirtualMachines, DiskImages used by Volumes — with
// one rule: they cannot be deleted while used. The deletion stays pending (the
// object stays, with a condition and an event naming the users) and proceeds
// by itself when the last user lets go. The nodes make the backing libvirt
// volume, network or image when a VM needs it; a kind whose node copy must be
// removed when the resource goes (Volumes) says how with Kind.Release.
package inuse

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// TypeInUse is True while other resources use the resource.
const TypeInUse xpv2.ConditionType = "InUse"

// ReasonDeletionBlocked is the event a refused deletion records.
const ReasonDeletionBlocked event.Reason = "DeletionBlocked"

// Kind describes one kind of used resource.
type Kind[T resource.ModernManaged] struct {
	GroupKind        string
	GroupVersionKind schema.GroupVersionKind
	// New returns an empty object of the kind.
	New func() T
	// User describes the kind that uses this one.
	User User
	// Related are further kinds whose changes may change this kind's status.
	Related []Related
	// Observe writes what is known into the object's status.atProvider and
	// returns its Ready condition.
	Observe func(ctx context.Context, kube client.Reader, obj T, users Users) (xpv2.Condition, error)
	// Release, if set, removes what the resource stands for outside
	// Kubernetes once nothing uses it. The deletion of a resource calls it
	// until it returns released; only then is the finalizer removed. It must
	// be idempotent and must not block: a release that waits on a node
	// returns false and is called again when Sources fire or at the next
	// backoff. An error is shown in the resource's Synced condition. Unset
	// means the resource is released as soon as it is unused.
	Release func(ctx context.Context, obj T) (released bool, err error)
	// Sources are further triggers of reconciles, such as a Notifier's for
	// the nodes' reports Release waits on.
	Sources []source.Source
	// AwaitsBinding, if set, says that a new user of obj will bind it (write
	// to it) soon, which reconciles it anyway: a user's creation then does
	// not wake obj, and one status write shows both the user and the
	// binding. A Volume that a VM's reconcile binds to the VM's node is one:
	// in a burst the VM is placed well after its creation, so the user
	// settle time cannot merge the two, and waking it at the creation
	// would cost a second status write per VM.
	AwaitsBinding func(obj T) bool
}

// User is a kind whose objects use resources of another kind by name, in the
// same namespace.
type User struct {
	// Kind names the users in conditions, events and errors.
	Kind string
	// New returns an empty object and an empty list of the kind.
	New     func() client.Object
	NewList func() client.ObjectList
	// Index is the field index of the kind by the names it uses.
	Index string
	// Uses lists the names an object of the kind uses.
	Uses func(client.Object) []string
	// Node, if set, is the node an object of the kind is on, which the
	// status of what it uses shows: a user that comes to a node or moves
	// wakes what it uses, as a change of what it uses does.
	Node func(client.Object) string
}

// changes passes the events of users that may change the status of what
// they use: a creation, a deletion, a change of spec, a change of what is
// used (which a user's status may say: a VM whose guest lets a removed
// disk go) and, when u says where its objects are, a change of node. Their
// other writes (a VM's status, many per start) do not: they would
// reconcile every resource used once more each.
func (u User) changes() predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
			return !sameNames(u.Uses(e.ObjectOld), u.Uses(e.ObjectNew)) ||
				(u.Node != nil && u.Node(e.ObjectOld) != u.Node(e.ObjectNew))
		},
	})
}

// sameNames says whether a and b hold the same names, in any order: a
// user's status may list what it uses in another order than before
// without using anything else.
func sameNames(a, b []string) bool {
	if slices.Equal(a, b) {
		return true
	}
	if len(a) != len(b) {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// Related is a kind whose changes may change the status of resources of
// another kind: Names says which, in the changed object's namespace.
type Related struct {
	Object client.Object
	Names  func(ctx context.Context, kube client.Reader, o client.Object) []string
}

// MaxNamed is how many users a status, condition, error or event names; the
// rest are counted. A VirtualNetwork may have thousands of VMs: named in
// full they would make its status and its InUse message grow with every VM
// (each change writing it all again, and etcd refusing an object over
// 1.5 MiB), and kubectl describe would print them all.
const MaxNamed = 20

// Named is the first MaxNamed of users, which are sorted.
func Named[S ~[]E, E any](users S) S {
	return users[:min(len(users), MaxNamed)]
}

// naming lists users for a message: "a, b", or "a, b, ... and 980 more".
func naming(users Users) string {
	s := strings.Join(Named(users).Names(), ", ")
	if more := len(users) - MaxNamed; more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// Users are the objects that use a resource, sorted by name. They are the
// cache's own, uncopied: the users of a VirtualNetwork of a whole fleet are
// every VM, listed on each of its reconciles. Read them; never change them.
type Users []client.Object

// Names are the users' names, in order; none is an empty list, not nil.
func (u Users) Names() []string {
	names := make([]string, len(u))
	for i, o := range u {
		names[i] = o.GetName()
	}
	return names
}

// Users lists the objects in namespace whose u.Index names name: from the
// index of u's informer in informers (nil: none) when it keeps it, else by
// a List of kube. An indexer gives the cache's own objects and builds no
// list; a List, even uncopied, copies each object into the list's items,
// and a VirtualNetwork of a whole fleet lists every VM on each reconcile.
func (u User) Users(ctx context.Context, kube client.Reader, informers cache.Informers, namespace, name string) (Users, error) {
	objs, err := u.indexed(ctx, informers, namespace, name)
	if err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		// None indexed, or an index its informer keeps otherwise than
		// indexed reads it: a List says which.
		l := u.NewList()
		if err := kube.List(ctx, l, client.InNamespace(namespace), client.MatchingFields{u.Index: name}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, errors.Wrapf(err, "cannot list %s users", u.Kind)
		}
		items, err := apimeta.ExtractList(l)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read %s list", u.Kind)
		}
		objs = make([]any, len(items))
		for i, o := range items {
			objs[i] = o
		}
	}
	users := make(Users, 0, len(objs))
	for _, o := range objs {
		if m, ok := o.(client.Object); ok {
			users = append(users, m)
		}
	}
	slices.SortFunc(users, func(a, b client.Object) int { return strings.Compare(a.GetName(), b.GetName()) })
	return users, nil
}

// indexed reads what controller-runtime's field index u.Index of u's
// informer holds under namespace and name: nothing when informers is nil or
// the informer keeps no such index.
func (u User) indexed(ctx context.Context, informers cache.Informers, namespace, name string) ([]any, error) {
	if informers == nil {
		return nil, nil
	}
	inf, err := informers.GetInformer(ctx, u.New())
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read the %s informer", u.Kind)
	}
	shared, ok := inf.(toolscache.SharedIndexInformer)
	if !ok {
		return nil, nil
	}
	// controller-runtime's names of a field index and of its keys
	// (cache/internal's FieldIndexName and KeyToNamespacedKey).
	index := "field:" + u.Index
	if namespace == "" {
		namespace = "__all_namespaces"
	}
	if _, ok := shared.GetIndexer().GetIndexers()[index]; !ok {
		return nil, nil
	}
	objs, err := shared.GetIndexer().ByIndex(index, namespace+"/"+name)
	return objs, errors.Wrapf(err, "cannot read %s users", u.Kind)
}

// SetupGated adds the controller once the CRD is established (safe-start).
func SetupGated[T resource.ModernManaged](mgr ctrl.Manager, o controller.Options, k Kind[T], memory *perobject.Owner, polls *wake.Polls) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, k, memory, polls); err != nil {
			panic(errors.Wrapf(err, "cannot set up the %s controller", k.GroupKind))
		}
	}, k.GroupVersionKind)
	return nil
}

// Setup adds the controller of kind k, whose memory of each object memory
// owns and whose drift polls polls spreads (nil: every PollInterval).
func Setup[T resource.ModernManaged](mgr ctrl.Manager, o controller.Options, k Kind[T], memory *perobject.Owner, polls *wake.Polls) error {
	name := managed.ControllerName(k.GroupKind)
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor(name)) //nolint:staticcheck // crossplane-runtime still records through the old events API
	finalize := make(chan ctrlevent.GenericEvent, finalizeBuffer)
	e := &external[T]{kube: mgr.GetClient(), informers: mgr.GetCache(), kind: k, recorder: recorder, released: perobject.NewMap[struct{}](memory), settles: &settles{}, finalize: finalize}
	opts := []managed.ReconcilerOption{
		managed.WithTypedExternalConnector[T](e),
		managed.WithLogger(o.Logger.WithValues("controller", name)),
		managed.WithPollInterval(o.PollInterval),
		managed.WithPollIntervalHook(polls.Hook(k.New())),
		managed.WithRecorder(recorder),
		// Nothing external to name or to lose track of: Create does
		// nothing, so neither the external-name nor the create-succeeded
		// annotation is worth an API write per object.
		managed.WithInitializers(),
		managed.WithCriticalAnnotationUpdater(managed.CriticalAnnotationUpdateFn(func(context.Context, client.Object) error { return nil })),
	}
	if o.Features.Enabled(feature.EnableBetaManagementPolicies) {
		// Without Delete, a deletion never calls Delete, so nothing is
		// released: what the resource stands for stays.
		opts = append(opts, managed.WithManagementPolicies())
	}
	r := managed.NewReconciler(mgr, resource.ManagedKind(k.GroupVersionKind), opts...)
	// A user that starts or stops using the resource (created, deleted, its
	// spec changed, or its status no longer holding it) wakes it, so a
	// blocked deletion proceeds, and one that comes to a node (User.Node).
	// Only those changes: a user's other status writes would otherwise
	// reconcile (and rewrite the status of) every resource it uses, several
	// times per VM start, which would make this the hub's largest source of
	// API writes.
	copts := o.ForControllerRuntime()
	copts.RateLimiter = apiwrites.ControllerRateLimiter()
	b := ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(copts).
		For(k.New(), builder.WithPredicates(beyondStatus)).
		Watches(k.User.New(), enqueueAfter(e.settles.of, func(_ context.Context, o client.Object) []string { return k.User.Uses(o) }, k.bindingWakes(mgr.GetClient())),
			builder.WithPredicates(k.User.changes()))
	for _, rel := range k.Related {
		b = b.Watches(rel.Object, enqueue(func(ctx context.Context, o client.Object) []string { return rel.Names(ctx, mgr.GetClient(), o) }))
	}
	for _, src := range k.Sources {
		b = b.WatchesRawSource(src)
	}
	b = b.WatchesRawSource(source.Channel(finalize, &handler.EnqueueRequestForObject{}))
	return b.Complete(ratelimiter.NewReconciler(name, r, o.GlobalRateLimiter))
}

// beyondStatus passes every event of a resource but an update of its status
// alone: the controller's own status writes would otherwise reconcile each
// resource once more for nothing, which for a VirtualNetwork of a whole fleet
// lists every VM again. A change of its spec, labels, annotations (a
// Volume's binding), finalizers or deletion passes; drift is still polled.
var beyondStatus = predicate.Or(resource.DesiredStateChanged(), predicate.Funcs{
	UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
		return !slices.Equal(e.ObjectOld.GetFinalizers(), e.ObjectNew.GetFinalizers()) ||
			!e.ObjectOld.GetDeletionTimestamp().Equal(e.ObjectNew.GetDeletionTimestamp())
	},
})

// enqueue reconciles the resources names returns, in the changed object's
// namespace.
func enqueue(names func(context.Context, client.Object) []string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return requests(ctx, names, o)
	})
}

func requests(ctx context.Context, names func(context.Context, client.Object) []string, o client.Object) []reconcile.Request {
	ns := names(ctx, o)
	out := make([]reconcile.Request, 0, len(ns))
	for _, n := range ns {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: n}})
	}
	return out
}

// userSettle is how long a resource waits after a change of its users
// before it is reconciled. A VM that starts using a Volume binds it to its
// node moments later; one status write then shows both the new user and
// the node, where reconciling at once would write twice. It is also how
// much later a deletion waiting for its last user proceeds.
const userSettle = 500 * time.Millisecond

// perUserSettle is how much longer than userSettle a resource with many
// users waits, per user. Each reconcile of a resource lists its users, so
// a VirtualNetwork of a whole fleet reconciled every userSettle through a
// burst would cost the hub CPU that grows with the square of the fleet.
// Waiting this long per user keeps the listing a small share of the time
// waited (ten thousand users: 2 s between reconciles, its status that
// much behind, a blocked deletion that much later).
const perUserSettle = 200 * time.Microsecond

// settleFor is how long a resource with users users waits after a change
// of them.
func settleFor(users int) time.Duration {
	return max(userSettle, time.Duration(users)*perUserSettle)
}

// settles holds the resources whose users are so many that they wait
// longer than userSettle (settleFor), as their last reconcile counted
// them. Others are not held: the map stays as small as the number of such
// resources, and a resource leaves it when its users drop, which a
// resource being deleted does before it goes.
type settles struct {
	m sync.Map // types.NamespacedName to time.Duration
}

// record notes that the resource key has users users.
func (s *settles) record(key types.NamespacedName, users int) {
	if d := settleFor(users); d > userSettle {
		s.m.Store(key, d)
		return
	}
	s.m.Delete(key)
}

// of is how long the resource r waits after a change of its users.
func (s *settles) of(r reconcile.Request) time.Duration {
	if d, ok := s.m.Load(r.NamespacedName); ok {
		return d.(time.Duration) //nolint:forcetypeassert // only record stores, and only durations
	}
	return userSettle
}

// bindingWakes reports whether the resource r, which a new user names,
// will be woken by that user's binding of it (see Kind.AwaitsBinding), as
// the cache of kube shows it now.
func (k Kind[T]) bindingWakes(kube client.Reader) func(context.Context, reconcile.Request) bool {
	return func(ctx context.Context, r reconcile.Request) bool {
		if k.AwaitsBinding == nil {
			return false
		}
		obj := k.New()
		if err := kube.Get(ctx, r.NamespacedName, obj); err != nil {
			// Not there (yet), or unreadable: wake it, as without the hook.
			return false
		}
		return !meta.WasDeleted(obj) && k.AwaitsBinding(obj)
	}
}

// enqueueAfter is enqueue with every reconcile delayed by settle: the
// workqueue merges it with any the resource gets meanwhile. A created user
// does not wake a resource for which bound is true: its binding will.
func enqueueAfter(settle func(reconcile.Request) time.Duration, names func(context.Context, client.Object) []string, bound func(context.Context, reconcile.Request) bool) handler.EventHandler {
	add := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], created bool, objs ...client.Object) {
		for _, o := range objs {
			for _, r := range requests(ctx, names, o) {
				if created && bound(ctx, r) {
					continue
				}
				q.AddAfter(r, settle(r))
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e ctrlevent.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, true, e.Object)
		},
		// Both versions: a user that stopped using a resource wakes it too.
		UpdateFunc: func(ctx context.Context, e ctrlevent.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, false, e.ObjectOld, e.ObjectNew)
		},
		DeleteFunc: func(ctx context.Context, e ctrlevent.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, false, e.Object)
		},
		GenericFunc: func(ctx context.Context, e ctrlevent.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, false, e.Object)
		},
	}
}

// external is both connector and client: there is nothing to connect to.
type external[T resource.ModernManaged] struct {
	kube client.Client
	// informers, when set, serve the users (User.Users).
	informers cache.Informers
	kind      Kind[T]
	recorder  event.Recorder
	// released holds the resources being deleted whose Release succeeded.
	// Losing it (a hub restart) only calls Release once more.
	released *perobject.Map[struct{}]
	settles  *settles
	// finalize reconciles a released resource again at once (see
	// Delete).
	finalize chan ctrlevent.GenericEvent
}

// finalizeBuffer is how many released resources may wait to be reconciled
// again at once; past it, one waits for its backoff instead.
const finalizeBuffer = 1024

func (e *external[T]) Connect(context.Context, T) (managed.TypedExternalClient[T], error) {
	return e, nil
}

func (e *external[T]) users(ctx context.Context, obj T) (Users, error) {
	return e.kind.User.Users(ctx, e.kube, e.informers, obj.GetNamespace(), obj.GetName())
}

// Observe reports the resource as existing (and, while it is being deleted,
// as existing until nothing uses it).
func (e *external[T]) Observe(ctx context.Context, obj T) (managed.ExternalObservation, error) {
	users, err := e.users(ctx, obj)
	if err != nil {
		return managed.ExternalObservation{}, err
	}
	e.settles.record(types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}, len(users))
	ready, err := e.kind.Observe(ctx, e.kube, obj, users)
	if err != nil {
		// A hub still reading the fleet a kind reads (a Volume's records,
		// a DiskImage's reports) retries without a word.
		return managed.ExternalObservation{}, fleet.QuietWhileStarting(err)
	}
	inUse := xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionFalse, Reason: "Unused", LastTransitionTime: metav1.Now()}
	if len(users) > 0 {
		inUse.Status, inUse.Reason = corev1.ConditionTrue, xpv2.ConditionReason("UsedBy"+e.kind.User.Kind+"s")
		inUse.Message = "used by " + e.kind.User.Kind + " " + naming(users)
	}
	obj.SetConditions(inUse)
	if meta.WasDeleted(obj) {
		exists := len(users) > 0
		if !exists && e.kind.Release != nil {
			_, released := e.released.LoadAndDelete(obj.GetUID())
			exists = !released
		}
		return managed.ExternalObservation{ResourceExists: exists}, nil
	}
	obj.SetConditions(ready)
	return managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, nil
}

// Create and Update have nothing to do: the resource is made on a node when
// a VM there needs it.
func (e *external[T]) Create(context.Context, T) (managed.ExternalCreation, error) {
	return managed.ExternalCreation{}, nil
}

func (e *external[T]) Update(context.Context, T) (managed.ExternalUpdate, error) {
	return managed.ExternalUpdate{}, nil
}

// Delete refuses while the resource is used, then releases it.
func (e *external[T]) Delete(ctx context.Context, obj T) (managed.ExternalDelete, error) {
	users, err := e.users(ctx, obj)
	if err != nil {
		return managed.ExternalDelete{}, err
	}
	if len(users) > 0 {
		err := errors.New(fmt.Sprintf("%s %s is used by %s %s: it is deleted once they no longer use it",
			e.kind.GroupVersionKind.Kind, obj.GetName(), e.kind.User.Kind, naming(users)))
		e.recorder.Event(obj, event.Warning(ReasonDeletionBlocked, err))
		return managed.ExternalDelete{}, err
	}
	obj.SetConditions(xpv2.Deleting())
	if e.kind.Release == nil {
		return managed.ExternalDelete{}, nil
	}
	released, err := e.kind.Release(ctx, obj)
	if err != nil {
		return managed.ExternalDelete{}, err
	}
	if released {
		e.released.Store(obj.GetUID(), struct{}{})
		// The managed reconciler finalizes it at its next reconcile, which
		// it requeues with backoff: a deletion refused while users held
		// the resource has grown that up to apiwrites.MaxDelay. Nothing is
		// left to wait for, so come back now.
		again := e.kind.New()
		again.SetNamespace(obj.GetNamespace())
		again.SetName(obj.GetName())
		select {
		case e.finalize <- ctrlevent.GenericEvent{Object: again}:
		default:
		}
	}
	return managed.ExternalDelete{}, nil
}

func (e *external[T]) Disconnect(context.Context) error { return nil }
