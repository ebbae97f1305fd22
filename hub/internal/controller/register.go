// Package controller wires the hub's controllers.
package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/diskimage"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/controller/volume"
)

// vmUser describes VirtualMachines as users of what index names.
func vmUser(index string, uses func(*v1alpha1.VirtualMachine) []string) inuse.User {
	return inuse.User{
		Kind:    v1alpha1.VirtualMachineKind,
		New:     func() client.Object { return &v1alpha1.VirtualMachine{} },
		NewList: func() client.ObjectList { return &v1alpha1.VirtualMachineList{} },
		Index:   index,
		Uses: func(o client.Object) []string {
			if vm, ok := o.(*v1alpha1.VirtualMachine); ok {
				return uses(vm)
			}
			return nil
		},
	}
}

// Volumes are used by VirtualMachines through spec.forProvider.diskAttachments.
var Volumes = inuse.Kind[*v1alpha1.Volume]{
	GroupKind:        v1alpha1.VolumeGroupKind,
	GroupVersionKind: v1alpha1.VolumeGroupVersionKind,
	New:              func() *v1alpha1.Volume { return &v1alpha1.Volume{} },
	User: vmUser(virtualmachine.IndexVolumes, func(vm *v1alpha1.VirtualMachine) []string {
		names := make([]string, 0, len(vm.Spec.ForProvider.DiskAttachments))
		for _, a := range vm.Spec.ForProvider.DiskAttachments {
			names = append(names, string(a.Name))
		}
		return names
	}),
	Observe: func(_ context.Context, _ client.Reader, v *v1alpha1.Volume, users []string) (xpv2.Condition, error) {
		node := v.GetAnnotations()[v1alpha1.AnnotationNode]
		v.Status.AtProvider.Node, v.Status.AtProvider.AttachedTo = node, users
		v.Status.AtProvider.Phase = v1alpha1.PhasePending
		if node != "" {
			v.Status.AtProvider.Phase = v1alpha1.PhaseRunning
		}
		return xpv2.Available(), nil
	},
}

// releasingVolumes is Volumes with their deletion on the node: a deleted
// Volume goes once its node deleted the volume.
func releasingVolumes(mgr ctrl.Manager, vo virtualmachine.Options, notifier *virtualmachine.Notifier) inuse.Kind[*v1alpha1.Volume] {
	name := managed.ControllerName(v1alpha1.VolumeGroupKind)
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor(name)) //nolint:staticcheck // crossplane-runtime still records through the old events API
	k := Volumes
	k.Release = volume.NewReleaser(mgr.GetClient(), vo, notifier, recorder).Release
	k.Sources = []source.Source{notifier.Source()}
	return k
}

// VirtualNetworks are used by VirtualMachines through
// spec.forProvider.virtualNetworks.
var VirtualNetworks = inuse.Kind[*v1alpha1.VirtualNetwork]{
	GroupKind:        v1alpha1.VirtualNetworkGroupKind,
	GroupVersionKind: v1alpha1.VirtualNetworkGroupVersionKind,
	New:              func() *v1alpha1.VirtualNetwork { return &v1alpha1.VirtualNetwork{} },
	User: vmUser(virtualmachine.IndexNetworks, func(vm *v1alpha1.VirtualMachine) []string {
		names := make([]string, 0, len(vm.Spec.ForProvider.VirtualNetworks))
		for _, n := range vm.Spec.ForProvider.VirtualNetworks {
			names = append(names, string(n))
		}
		return names
	}),
	Observe: func(_ context.Context, _ client.Reader, n *v1alpha1.VirtualNetwork, users []string) (xpv2.Condition, error) {
		n.Status.AtProvider.AttachedTo = users
		n.Status.AtProvider.Phase = v1alpha1.PhaseRunning
		return xpv2.Available(), nil
	},
}

// SetupGated adds every controller, each once its CRD is established.
// volumes and images are the Notifiers the Pool's fleets feed with Volume
// and image report changes (Fleet.SubscribeVolumes, Fleet.SubscribeImages).
func SetupGated(ctx context.Context, mgr ctrl.Manager, o controller.Options, vo virtualmachine.Options, volumes, images *virtualmachine.Notifier) error {
	// The indexes serve several controllers; they must exist before any of
	// them starts, whatever order their gates open in.
	if err := virtualmachine.IndexUsage(ctx, mgr); err != nil {
		return err
	}
	if err := providerconfig.Setup(mgr, o); err != nil {
		return err
	}
	if err := virtualmachine.SetupGated(mgr, o, vo); err != nil {
		return err
	}
	if err := inuse.SetupGated(mgr, o, releasingVolumes(mgr, vo, volumes)); err != nil {
		return err
	}
	if err := inuse.SetupGated(mgr, o, VirtualNetworks); err != nil {
		return err
	}
	return inuse.SetupGated(mgr, o, diskimage.NewKind(mgr.GetClient(), vo.Pool, images))
}
