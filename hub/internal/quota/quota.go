// Package quota counts what each namespace holds of the fleet and checks it
// against the TenantQuotas an administrator set for the namespace.
//
// A namespace holds every VirtualMachine bound to a node (one being
// deleted too, until it is gone: its guest runs until then) and every
// guest orphaned from its VMs, until the guest is deleted; every Volume
// bound to a node; every snapshot a node was asked to take that did not
// fail; and every address the hub gave its VMs. Nothing is written to
// count: the objects come from the informer cache, the orphans from the
// fleets' reports.
//
// Each is admitted where the hub makes it: a VM with the Volumes and
// addresses it brings by the placement loop (Admit), a snapshot by its
// controller before any node is asked (AdmitSnapshot). Since the cache
// shows a binding only some time after it was written, the Counter also
// counts what it admitted until the cache shows it counted, all under one
// lock, so neither a burst nor two admissions at once pass a limit.
package quota

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
)

// Amounts are what a namespace holds, or what one object adds to it.
type Amounts struct {
	VMs          int64
	VCPU         int64
	MemoryBytes  int64
	StorageBytes int64
	Volumes      int64
	Snapshots    int64
	Addresses    int64
}

func (a Amounts) add(o Amounts) Amounts {
	return Amounts{
		VMs: a.VMs + o.VMs, VCPU: a.VCPU + o.VCPU, MemoryBytes: a.MemoryBytes + o.MemoryBytes,
		StorageBytes: a.StorageBytes + o.StorageBytes, Volumes: a.Volumes + o.Volumes,
		Snapshots: a.Snapshots + o.Snapshots, Addresses: a.Addresses + o.Addresses,
	}
}

// Of is what vm adds to its namespace: one VM of its shape, which for a VM
// of an instance type is the one recorded from the type.
func Of(vm *v1alpha1.VirtualMachine) Amounts {
	vcpu, memory, _ := vm.Shape()
	return Amounts{VMs: 1, VCPU: int64(vcpu), MemoryBytes: memory.Value()}
}

// OfVolume is what v adds to its namespace once on a node.
func OfVolume(v *v1alpha1.Volume) Amounts {
	return Amounts{Volumes: 1, StorageBytes: v.Spec.ForProvider.Size.Value()}
}

// API is a as a TenantQuota's status shows it.
func (a Amounts) API() apisv1alpha1.QuotaAmounts {
	return apisv1alpha1.QuotaAmounts{
		VMs: &a.VMs, VCPU: &a.VCPU, Memory: resource.NewQuantity(a.MemoryBytes, resource.BinarySI),
		Storage: resource.NewQuantity(a.StorageBytes, resource.BinarySI),
		Volumes: &a.Volumes, Snapshots: &a.Snapshots, Addresses: &a.Addresses,
	}
}

// limit is one resource a TenantQuota limits.
type limit struct {
	name string
	// hard is the limit, nil when the quota sets none.
	hard func(apisv1alpha1.QuotaAmounts) *int64
	// of is the amount of a.
	of func(a Amounts) int64
	// format shows an amount.
	format func(int64) string
	// optional resources are left out of a summary while neither limited
	// nor held, so a quota of VMs alone reads as it always did.
	optional bool
}

func count(n int64) string { return fmt.Sprint(n) }

func bytes(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

// quantity is q's value, or nil.
func quantity(q *resource.Quantity) *int64 {
	if q == nil {
		return nil
	}
	v := q.Value()
	return &v
}

// limits are every resource a TenantQuota limits, in the order messages
// and summaries name them.
var limits = []limit{
	{name: "vms", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return h.VMs }, of: func(a Amounts) int64 { return a.VMs }, format: count},
	{name: "vcpu", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return h.VCPU }, of: func(a Amounts) int64 { return a.VCPU }, format: count},
	{name: "memory", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return quantity(h.Memory) }, of: func(a Amounts) int64 { return a.MemoryBytes }, format: bytes},
	{name: "storage", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return quantity(h.Storage) }, of: func(a Amounts) int64 { return a.StorageBytes }, format: bytes, optional: true},
	{name: "volumes", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return h.Volumes }, of: func(a Amounts) int64 { return a.Volumes }, format: count, optional: true},
	{name: "snapshots", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return h.Snapshots }, of: func(a Amounts) int64 { return a.Snapshots }, format: count, optional: true},
	{name: "addresses", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return h.Addresses }, of: func(a Amounts) int64 { return a.Addresses }, format: count, optional: true},
}

// Summary is used against the hard limits of q, as kubectl shows a
// ResourceQuota: "vms: 2/4, vcpu: 6/8, memory: 4Gi/8Gi, storage: 20Gi/50Gi";
// a resource q does not limit shows its use alone, and storage, volumes,
// snapshots and addresses only when held.
func Summary(q *apisv1alpha1.TenantQuota, used Amounts) string {
	parts := make([]string, 0, len(limits))
	for _, l := range limits {
		h := l.hard(q.Spec.Hard)
		if l.optional && h == nil && l.of(used) == 0 {
			continue
		}
		s := l.name + ": " + l.format(l.of(used))
		if h != nil {
			s += "/" + l.format(*h)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// ExceededError says which limit of which TenantQuota an object would take
// its namespace past. It is no fault of the hub's: a VM waits until its
// namespace holds less, or an administrator raises the limit.
type ExceededError struct {
	Namespace, Quota, Resource string
	// What is the object admitted: "this VM", "this snapshot".
	What string
	// Used is what the namespace holds of Resource without the object,
	// Want what the object adds, Hard the limit; formatted for people.
	Used, Want, Hard string
	// Total is Used plus Want, formatted.
	Total string
}

func (e *ExceededError) Error() string {
	return fmt.Sprintf("quota of namespace %s exceeded: %s would be %s of %s (TenantQuota %s; %s in use, %s %s)",
		e.Namespace, e.Resource, e.Total, e.Hard, e.Quota, e.Used, e.What, e.Want)
}

// Check says whether used plus want, what the object named what adds,
// stays within every quota of qs: nil, or an ExceededError for the first
// limit passed.
func Check(qs []apisv1alpha1.TenantQuota, used, want Amounts, what string) error {
	total := used.add(want)
	for i := range qs {
		q := &qs[i]
		for _, l := range limits {
			h := l.hard(q.Spec.Hard)
			// What adds nothing of a resource passes its limit, even
			// one already passed (lowered below what the namespace holds).
			if h == nil || l.of(want) == 0 || l.of(total) <= *h {
				continue
			}
			return &ExceededError{
				Namespace: q.Spec.Namespace, Quota: q.Name, Resource: l.name, What: what,
				Used: l.format(l.of(used)), Want: l.format(l.of(want)), Hard: l.format(*h), Total: l.format(l.of(total)),
			}
		}
	}
	return nil
}

// For returns the TenantQuotas of namespace.
func For(ctx context.Context, kube client.Reader, namespace string) ([]apisv1alpha1.TenantQuota, error) {
	l := &apisv1alpha1.TenantQuotaList{}
	if err := kube.List(ctx, l); err != nil {
		return nil, errors.Wrap(err, "cannot list TenantQuotas")
	}
	out := l.Items[:0]
	for _, q := range l.Items {
		if q.Spec.Namespace == namespace {
			out = append(out, q)
		}
	}
	return out, nil
}
