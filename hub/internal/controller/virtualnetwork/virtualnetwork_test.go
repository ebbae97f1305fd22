package virtualnetwork

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
)

// TestStatusNamesTheFirstUsersAndCountsThemAll pins that a network's status
// stays small however many VMs attach to it, on however many nodes: it
// names the first inuse.MaxNamed of each and counts them all.
func TestStatusNamesTheFirstUsersAndCountsThemAll(t *testing.T) {
	// n VMs, two to a node.
	vms := func(n int) inuse.Users {
		var out inuse.Users
		for i := range n {
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vm-%04d", i)}}
			vm.Status.AtProvider.Node = fmt.Sprintf("node%04d", i/2)
			out = append(out, vm)
		}
		return out
	}
	nodes := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("node%04d", i))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		users     inuse.Users
		wantNamed []string
		wantNodes []string
		wantCount int32
	}{
		{"none", nil, []string{}, nil, 0},
		{"a few, all named", vms(3), vms(3).Names(), nodes(2), 2},
		{"thousands, the first named", vms(5000), vms(inuse.MaxNamed).Names(), nodes(inuse.MaxNamed), 2500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &v1alpha1.VirtualNetwork{}
			_, err := Kind.Observe(context.Background(), kubeWith(t), n, tc.users)
			require.NoError(t, err)
			assert.Equal(t, tc.wantNamed, n.Status.AtProvider.AttachedTo)
			assert.Equal(t, int32(len(tc.users)), n.Status.AtProvider.AttachedCount) //nolint:gosec // test sizes
			assert.Equal(t, tc.wantNodes, n.Status.AtProvider.Nodes)
			assert.Equal(t, tc.wantCount, n.Status.AtProvider.NodeCount)
			assert.Equal(t, v1alpha1.PhaseRunning, n.Status.AtProvider.Phase)
		})
	}
}

// kubeWith is a fake API server holding objs, with the index of VMs by
// network the controller lists them by.
func kubeWith(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	require.NoError(t, apisv1alpha1.AddToScheme(s))
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithIndex(&v1alpha1.VirtualMachine{}, index.NetworkUsers.Index, index.NetworkUsers.Uses).Build()
}

// TestStatusShowsTheFleetsView: a network virtfleet addresses gets a VNI
// no other network has and keeps it, and its status lists the nodes its
// VMs run on and how many of its addresses are given out.
func TestStatusShowsTheFleetsView(t *testing.T) {
	ctx := context.Background()
	network := func(name, cidr string, vni int32) *v1alpha1.VirtualNetwork {
		n := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(name + "-uid")},
			Spec: v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: cidr}}}
		n.Status.AtProvider.VNI = vni
		return n
	}
	vm := func(name, node string, networks ...v1alpha1.LocalName) *v1alpha1.VirtualMachine {
		v := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name}}
		v.Spec.ForProvider.VirtualNetworks = networks
		v.Status.AtProvider.Node = node
		return v
	}
	held := func(network, addr string) *v1alpha1.NetworkAddress {
		return &v1alpha1.NetworkAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: network + "." + addr, Labels: map[string]string{ipam.LabelNetwork: network}}}
	}
	kube := kubeWith(t,
		network("old", "10.1.0.0/24", 1), network("older", "10.2.0.0/24", 3),
		vm("web-1", "node2", "db"), vm("web-2", "node1", "db"), vm("web-3", "node2", "db"), vm("pending", "", "db"), vm("other", "node3", "old"),
		held("db", "10.3.0.2"), held("db", "10.3.0.3"), held("old", "10.1.0.2"))
	// A fresh allocator: other tests' networks got VNIs from the shared one.
	shared := vniAllocator
	vniAllocator = &vnis{given: map[types.UID]int32{}}
	t.Cleanup(func() { vniAllocator = shared })

	db := network("db", "10.3.0.0/29", 0)
	users, err := Kind.User.Users(ctx, kube, nil, "team-a", "db")
	require.NoError(t, err)
	require.Equal(t, []string{"pending", "web-1", "web-2", "web-3"}, users.Names(), "the network's VMs, sorted, not another network's")
	_, err = observe(ctx, kube, db, users)
	require.NoError(t, err)
	assert.Equal(t, int32(2), db.Status.AtProvider.VNI, "the lowest VNI no network holds")
	assert.Equal(t, []string{"node1", "node2"}, db.Status.AtProvider.Nodes)
	assert.Equal(t, int32(2), db.Status.AtProvider.NodeCount)
	assert.Equal(t, int32(2), db.Status.AtProvider.AddressesAllocated)
	assert.Equal(t, int32(5), db.Status.AtProvider.AddressesTotal, "a /29 less network, gateway and broadcast")

	next := network("next", "10.4.0.0/24", 0)
	_, err = observe(ctx, kube, next, nil)
	require.NoError(t, err)
	assert.Equal(t, int32(4), next.Status.AtProvider.VNI, "not the one given to db, whose status the cache does not show yet")

	again := db.DeepCopy()
	again.Status.AtProvider.VNI = 0
	_, err = observe(ctx, kube, again, nil)
	require.NoError(t, err)
	assert.Equal(t, int32(2), again.Status.AtProvider.VNI, "the same network keeps its VNI")

	bridged := network("lan", "", 0)
	bridged.Spec.ForProvider.Mode, bridged.Spec.ForProvider.Bridge = v1alpha1.NetworkModeBridge, "br0"
	_, err = observe(ctx, kube, bridged, nil)
	require.NoError(t, err)
	assert.Zero(t, bridged.Status.AtProvider.VNI, "a host bridge's segment is not the hub's")
	assert.Zero(t, bridged.Status.AtProvider.AddressesTotal)
}

