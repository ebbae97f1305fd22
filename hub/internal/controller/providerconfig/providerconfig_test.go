package providerconfig

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

func TestTargetOf(t *testing.T) {
	cases := map[string]struct {
		spec apisv1alpha1.ProviderConfigSpec
		want fleet.Target
	}{
		"OneServer": {
			spec: apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://a:4222", Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
			want: fleet.Target{URL: "nats://a:4222"},
		},
		"AClusterWithReplicatedBuckets": {
			spec: apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://a:4222,nats://b:4222,nats://c:4222", Replicas: 3, Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
			want: fleet.Target{URL: "nats://a:4222,nats://b:4222,nats://c:4222", Replicas: 3},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := TargetOf(context.Background(), nil, tc.spec)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestOwnSecret: a namespaced ProviderConfig's Secret is read in its own
// namespace, whatever it names; a ClusterProviderConfig's as it says.
func TestOwnSecret(t *testing.T) {
	withRef := func(namespace string) apisv1alpha1.ProviderConfigSpec {
		return apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://n:4222", Credentials: apisv1alpha1.NATSCredentials{
			Source: xpv2.CredentialsSourceSecret,
			CommonCredentialSelectors: xpv2.CommonCredentialSelectors{SecretRef: &xpv2.SecretKeySelector{
				SecretReference: xpv2.SecretReference{Namespace: namespace, Name: "creds"}, Key: "hub.nk",
			}},
		}}
	}
	cases := map[string]struct {
		spec      apisv1alpha1.ProviderConfigSpec
		namespace string
		want      string
		refused   bool
	}{
		"ItsOwnNamespace":                  {spec: withRef("team-a"), namespace: "team-a", want: "team-a"},
		"NoNamespaceMeansItsOwn":           {spec: withRef(""), namespace: "team-a", want: "team-a"},
		"AnotherNamespaceIsRefused":        {spec: withRef("virtfleet-system"), namespace: "team-a", refused: true},
		"AClusterProviderConfigNamesAnyNS": {spec: withRef("virtfleet-system"), namespace: "", want: "virtfleet-system"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := tc.spec.DeepCopy()
			got, err := OwnSecret(tc.spec, tc.namespace)
			assert.Equal(t, before, &tc.spec, "the spec read from the cache is not changed")
			if tc.refused {
				assert.ErrorContains(t, err, `spec.credentials.secretRef.namespace is "virtfleet-system": a ProviderConfig reads Secrets only in its own namespace team-a`)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Credentials.SecretRef.Namespace)
		})
	}
}

func TestNATSServers(t *testing.T) {
	cases := map[string]struct {
		url  string
		want []string
	}{
		"OneURL":                 {url: "nats://nats.example:4222", want: []string{"nats.example:4222"}},
		"TheDefaultPort":         {url: "nats://nats.example", want: []string{"nats.example:4222"}},
		"NoScheme":               {url: "nats.example:5222", want: []string{"nats.example:5222"}},
		"SeveralWithSpaces":      {url: "nats://a:1, tls://B:2 ,", want: []string{"a:1", "b:2"}},
		"AnIPv6Address":          {url: "nats://[::1]:4222", want: []string{"[::1]:4222"}},
		"CredentialsInTheURLGo":  {url: "nats://user:pass@a:4222", want: []string{"a:4222"}},
		"NothingIsNoServer":      {url: "", want: nil},
		"APathDoesNotChangeIt":   {url: "nats://a:4222/x", want: []string{"a:4222"}},
		"UpperCaseHostsAreLower": {url: "nats://NATS.Example:4222", want: []string{"nats.example:4222"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, NATSServers(tc.url))
		})
	}
}

// TestTenanted: a tenant's ProviderConfig that names an address of its
// choosing would have the hub dial it and hold the connection; only the
// servers an administrator named are allowed.
func TestTenanted(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, apisv1alpha1.AddToScheme(scheme))
	cpc := func(name, url string, grants ...apisv1alpha1.TenantGrant) *apisv1alpha1.ClusterProviderConfig {
		return &apisv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: apisv1alpha1.ClusterProviderConfigSpec{
			ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{NATSURL: url}, Grants: grants,
		}}
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		cpc("default", "nats://nats.virtfleet-system:4222"),
		cpc("edge", "nats://edge-1:4222,nats://edge-2:4222", apisv1alpha1.TenantGrant{Namespaces: []string{"team-b"}, NATSServers: []string{"team-b-nats:4222"}}),
		cpc("lab", "nats://lab:4222", apisv1alpha1.TenantGrant{Namespaces: []string{"lab"}, NATSServers: []string{"*"}}),
	).Build()
	cases := map[string]struct {
		url, namespace string
		refused        string
	}{
		"AClusterProviderConfigsServer":     {url: "nats://nats.virtfleet-system:4222", namespace: "team-a"},
		"OneOfAnotherClusterConfigsServers": {url: "nats://edge-2", namespace: "team-a"},
		"AnAddressOfTheTenantsChoosing":     {url: "nats://10.0.0.1:4222", namespace: "team-a", refused: "(natsServers: [10.0.0.1:4222])"},
		"AnAllowedOneBesideAnother":         {url: "nats://edge-1:4222,nats://169.254.169.254:80", namespace: "team-a", refused: "names NATS server 169.254.169.254:80"},
		"AServerGrantedTheNamespace":        {url: "nats://team-b-nats:4222", namespace: "team-b"},
		"ThatServerForAnotherNamespace":     {url: "nats://team-b-nats:4222", namespace: "team-a", refused: "(natsServers: [team-b-nats:4222])"},
		"AStarGrantsAnyServer":              {url: "nats://anything:1", namespace: "lab"},
		"AClusterProviderConfigNamesAny":    {url: "nats://anything:1", namespace: ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			spec := apisv1alpha1.ProviderConfigSpec{NATSURL: tc.url, Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}}
			got, err := Tenanted(context.Background(), kube, spec, tc.namespace)
			if tc.refused != "" {
				var refused *tenancy.RefusedError
				require.ErrorAs(t, err, &refused)
				assert.Contains(t, err.Error(), tc.refused)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, spec, got)
		})
	}
}
