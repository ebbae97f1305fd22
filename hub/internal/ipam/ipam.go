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
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
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

// ownWriteGrace is how long a record this Allocator created or deleted is
// believed over a reader that does not show the write yet. An informer shows
// a write far sooner; past it, the reader is believed, so that a record
// someone else deleted meanwhile is not kept in a view forever.
const ownWriteGrace = time.Minute

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
	return &Allocator{c: c, r: r, views: map[types.NamespacedName]*view{}}
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

// view returns the view of network, new and unloaded when there is none.
func (a *Allocator) view(network *v1alpha1.VirtualNetwork) *view {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := types.NamespacedName{Namespace: network.Namespace, Name: network.Name}
	v := a.views[k]
	if v == nil {
		v = &view{namespace: network.Namespace, name: network.Name}
		a.views[k] = v
	}
	return v
}

// load makes v a loaded view of network: it starts again from a List when
// v was never loaded or was of another network of that name (another uid)
// or of another cidr. The caller holds v.mu.
func (a *Allocator) load(ctx context.Context, v *view, network *v1alpha1.VirtualNetwork, s subnet) error {
	if v.loaded && v.networkUID == network.UID && v.subnet == s {
		return nil
	}
	v.reset(network.UID, s)
	if err := a.refresh(ctx, v); err != nil {
		return err
	}
	v.loaded = true
	v.cursor = s.lo
	if len(v.held) > 0 {
		v.cursor = v.after(slices.Max(slices.Collect(maps.Keys(v.held))))
	}
	return nil
}

// refresh rebuilds v from a List of its network's records, keeping this
// Allocator's own recent writes that the reader does not show yet. The
// caller holds v.mu.
func (a *Allocator) refresh(ctx context.Context, v *view) error {
	list := &v1alpha1.NetworkAddressList{}
	if err := a.r.List(ctx, list, client.InNamespace(v.namespace), client.MatchingLabels{LabelNetwork: v.name}); err != nil {
		return errors.Wrapf(err, "cannot list the addresses of network %s", v.name)
	}
	now := time.Now()
	for name, w := range v.own {
		if now.Sub(w.at) > ownWriteGrace {
			delete(v.own, name)
		}
	}
	v.clear()
	for i := range list.Items {
		r := fromObject(&list.Items[i], v.name)
		if w, ok := v.own[r.name]; ok {
			switch {
			case w.rec == nil && w.uid == r.uid:
				// This Allocator deleted it; the reader lags.
				continue
			case w.rec == nil:
				// Made again since, by someone else.
				delete(v.own, r.name)
			case w.uid != r.uid:
				// The reader lags behind this Allocator's create
				// and shows a record of that name before it.
				continue
			default:
				// The reader shows this Allocator's create.
				delete(v.own, r.name)
			}
		}
		v.add(r)
	}
	for _, w := range v.own {
		if w.rec != nil {
			v.add(w.rec)
		}
	}
	return nil
}

// lookup adds the records of vm that the reader has to v and returns those
// v knows. The caller holds v.mu.
func (a *Allocator) lookup(ctx context.Context, v *view, vm *v1alpha1.VirtualMachine) ([]*record, error) {
	list, err := a.listOf(ctx, vm)
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if string(list.Items[i].Spec.Network) != v.name {
			continue
		}
		r := fromObject(&list.Items[i], v.name)
		if w, ok := v.own[r.name]; ok && w.rec == nil && w.uid == r.uid {
			continue // deleted by this Allocator; the reader lags
		}
		v.add(r)
	}
	return v.recordsOf(string(vm.UID)), nil
}

