// Package virtualnetwork reconciles VirtualNetworks with the inuse
// controller: their users are the VirtualMachines attached to them, and a
// deletion is held while any is. The nodes make the backing network when a
// VM there needs it, so there is nothing to release on them.
package virtualnetwork

import (
	"context"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
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
// for what its namespace was not granted (an import, a host bridge, a cidr
// outside its networkCIDRs) or its cidr overlaps an earlier network's; the
// VMs on it are refused then too, and no node makes it for them.
func observe(ctx context.Context, kube client.Reader, n *v1alpha1.VirtualNetwork, users inuse.Users) (xpv2.Condition, error) {
	n.Status.AtProvider.AttachedTo = inuse.Named(users).Names()
	n.Status.AtProvider.AttachedCount = int32(len(users)) //nolint:gosec // far fewer VMs than 2^31
	n.Status.AtProvider.Phase = v1alpha1.PhaseRunning
	nodes := nodesOf(users)
	n.Status.AtProvider.Nodes = inuse.Named(nodes)
	n.Status.AtProvider.NodeCount = int32(len(nodes)) //nolint:gosec // far fewer nodes than 2^31
	if ipam.Addressed(n) {
		var err error
		if n.Status.AtProvider.VNI, err = vniAllocator.of(ctx, kube, n); err != nil {
			return xpv2.Condition{}, err
		}
		held := &v1alpha1.NetworkAddressList{}
		if err := kube.List(ctx, held, client.InNamespace(n.Namespace), client.MatchingLabels{ipam.LabelNetwork: n.Name}, client.UnsafeDisableDeepCopy); err != nil {
			return xpv2.Condition{}, errors.Wrap(err, "cannot list the network's addresses")
		}
		n.Status.AtProvider.AddressesAllocated = int32(len(held.Items)) //nolint:gosec // at most a /8's addresses
		n.Status.AtProvider.AddressesTotal = int32(ipam.Total(n))       //nolint:gosec // at most a /8's addresses
	}
	if !tenancy.NeedsGrant(n) {
		return xpv2.Available(), nil
	}
	g, err := providerconfig.GrantOf(ctx, kube, n.Namespace)
	if err != nil {
		return xpv2.Condition{}, err
	}
	err = g.CheckNetwork(n)
	if err == nil {
		var overlap *ipam.OverlapError
		if err = CheckOverlaps(ctx, kube, *n); err != nil && !errors.As(err, &overlap) {
			return xpv2.Condition{}, err
		}
	}
	if err != nil {
		n.Status.AtProvider.Phase = v1alpha1.PhaseFailed
		return xpv2.Unavailable().WithMessage(err.Error()), nil
	}
	return xpv2.Available(), nil
}

// nodesOf are the nodes the network's VMs, its users, run on, sorted, each
// once. The status names the first inuse.MaxNamed of them: every VM's
// reconcile reads its networks, and a network over a fleet of a thousand
// nodes naming them all would be copied whole on each read.
func nodesOf(users inuse.Users) []string {
	seen := map[string]bool{}
	for _, u := range users {
		if vm, ok := u.(*v1alpha1.VirtualMachine); ok && vm.Status.AtProvider.Node != "" {
			seen[vm.Status.AtProvider.Node] = true
		}
	}
	if len(seen) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(seen))
}

// SetupGated adds the VirtualNetwork controller once the CRD is
// established. memory forgets what addresses and the VNI allocator
// remember of a network once it is gone.
func SetupGated(mgr ctrl.Manager, o controller.Options, addresses *ipam.Allocator, memory *perobject.Owner, polls *wake.Polls) error {
	memory.OnForget(vniAllocator.forget)
	memory.OnForget(func(uid types.UID) { addresses.Forget(string(uid)) })
	return inuse.SetupGated(mgr, o, Kind, memory, polls)
}
