package providerconfig

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
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
