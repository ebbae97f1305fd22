// Package intern shares the strings that repeat across the objects the hub
// caches. Each object decoded from a watch holds its own copy of every
// string: the same namespace, finalizer, annotation keys, condition types
// and reasons, node and network names again in each of a fleet's VMs,
// Volumes and NetworkAddresses. Transform points such strings of a decoded
// object at one shared copy before the cache stores it, so the copies are
// garbage at once instead of living as long as the object, and the
// collector marks one string where it marked one per object.
//
// Only fields whose values repeat are interned: names, uids, addresses,
// seals and messages, unique per object, would only fill the table.
package intern

import (
	"reflect"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// DefaultMaxEntries bounds a Table made by NewTable: strings the objects
// repeat are few (condition reasons, node and network names, namespaces,
// metadata keys); a table that reaches the bound keeps what it holds and
// shares no new string, so objects that make up new values cannot grow it
// without bound.
const DefaultMaxEntries = 1 << 16

// maxLen is the longest string a Table shares: repeated values are short,
// and a long one costs its whole length to hold in the table.
const maxLen = 128

// A Table holds one copy of each string it was given. It is safe for
// concurrent use.
type Table struct {
	max int

	mu      sync.RWMutex
	strings map[string]string
}

// NewTable returns a Table of at most max strings.
func NewTable(max int) *Table {
	return &Table{max: max, strings: map[string]string{}}
}

// String returns t's copy of s, made s if t had none and has room.
func (t *Table) String(s string) string {
	if s == "" || len(s) > maxLen {
		return s
	}
	t.mu.RLock()
	shared, ok := t.strings[s]
	t.mu.RUnlock()
	if ok {
		return shared
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if shared, ok := t.strings[s]; ok {
		return shared
	}
	if len(t.strings) >= t.max {
		return s
	}
	t.strings[s] = s
	return s
}

// set points *p, of any string type, at t's copy of it.
func set[T ~string](t *Table, p *T) {
	*p = T(t.String(string(*p)))
}

// Transform returns a cache transform (cache.TransformFunc) that points the
// repeated strings of each object at t's copies, after next (nil for none)
// transformed it. The values of the labels and annotations named by
// valueKeys are shared as well as every key: those whose values repeat,
// such as a node's or a network's name.
func Transform(t *Table, next func(any) (any, error), valueKeys ...string) func(any) (any, error) {
	shared := map[string]bool{}
	for _, k := range valueKeys {
		shared[k] = true
	}
	return func(in any) (any, error) {
		if next != nil {
			var err error
			if in, err = next(in); err != nil {
				return in, err
			}
		}
		t.object(in, shared)
		return in, nil
	}
}

// object interns the repeated strings of o.
func (t *Table) object(o any, valueKeys map[string]bool) {
	m, err := meta.Accessor(o)
	if err != nil {
		return
	}
	m.SetNamespace(t.String(m.GetNamespace()))
	m.SetLabels(t.strmap(m.GetLabels(), valueKeys))
	m.SetAnnotations(t.strmap(m.GetAnnotations(), valueKeys))
	f := m.GetFinalizers()
	for i := range f {
		set(t, &f[i])
	}
	refs := m.GetOwnerReferences()
	for i := range refs {
		set(t, &refs[i].APIVersion)
		set(t, &refs[i].Kind)
	}
	if c := conditions(o); c != nil {
		for i := range *c {
			set(t, &(*c)[i].Type)
			set(t, &(*c)[i].Status)
			set(t, &(*c)[i].Reason)
		}
	}
	switch o := o.(type) {
	case *v1alpha1.VirtualMachine:
		t.vm(o)
	case *v1alpha1.Volume:
		if f := o.Spec.ForProvider.Format; f != nil {
			set(t, f)
		}
		set(t, &o.Status.AtProvider.Phase)
		set(t, &o.Status.AtProvider.Node)
	case *v1alpha1.NetworkAddress:
		set(t, &o.Spec.Network)
	}
	if mr, ok := o.(interface {
		GetProviderConfigReference() *xpv2.ProviderConfigReference
	}); ok {
		if r := mr.GetProviderConfigReference(); r != nil {
			set(t, &r.Kind)
			set(t, &r.Name)
		}
	}
}

// vm interns the repeated strings of a VirtualMachine's spec and status.
func (t *Table) vm(vm *v1alpha1.VirtualMachine) {
	p, s := &vm.Spec.ForProvider, &vm.Status.AtProvider
	for i := range p.VirtualNetworks {
		set(t, &p.VirtualNetworks[i])
	}
	if p.Availability != nil {
		set(t, p.Availability)
	}
	set(t, &s.Phase)
	set(t, &s.Node)
	for i := range s.Interfaces {
		set(t, &s.Interfaces[i].Network)
		set(t, &s.Interfaces[i].Source)
	}
	if s.Binding != nil {
		set(t, &s.Binding.Node)
	}
}

// strmap returns m with every key, and the values of valueKeys, t's
// copies; the map is rebuilt, as a key cannot be replaced in place.
func (t *Table) strmap(m map[string]string, valueKeys map[string]bool) map[string]string {
	if len(m) == 0 {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		if valueKeys[k] {
			v = t.String(v)
		}
		out[t.String(k)] = v
	}
	return out
}

// conditions is o's status.conditions, the crossplane conditions every
// managed resource and most of virtfleet's kinds have; nil for others.
func conditions(o any) *[]xpv2.Condition {
	v := reflect.ValueOf(o)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	status := v.Elem().FieldByName("Status")
	if status.Kind() != reflect.Struct {
		return nil
	}
	c := status.FieldByName("Conditions")
	if !c.IsValid() || !c.CanAddr() {
		return nil
	}
	p, ok := c.Addr().Interface().(*[]xpv2.Condition)
	if !ok {
		return nil
	}
	return p
}
