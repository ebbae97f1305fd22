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
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
)

// TestStatusNamesTheFirstUsersAndCountsThemAll pins that a network's status
// stays small however many VMs attach to it: it names the first
// inuse.MaxNamed and counts them all.
func TestStatusNamesTheFirstUsersAndCountsThemAll(t *testing.T) {
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("vm-%04d", i)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		users     []string
		wantNamed []string
	}{
		{"none", nil, nil},
		{"a few, all named", names(3), names(3)},
		{"thousands, the first named", names(5000), names(inuse.MaxNamed)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &v1alpha1.VirtualNetwork{}
			_, err := Kind.Observe(context.Background(), nil, n, tc.users)
			require.NoError(t, err)
			assert.Equal(t, tc.wantNamed, n.Status.AtProvider.AttachedTo)
			assert.Equal(t, int32(len(tc.users)), n.Status.AtProvider.AttachedCount) //nolint:gosec // test sizes
			assert.Equal(t, v1alpha1.PhaseRunning, n.Status.AtProvider.Phase)
		})
	}
}

// TestARefusedNetworkSaysWhy: a network that imports a node's network or
// joins a host bridge shows, in its own status, the grant its namespace
// lacks; granted, or asking for nothing, it is available.
func TestARefusedNetworkSaysWhy(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	require.NoError(t, apisv1alpha1.AddToScheme(s))
	kube := fake.NewClientBuilder().WithScheme(s).WithObjects(&apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: apisv1alpha1.ClusterProviderConfigSpec{Grants: []apisv1alpha1.TenantGrant{
			{Namespaces: []string{"ops"}, Import: true, HostBridges: []string{"br0"}},
		}},
	}).Build()
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
