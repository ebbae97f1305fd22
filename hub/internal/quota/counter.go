package quota

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// Counter counts what namespaces hold. It is safe for concurrent use.
type Counter struct {
	kube   client.Reader
	fleets func() []*fleet.Fleet

	mu sync.Mutex
	// admitted is what Admit, AdmitVolume, AdmitSnapshot, AdmitAddresses
	// and AdmitGrowth let in that the cache or the hub's records do not
	// count yet.
	admitted map[key]admission
}

// key names one admission: of a VM, of a Volume a VM's placement makes
// or a placed VM is given (by the Volume's uid), of the addresses a VM is
// to hold in all (by the VM's uid), of a snapshot, or of a Volume's growth
// (by the Volume's uid).
type key struct {
	kind string
	uid  types.UID
}

// Kinds of admission.
const (
	admittedVM        = "vm"
	admittedVolume    = "volume"
	admittedAddresses = "addresses"
	admittedSnapshot  = "snapshot"
	admittedGrowth    = "growth"
)

type admission struct {
	namespace string
	amounts   Amounts
	// by is the uid of the object whose admission let this in: the VM
	// that brings or is given a Volume, and its addresses; the snapshot
	// itself; the Volume that grows.
	by types.UID
	// size is, of a growth, the size the Volume grows to: it counts
	// until the cache shows the Volume on a node at that size in effect.
	size int64
}

// NewCounter returns a Counter reading VMs, Volumes, snapshots,
// NetworkAddresses and TenantQuotas from kube (the informer cache) and
// orphans from the fleets.
func NewCounter(kube client.Reader, fleets func() []*fleet.Fleet) *Counter {
	return &Counter{kube: kube, fleets: fleets, admitted: map[key]admission{}}
}

// Used is what namespace holds.
func (c *Counter) Used(ctx context.Context, namespace string) (Amounts, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, err := c.tally(ctx, namespace, "")
	return t.used, err
}

// tally is what a namespace holds, with what an admission needs to know of
// it.
type tally struct {
	used Amounts
	// volumes are the namespace's Volumes, by name.
	volumes map[string]*v1alpha1.Volume
	// addresses are how many addresses each VM holds, by the VM's uid.
	addresses map[types.UID]int64
}

// tally counts what namespace holds, but except and what its admission
// let in, with c.mu held. The admissions the cache counts now are dropped.
func (c *Counter) tally(ctx context.Context, namespace string, except types.UID) (tally, error) {
	t := tally{volumes: map[string]*v1alpha1.Volume{}, addresses: map[types.UID]int64{}}
	vms := &v1alpha1.VirtualMachineList{}
	if err := c.kube.List(ctx, vms, client.InNamespace(namespace)); err != nil {
		return tally{}, errors.Wrap(err, "cannot list the namespace's VirtualMachines")
	}
	memory := map[types.UID]int64{}
	adopted := map[string]bool{}
	for i := range vms.Items {
		vm := &vms.Items[i]
		memory[vm.UID] = Of(vm).MemoryBytes
		if vm.GetAnnotations()[v1alpha1.AnnotationNode] == "" {
			continue
		}
		delete(c.admitted, key{admittedVM, vm.UID})
		if o := vm.GetAnnotations()[v1alpha1.AnnotationAdopted]; o != "" {
			adopted[o] = true
		}
		if vm.UID != except {
			t.used = t.used.add(Of(vm))
		}
	}
	if err := c.countVolumes(ctx, namespace, &t); err != nil {
		return tally{}, err
	}
	if err := c.countSnapshots(ctx, namespace, memory, &t); err != nil {
		return tally{}, err
	}
	if err := c.countAddresses(ctx, namespace, &t); err != nil {
		return tally{}, err
	}
	for k, a := range c.admitted {
		if a.namespace != namespace || a.by == except || k.uid == except {
			continue
		}
		if k.kind == admittedAddresses {
			// Of the addresses a VM is to hold, those recorded count
			// as records already.
			t.used.Addresses += max(a.amounts.Addresses-t.addresses[k.uid], 0)
			continue
		}
		t.used = t.used.add(a.amounts)
	}
	for _, f := range c.fleets() {
		orphans, err := f.Orphans(namespace)
		if err != nil {
			return tally{}, err
		}
		for _, o := range orphans {
			// An orphan a VM adopted is counted as that VM.
			if !adopted[o.UID] {
				t.used = t.used.add(Amounts{VMs: 1, VCPU: int64(o.Report.Report.VCPU), MemoryBytes: o.Report.Report.MemoryBytes})
			}
		}
	}
	return t, nil
}

