package virtualnetwork

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// TestATenantTakesNoRangeItWasNotGiven runs the VirtualNetwork controller
// against a real API server (and the real nats-server of every
// controllertest fleet). The administrator confines every namespace to
// 10.20.0.0/16 and gives the victim 10.30.0.0/16 besides; the victim's
// network db (10.20.1.0/24) exists and is Available. The attacker, with
// edit rights in namespace tenant only:
//  1. creates steal, 10.20.1.128/25, inside its own grant and more
//     specific than db, so that on a node with both it would take half of
//     db's addresses;
//  2. creates pods, 10.96.0.0/24, outside its grant, where the cluster's
//     services are;
//  3. creates all, 0.0.0.0/1, which would cover every range the node
//     routes to;
//  4. creates squat, 10.30.0.0/16, the victim's range, before the victim
//     makes a network there.
//
// Each is refused in its own status, naming spec.forProvider.cidr and the
// ranges granted or the range taken; db stays Available; the victim's lab,
// 10.30.1.0/24 made after the squat, is Available, since a refused network
// takes no range; and a network of the tenant's own that overlaps another
// of its own is refused naming it.
func TestATenantTakesNoRangeItWasNotGiven(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	e := controllertest.Start(t, nil, func(mgr ctrl.Manager, o controller.Options, _ *controllertest.Env) error {
		memory := perobject.NewOwner(mgr.GetCache(), &v1alpha1.VirtualNetwork{})
		if err := mgr.Add(memory); err != nil {
			return err
		}
		return inuse.Setup(mgr, o, Kind, memory, nil)
	})
	const victim, tenant = "victim", "tenant"
	for _, ns := range []string{victim, tenant} {
		require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	require.NoError(t, e.Kube.Create(e.Ctx, &apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "ranges"},
		Spec: apisv1alpha1.ClusterProviderConfigSpec{
			ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{NATSURL: e.Fleet.URL, Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
			Grants: []apisv1alpha1.TenantGrant{
				{Namespaces: []string{"*"}, NetworkCIDRs: []string{"10.20.0.0/16"}},
				{Namespaces: []string{victim}, NetworkCIDRs: []string{"10.30.0.0/16"}},
			},
		},
	}))
	create := func(namespace, name, cidr string) *v1alpha1.VirtualNetwork {
		t.Helper()
		n := &v1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: cidr}},
		}
		require.NoError(t, e.Kube.Create(e.Ctx, n))
		return n
	}
	available := func(t *testing.T, n *v1alpha1.VirtualNetwork) {
		t.Helper()
		controllertest.Await(t, e, n, 30*time.Second, func(c *assert.CollectT, got *v1alpha1.VirtualNetwork) {
			assert.Equal(c, corev1.ConditionTrue, got.GetCondition(xpv2.TypeReady).Status, got.GetCondition(xpv2.TypeReady).Message)
			assert.Equal(c, v1alpha1.PhaseRunning, got.Status.AtProvider.Phase)
		})
	}
	refused := func(t *testing.T, n *v1alpha1.VirtualNetwork, says string) {
		t.Helper()
		got := controllertest.Await(t, e, n, 30*time.Second, func(c *assert.CollectT, got *v1alpha1.VirtualNetwork) {
			assert.Equal(c, v1alpha1.PhaseFailed, got.Status.AtProvider.Phase)
		})
		ready := got.GetCondition(xpv2.TypeReady)
		assert.Equal(t, corev1.ConditionFalse, ready.Status)
		assert.Contains(t, ready.Message, "refused: ")
		assert.Contains(t, ready.Message, says)
	}
	// Creation times have whole seconds; a network created in a later
	// second than another surely came after it.
	later := func(t *testing.T, than *v1alpha1.VirtualNetwork) {
		t.Helper()
		require.Eventually(t, func() bool { return time.Now().Truncate(time.Second).After(than.CreationTimestamp.Time) }, 2*time.Second, 10*time.Millisecond)
	}

	db := create(victim, "db", "10.20.1.0/24")
	available(t, db)
	later(t, db)

	for name, tc := range map[string]struct {
		network, cidr, says string
	}{
		"AMoreSpecificRangeOfAnotherNamespacesNetwork": {"steal", "10.20.1.128/25", "spec.forProvider.cidr 10.20.1.128/25 overlaps 10.20.1.0/24 of a VirtualNetwork of another namespace, which came first"},
		"TheClustersServiceRange":                      {"pods", "10.96.0.0/24", "VirtualNetwork pods's spec.forProvider.cidr 10.96.0.0/24 lies outside the ranges granted to the namespace (10.20.0.0/16)"},
		"EverythingTheNodeRoutes":                      {"all", "0.0.0.0/1", "(networkCIDRs: [0.0.0.0/1])"},
		"ARangeGrantedToAnotherNamespace":              {"squat", "10.30.0.0/16", "spec.forProvider.cidr 10.30.0.0/16 lies outside the ranges granted"},
	} {
		t.Run(name, func(t *testing.T) { refused(t, create(tenant, tc.network, tc.cidr), tc.says) })
	}
	available(t, db)

	t.Run("ARefusedNetworkTakesNoRange", func(t *testing.T) {
		squat := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "squat"}}
		e.Get(t, squat)
		later(t, squat)
		available(t, create(victim, "lab", "10.30.1.0/24"))
	})

	t.Run("ItsOwnNetworksOverlapNoMoreThanAnothers", func(t *testing.T) {
		a := create(tenant, "a", "10.20.2.0/24")
		available(t, a)
		later(t, a)
		refused(t, create(tenant, "b", "10.20.2.0/25"), "overlaps 10.20.2.0/24 of VirtualNetwork a, which came first")
	})
}