// TestARefusedNetworkSaysWhy: a network that imports a node's network or
// joins a host bridge shows, in its own status, the grant its namespace
// lacks; granted, or asking for nothing, it is available.
func TestARefusedNetworkSaysWhy(t *testing.T) {
	kube := kubeWith(t, &apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: apisv1alpha1.ClusterProviderConfigSpec{Grants: []apisv1alpha1.TenantGrant{
			{Namespaces: []string{"ops"}, Import: true, HostBridges: []string{"br0"}},
		}},
	})
	network := func(namespace, external string, mode v1alpha1.NetworkMode, bridge string) *v1alpha1.VirtualNetwork {
		n := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "net"},
			Spec: v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: mode, Bridge: bridge}}}
		if external != "" {
			meta.SetExternalName(n, external)
		}
		return n
	}
	cases := map[string]struct {
		n       *v1alpha1.VirtualNetwork
		refused string
	}{
		"ItsOwnNATNetwork":             {n: network("tenant-a", "", v1alpha1.NetworkModeNAT, "")},
		"AnImportWithoutTheGrant":      {n: network("tenant-a", "default", v1alpha1.NetworkModeNAT, ""), refused: `refused: the VirtualNetwork net imports "default"`},
		"AnImportWithIt":               {n: network("ops", "default", v1alpha1.NetworkModeNAT, "")},
		"AHostBridgeWithoutTheGrant":   {n: network("tenant-a", "", v1alpha1.NetworkModeBridge, "br0"), refused: `refused: the VirtualNetwork joins host bridge "br0"`},
		"AHostBridgeGranted":           {n: network("ops", "", v1alpha1.NetworkModeBridge, "br0")},
		"AnotherHostBridgeThanGranted": {n: network("ops", "", v1alpha1.NetworkModeBridge, "br-mgmt"), refused: `joins host bridge "br-mgmt"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ready, err := Kind.Observe(context.Background(), kube, tc.n, nil)
			require.NoError(t, err)
			if tc.refused == "" {
				assert.Equal(t, corev1.ConditionTrue, ready.Status)
				assert.Equal(t, v1alpha1.PhaseRunning, tc.n.Status.AtProvider.Phase)
				return
			}
			assert.Equal(t, corev1.ConditionFalse, ready.Status)
			assert.Contains(t, ready.Message, tc.refused)
			assert.Equal(t, v1alpha1.PhaseFailed, tc.n.Status.AtProvider.Phase)
		})
	}
}
