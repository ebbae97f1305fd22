// Package inuse reconciles the resources VirtualMachines use — Volumes and
// VirtualNetworks — with one rule: they cannot be deleted while a VM uses
// them. The deletion stays pending (the object stays, with a condition and an
// event naming the VMs) and proceeds by itself when the last VM lets go.
// The nodes make the backing libvirt volume or network when a VM needs it.
package inuse

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
)

// TypeInUse is True while VirtualMachines use the resource.
const TypeInUse xpv2.ConditionType = "InUse"

// ReasonDeletionBlocked is the event a refused deletion records.
const ReasonDeletionBlocked event.Reason = "DeletionBlocked"

// Kind describes one kind of used resource.
type Kind[T resource.ModernManaged] struct {
	GroupKind        string
	GroupVersionKind schema.GroupVersionKind
	// New returns an empty object of the kind.
	New func() T
	// Index is the VirtualMachine field index naming this kind.
	Index string
	// Observe writes what is known into the object's status.atProvider.
	Observe func(obj T, users []string)
}

// SetupGated adds the controller once the CRD is established (safe-start).
func SetupGated[T resource.ModernManaged](mgr ctrl.Manager, o controller.Options, k Kind[T]) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, k); err != nil {
			panic(errors.Wrapf(err, "cannot set up the %s controller", k.GroupKind))
		}
	}, k.GroupVersionKind)
	return nil
}

// Setup adds the controller of kind k.
func Setup[T resource.ModernManaged](mgr ctrl.Manager, o controller.Options, k Kind[T]) error {
	name := managed.ControllerName(k.GroupKind)
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor(name)) //nolint:staticcheck // crossplane-runtime still records through the old events API
	r := managed.NewReconciler(mgr, resource.ManagedKind(k.GroupVersionKind),
		managed.WithTypedExternalConnector[T](&external[T]{kube: mgr.GetClient(), kind: k, recorder: recorder}),
		managed.WithLogger(o.Logger.WithValues("controller", name)),
		managed.WithPollInterval(o.PollInterval),
		managed.WithRecorder(recorder),
	)
	// A VM that stops using the resource (deleted, or its spec changed)
	// wakes it, so a blocked deletion proceeds at once.
	used := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		vm, ok := o.(*v1alpha1.VirtualMachine)
		if !ok {
			return nil
		}
		var names []string
		switch k.Index {
		case virtualmachine.IndexVolumes:
			for _, a := range vm.Spec.ForProvider.DiskAttachments {
				names = append(names, string(a.Name))
			}
		case virtualmachine.IndexNetworks:
			for _, n := range vm.Spec.ForProvider.VirtualNetworks {
				names = append(names, string(n))
			}
		}
		out := make([]reconcile.Request, 0, len(names))
		for _, n := range names {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: vm.Namespace, Name: n}})
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(k.New()).
		Watches(&v1alpha1.VirtualMachine{}, used).
		Complete(ratelimiter.NewReconciler(name, r, o.GlobalRateLimiter))
}

// external is both connector and client: there is nothing to connect to.
type external[T resource.ModernManaged] struct {
	kube     client.Client
	kind     Kind[T]
	recorder event.Recorder
}

func (e *external[T]) Connect(context.Context, T) (managed.TypedExternalClient[T], error) {
	return e, nil
}

func (e *external[T]) users(ctx context.Context, obj T) ([]string, error) {
	vms, err := virtualmachine.Users(ctx, e.kube, e.kind.Index, obj)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(vms))
	for _, vm := range vms {
		names = append(names, vm.Name)
	}
	sort.Strings(names)
	return names, nil
}

// Observe reports the resource as existing (and, while it is being deleted,
// as existing until no VM uses it).
func (e *external[T]) Observe(ctx context.Context, obj T) (managed.ExternalObservation, error) {
	users, err := e.users(ctx, obj)
	if err != nil {
		return managed.ExternalObservation{}, err
	}
	e.kind.Observe(obj, users)
	inUse := xpv2.Condition{Type: TypeInUse, Status: corev1.ConditionFalse, Reason: "Unused", LastTransitionTime: metav1.Now()}
	if len(users) > 0 {
		inUse.Status, inUse.Reason = corev1.ConditionTrue, "UsedByVirtualMachines"
		inUse.Message = "used by VirtualMachine " + strings.Join(users, ", ")
	}
	obj.SetConditions(inUse)
	if meta.WasDeleted(obj) {
		return managed.ExternalObservation{ResourceExists: len(users) > 0}, nil
	}
	obj.SetConditions(xpv2.Available())
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

// Delete refuses while VMs use the resource.
func (e *external[T]) Delete(ctx context.Context, obj T) (managed.ExternalDelete, error) {
	users, err := e.users(ctx, obj)
	if err != nil {
		return managed.ExternalDelete{}, err
	}
	if len(users) > 0 {
		err := errors.New(fmt.Sprintf("%s %s is used by VirtualMachine %s: it is deleted once they no longer use it",
			e.kind.GroupVersionKind.Kind, obj.GetName(), strings.Join(users, ", ")))
		e.recorder.Event(obj, event.Warning(ReasonDeletionBlocked, err))
		return managed.ExternalDelete{}, err
	}
	obj.SetConditions(xpv2.Deleting())
	return managed.ExternalDelete{}, nil
}

func (e *external[T]) Disconnect(context.Context) error { return nil }