// countVolumes counts the namespace's Volumes on a node into t.
func (c *Counter) countVolumes(ctx context.Context, namespace string, t *tally) error {
	l := &v1alpha1.VolumeList{}
	if err := c.kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return errors.Wrap(err, "cannot list the namespace's Volumes")
	}
	for i := range l.Items {
		v := &l.Items[i]
		t.volumes[v.Name] = v
		if v.GetAnnotations()[v1alpha1.AnnotationNode] == "" {
			continue
		}
		delete(c.admitted, key{admittedVolume, v.UID})
		a := OfVolume(v)
		size, err := c.sizeInEffect(v)
		if err != nil {
			return err
		}
		if g, ok := c.admitted[key{admittedGrowth, v.UID}]; ok && size >= g.size {
			// The size record landed: it counts the growth now.
			delete(c.admitted, key{admittedGrowth, v.UID})
		}
		a.StorageBytes = size
		t.used = t.used.add(a)
	}
	return nil
}

// sizeInEffect is the size v holds on its node: the one the hub recorded
// (fleet.Fleet.RecordSize), its spec's where none is. A growth past the
// quota is never recorded, and so never counted.
func (c *Counter) sizeInEffect(v *v1alpha1.Volume) (int64, error) {
	want := v.Spec.ForProvider.Size.Value()
	for _, f := range c.fleets() {
		size, ok, err := f.SizeInEffect(string(v.UID))
		if err != nil {
			return 0, err
		}
		if ok {
			return min(size, want), nil
		}
	}
	return want, nil
}

// countSnapshots counts into t the namespace's snapshots a node was asked
// for that did not fail; memory is the memory of the namespace's VMs, by
// uid.
func (c *Counter) countSnapshots(ctx context.Context, namespace string, memory map[types.UID]int64, t *tally) error {
	l := &v1alpha1.VirtualMachineSnapshotList{}
	if err := c.kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return errors.Wrap(err, "cannot list the namespace's VirtualMachineSnapshots")
	}
	for i := range l.Items {
		s := &l.Items[i]
		if s.Status.Node != "" || s.Status.Phase == v1alpha1.SnapshotFailed {
			delete(c.admitted, key{admittedSnapshot, s.UID})
		}
		if s.Status.Node == "" || s.Status.Phase == v1alpha1.SnapshotFailed {
			continue
		}
		size := int64(0)
		switch {
		case s.Status.Size != nil:
			size = s.Status.Size.Value()
		case s.Status.CreationTime == nil && s.Status.VM != nil:
			// Being taken: it may grow to what its disks and memory hold.
			size = reserve(s.Status.VM.DiskAttachments, s.Spec.IncludeMemory, memory[types.UID(s.Status.SourceUID)], t.volumes)
		}
		t.used = t.used.add(Amounts{Snapshots: 1, StorageBytes: size})
	}
	return nil
}

// reserve is what a snapshot being taken of a VM with disks and memory
// may hold: every disk, whose blocks the guest may all overwrite while the
// snapshot keeps the old ones, and its memory if it keeps that.
func reserve(disks []v1alpha1.DiskAttachment, withMemory bool, memory int64, volumes map[string]*v1alpha1.Volume) int64 {
	var sum int64
	for _, d := range disks {
		if v, ok := volumes[string(d.Name)]; ok {
			sum += v.Spec.ForProvider.Size.Value()
		}
	}
	if withMemory {
		sum += memory
	}
	return sum
}

