// Package virtualnetwork reconciles VirtualNetworks with the inuse
// controller: their users are the VirtualMachines attached to them, and a
// deletion is held while any is. The nodes make the backing network when a
// VM there needs it, so there is nothing to release on them.
package virtualnetwork

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

// Kind is the VirtualNetwork kind for the inuse controller.
var Kind = inuse.Kind[*v1alpha1.VirtualNetwork]{
	GroupKind:        v1alpha1.VirtualNetworkGroupKind,
	GroupVersionKind: v1alpha1.VirtualNetworkGroupVersionKind,
	New:              func() *v1alpha1.VirtualNetwork { return &v1alpha1.VirtualNetwork{} },
	User:             index.NetworkUsers,
	Observe:          observe,
}

// observe shows the network's users, and why it is refused when it asks
// for what its namespace was not granted (an import, a host bridge); the
// VMs on it are refused then too, and no node makes it for them.
func observe(ctx context.Context, kube client.Reader, n *v1alpha1.VirtualNetwork, users []string) (xpv2.Condition, error) {
	n.Status.AtProvider.AttachedTo = inuse.Named(users)
	n.Status.AtProvider.AttachedCount = int32(len(users)) //nolint:gosec // far fewer VMs than 2^31
	n.Status.AtProvider.Phase = v1alpha1.PhaseRunning
	if !tenancy.NeedsGrant(n) {
		return xpv2.Available(), nil
	}
	g, err := providerconfig.GrantOf(ctx, kube, n.Namespace)
	if err != nil {
		return xpv2.Condition{}, err
	}
	if err := g.CheckNetwork(n); err != nil {
		n.Status.AtProvider.Phase = v1alpha1.PhaseFailed
		return xpv2.Unavailable().WithMessage(err.Error()), nil
	}
	return xpv2.Available(), nil
}

// SetupGated adds the VirtualNetwork controller once the CRD is established.
func SetupGated(mgr ctrl.Manager, o controller.Options) error {
	return inuse.SetupGated(mgr, o, Kind)
}
