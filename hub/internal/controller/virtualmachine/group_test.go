package virtualmachine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

// TestSchedulerFollowsItsPlacementGroups runs the placement loop against a
// real API server with one node, and a backoff of an hour: a VM is placed
// again the moment the PlacementGroup it waits for is made or changed, not
// when the backoff expires. A VM naming a group not made yet waits for it,
// rather than being placed as if it had none; the next VM of a required
// anti-affinity group finds no second node and stays Pending naming the
// rule, until the group is made a preference.
func TestSchedulerFollowsItsPlacementGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	sl := startScheduler(t, false, workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](time.Hour, time.Hour))
	cp, ctx, b := sl.cp, sl.ctx, sl.b
	// The node beats as an agent does, so it stays fresh however slowly
	// the API server answers; a heartbeat like the one before it retries
	// nothing.
	beat := func() {
		b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 16, MemoryBytes: 32 << 30}}})
	}
	beat()
	go wait.UntilWithContext(ctx, func(context.Context) { beat() }, time.Second)

	newVM := func(name string) client.ObjectKey {
		require.NoError(t, cp.Client.Create(ctx, vol(name+"-root", "")))
		vm := &v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Vcpu: 1, Memory: resource.MustParse("512Mi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(name + "-root")}},
				PlacementGroup: ptr.To(v1alpha1.LocalName("web")),
			}},
		}
		require.NoError(t, cp.Client.Create(ctx, vm))
		return client.ObjectKeyFromObject(vm)
	}
	pending := func(key client.ObjectKey, reason string) {
		t.Helper()
		got := &v1alpha1.VirtualMachine{}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			require.NoError(c, cp.Client.Get(ctx, key, got))
			assert.Equal(c, v1alpha1.PhasePending, got.Status.AtProvider.Phase)
			assert.Contains(c, got.GetCondition(xpv2.TypeReady).Message, reason)
		}, 30*time.Second, 10*time.Millisecond)
		assert.Empty(t, got.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
	}
	placed := func(key client.ObjectKey, why string) {
		t.Helper()
		got := &v1alpha1.VirtualMachine{}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			require.NoError(c, cp.Client.Get(ctx, key, got))
			assert.Equal(c, testNode, got.GetAnnotations()[v1alpha1.AnnotationNode], "still: %s", got.GetCondition(xpv2.TypeReady).Message)
		}, 30*time.Second, 10*time.Millisecond, why)
	}

	first := newVM("web-0")
	pending(first, "waiting for PlacementGroup web in namespace default: create it")

	pg := &v1alpha1.PlacementGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity},
	}
	require.NoError(t, cp.Client.Create(ctx, pg))
	placed(first, "the VM is placed when its group is made, not after the hour's backoff")

	second := newVM("web-1")
	pending(second, "placement group web (anti-affinity) has a VM in node "+testNode+" already")

	require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(pg), pg))
	pg.Spec.Required = ptr.To(false)
	require.NoError(t, cp.Client.Update(ctx, pg))
	placed(second, "a preference lets the VM share the node, as soon as the group says so")
}

// TestGroupOf pins how a VM's PlacementGroup reads for placement: its
// policy, and the nodes of the other VMs of the group the hub placed; and
// that a group that does not exist holds a new VM back but no longer binds
// one placed already.
func TestGroupOf(t *testing.T) {
	f := fleettest.Start(t, bus.NewFake())
	member := func(name, namespace, group, node string, sealed bool) *v1alpha1.VirtualMachine {
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + namespace + "-" + name)}}
		vm.Spec.ForProvider.PlacementGroup = ptr.To(v1alpha1.LocalName(group))
		if node != "" {
			vm.Annotations = map[string]string{v1alpha1.AnnotationNode: node}
			if sealed {
				vm.Annotations[v1alpha1.AnnotationSeal] = f.Seal(string(vm.UID), node, "")
			}
		}
		return vm
	}
	web := &v1alpha1.PlacementGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web"},
		Spec:       v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity, TopologyKey: "topology.example/rack"},
	}
	db := &v1alpha1.PlacementGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db"},
		Spec:       v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAffinity, Required: ptr.To(false)},
	}
	self := member("web-0", "team-a", "web", "", false)
	objs := []client.Object{
		web, db, self,
		member("web-1", "team-a", "web", "node1", true),
		member("web-2", "team-a", "web", "node2", true),
		member("web-3", "team-a", "web", "", false),
		// A node annotation a tenant wrote by hand places no member.
		member("web-4", "team-a", "web", "node3", false),
		// Another namespace's group of the same name is another group.
		member("web-0", "team-b", "web", "node3", true),
		member("db-0", "team-a", "db", "node3", true),
	}
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.SchemeBuilder.AddToScheme(scheme))
	// A hand-written annotation is checked against the grants.
	require.NoError(t, apisv1alpha1.SchemeBuilder.AddToScheme(scheme))
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithIndex(&v1alpha1.VirtualMachine{}, index.PlacementGroupMembers.Index, index.PlacementGroupMembers.Uses).Build()

	cases := []struct {
		name string
		vm   *v1alpha1.VirtualMachine
		want *placement.Group
		// missing: GroupOf waits for the group, MovedGroupOf reads none.
		missing bool
	}{
		{name: "a VM naming no group has none", vm: &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "solo"}}},
		{
			name: "the group's rule and its placed members' nodes, not the VM's own",
			vm:   self,
			want: &placement.Group{Key: "team-a/web", Name: "web", AntiAffinity: true, Required: true, TopologyKey: "topology.example/rack", Members: map[string]string{"uid-team-a-web-1": "node1", "uid-team-a-web-2": "node2"}},
		},
		{
			name: "a preferred affinity",
			vm:   member("db-1", "team-a", "db", "", false),
			want: &placement.Group{Key: "team-a/db", Name: "db", Required: false, Members: map[string]string{"uid-team-a-db-0": "node3"}},
		},
		{name: "a group that does not exist", vm: member("api-0", "team-a", "api", "node1", true), missing: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := GroupOf(t.Context(), kube, tc.vm, f)
			moved, movedErr := MovedGroupOf(t.Context(), kube, tc.vm, f)
			require.NoError(t, movedErr)
			if tc.missing {
				var missing *MissingGroupError
				require.ErrorAs(t, err, &missing)
				assert.EqualError(t, err, "waiting for PlacementGroup api in namespace team-a: create it and the VM is placed by it")
				assert.Equal(t, []string{refusalWaiting}, refusalReasons(err), "counted as waiting")
				assert.Nil(t, moved, "a group gone binds a placed VM no more")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want, moved, "a move reads the same group")
		})
	}
}
