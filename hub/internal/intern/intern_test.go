package intern

import (
	"encoding/json"
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// decoded returns o as a watch would: decoded from its JSON, each string
// a copy of its own.
func decoded[T any](t *testing.T, o T) T {
	t.Helper()
	b, err := json.Marshal(o)
	require.NoError(t, err)
	var out T
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func testVM(name, node string) *v1alpha1.VirtualMachine {
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
		Namespace: "team", Name: name, UID: "uid-" + "name",
		Labels:        map[string]string{"app": "db", "owner-" + name: "x"},
		Annotations:   map[string]string{v1alpha1.AnnotationNode: node, "seal": "seal-of-" + name},
		Finalizers:    []string{"finalizer.managedresource.crossplane.io"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
	}}
	vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"net"}
	vm.Spec.ForProvider.Availability = ptr.To(v1alpha1.AvailabilityRestart)
	vm.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "default"}
	vm.Status.AtProvider.Phase, vm.Status.AtProvider.Node = v1alpha1.PhaseRunning, node
	vm.Status.AtProvider.Interfaces = []v1alpha1.InterfaceStatus{{Network: "net", MAC: "52:54:00:00:00:" + name[len(name)-2:], Source: "backend"}}
	vm.SetConditions(xpv2.Available(), xpv2.ReconcileSuccess())
	return vm
}

// same tells whether a and b share their bytes, not only their content.
func same(a, b string) bool {
	return a == b && unsafe.StringData(a) == unsafe.StringData(b)
}

func TestTransformSharesRepeatedStringsOnly(t *testing.T) {
	tab := NewTable(DefaultMaxEntries)
	transform := Transform(tab, cache.TransformStripManagedFields(), v1alpha1.AnnotationNode)
	var got []*v1alpha1.VirtualMachine
	for _, name := range []string{"vm-01", "vm-02"} {
		in := decoded(t, testVM(name, "node7"))
		want := in.DeepCopy()
		o, err := transform(in)
		require.NoError(t, err)
		vm := o.(*v1alpha1.VirtualMachine)
		want.ManagedFields = nil
		assert.Equal(t, want, vm, "the object is unchanged but for its managedFields")
		got = append(got, vm)
	}
	a, b := got[0], got[1]
	shared := map[string][2]string{
		"namespace":         {a.Namespace, b.Namespace},
		"finalizer":         {a.Finalizers[0], b.Finalizers[0]},
		"node annotation":   {a.Annotations[v1alpha1.AnnotationNode], b.Annotations[v1alpha1.AnnotationNode]},
		"condition type":    {string(a.Status.Conditions[0].Type), string(b.Status.Conditions[0].Type)},
		"condition reason":  {string(a.Status.Conditions[1].Reason), string(b.Status.Conditions[1].Reason)},
		"condition status":  {string(a.Status.Conditions[0].Status), string(b.Status.Conditions[0].Status)},
		"network":           {string(a.Spec.ForProvider.VirtualNetworks[0]), string(b.Spec.ForProvider.VirtualNetworks[0])},
		"availability":      {string(*a.Spec.ForProvider.Availability), string(*b.Spec.ForProvider.Availability)},
		"provider config":   {a.Spec.ProviderConfigReference.Kind, b.Spec.ProviderConfigReference.Kind},
		"phase":             {string(a.Status.AtProvider.Phase), string(b.Status.AtProvider.Phase)},
		"node":              {a.Status.AtProvider.Node, b.Status.AtProvider.Node},
		"node and its note": {a.Status.AtProvider.Node, b.Annotations[v1alpha1.AnnotationNode]},
		"interface network": {a.Status.AtProvider.Interfaces[0].Network, b.Status.AtProvider.Interfaces[0].Network},
	}
	for what, s := range shared {
		assert.True(t, same(s[0], s[1]), "the %s %q is one string", what, s[0])
	}
	for k := range a.Annotations {
		for k2 := range b.Annotations {
			if k == k2 {
				assert.True(t, same(k, k2), "the annotation key %q is one string", k)
			}
		}
	}
	for _, unique := range []string{a.Name, "seal-of-vm-01", "52:54:00:00:00:01", "owner-vm-01", string(a.UID)} {
		_, held := tab.strings[unique]
		assert.Equal(t, unique == "owner-vm-01", held, "only keys and repeating fields are held, not %q", unique)
	}
}

func TestTableIsBounded(t *testing.T) {
	tab := NewTable(3)
	for i := range 10 {
		tab.String(fmt.Sprint("s", i))
	}
	assert.Equal(t, 3, len(tab.strings), "the table stops at its bound")
	fresh := string([]byte("s9"))
	assert.False(t, same(tab.String(fresh), "s9"), "a string beyond the bound is returned as it came")
	held := string([]byte("s1"))
	assert.True(t, same(tab.String(held), tab.String("s1")), "what the table holds is still shared")
	long := string(make([]byte, maxLen+1))
	tab = NewTable(10)
	tab.String(long)
	assert.Equal(t, 0, len(tab.strings), "a string longer than %d bytes is not held", maxLen)
}

func TestTransformLeavesOtherObjects(t *testing.T) {
	for name, in := range map[string]any{
		"NotAnObject":  "a string",
		"NoConditions": &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Labels: map[string]string{"a": "b"}}},
		"Volume":       &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "team"}, Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Format: ptr.To(v1alpha1.DiskFormatQCOW2)}}},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := Transform(NewTable(10), nil)(in)
			require.NoError(t, err)
			assert.Equal(t, in, out)
		})
	}
}