// countAddresses counts into t the addresses the hub gave the namespace's
// VMs.
func (c *Counter) countAddresses(ctx context.Context, namespace string, t *tally) error {
	l := &v1alpha1.NetworkAddressList{}
	if err := c.kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return errors.Wrap(err, "cannot list the namespace's NetworkAddresses")
	}
	for i := range l.Items {
		t.addresses[types.UID(l.Items[i].Spec.VirtualMachineUID)]++
	}
	t.used.Addresses += int64(len(l.Items))
	for uid, n := range t.addresses {
		k := key{admittedAddresses, uid}
		if a, ok := c.admitted[k]; ok && n >= a.amounts.Addresses {
			delete(c.admitted, k)
		}
	}
	return nil
}

// Placement is what placing a VM makes besides its guest.
type Placement struct {
	// Volumes are the VM's Volumes: those on no node yet are made with
	// the guest, on its node.
	Volumes []v1alpha1.Volume
	// Addresses is how many addresses the hub is to give the VM, one on
	// each of its networks whose addresses are the hub's.
	Addresses int64
}

// Admit says whether vm, which is on no node yet, fits in every TenantQuota
// of its namespace with what p makes (nil, or an ExceededError), and if it
// does counts it until the cache shows it bound, its Volumes bound and its
// addresses recorded, or Forget is told of it. A VM admitted again (its
// binding's write was retried) is counted once, and so is a Volume two VMs
// bring.
func (c *Counter) Admit(ctx context.Context, vm *v1alpha1.VirtualMachine, p Placement) error {
	return c.under(ctx, vm.Namespace, vm.UID, func(qs []apisv1alpha1.TenantQuota, t tally) error {
		want := Of(vm)
		var volumes []*v1alpha1.Volume
		for i := range p.Volumes {
			v := &p.Volumes[i]
			if a, ok := c.admitted[key{admittedVolume, v.UID}]; v.GetAnnotations()[v1alpha1.AnnotationNode] != "" || (ok && a.by != vm.UID) {
				continue
			}
			volumes = append(volumes, v)
			want = want.add(OfVolume(v))
		}
		addresses := max(p.Addresses-t.addresses[vm.UID], 0)
		want.Addresses = addresses
		if err := Check(qs, t.used, want, "this VM"); err != nil {
			c.forget(vm.UID)
			return err
		}
		c.admitted[key{admittedVM, vm.UID}] = admission{namespace: vm.Namespace, amounts: Of(vm), by: vm.UID}
		for _, v := range volumes {
			c.admitted[key{admittedVolume, v.UID}] = admission{namespace: vm.Namespace, amounts: OfVolume(v), by: vm.UID}
		}
		if addresses > 0 {
			// Recorded once the VM holds as many as it was admitted with.
			c.admitted[key{admittedAddresses, vm.UID}] = admission{namespace: vm.Namespace, amounts: Amounts{Addresses: t.addresses[vm.UID] + addresses}, by: vm.UID}
		}
		return nil
	})
}

// AdmitSnapshot says whether s, a snapshot of vm no node was asked for
// yet, fits in every TenantQuota of its namespace (nil, or an
// ExceededError), and if it does counts it until the cache shows its node
// or Forget is told of it. Until its node reports its size, a snapshot
// counts what it may grow to: the size of its VM's disks, and its memory
// if it keeps that.
func (c *Counter) AdmitSnapshot(ctx context.Context, s *v1alpha1.VirtualMachineSnapshot, vm *v1alpha1.VirtualMachine) error {
	return c.under(ctx, s.Namespace, s.UID, func(qs []apisv1alpha1.TenantQuota, t tally) error {
		want := Amounts{Snapshots: 1, StorageBytes: reserve(vm.Spec.ForProvider.DiskAttachments, s.Spec.IncludeMemory, Of(vm).MemoryBytes, t.volumes)}
		return c.admit(qs, t.used, key{admittedSnapshot, s.UID}, admission{namespace: s.Namespace, amounts: want, by: s.UID}, "this snapshot")
	})
}

