package providerconfig_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	crpc "github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/providerconfig"
	xpresource "github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
)

// TestAProviderConfigIsHeldWhileManagedResourcesNameIt runs the
// ProviderConfig controllers against a real API server. A ProviderConfig's
// users are the VirtualMachines, Volumes and DiskImages that name it, with
// no object recording the use: its status counts them, a deletion waits
// for them with a Terminating condition, and a user that names another
// ProviderConfig, or goes, lets it go.
func TestAProviderConfigIsHeldWhileManagedResourcesNameIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, nil, func(mgr ctrl.Manager, o controller.Options, _ *controllertest.Env) error {
		return providerconfig.Setup(mgr, o)
	})
	spec := apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://unused", Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}}

	cases := map[string]struct {
		config func(ns string) xpresource.ProviderConfig
		kind   string
	}{
		"AClusterProviderConfigUsedFromEveryNamespace": {
			config: func(string) xpresource.ProviderConfig {
				return &apisv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: apisv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec}}
			},
			kind: apisv1alpha1.ClusterProviderConfigKind,
		},
		"AProviderConfigUsedInItsNamespace": {
			config: func(ns string) xpresource.ProviderConfig {
				return &apisv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"}, Spec: spec}
			},
			kind: apisv1alpha1.ProviderConfigKind,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			other := "elsewhere-" + strings.ToLower(tc.kind)
			require.NoError(t, env.Kube.Create(env.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}))
			pc := tc.config(ns)
			require.NoError(t, env.Kube.Create(env.Ctx, pc))
			ref := &xpv2.ProviderConfigReference{Kind: tc.kind, Name: pc.GetName()}
			vm := named(&v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}}, ref)
			vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{Vcpu: 1, Memory: resource.MustParse("1Gi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: "root"}}}
			vol := named(&v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "root"}}, ref)
			vol.Spec.ForProvider.Size = resource.MustParse("1Gi")
			img := named(&v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden"}}, ref)
			img.Spec.ForProvider.Source.VolumeRef = &v1alpha1.LocalReference{Name: "root"}
			// Not users: a VM naming the default ClusterProviderConfig, and
			// one in another namespace naming the same ref, which for a
			// ProviderConfig is that namespace's own.
			bystander := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bystander"}}
			bystander.Spec.ForProvider = vm.Spec.ForProvider
			elsewhere := named(&v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "vm"}}, ref)
			elsewhere.Spec.ForProvider = vm.Spec.ForProvider
			for _, o := range []client.Object{vm, vol, img, bystander, elsewhere} {
				require.NoError(t, env.Kube.Create(env.Ctx, o))
			}
			want := int64(3)
			if tc.kind == apisv1alpha1.ClusterProviderConfigKind {
				want = 4 // the VM of the other namespace uses it too
			}
			users := func() int64 {
				require.NoError(t, env.Kube.Get(env.Ctx, client.ObjectKeyFromObject(pc), pc))
				return pc.GetUsers()
			}
			require.Eventually(t, func() bool { return users() == want }, 30*time.Second, 100*time.Millisecond, "status.users counts the resources naming it")
			assert.Contains(t, pc.GetFinalizers(), "in-use.crossplane.io")

			require.NoError(t, env.Kube.Delete(env.Ctx, pc))
			require.Eventually(t, func() bool {
				users()
				return pc.GetCondition(crpc.TypeTerminating).Status == corev1.ConditionTrue
			}, 30*time.Second, 100*time.Millisecond, "the deletion waits for its users")
			assert.Contains(t, pc.GetCondition(crpc.TypeTerminating).Message, "deletion waits for")

			// A user that names another ProviderConfig no longer uses it.
			require.NoError(t, env.Kube.Get(env.Ctx, client.ObjectKeyFromObject(vol), vol))
			vol.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: apisv1alpha1.ClusterProviderConfigKind, Name: "default"})
			require.NoError(t, env.Kube.Update(env.Ctx, vol))
			require.Eventually(t, func() bool { return users() == want-1 }, 30*time.Second, 100*time.Millisecond, "a user that names another is not counted")

			for _, o := range []client.Object{vm, img, elsewhere} {
				require.NoError(t, env.Kube.Delete(env.Ctx, o))
			}
			require.NoError(t, wait.PollUntilContextTimeout(env.Ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				return kerrors.IsNotFound(env.Kube.Get(ctx, client.ObjectKeyFromObject(pc), pc)), nil
			}), "the ProviderConfig goes with its last user")
		})
	}
}

// named is mg naming the ProviderConfig ref.
func named[T xpresource.ModernManaged](mg T, ref *xpv2.ProviderConfigReference) T {
	mg.SetProviderConfigReference(ref)
	return mg
}
