package virtualmachine

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
)

// holdGrowth keeps m, the machine the hub is about to send vm's node, from
// growing the guest past what the node has free: a node resizes a running
// guest live, so a larger vcpu or memory takes room on the node at once,
// and placement checked only the shape the VM was placed with. The growth
// is what m asks beyond what the node reported the guest to have (and
// counts in its heartbeat's allocation); a part of it the node has no room
// for keeps the reported size, and the guest runs on as it was. It says
// why, for the VM's Ready condition; "" when m goes as declared. A guest
// not reported yet, or reported without its shape, is left as placement
// chose: there is no growth to tell.
func (e *external) holdGrowth(vm *v1alpha1.VirtualMachine, node string, m *wire.Machine) string {
	rep, ok := e.fleet.Guests.Report(node, string(vm.UID))
	if !ok || rep.Report.VCPU == 0 || rep.Report.MemoryBytes == 0 {
		return ""
	}
	has := placement.Resources{VCPU: int64(rep.Report.VCPU), MemoryBytes: rep.Report.MemoryBytes}
	if int64(m.VCPU) <= has.VCPU && m.MemoryBytes <= has.MemoryBytes {
		return ""
	}
	free := placement.Resources{}
	if n, ok := e.fleet.Placeable(node); ok {
		free = e.opts.Placer.Free(n)
	}
	return holdBeyond(m, has, free, node)
}

// holdBeyond keeps each of m's vcpu and memory that grows past has by more
// than free at has, and says so naming the field.
func holdBeyond(m *wire.Machine, has, free placement.Resources, node string) string {
	var held []string
	if grow := int64(m.VCPU) - has.VCPU; grow > free.VCPU && grow > 0 {
		held = append(held, fmt.Sprintf("vcpu %d needs %d vCPUs more than the guest has and node %s has %d free: the guest keeps %d", m.VCPU, grow, node, max(free.VCPU, 0), has.VCPU))
		m.VCPU = int32(has.VCPU)
	}
	if grow := m.MemoryBytes - has.MemoryBytes; grow > free.MemoryBytes && grow > 0 {
		held = append(held, fmt.Sprintf("memory of %d bytes needs %d bytes more than the guest has and node %s has %d free: the guest keeps %d", m.MemoryBytes, grow, node, max(free.MemoryBytes, 0), has.MemoryBytes))
		m.MemoryBytes = has.MemoryBytes
	}
	if len(held) == 0 {
		return ""
	}
	return strings.Join(held, "; ") + " (it grows once the node has room, or at a restart on another node)"
}

// declaredShape is the vcpu and memory vm asks for, as its intent carries
// them.
func declaredShape(vm *v1alpha1.VirtualMachine) (int32, int64) {
	vcpu, memory, _ := vm.Shape()
	return vcpu, memory.Value()
}

// sizeVolumes sets d's sizes, grows and heldGrowth: a Volume grows on its
// node only once the hub admitted the growth against its namespace's
// storage quota and recorded the new size (recordGrowth), where no
// tenant can write; one past the quota keeps the size in effect and says
// why. It only asks the quota (quota.Counter.FitsGrowth), as Observe
// must; a growth is admitted as it is recorded. The placement that makes
// a Volume records the size it admitted (recordAdmittedSizes); one
// without a record is admitted whole as it is bound (admitAttached) and
// its size recorded as it is.
func (e *external) sizeVolumes(ctx context.Context, d *dependencies) error {
	d.sizes, d.grows, d.heldGrowth, d.attached = map[types.UID]int64{}, map[types.UID]int64{}, nil, map[types.UID]bool{}
	for i := range d.volumes {
		v := &d.volumes[i]
		if meta.GetExternalName(v) != "" {
			// Attached at the size its node reports; never grown.
			continue
		}
		want := v.Spec.ForProvider.Size.Value()
		size, ok, err := e.fleet.SizeInEffect(string(v.UID))
		switch {
		case err != nil:
			return err
		case !ok:
			if err := e.fitsAttached(ctx, v); err != nil {
				return err
			}
			if v.GetAnnotations()[v1alpha1.AnnotationNode] == "" {
				d.attached[v.UID] = true
			}
			d.grows[v.UID] = want
			continue
		case want <= size:
			continue
		}
		d.sizes[v.UID] = size
		d.grows[v.UID] = want
		if e.opts.Quotas != nil {
			if err := d.holdPastQuota(v, size, e.opts.Quotas.FitsGrowth(ctx, v, size)); err != nil {
				return err
			}
		}
	}
	return nil
}