// AdmitVolume says whether v, on no node yet, given to vm after vm was
// placed, fits in every TenantQuota of its namespace (nil, or an
// ExceededError), and if it does counts it until the cache shows it bound,
// or ForgetVolume or Forget (of v or of vm) is told of it. The hub admits
// such a Volume just before it binds it to vm's node: two Volumes given at
// once, to two VMs or to one, can never both pass a quota that takes one.
// A Volume admitted already with another VM (Admit, or AdmitVolume) is
// counted once, as that VM's.
func (c *Counter) AdmitVolume(ctx context.Context, vm *v1alpha1.VirtualMachine, v *v1alpha1.Volume) error {
	return c.under(ctx, v.Namespace, v.UID, func(qs []apisv1alpha1.TenantQuota, t tally) error {
		k := key{admittedVolume, v.UID}
		if a, ok := c.admitted[k]; ok && a.by != vm.UID {
			return nil
		}
		return c.admit(qs, t.used, k, admission{namespace: v.Namespace, amounts: OfVolume(v), by: vm.UID}, "this Volume")
	})
}

// ForgetVolume stops counting the Volume of uid that AdmitVolume let in
// for the VM of vm: it was not bound after all. One another VM brings
// counts on.
func (c *Counter) ForgetVolume(uid, vm types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.admitted[key{admittedVolume, uid}]; a.by == vm {
		delete(c.admitted, key{admittedVolume, uid})
	}
}

// FitsVolume says whether v, on no node yet, would fit in every
// TenantQuota of its namespace if it were made now, beside what was
// admitted but v itself: nil, or an ExceededError. It admits nothing: a
// Volume is made with the first VM that uses it, and admitted with that VM
// (Admit, or AdmitVolume for a VM placed already); this lets the Volume
// itself say why it is made nowhere, and a VM's Observe ask.
func (c *Counter) FitsVolume(ctx context.Context, v *v1alpha1.Volume) error {
	return c.under(ctx, v.Namespace, v.UID, func(qs []apisv1alpha1.TenantQuota, t tally) error {
		return Check(qs, t.used, OfVolume(v), "this Volume")
	})
}

// FitsGrowth says whether v, at size, may grow to its spec's size within
// every TenantQuota of its namespace, beside the other growths admitted:
// nil, or an ExceededError naming the limit. It admits nothing: it says
// what the Volume and its VM's Ready condition tell the tenant, and a
// growth of v admitted already is not counted against itself.
func (c *Counter) FitsGrowth(ctx context.Context, v *v1alpha1.Volume, size int64) error {
	return c.underGrowth(ctx, v, func(qs []apisv1alpha1.TenantQuota, used Amounts) error {
		return Check(qs, used, growth(v, size), "this Volume's growth")
	})
}

// AdmitGrowth says whether v, at size, may grow to its spec's size within
// every TenantQuota of its namespace (nil, or an ExceededError naming the
// limit), and if it may counts the growth until the cache shows v on a
// node at that size in effect, or ForgetGrowth or Forget is told of it.
// The hub admits a growth just before it records the size
// (fleet.Fleet.RecordSize), and the record is what counts from then on:
// two growths checked before either record landed can never both pass a
// quota that takes one. A growth of v admitted again replaces the first.
func (c *Counter) AdmitGrowth(ctx context.Context, v *v1alpha1.Volume, size int64) error {
	return c.underGrowth(ctx, v, func(qs []apisv1alpha1.TenantQuota, used Amounts) error {
		a := admission{namespace: v.Namespace, amounts: growth(v, size), by: v.UID, size: v.Spec.ForProvider.Size.Value()}
		return c.admit(qs, used, key{admittedGrowth, v.UID}, a, "this Volume's growth")
	})
}

// ForgetGrowth stops counting the growth of the Volume of uid that
// AdmitGrowth let in: its size was not recorded after all.
func (c *Counter) ForgetGrowth(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.admitted, key{admittedGrowth, uid})
}

