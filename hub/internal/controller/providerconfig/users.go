package providerconfig

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/providerconfig"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
)

// The users of a ProviderConfig are the managed resources whose reconcilers
// resolve it: VirtualMachines, Volumes and DiskImages naming it in
// spec.providerConfigRef. A ProviderConfig with users is not deleted: its
// deletion waits, as Crossplane's does, with a Terminating condition and an
// event, and proceeds by itself when the last user is gone. status.users
// counts them.
//
// Crossplane's providers record each use as a ProviderConfigUsage: an object
// and a create per managed resource, and a create lost to a conflict
// whenever a reconcile reads a cache that has not seen the usage yet. The
// hub counts its users instead, from the watch events of the user kinds,
// so a managed resource costs the API server no object and no write for it.
// The count is the cache's: exact once the caches have synced, which the
// controller waits for before it reconciles anything.

// finalizer holds a ProviderConfig while it has users; Crossplane's
// ProviderConfig reconciler uses the same.
const finalizer = "in-use.crossplane.io"

// usersSettle is how long a change of users waits before the ProviderConfig
// is reconciled: a burst of creates then costs one status write a settle,
// not one a VM.
const usersSettle = time.Second

// userKinds are the kinds whose objects can use a ProviderConfig.
var userKinds = []func() client.Object{
	func() client.Object { return &v1alpha1.VirtualMachine{} },
	func() client.Object { return &v1alpha1.Volume{} },
	func() client.Object { return &v1alpha1.DiskImage{} },
}

// uses is the ProviderConfig of kind that o names, as the request that
// reconciles it, if o names one of kind. A ProviderConfig is in o's
// namespace; a ClusterProviderConfig in none.
func uses(o client.Object, kind string) (reconcile.Request, bool) {
	mg, ok := o.(resource.ModernManaged)
	if !ok {
		return reconcile.Request{}, false
	}
	ref := mg.GetProviderConfigReference()
	if ref == nil || ref.Kind != kind || ref.Name == "" {
		return reconcile.Request{}, false
	}
	r := reconcile.Request{NamespacedName: types.NamespacedName{Name: ref.Name}}
	if kind == apisv1alpha1.ProviderConfigKind {
		r.Namespace = o.GetNamespace()
	}
	return r, true
}

// Users counts the users of the ProviderConfigs of one kind, from the watch
// events of the user kinds.
type Users struct {
	kind string

	mu sync.Mutex
	n  map[types.NamespacedName]int64
}

// NewUsers counts the users of ProviderConfigs of kind (ProviderConfig or
// ClusterProviderConfig).
func NewUsers(kind string) *Users {
	return &Users{kind: kind, n: map[types.NamespacedName]int64{}}
}

// Of is how many users the ProviderConfig pc has.
func (u *Users) Of(pc types.NamespacedName) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[pc]
}

// add counts o, if it is a user, by d, and queues its ProviderConfig.
func (u *Users) add(o client.Object, d int64, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	r, ok := uses(o, u.kind)
	if !ok {
		return
	}
	u.mu.Lock()
	if u.n[r.NamespacedName] += d; u.n[r.NamespacedName] <= 0 {
		delete(u.n, r.NamespacedName)
	}
	u.mu.Unlock()
	q.AddAfter(r, usersSettle)
}

// Handler counts the objects of a user kind as they come, change the
// ProviderConfig they name and go, and queues the ProviderConfigs whose
// count changed.
func (u *Users) Handler() handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e ctrlevent.CreateEvent, q queue) { u.add(e.Object, 1, q) },
		UpdateFunc: func(_ context.Context, e ctrlevent.UpdateEvent, q queue) {
			before, _ := uses(e.ObjectOld, u.kind)
			after, _ := uses(e.ObjectNew, u.kind)
			if before != after {
				u.add(e.ObjectOld, -1, q)
				u.add(e.ObjectNew, 1, q)
			}
		},
		DeleteFunc: func(_ context.Context, e ctrlevent.DeleteEvent, q queue) { u.add(e.Object, -1, q) },
	}
}