// listOf lists the records of vm in its namespace: by IndexVMUID while the
// reader has that index, else by label.
func (a *Allocator) listOf(ctx context.Context, vm *v1alpha1.VirtualMachine) (*v1alpha1.NetworkAddressList, error) {
	list := &v1alpha1.NetworkAddressList{}
	if !a.unindexed.Load() {
		err := a.r.List(ctx, list, client.InNamespace(vm.Namespace), client.MatchingFields{IndexVMUID: string(vm.UID)})
		if err == nil || ctx.Err() != nil {
			return list, errors.Wrapf(err, "cannot list the addresses of VirtualMachine %s/%s", vm.Namespace, vm.Name)
		}
		a.unindexed.Store(true)
	}
	err := a.r.List(ctx, list, client.InNamespace(vm.Namespace), client.MatchingLabels{LabelVMUID: string(vm.UID)})
	return list, errors.Wrapf(err, "cannot list the addresses of VirtualMachine %s/%s", vm.Namespace, vm.Name)
}

// confirm returns the VM's record r as the API server has it, re-creating it
// when it is gone (deleted by hand, say); nil when the address turned out to
// be another VM's. The caller holds v.mu.
func (a *Allocator) confirm(ctx context.Context, v *view, vm *v1alpha1.VirtualMachine, r *record) (*record, error) {
	got, err := a.get(ctx, v, r.name)
	if err != nil {
		return nil, err
	}
	if got == nil {
		if got, err = a.create(ctx, v, vm, r.addr); err != nil {
			return nil, err
		}
		if got.vmUID == "" {
			return nil, errors.Errorf("address %s of network %s is recorded, but its record cannot be read yet", r.addr, v.name)
		}
	}
	v.add(got)
	if got.vmUID != string(vm.UID) {
		return nil, nil
	}
	return got, nil
}

// take records want for vm. The caller holds v.mu.
func (a *Allocator) take(ctx context.Context, v *view, vm *v1alpha1.VirtualMachine, want netip.Addr) (*record, error) {
	u := index(want)
	if h := v.held[u]; h != nil && h.vmUID != string(vm.UID) {
		// The holder may have released it through another replica.
		if err := a.refresh(ctx, v); err != nil {
			return nil, err
		}
		if h := v.held[u]; h != nil && h.vmUID != string(vm.UID) {
			return nil, &HeldError{Network: v.name, Address: want.String(), VirtualMachine: h.vm}
		}
	}
	got, err := a.create(ctx, v, vm, want)
	if err != nil {
		return nil, err
	}
	if got.vmUID != string(vm.UID) {
		return nil, &HeldError{Network: v.name, Address: want.String(), VirtualMachine: got.vm}
	}
	return got, nil
}

// allocate records the next free address for vm. Every address the view
// offers is either recorded for vm or, when the API server refuses it,
// learnt to be held, so the loop ends. The caller holds v.mu.
func (a *Allocator) allocate(ctx context.Context, v *view, vm *v1alpha1.VirtualMachine) (*record, error) {
	refreshed := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, errors.Wrapf(err, "cannot allocate an address of network %s", v.name)
		}
		addr, ok := v.next()
		if !ok {
			if refreshed {
				return nil, &ExhaustedError{Network: v.name, Allocated: len(v.held), Total: v.subnet.total()}
			}
			// Other replicas may have released addresses.
			if err := a.refresh(ctx, v); err != nil {
				return nil, err
			}
			refreshed = true
			continue
		}
		got, err := a.create(ctx, v, vm, addr)
		if err != nil {
			return nil, err
		}
		if got.vmUID == string(vm.UID) {
			return got, nil
		}
		v.jump()
	}
}

