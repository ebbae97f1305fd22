// Package ipam is the hub's address allocator for VirtualNetworks: it gives
// each VirtualMachine interface an IPv4 address of its network's cidr and
// records the allocation in the Kubernetes API, so that it survives hub
// restarts and two hub replicas never give out the same address.
//
// An allocation is a NetworkAddress in the VM's namespace named
// "<network>.<a.b.c.d>". The API server keeps names unique, so creating the
// record is the allocation: whoever creates it holds the address, and a
// second Create fails with AlreadyExists, whichever replica sends it. The
// record's name, not its spec, is therefore what counts as holding an
// address. Records carry the labels LabelNetwork and LabelVMUID so they can
// be listed by network or by VM, and an owner reference to their VM so that
// Kubernetes' garbage collector removes those of deleted VMs; the hub also
// deletes them itself (Release), for API servers without a garbage collector.
//
// The Allocator keeps, per network, a view of the records it knows, so that
// choosing an address does not list the network's records every time. The
// view is a hint, the API server the authority: the view is built from a
// List the first time a network is used and rebuilt when it claims that the
// network is full or that a fixed address is another VM's, and by Usage, so
// that releases by another replica are seen; an address another replica
// took meanwhile costs one Create that fails with AlreadyExists, after which
// the view knows it. Whether a VM the view does not know already holds an
// address (given by another replica) is asked of the reader, by VM uid
// (IndexVMUID); the address a view knows a VM holds is read back before it
// is returned, so a record deleted by hand is made again. The reader may be
// an informer that lags behind the API server: the Allocator trusts its own
// creates and deletes over a reader that does not show them yet, for a while
// (ownWriteGrace), and reads from the client what the reader does not have.
package ipam

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// Labels of every NetworkAddress the Allocator writes.
const (
	// LabelNetwork is the name of the VirtualNetwork the address is of.
	LabelNetwork = "compute.virtfleet.io/network"
	// LabelVMUID is the uid of the VirtualMachine holding the address.
	LabelVMUID = "compute.virtfleet.io/vm-uid"
)

// IndexVMUID is the field index of NetworkAddresses by the uid of the VM
// holding them. Finding whether a VM already holds an address, which Ensure
// asks of every VM its view does not know, is then a lookup rather than a
// scan of the namespace's records: register it (Index) on an informer-backed
// reader. Without it the Allocator lists by label.
const IndexVMUID = "spec.virtualMachineUID"

// Index registers IndexVMUID with fi, such as a manager's field indexer,
// before its informers start.
func Index(ctx context.Context, fi client.FieldIndexer) error {
	return errors.Wrap(fi.IndexField(ctx, &v1alpha1.NetworkAddress{}, IndexVMUID, vmUIDOf), "cannot index NetworkAddresses by VM uid")
}

// vmUIDOf is the value of IndexVMUID of o.
func vmUIDOf(o client.Object) []string {
	if na, ok := o.(*v1alpha1.NetworkAddress); ok && na.Spec.VirtualMachineUID != "" {
		return []string{na.Spec.VirtualMachineUID}
	}
	return nil
}

// Addressed says whether the hub gives n's VMs their addresses and joins
// n's bridges on every node into one segment: a network virtfleet makes from
// a cidr (nat or isolated). An imported network is the site's, with the
// site's addresses, and a bridge-mode one is the host bridge's segment.
func Addressed(n *v1alpha1.VirtualNetwork) bool {
	return meta.GetExternalName(n) == "" && n.Spec.ForProvider.Mode != v1alpha1.NetworkModeBridge && n.Spec.ForProvider.CIDR != ""
}

// Total is how many addresses network gives to VMs: its cidr less the
// network, gateway and broadcast addresses; 0 for a network without
// addresses of the hub's.
func Total(network *v1alpha1.VirtualNetwork) int {
	s, err := parseSubnet(network)
	if err != nil || !Addressed(network) {
		return 0
	}
	return s.total()
}