// UsersReconciler holds the ProviderConfigs of one kind while they have
// users and shows how many they have.
type UsersReconciler struct {
	kube     client.Client
	new      func() resource.ProviderConfig
	users    *Users
	recorder event.Recorder
}

// Reconcile adds the finalizer to a ProviderConfig, shows its users, and
// removes the finalizer of a deleted one once it has none.
func (r *UsersReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pc := r.new()
	if err := r.kube.Get(ctx, req.NamespacedName, pc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(errors.Wrap(err, "cannot get the ProviderConfig"))
	}
	users := r.users.Of(req.NamespacedName)
	if meta.WasDeleted(pc) {
		if users == 0 {
			meta.RemoveFinalizer(pc, finalizer)
			return reconcile.Result{}, ignoreGone(errors.Wrap(r.kube.Update(ctx, pc), "cannot let the ProviderConfig go"))
		}
		msg := fmt.Sprintf("deletion waits for %d %s naming it in spec.providerConfigRef (VirtualMachines, Volumes, DiskImages)", users, plural(users, "resource", "resources"))
		was := pc.GetCondition(providerconfig.TypeTerminating)
		if pc.GetUsers() == users && was.Status == corev1.ConditionTrue && was.Message == msg {
			return reconcile.Result{}, nil
		}
		r.recorder.Event(pc, event.Warning(inuse.ReasonDeletionBlocked, errors.New(msg)))
		pc.SetUsers(users)
		pc.SetConditions(providerconfig.Terminating().WithMessage(msg))
		return reconcile.Result{}, ignoreGone(errors.Wrap(r.kube.Status().Update(ctx, pc), "cannot show the ProviderConfig's users"))
	}
	if !meta.FinalizerExists(pc, finalizer) {
		meta.AddFinalizer(pc, finalizer)
		if err := r.kube.Update(ctx, pc); err != nil {
			return reconcile.Result{}, ignoreGone(errors.Wrap(err, "cannot hold the ProviderConfig while it has users"))
		}
	}
	if pc.GetUsers() == users {
		return reconcile.Result{}, nil
	}
	pc.SetUsers(users)
	return reconcile.Result{}, ignoreGone(errors.Wrap(r.kube.Status().Update(ctx, pc), "cannot show the ProviderConfig's users"))
}

// ignoreGone is err unless it says the ProviderConfig changed or went since
// it was read: its watch event queues it again, or it is gone.
func ignoreGone(err error) error {
	if kerrors.IsConflict(err) || kerrors.IsNotFound(err) {
		return nil
	}
	return err
}

// plural is one when n is 1 and many otherwise.
func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// SetupGated adds the controllers of both kinds of ProviderConfig once the
// CRDs of the ProviderConfigs and of their users are established.
func SetupGated(mgr ctrl.Manager, o controller.Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o); err != nil {
			panic(errors.Wrap(err, "cannot set up the ProviderConfig controllers"))
		}
	}, apisv1alpha1.ProviderConfigGroupVersionKind, apisv1alpha1.ClusterProviderConfigGroupVersionKind,
		v1alpha1.VirtualMachineGroupVersionKind, v1alpha1.VolumeGroupVersionKind, v1alpha1.DiskImageGroupVersionKind)
	return nil
}

// Setup adds the controllers of both kinds of ProviderConfig.
func Setup(mgr ctrl.Manager, o controller.Options) error {
	for _, k := range configKinds {
		name := providerconfig.ControllerName(k.groupKind)
		r := &UsersReconciler{
			kube: mgr.GetClient(), new: k.new, users: NewUsers(k.kind),
			recorder: event.NewAPIRecorder(mgr.GetEventRecorderFor(name)), //nolint:staticcheck // crossplane-runtime still records through the old events API
		}
		b := ctrl.NewControllerManagedBy(mgr).
			Named(name).
			WithOptions(o.ForControllerRuntime()).
			For(k.new())
		for _, user := range userKinds {
			b = b.Watches(user(), r.users.Handler())
		}
		if err := b.Complete(ratelimiter.NewReconciler(name, r, o.GlobalRateLimiter)); err != nil {
			return errors.Wrapf(err, "cannot set up the %s controller", k.kind)
		}
	}
	return nil
}