// create records addr for vm and returns the record that holds addr
// afterwards: the new one; the one that existed, which may be vm's own; or,
// when an existing record could not be read, one with no VM that still marks
// addr as held. The caller holds v.mu; create lets it go while it waits for
// the API server (unlocked).
func (a *Allocator) create(ctx context.Context, v *view, vm *v1alpha1.VirtualMachine, addr netip.Addr) (*record, error) {
	na := &v1alpha1.NetworkAddress{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       v.namespace,
			Name:            recordName(v.name, addr),
			Labels:          map[string]string{LabelNetwork: v.name, LabelVMUID: string(vm.UID)},
			OwnerReferences: ownedBy(vm),
		},
		Spec: v1alpha1.NetworkAddressSpec{
			Network:           v1alpha1.LocalName(v.name),
			Address:           addr.String(),
			VirtualMachine:    v1alpha1.LocalName(vm.Name),
			VirtualMachineUID: string(vm.UID),
		},
	}
	now := time.Now()
	var (
		got  *record
		gerr error
	)
	err := a.unlocked(v, na.Name, addr, func() error {
		err := a.c.Create(ctx, na)
		if kerrors.IsAlreadyExists(err) {
			got, gerr = a.get(ctx, v, na.Name)
		}
		return err
	})
	if err == nil {
		r := fromObject(na, v.name)
		if r.created.IsZero() {
			r.created = now
		}
		v.add(r)
		v.own[r.name] = ownWrite{rec: r, uid: r.uid, at: now}
		return r, nil
	}
	if !kerrors.IsAlreadyExists(err) {
		return nil, errors.Wrapf(err, "cannot record address %s of network %s for VirtualMachine %s", addr, v.name, vm.Name)
	}
	if gerr != nil {
		return nil, gerr
	}
	if got == nil {
		got = &record{name: na.Name, ns: v.namespace, addr: addr}
	}
	v.add(got)
	if got.vmUID == string(vm.UID) {
		// The reader may not show it yet: keep it across refreshes.
		v.own[got.name] = ownWrite{rec: got, uid: got.uid, at: now}
	}
	return got, nil
}

// unlocked runs write, which asks the API server about the record name of
// addr and touches nothing of v, with v.mu let go, so that the other
// allocations on the network need not wait for the API server's answer:
// with one network for a whole fleet, a lock held across every Create
// would make a burst's VMs get their addresses one round trip at a time.
// Meanwhile addr is held in v by a record of no VM, also across a refresh,
// so no other allocation of this Allocator offers it (the API server would
// refuse a second record of it anyway); unlocked removes that record once
// it has v.mu again. The caller holds v.mu.
func (a *Allocator) unlocked(v *view, name string, addr netip.Addr, write func() error) error {
	reserved := &record{name: name, ns: v.namespace, addr: addr}
	prior, hadPrior := v.own[name]
	v.add(reserved)
	v.own[name] = ownWrite{rec: reserved, at: time.Now()}
	v.mu.Unlock()
	err := write()
	v.mu.Lock()
	if w, ok := v.own[name]; ok && w.rec == reserved {
		delete(v.own, name)
		if hadPrior {
			v.own[name] = prior
		}
	}
	if v.records[name] == reserved {
		v.remove(name)
	}
	return err
}

// get reads the record name from the reader and, when the reader does not
// have it (yet), from the client; nil when neither has it.
func (a *Allocator) get(ctx context.Context, v *view, name string) (*record, error) {
	na := &v1alpha1.NetworkAddress{}
	key := types.NamespacedName{Namespace: v.namespace, Name: name}
	err := a.r.Get(ctx, key, na)
	if kerrors.IsNotFound(err) {
		err = a.c.Get(ctx, key, na)
	}
	if kerrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read NetworkAddress %s", name)
	}
	return fromObject(na, v.name), nil
}

// delete deletes the record r, only if it is still that record (same uid),
// and forgets it in v, which may be nil. The caller holds v.mu.
func (a *Allocator) delete(ctx context.Context, v *view, r *record) error {
	na := &v1alpha1.NetworkAddress{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: r.name}}
	var opts []client.DeleteOption
	if r.uid != "" {
		// A record of the same name made since is another VM's: the
		// API server refuses the deletion with a Conflict.
		opts = append(opts, client.Preconditions{UID: ptr.To(r.uid)})
	}
	err := a.c.Delete(ctx, na, opts...)
	switch {
	case kerrors.IsForbidden(err):
		// A hub installed by Crossplane's package manager may not delete
		// its own kinds (its RBAC manager grants providers no delete). The
		// record stays held, by its VM, until Kubernetes' garbage collector
		// follows its owner reference once the VM is gone.
		return nil
	case kerrors.IsConflict(err):
		if v != nil {
			v.remove(r.name)
		}
		return nil
	case err != nil && !kerrors.IsNotFound(err):
		return errors.Wrapf(err, "cannot delete NetworkAddress %s", r.name)
	}
	if v != nil {
		if cur := v.records[r.name]; cur != nil && cur.uid == r.uid {
			v.remove(r.name)
		}
		v.own[r.name] = ownWrite{uid: r.uid, at: time.Now()}
	}
	return nil
}