// An Allocator gives VirtualMachines addresses of their VirtualNetworks. It
// is safe for concurrent use: allocations on one network are serialised (one
// mutex per network) but for their API writes, which proceed in parallel,
// each for an address reserved to it; those on different networks proceed
// in parallel.
//
// Within a network's usable range it hands out addresses next-fit: a cursor
// moves past each address it gives and wraps around at the end of the
// range, and the first free address from the cursor is the next one. That
// costs little per allocation even when most of the range is taken, and an
// address a deleted VM released is not given to a new VM until the cursor
// has gone round the range, so that ARP caches, DHCP leases, SSH known hosts
// and firewall rules that still name the old VM reach no new one soon after.
// A view built from a List starts its cursor past the highest address held,
// so a restarted hub goes on where the addresses end, and a fresh network
// hands out its addresses in order from the first.
//
// When the API server refuses an address because another replica took it,
// the cursor jumps to a random point of the range. Two replicas allocating
// at once would otherwise share one cursor, and the one that lost a race,
// paying a failed Create and a read for every address the other took
// meanwhile, would stay behind the other at each allocation after; apart,
// each goes on in order until it runs into addresses the other took.
type Allocator struct {
	c client.Client
	r client.Reader
	// unindexed is set once r refused a List by IndexVMUID.
	unindexed atomic.Bool
	// exhaustedRecheck is how long a network found full is believed
	// before the next allocation on it lists its records again.
	exhaustedRecheck time.Duration

	mu    sync.Mutex
	views map[types.NamespacedName]*view
}

// New returns an Allocator that writes NetworkAddresses with c and lists
// them with r, which may be an informer-backed reader (nil means c). Reads
// that must not miss a record (whom an address that exists belongs to) fall
// back to c when r does not find it, so c should read from the API server.
func New(c client.Client, r client.Reader) *Allocator {
	if r == nil {
		r = c
	}
	return &Allocator{c: c, r: r, views: map[types.NamespacedName]*view{}, exhaustedRecheck: defaultExhaustedRecheck}
}

// Ensure returns the address of vm on network, with the prefix length of the
// network's cidr, and records one for it when it has none. fixed, when not
// empty, is the address vm must have (its spec.forProvider.addresses entry
// for the network): a VM that holds another address on the network gets
// fixed and loses the other. Without fixed, a VM keeps the address it has.
// Ensure is idempotent: a VM holds at most one address per network, and any
// other record of it on the network (a former fixed address, one of an
// earlier cidr, one another replica made in a race) is deleted.
//
// Errors: InvalidAddressError and InvalidNetworkError are terminal (see
// IsTerminal); HeldError and ExhaustedError go away when other VMs release
// addresses.
func (a *Allocator) Ensure(ctx context.Context, vm *v1alpha1.VirtualMachine, network *v1alpha1.VirtualNetwork, fixed string) (netip.Prefix, error) {
	if vm.UID == "" {
		return netip.Prefix{}, errors.Errorf("VirtualMachine %s/%s has no uid: only a VM read from the API server can hold an address", vm.Namespace, vm.Name)
	}
	if network.Namespace != vm.Namespace {
		return netip.Prefix{}, errors.Errorf("VirtualMachine %s/%s cannot have an address of VirtualNetwork %s/%s, which is in another namespace", vm.Namespace, vm.Name, network.Namespace, network.Name)
	}
	s, err := parseSubnet(network)
	if err != nil {
		return netip.Prefix{}, err
	}
	var want netip.Addr
	if fixed != "" {
		if want, err = s.check(network.Name, fixed); err != nil {
			return netip.Prefix{}, err
		}
	}

	v := a.view(network)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := a.load(ctx, v, network, s); err != nil {
		return netip.Prefix{}, err
	}

	mine := v.recordsOf(string(vm.UID))
	if len(mine) == 0 {
		// Another replica may have recorded an address for vm that
		// this view never came across.
		if mine, err = a.lookup(ctx, v, vm); err != nil {
			return netip.Prefix{}, err
		}
	}
	var keep *record
	for _, r := range mine {
		if (want.IsValid() && r.addr != want) || !s.contains(r.addr) {
			continue
		}
		if keep, err = a.confirm(ctx, v, vm, r); err != nil {
			return netip.Prefix{}, err
		}
		if keep != nil {
			break
		}
	}
	switch {
	case keep != nil:
	case want.IsValid():
		keep, err = a.take(ctx, v, vm, want)
	default:
		keep, err = a.allocate(ctx, v, vm)
	}
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, r := range mine {
		if cur := v.records[r.name]; r.name == keep.name || (cur != nil && cur.vmUID != r.vmUID) {
			// Kept, or found to be another VM's meanwhile.
			continue
		}
		if err := a.delete(ctx, v, r); err != nil {
			return netip.Prefix{}, err
		}
	}
	return netip.PrefixFrom(keep.addr, s.prefix.Bits()), nil
}

