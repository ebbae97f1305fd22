// Package quota counts what each namespace holds of the fleet and checks it
// against the TenantQuotas an administrator set for the namespace.
//
// A namespace holds every VirtualMachine bound to a node (one being
// deleted too, until it is gone: its guest runs until then) and every
// guest orphaned from its VMs, until the guest is deleted. Nothing is
// written to count: the VMs come from the informer cache, the orphans from
// the fleets' reports. The placement loop asks Admit before it places a
// VM; since the cache shows a binding only some time after it was written,
// the Counter also counts the VMs it admitted until the cache shows them
// bound, so neither a burst nor two batches placed at once pass a limit.
package quota

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// Amounts are what a namespace holds, or what one VM adds to it.
type Amounts struct {
	VMs         int64
	VCPU        int64
	MemoryBytes int64
}

func (a Amounts) add(o Amounts) Amounts {
	return Amounts{VMs: a.VMs + o.VMs, VCPU: a.VCPU + o.VCPU, MemoryBytes: a.MemoryBytes + o.MemoryBytes}
}

// Of is what vm adds to its namespace: one VM of its shape, which for a VM
// of an instance type is the one recorded from the type.
func Of(vm *v1alpha1.VirtualMachine) Amounts {
	vcpu, memory, _ := vm.Shape()
	return Amounts{VMs: 1, VCPU: int64(vcpu), MemoryBytes: memory.Value()}
}

// API is a as a TenantQuota's status shows it.
func (a Amounts) API() apisv1alpha1.QuotaAmounts {
	return apisv1alpha1.QuotaAmounts{VMs: &a.VMs, VCPU: &a.VCPU, Memory: resource.NewQuantity(a.MemoryBytes, resource.BinarySI)}
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
}

func count(n int64) string { return fmt.Sprint(n) }

func bytes(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

// limits are every resource a TenantQuota limits, in the order messages
// and summaries name them.
var limits = []limit{
	{name: "vms", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return h.VMs }, of: func(a Amounts) int64 { return a.VMs }, format: count},
	{name: "vcpu", hard: func(h apisv1alpha1.QuotaAmounts) *int64 { return h.VCPU }, of: func(a Amounts) int64 { return a.VCPU }, format: count},
	{name: "memory", hard: func(h apisv1alpha1.QuotaAmounts) *int64 {
		if h.Memory == nil {
			return nil
		}
		v := h.Memory.Value()
		return &v
	}, of: func(a Amounts) int64 { return a.MemoryBytes }, format: bytes},
}

// Summary is used against the hard limits of q, as kubectl shows a
// ResourceQuota: "vms: 2/4, vcpu: 6/8, memory: 4Gi/8Gi"; a resource q does
// not limit shows its use alone.
func Summary(q *apisv1alpha1.TenantQuota, used Amounts) string {
	parts := make([]string, 0, len(limits))
	for _, l := range limits {
		s := l.name + ": " + l.format(l.of(used))
		if h := l.hard(q.Spec.Hard); h != nil {
			s += "/" + l.format(*h)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// ExceededError says which limit of which TenantQuota a VM would take its
// namespace past. It is no fault of the hub's: the VM waits until its
// namespace holds less, or an administrator raises the limit.
type ExceededError struct {
	Namespace, Quota, Resource string
	// Used is what the namespace holds of Resource without the VM, Want
	// what the VM adds, Hard the limit; formatted for people.
	Used, Want, Hard string
	// Total is Used plus Want, formatted.
	Total string
}

func (e *ExceededError) Error() string {
	return fmt.Sprintf("quota of namespace %s exceeded: %s would be %s of %s (TenantQuota %s; %s in use, this VM %s)",
		e.Namespace, e.Resource, e.Total, e.Hard, e.Quota, e.Used, e.Want)
}

// Check says whether used plus want stays within every quota of qs: nil,
// or an ExceededError for the first limit passed.
func Check(qs []apisv1alpha1.TenantQuota, used, want Amounts) error {
	total := used.add(want)
	for i := range qs {
		q := &qs[i]
		for _, l := range limits {
			h := l.hard(q.Spec.Hard)
			// A VM that adds nothing of a resource passes its limit, even
			// one already passed (lowered below what the namespace holds).
			if h == nil || l.of(want) == 0 || l.of(total) <= *h {
				continue
			}
			return &ExceededError{
				Namespace: q.Spec.Namespace, Quota: q.Name, Resource: l.name,
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

// Counter counts what namespaces hold. It is safe for concurrent use.
type Counter struct {
	kube   client.Reader
	fleets func() []*fleet.Fleet

	mu sync.Mutex
	// admitted are the VMs Admit let in that the cache did not show bound
	// yet, by uid.
	admitted map[types.UID]admission
}

type admission struct {
	namespace string
	amounts   Amounts
}

// NewCounter returns a Counter reading VMs and TenantQuotas from kube (the
// informer cache) and orphans from the fleets.
func NewCounter(kube client.Reader, fleets func() []*fleet.Fleet) *Counter {
	return &Counter{kube: kube, fleets: fleets, admitted: map[types.UID]admission{}}
}

// Used is what namespace holds.
func (c *Counter) Used(ctx context.Context, namespace string) (Amounts, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used(ctx, namespace, "")
}

// used is what namespace holds but the VM except, with c.mu held. The
// admissions the cache shows bound are dropped: the cache counts them now.
func (c *Counter) used(ctx context.Context, namespace string, except types.UID) (Amounts, error) {
	l := &v1alpha1.VirtualMachineList{}
	if err := c.kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return Amounts{}, errors.Wrap(err, "cannot list the namespace's VirtualMachines")
	}
	var sum Amounts
	adopted := map[string]bool{}
	for i := range l.Items {
		vm := &l.Items[i]
		if vm.GetAnnotations()[v1alpha1.AnnotationNode] == "" {
			continue
		}
		delete(c.admitted, vm.UID)
		if o := vm.GetAnnotations()[v1alpha1.AnnotationAdopted]; o != "" {
			adopted[o] = true
		}
		if vm.UID != except {
			sum = sum.add(Of(vm))
		}
	}
	for uid, a := range c.admitted {
		if a.namespace == namespace && uid != except {
			sum = sum.add(a.amounts)
		}
	}
	for _, f := range c.fleets() {
		orphans, err := f.Orphans(namespace)
		if err != nil {
			return Amounts{}, err
		}
		for _, o := range orphans {
			// An orphan a VM adopted is counted as that VM.
			if !adopted[o.UID] {
				sum = sum.add(Amounts{VMs: 1, VCPU: int64(o.Report.Report.VCPU), MemoryBytes: o.Report.Report.MemoryBytes})
			}
		}
	}
	return sum, nil
}

// Admit says whether vm, which is on no node yet, fits in every TenantQuota
// of its namespace (nil, or an ExceededError), and if it does counts it
// until the cache shows it bound or Forget is told of it. A VM admitted
// again (its binding's write was retried) is counted once.
func (c *Counter) Admit(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	qs, err := For(ctx, c.kube, vm.Namespace)
	if err != nil || len(qs) == 0 {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	used, err := c.used(ctx, vm.Namespace, vm.UID)
	if err != nil {
		return err
	}
	want := Of(vm)
	if err := Check(qs, used, want); err != nil {
		delete(c.admitted, vm.UID)
		return err
	}
	c.admitted[vm.UID] = admission{namespace: vm.Namespace, amounts: want}
	return nil
}

// Forget stops counting the admission of uid: its VM is gone, or was not
// bound after all.
func (c *Counter) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.admitted, uid)
}
