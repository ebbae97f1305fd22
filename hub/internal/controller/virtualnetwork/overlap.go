package virtualnetwork

import (
	"context"
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

// CheckOverlaps refuses, with an ipam.OverlapError, the first of networks
// whose cidr overlaps that of a VirtualNetwork of any namespace that came
// before it (ipam.CheckOverlap). Only networks their own namespace may have
// count, so a range outside a tenant's grants is never taken from anyone.
// Both the network's own controller and every VM publishing an intent with
// the network ask this, so a refused network is made on no node.
func CheckOverlaps(ctx context.Context, kube client.Reader, networks ...v1alpha1.VirtualNetwork) error {
	if !slices.ContainsFunc(networks, func(n v1alpha1.VirtualNetwork) bool { return ipam.Addressed(&n) }) {
		return nil
	}
	all := &v1alpha1.VirtualNetworkList{}
	if err := kube.List(ctx, all, client.UnsafeDisableDeepCopy); err != nil {
		return errors.Wrap(err, "cannot list VirtualNetworks to check for overlapping cidrs")
	}
	cpcs := &apisv1alpha1.ClusterProviderConfigList{}
	if err := kube.List(ctx, cpcs); err != nil {
		return errors.Wrap(err, "cannot list ClusterProviderConfigs for the namespaces' grants")
	}
	grants := map[string]tenancy.Grant{}
	counts := func(o *v1alpha1.VirtualNetwork) bool {
		g, ok := grants[o.Namespace]
		if !ok {
			g = tenancy.For(cpcs.Items, o.Namespace)
			grants[o.Namespace] = g
		}
		return g.CheckNetwork(o) == nil
	}
	for i := range networks {
		if err := ipam.CheckOverlap(&networks[i], all.Items, counts); err != nil {
			return err
		}
	}
	return nil
}