// Known returns the address Ensure would return for vm on network and fixed
// without writing anything, if the Allocator already knows it: false when it
// has not loaded the network, knows no record of vm there, or would have to
// change it (fixed differs). It asks nothing of the API server, so a
// reconcile that only looks can call it; one that finds false calls Ensure.
func (a *Allocator) Known(vm *v1alpha1.VirtualMachine, network *v1alpha1.VirtualNetwork, fixed string) (netip.Prefix, bool) {
	a.mu.Lock()
	v := a.views[types.NamespacedName{Namespace: network.Namespace, Name: network.Name}]
	a.mu.Unlock()
	if v == nil {
		return netip.Prefix{}, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.loaded || v.networkUID != network.UID || v.subnet.prefix.String() != network.Spec.ForProvider.CIDR {
		return netip.Prefix{}, false
	}
	for _, r := range v.recordsOf(string(vm.UID)) {
		if v.subnet.contains(r.addr) && (fixed == "" || r.addr.String() == fixed) {
			return netip.PrefixFrom(r.addr, v.subnet.prefix.Bits()), true
		}
	}
	return netip.Prefix{}, false
}

// Release deletes every NetworkAddress of vm (by uid) in its namespace, on
// every network. Records already gone are no error.
func (a *Allocator) Release(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if vm.UID == "" {
		return errors.Errorf("VirtualMachine %s/%s has no uid", vm.Namespace, vm.Name)
	}
	uid := string(vm.UID)
	list, err := a.listOf(ctx, vm)
	if err != nil {
		return err
	}
	listed := map[string][]*record{}
	for i := range list.Items {
		o := &list.Items[i]
		if o.Spec.VirtualMachineUID == uid {
			n := string(o.Spec.Network)
			listed[n] = append(listed[n], fromObject(o, n))
		}
	}
	a.mu.Lock()
	views := map[string]*view{}
	for k, v := range a.views {
		if k.Namespace == vm.Namespace {
			views[k.Name] = v
		}
	}
	a.mu.Unlock()

	for name, v := range views {
		recs := listed[name]
		delete(listed, name)
		if err := a.releaseIn(ctx, v, uid, recs); err != nil {
			return err
		}
	}
	for _, recs := range listed {
		for _, r := range recs {
			if err := a.delete(ctx, nil, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// Keep has vm's records outlive it: a VM released with its guest (deleted
// without the Delete management policy) leaves the guest running with its
// addresses, so they stay held, by the VM's uid, with no owner reference
// for Kubernetes' garbage collector to follow. Adopt hands them to the VM
// that adopts the guest.
func (a *Allocator) Keep(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	_, err := a.hand(ctx, vm.Namespace, string(vm.UID), nil)
	return err
}

// Adopt hands to vm the records of the released guest it adopts, held by
// the uid it was released under, so the guest keeps its addresses under its
// new VM, and returns the addresses handed over, by network name. Records
// already handed over, or none, are no error: then it returns none, and
// Ensure finds what was handed over.
func (a *Allocator) Adopt(ctx context.Context, vm *v1alpha1.VirtualMachine, from string) (map[string]netip.Addr, error) {
	if vm.UID == "" {
		return nil, errors.Errorf("VirtualMachine %s/%s has no uid", vm.Namespace, vm.Name)
	}
	return a.hand(ctx, vm.Namespace, from, vm)
}

// hand moves the records of the VM uid from to vm, or, with vm nil, drops
// their owner reference. Each record is patched on the version read, and
// the views that know it learn its new holder.
func (a *Allocator) hand(ctx context.Context, namespace, from string, vm *v1alpha1.VirtualMachine) (map[string]netip.Addr, error) {
	held := &v1alpha1.VirtualMachine{}
	held.Namespace, held.UID = namespace, types.UID(from)
	list, err := a.listOf(ctx, held)
	if err != nil {
		return nil, err
	}
	handed := map[string]netip.Addr{}
	for i := range list.Items {
		o := &list.Items[i]
		if o.Spec.VirtualMachineUID != from {
			continue
		}
		patch := client.MergeFromWithOptions(o.DeepCopy(), client.MergeFromWithOptimisticLock{})
		o.OwnerReferences = nil
		if vm != nil {
			if o.Labels == nil {
				o.Labels = map[string]string{}
			}
			o.Labels[LabelVMUID] = string(vm.UID)
			o.Spec.VirtualMachine, o.Spec.VirtualMachineUID = v1alpha1.LocalName(vm.Name), string(vm.UID)
			o.OwnerReferences = ownedBy(vm)
		}
		if err := a.c.Patch(ctx, o, patch); err != nil {
			return nil, errors.Wrapf(err, "cannot hand over address %s of network %s", o.Spec.Address, o.Spec.Network)
		}
		if addr, err := netip.ParseAddr(o.Spec.Address); err == nil {
			handed[string(o.Spec.Network)] = addr
		}
		a.mu.Lock()
		v := a.views[types.NamespacedName{Namespace: namespace, Name: string(o.Spec.Network)}]
		a.mu.Unlock()
		if v != nil {
			v.mu.Lock()
			r := fromObject(o, v.name)
			v.add(r)
			v.own[r.name] = ownWrite{rec: r, uid: r.uid, at: time.Now()}
			v.mu.Unlock()
		}
	}
	return handed, nil
}

// ownedBy is the owner reference of a record held by vm: Kubernetes'
// garbage collector removes the records of a deleted VM where the hub did
// not (it was down, or the VM's finalizer was stripped by hand).
func ownedBy(vm *v1alpha1.VirtualMachine) []metav1.OwnerReference {
	return []metav1.OwnerReference{{
		APIVersion:         v1alpha1.SchemeGroupVersion.String(),
		Kind:               v1alpha1.VirtualMachineKind,
		Name:               vm.Name,
		UID:                vm.UID,
		Controller:         ptr.To(false),
		BlockOwnerDeletion: ptr.To(false),
	}}
}

// releaseIn deletes the records of the VM uid on v's network: those v knows
// and listed, which the reader showed.
func (a *Allocator) releaseIn(ctx context.Context, v *view, uid string, listed []*record) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	recs := v.recordsOf(uid)
	for _, l := range listed {
		if !slices.ContainsFunc(recs, func(r *record) bool { return r.name == l.name }) {
			recs = append(recs, l)
		}
	}
	for _, r := range recs {
		if err := a.delete(ctx, v, r); err != nil {
			return err
		}
	}
	return nil
}

// Forget drops the view of the VirtualNetwork with this uid; it is called
// once the network is gone, so the Allocator does not hold a view of every
// network it ever served.
func (a *Allocator) Forget(uid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, v := range a.views {
		if string(v.networkUID) == uid {
			delete(a.views, k)
		}
	}
}