// record is what a view keeps of one NetworkAddress.
type record struct {
	name string
	ns   string
	// addr is the address the record's name holds; invalid when the name
	// is not "<network>.<a.b.c.d>".
	addr    netip.Addr
	vm      string
	vmUID   string
	uid     types.UID
	created time.Time
}

// fromObject is the record of o, a NetworkAddress of network.
func fromObject(o *v1alpha1.NetworkAddress, network string) *record {
	r := &record{
		name:    o.Name,
		ns:      o.Namespace,
		vm:      string(o.Spec.VirtualMachine),
		vmUID:   o.Spec.VirtualMachineUID,
		uid:     o.UID,
		created: o.CreationTimestamp.Time,
	}
	if s, ok := strings.CutPrefix(o.Name, network+"."); ok {
		if addr, err := netip.ParseAddr(s); err == nil && addr.Is4() {
			r.addr = addr
		}
	}
	return r
}

// recordName is the name of the record of addr on network.
func recordName(network string, addr netip.Addr) string {
	return network + "." + addr.String()
}

// ownWrite is a record this Allocator created (rec set) or deleted (rec
// nil), with the uid of the object written and when.
type ownWrite struct {
	rec *record
	uid types.UID
	at  time.Time
}

// view is what an Allocator knows of one network's records. Its mutex
// serialises the allocations on the network.
type view struct {
	mu sync.Mutex

	namespace, name string
	networkUID      types.UID
	subnet          subnet
	loaded          bool

	// records are the network's records by name; held those whose
	// address is in the usable range, by address; byVM those of each VM,
	// by VM uid and name.
	records map[string]*record
	held    map[uint32]*record
	byVM    map[string]map[string]*record
	// cursor is the next address next considers.
	cursor uint32
	// own are this Allocator's recent writes, by record name.
	own map[string]ownWrite
}

func (v *view) reset(uid types.UID, s subnet) {
	v.networkUID, v.subnet, v.loaded = uid, s, false
	v.own = map[string]ownWrite{}
	v.clear()
}

func (v *view) clear() {
	v.records = map[string]*record{}
	v.held = map[uint32]*record{}
	v.byVM = map[string]map[string]*record{}
}

// add puts r in v, in place of any record of the same name.
func (v *view) add(r *record) {
	v.remove(r.name)
	v.records[r.name] = r
	if v.subnet.contains(r.addr) {
		v.held[index(r.addr)] = r
	}
	if r.vmUID != "" {
		if v.byVM[r.vmUID] == nil {
			v.byVM[r.vmUID] = map[string]*record{}
		}
		v.byVM[r.vmUID][r.name] = r
	}
}

func (v *view) remove(name string) {
	r := v.records[name]
	if r == nil {
		return
	}
	delete(v.records, name)
	if v.subnet.contains(r.addr) && v.held[index(r.addr)] == r {
		delete(v.held, index(r.addr))
	}
	if m := v.byVM[r.vmUID]; m != nil {
		delete(m, name)
		if len(m) == 0 {
			delete(v.byVM, r.vmUID)
		}
	}
}

// recordsOf returns the records of the VM uid, oldest first, so that of
// several the one every replica keeps is the same.
func (v *view) recordsOf(uid string) []*record {
	recs := make([]*record, 0, len(v.byVM[uid]))
	for _, r := range v.byVM[uid] {
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(x, y *record) int {
		return cmp.Or(x.created.Compare(y.created), cmp.Compare(x.name, y.name))
	})
	return recs
}