// fitsAttached says whether v, which has no size recorded, may be made at
// its spec's size (an error naming the limit if not). The placement that
// makes a Volume records its size (recordAdmittedSizes), so one on no node
// without a record was attached to its VM after the VM was placed, and
// nothing admitted it yet. One on a node without a record was bound by a
// hub from before the records, and is there. It only asks, as Observe
// must: the Volume is admitted just before it is bound (admitAttached).
func (e *external) fitsAttached(ctx context.Context, v *v1alpha1.Volume) error {
	if v.GetAnnotations()[v1alpha1.AnnotationNode] != "" || e.opts.Quotas == nil {
		return nil
	}
	return errors.Wrapf(e.opts.Quotas.FitsVolume(ctx, v), "cannot make Volume %s", v.Name)
}

// admitAttached admits v, one of d.attached, to vm's namespace's quota
// just before it is bound to vm's node: the quota counts it until the
// cache shows it bound. sizeVolumes only asked whether it fits beside what
// was admitted, and two Volumes asked about at once, given to one VM or
// to two, may each fit alone and not together.
func (e *external) admitAttached(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, v *v1alpha1.Volume) error {
	if !d.attached[v.UID] || e.opts.Quotas == nil {
		return nil
	}
	return errors.Wrapf(e.opts.Quotas.AdmitVolume(ctx, vm, v), "cannot make Volume %s", v.Name)
}

// recordAdmittedSizes records the size of each of volumes that a VM's
// placement makes, those on no node yet, as the namespace's quota admitted
// it (quota.Counter.Admit): a size raised between the placement and the
// first publish is then a growth like any other (sizeVolumes), not a size
// first recorded unchecked.
func recordAdmittedSizes(ctx context.Context, f *fleet.Fleet, volumes []v1alpha1.Volume) error {
	for i := range volumes {
		v := &volumes[i]
		if v.GetAnnotations()[v1alpha1.AnnotationNode] != "" || meta.GetExternalName(v) != "" {
			continue
		}
		if err := f.RecordSize(ctx, string(v.UID), v.Spec.ForProvider.Size.Value()); err != nil {
			return err
		}
	}
	return nil
}

// recordGrowth records the sizes d's Volumes grow to, before the intent
// that sends them is published. Each growth is admitted against the
// namespace's quota just before its record is written (admitGrowth), and
// forgotten if the write fails: sizeVolumes only asked whether each
// growth fits beside those admitted, and two growths asked about at once,
// by one VM or by two, may each fit alone and not together.
func (e *external) recordGrowth(ctx context.Context, d *dependencies) error {
	for _, uid := range slices.Sorted(maps.Keys(d.grows)) {
		if err := e.admitGrowth(ctx, d, uid); err != nil {
			return err
		}
		size, ok := d.grows[uid]
		if !ok {
			// Held: the node is sent the size in effect.
			continue
		}
		if err := e.fleet.RecordSize(ctx, string(uid), size); err != nil {
			if e.opts.Quotas != nil {
				e.opts.Quotas.ForgetGrowth(uid)
			}
			return e.busFailed(string(uid), err)
		}
		delete(d.sizes, uid)
	}
	return nil
}

// admitGrowth admits the growth of d's Volume of uid, one with a size in
// effect (d.sizes): the quota then counts it until its record lands. One
// past the quota is taken out of d.grows and said in d.heldGrowth, as
// sizeVolumes says it. The others, Volumes without a record yet, were
// admitted whole as they were bound (admitAttached).
func (e *external) admitGrowth(ctx context.Context, d *dependencies, uid types.UID) error {
	size, ok := d.sizes[uid]
	if !ok || e.opts.Quotas == nil {
		return nil
	}
	v := d.volume(uid)
	if v == nil {
		return nil
	}
	return d.holdPastQuota(v, size, e.opts.Quotas.AdmitGrowth(ctx, v, size))
}

// holdPastQuota takes err, the quota's answer about v's growth from size:
// an ExceededError holds the growth, said in d.heldGrowth, and is no
// error of the reconcile; any other error is returned.
func (d *dependencies) holdPastQuota(v *v1alpha1.Volume, size int64, err error) error {
	var exceeded *quota.ExceededError
	if !errors.As(err, &exceeded) {
		return err
	}
	delete(d.grows, v.UID)
	d.heldGrowth = append(d.heldGrowth, fmt.Sprintf("Volume %s keeps its size of %s: %v", v.Name, resource.NewQuantity(size, resource.BinarySI), err))
	return nil
}

// volume is d's Volume of uid, nil if it has none.
func (d *dependencies) volume(uid types.UID) *v1alpha1.Volume {
	for i := range d.volumes {
		if d.volumes[i].UID == uid {
			return &d.volumes[i]
		}
	}
	return nil
}
