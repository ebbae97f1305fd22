// Package controller wires the hub's controllers.
package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
)

// Volumes are used by VirtualMachines through spec.forProvider.diskAttachments.
var Volumes = inuse.Kind[*v1alpha1.Volume]{
	GroupKind:        v1alpha1.VolumeGroupKind,
	GroupVersionKind: v1alpha1.VolumeGroupVersionKind,
	New:              func() *v1alpha1.Volume { return &v1alpha1.Volume{} },
	Index:            virtualmachine.IndexVolumes,
	Observe: func(v *v1alpha1.Volume, users []string) {
		node := v.GetAnnotations()[v1alpha1.AnnotationNode]
		v.Status.AtProvider.Node, v.Status.AtProvider.AttachedTo = node, users
		v.Status.AtProvider.Phase = v1alpha1.PhasePending
		if node != "" {
			v.Status.AtProvider.Phase = v1alpha1.PhaseRunning
		}
	},
}

// VirtualNetworks are used by VirtualMachines through
// spec.forProvider.virtualNetworks.
var VirtualNetworks = inuse.Kind[*v1alpha1.VirtualNetwork]{
	GroupKind:        v1alpha1.VirtualNetworkGroupKind,
	GroupVersionKind: v1alpha1.VirtualNetworkGroupVersionKind,
	New:              func() *v1alpha1.VirtualNetwork { return &v1alpha1.VirtualNetwork{} },
	Index:            virtualmachine.IndexNetworks,
	Observe: func(n *v1alpha1.VirtualNetwork, users []string) {
		n.Status.AtProvider.AttachedTo = users
		n.Status.AtProvider.Phase = v1alpha1.PhaseRunning
	},
}

// SetupGated adds every controller, each once its CRD is established.
func SetupGated(ctx context.Context, mgr ctrl.Manager, o controller.Options, vo virtualmachine.Options) error {
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
	if err := inuse.SetupGated(mgr, o, Volumes); err != nil {
		return err
	}
	return inuse.SetupGated(mgr, o, VirtualNetworks)
}
