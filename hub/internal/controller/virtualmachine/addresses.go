package virtualmachine

import (
	"context"
	"net/netip"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
)

// fixedAddress is the address vm's spec fixes on network, or "".
func fixedAddress(vm *v1alpha1.VirtualMachine, network string) string {
	for _, a := range vm.Spec.ForProvider.Addresses {
		if string(a.Network) == network {
			return a.Address
		}
	}
	return ""
}

// knownAddresses fills in d the addresses the allocator knows vm holds, and
// whether the VM's node joins its networks to the overlay; false when an
// address of one of its networks is not known yet or must change (Update
// then allocates it). It writes nothing.
func (e *external) knownAddresses(vm *v1alpha1.VirtualMachine, d *dependencies, node fleet.NodeStatus) bool {
	d.overlay = node.Heartbeat.TunnelAddress != ""
	if meta.GetExternalName(vm) != "" {
		return true
	}
	for i := range d.networks {
		n := &d.networks[i]
		if !ipam.Addressed(n) {
			continue
		}
		p, ok := e.opts.Addresses.Known(vm, n, fixedAddress(vm, n.Name))
		if !ok || (d.overlay && n.Status.AtProvider.VNI == 0) {
			return false
		}
		d.setAddress(n.Name, p)
	}
	return true
}

// allocate gives vm an address on each of its networks whose addresses are
// the hub's, the one its spec fixes where it does, and fills them in d. A
// guest imported by its external name keeps the addresses it has: they were
// never the hub's to give.
func (e *external) allocate(ctx context.Context, vm *v1alpha1.VirtualMachine, d *dependencies, node fleet.NodeStatus) error {
	d.overlay = node.Heartbeat.TunnelAddress != ""
	if meta.GetExternalName(vm) != "" {
		return nil
	}
	for _, a := range vm.Spec.ForProvider.Addresses {
		if !d.attaches(string(a.Network)) {
			return errors.Errorf("spec.forProvider.addresses names network %s, which is not one of the VM's virtualNetworks", a.Network)
		}
	}
	// An adopted guest keeps the addresses it holds.
	var adopted map[string]netip.Addr
	if from := vm.GetAnnotations()[v1alpha1.AnnotationAdopted]; from != "" {
		var err error
		if adopted, err = e.opts.Addresses.Adopt(ctx, vm, from); err != nil {
			return errors.Wrap(err, "cannot hand the adopted guest's addresses to the VM")
		}
	}
	// Placement admitted the addresses of the networks the VM had then;
	// one given a network since is admitted here, before any is given.
	if e.opts.Quotas != nil {
		if err := e.opts.Quotas.AdmitAddresses(ctx, vm, addressesOf(vm, *d)); err != nil {
			return errors.Wrap(err, "cannot give the VM its addresses")
		}
	}
	for i := range d.networks {
		n := &d.networks[i]
		if !ipam.Addressed(n) {
			if fixedAddress(vm, n.Name) != "" {
				return errors.Errorf("spec.forProvider.addresses fixes an address on network %s, whose addresses are not virtfleet's (it is imported or in bridge mode)", n.Name)
			}
			continue
		}
		if d.overlay && n.Status.AtProvider.VNI == 0 {
			// Its controller gives it one as soon as it sees it.
			return errors.Errorf("waiting for VirtualNetwork %s to be given a VNI", n.Name)
		}
		fixed := fixedAddress(vm, n.Name)
		if a, ok := adopted[n.Name]; ok && (fixed == "" || fixed == a.String()) {
			if cidr, err := netip.ParsePrefix(n.Spec.ForProvider.CIDR); err == nil && cidr.Contains(a) {
				d.setAddress(n.Name, netip.PrefixFrom(a, cidr.Bits()))
				continue
			}
		}
		p, err := e.opts.Addresses.Ensure(ctx, vm, n, fixed)
		if err != nil {
			return errors.Wrapf(err, "cannot give the VM an address on network %s", n.Name)
		}
		d.setAddress(n.Name, p)
	}
	return nil
}

// setAddress records the VM's address on network.
func (d *dependencies) setAddress(network string, p netip.Prefix) {
	if d.addresses == nil {
		d.addresses = map[string]netip.Prefix{}
	}
	d.addresses[network] = p
}

// attaches says whether the VM has an interface on network.
func (d *dependencies) attaches(network string) bool {
	for i := range d.networks {
		if d.networks[i].Name == network {
			return true
		}
	}
	return false
}