// underGrowth calls fits, with c.mu held, with the TenantQuotas of v's
// namespace and what it holds but the growth of v admitted already: a
// growth asked about again is not counted against itself. Nothing else of
// v is left out: until the cache shows v on a node, the admission of the
// VM that makes it counts its size.
func (c *Counter) underGrowth(ctx context.Context, v *v1alpha1.Volume, fits func(qs []apisv1alpha1.TenantQuota, used Amounts) error) error {
	return c.under(ctx, v.Namespace, "", func(qs []apisv1alpha1.TenantQuota, t tally) error {
		used := t.used
		used.StorageBytes -= c.admitted[key{admittedGrowth, v.UID}].amounts.StorageBytes
		return fits(qs, used)
	})
}

// growth is what v adds growing from size to its spec's size.
func growth(v *v1alpha1.Volume, size int64) Amounts {
	return Amounts{StorageBytes: v.Spec.ForProvider.Size.Value() - size}
}

// HeldGrowth says why v, on a node, keeps a size smaller than its spec's:
// the size in effect, and the ExceededError of its growth. It is nil when
// v holds its spec's size, or grows within every TenantQuota of its
// namespace beside the other growths admitted (the hub sends the growth
// with its VM's next intent). The tenant edits the Volume, not its VM, so
// the Volume says so too.
func (c *Counter) HeldGrowth(ctx context.Context, v *v1alpha1.Volume) (int64, error) {
	size, err := c.sizeInEffect(v)
	if err != nil || size >= v.Spec.ForProvider.Size.Value() {
		return size, err
	}
	return size, c.FitsGrowth(ctx, v, size)
}

// AdmitAddresses says whether vm, which is to hold one address on each of
// networks of its networks whose addresses are the hub's, may be given
// those it does not hold yet (nil, or an ExceededError), and if so counts
// them until the cache shows them recorded or Forget is told of it. It is
// asked just before the hub gives addresses, so that a placed VM given
// another network gets no address past the quota.
func (c *Counter) AdmitAddresses(ctx context.Context, vm *v1alpha1.VirtualMachine, networks int64) error {
	// What the VM's own admissions let in is left out, and only the
	// addresses it would add are checked, so its earlier admission of
	// the same addresses is not counted twice.
	return c.under(ctx, vm.Namespace, vm.UID, func(qs []apisv1alpha1.TenantQuota, t tally) error {
		want := max(networks-t.addresses[vm.UID], 0)
		if want == 0 {
			return nil
		}
		if err := Check(qs, t.used, Amounts{Addresses: want}, "this VM"); err != nil {
			return err
		}
		c.admitted[key{admittedAddresses, vm.UID}] = admission{namespace: vm.Namespace, amounts: Amounts{Addresses: networks}, by: vm.UID}
		return nil
	})
}

// under calls admit, with c.mu held, with the TenantQuotas of namespace
// and what it holds but except and what except's admission let in; a
// namespace without quotas admits everything.
func (c *Counter) under(ctx context.Context, namespace string, except types.UID, admit func(qs []apisv1alpha1.TenantQuota, t tally) error) error {
	qs, err := For(ctx, c.kube, namespace)
	if err != nil || len(qs) == 0 {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, err := c.tally(ctx, namespace, except)
	if err != nil {
		return err
	}
	return admit(qs, t)
}

// admit, with c.mu held, says whether a, what the object named what adds,
// fits in qs beside used (nil, or an ExceededError), and if it does counts
// it as k; if it does not, k, admitted before, counts no more.
func (c *Counter) admit(qs []apisv1alpha1.TenantQuota, used Amounts, k key, a admission, what string) error {
	if err := Check(qs, used, a.amounts, what); err != nil {
		delete(c.admitted, k)
		return err
	}
	c.admitted[k] = a
	return nil
}

// Forget stops counting what the admission of uid let in: its VM or
// snapshot is gone, or was not bound after all. A Volume gone before it
// was bound is forgotten by its own uid.
func (c *Counter) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(uid)
}

func (c *Counter) forget(uid types.UID) {
	for k, a := range c.admitted {
		if k.uid == uid || a.by == uid {
			delete(c.admitted, k)
		}
	}
}
