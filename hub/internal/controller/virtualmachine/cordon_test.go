package virtualmachine

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

func TestMarkCordoned(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.SchemeBuilder.AddToScheme(scheme))
	node := func(name string, spec v1alpha1.HypervisorNodeSpec) client.Object {
		return &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	}
	cases := map[string]struct {
		objects []client.Object
		want    map[string]bool
	}{
		"NoHypervisorNodes": {
			want: map[string]bool{"a": false, "b": false, "c": false, "d": false},
		},
		"CordonedAndDraining": {
			objects: []client.Object{
				node("a", v1alpha1.HypervisorNodeSpec{}),
				node("b", v1alpha1.HypervisorNodeSpec{Unschedulable: true}),
				node("c", v1alpha1.HypervisorNodeSpec{Drain: true}),
				// A node outside the fleet changes nothing.
				node("e", v1alpha1.HypervisorNodeSpec{Unschedulable: true}),
			},
			want: map[string]bool{"a": false, "b": true, "c": true, "d": false},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objects...).Build()
			nodes := []placement.Node{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
			got := map[string]bool{}
			for _, n := range MarkCordoned(context.Background(), kube, nodes) {
				got[n.Name] = n.Unschedulable
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