// next returns the first free address from the cursor and moves the cursor
// past it; false when v holds every address.
func (v *view) next() (netip.Addr, bool) {
	total := v.subnet.total()
	if len(v.held) >= total {
		return netip.Addr{}, false
	}
	for range total {
		u := v.cursor
		v.cursor = v.after(u)
		if _, taken := v.held[u]; !taken {
			return address(u), true
		}
	}
	return netip.Addr{}, false
}

// jump moves the cursor to a random address of the range.
func (v *view) jump() {
	v.cursor = v.subnet.lo + rand.Uint32N(uint32(v.subnet.total()))
}

// after is the address next considers after u.
func (v *view) after(u uint32) uint32 {
	if u >= v.subnet.hi {
		return v.subnet.lo
	}
	return u + 1
}

// subnet is a network's cidr and the range of it VMs get: all but its
// network address, its first host address (the gateway, the host's own) and
// its broadcast address.
type subnet struct {
	prefix netip.Prefix
	lo, hi uint32
}

func parseSubnet(n *v1alpha1.VirtualNetwork) (subnet, error) {
	cidr := n.Spec.ForProvider.CIDR
	invalid := func(reason string) error { return &InvalidNetworkError{Network: n.Name, CIDR: cidr, Reason: reason} }
	if cidr == "" {
		return subnet{}, invalid("is empty: the hub gives addresses only on a network with a cidr")
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() {
		return subnet{}, invalid("is not an IPv4 subnet such as 10.10.120.0/24")
	}
	if p.Bits() > 30 {
		return subnet{}, invalid("leaves no address for VMs: besides its network, gateway and broadcast addresses a subnet needs one for a VM, so it is a /30 or larger")
	}
	p = p.Masked()
	base := index(p.Addr())
	size := uint64(1) << (32 - p.Bits())
	return subnet{prefix: p, lo: base + 2, hi: uint32(uint64(base) + size - 2)}, nil
}

// total is how many addresses VMs get.
func (s subnet) total() int { return int(s.hi-s.lo) + 1 }

// contains says whether VMs get addr.
func (s subnet) contains(addr netip.Addr) bool {
	if !addr.Is4() || !s.prefix.Contains(addr) {
		return false
	}
	u := index(addr)
	return u >= s.lo && u <= s.hi
}

// check returns fixed as an address, or why network cannot give it to a VM.
func (s subnet) check(network, fixed string) (netip.Addr, error) {
	invalid := func(format string, args ...any) error {
		reason := fmt.Sprintf(format, args...)
		return &InvalidAddressError{Network: network, CIDR: s.prefix.String(), Address: fixed, Reason: fmt.Sprintf("%s, which gives VMs %s to %s", reason, address(s.lo), address(s.hi))}
	}
	addr, err := netip.ParseAddr(fixed)
	if err != nil || !addr.Is4() {
		return netip.Addr{}, invalid("it is not an IPv4 address; the network's cidr is %s", s.prefix)
	}
	switch u := index(addr); {
	case !s.prefix.Contains(addr):
		return netip.Addr{}, invalid("it is outside the network's cidr %s", s.prefix)
	case u == s.lo-2:
		return netip.Addr{}, invalid("it is the network address of cidr %s", s.prefix)
	case u == s.lo-1:
		return netip.Addr{}, invalid("it is the gateway, the host's own address, of cidr %s", s.prefix)
	case u == s.hi+1:
		return netip.Addr{}, invalid("it is the broadcast address of cidr %s", s.prefix)
	}
	return addr, nil
}

// index is addr as a number; addr is IPv4.
func index(addr netip.Addr) uint32 {
	b := addr.As4()
	return binary.BigEndian.Uint32(b[:])
}

// address is the IPv4 address numbered u.
func address(u uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], u)
	return netip.AddrFrom4(b)
}
