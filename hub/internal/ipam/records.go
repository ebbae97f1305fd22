package ipam

import (
	"context"
	"net/netip"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

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
			// Other replicas may have released addresses, which only a
			// List shows; this Allocator's own releases are in v already.
			// A List of a full network is as long as the network, so a
			// view found full is believed for a.exhaustedRecheck: the VMs
			// waiting for an address of it retry without listing it each.
			if refreshed {
				v.exhaustedAt = time.Now()
			}
			if refreshed || time.Since(v.exhaustedAt) < a.exhaustedRecheck {
				return nil, &ExhaustedError{Network: v.name, Allocated: len(v.held), Total: v.subnet.total()}
			}
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
		// A hub installed by Crossplane's package manager without
		// package/api's grants may not delete its own kinds (the RBAC
		// manager grants providers no delete). The record stays held, by
		// its VM, until Kubernetes' garbage collector follows its owner
		// reference once the VM is gone.
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
