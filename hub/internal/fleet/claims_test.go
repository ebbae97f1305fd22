package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// What of a heartbeat counts under its node's HypervisorNode spec.
func TestAdmit(t *testing.T) {
	const zone = v1alpha1.ReservedLabelPrefix + "zone"
	pins := func(pools, tunnel, migration *[]string) *v1alpha1.HypervisorNodeSpec {
		return &v1alpha1.HypervisorNodeSpec{Claims: &v1alpha1.NodeClaims{SharedPools: pools, TunnelCIDRs: tunnel, MigrationCIDRs: migration}}
	}
	claim := wire.NodeHeartbeat{
		Labels:      map[string]string{"rack": "r1", zone: "secure"},
		SharedPools: []string{"ceph", "vault"}, TunnelAddress: "10.0.0.7", MigrationURI: "qemu+tcp://10.0.0.7/system",
	}
	cases := map[string]struct {
		spec        *v1alpha1.HypervisorNodeSpec
		hb          wire.NodeHeartbeat
		wantLabels  map[string]string
		wantPools   []string
		wantTunnel  string
		wantURI     string
		wantRefused []string
	}{
		"WithoutAnAdministratorsWordOnlyReservedLabelsAreRefused": {
			hb: claim, wantLabels: map[string]string{"rack": "r1"}, wantPools: claim.SharedPools, wantTunnel: claim.TunnelAddress, wantURI: claim.MigrationURI,
			wantRefused: []string{"label " + zone + "=secure: under " + v1alpha1.ReservedLabelPrefix + ", which only spec.labels sets"},
		},
		"TheAdministratorsLabelsWin": {
			spec:       &v1alpha1.HypervisorNodeSpec{Labels: map[string]string{"rack": "r9", zone: "secure"}},
			hb:         claim,
			wantLabels: map[string]string{"rack": "r9", zone: "secure"}, wantPools: claim.SharedPools, wantTunnel: claim.TunnelAddress, wantURI: claim.MigrationURI,
			wantRefused: []string{"label " + zone + "=secure: under " + v1alpha1.ReservedLabelPrefix + ", which only spec.labels sets", "label rack=r1: spec.labels says rack=r9"},
		},
		"PinnedPoolsAndAddressesHold": {
			spec: pins(&[]string{"ceph"}, &[]string{"10.0.0.0/24"}, &[]string{"10.0.0.0/24"}), hb: claim,
			wantLabels: map[string]string{"rack": "r1"}, wantPools: []string{"ceph"}, wantTunnel: claim.TunnelAddress, wantURI: claim.MigrationURI,
			wantRefused: []string{"label " + zone + "=secure: under " + v1alpha1.ReservedLabelPrefix + ", which only spec.labels sets", "shared-pool vault: not in spec.claims.sharedPools"},
		},
		"AnEmptyListAllowsNothing": {
			spec: pins(&[]string{}, &[]string{}, &[]string{}), hb: wire.NodeHeartbeat{SharedPools: []string{"ceph"}, TunnelAddress: "10.0.0.7", MigrationURI: "qemu+tcp://10.0.0.7/system"},
			wantPools: []string{},
			wantRefused: []string{"shared-pool ceph: not in spec.claims.sharedPools", "tunnel-address 10.0.0.7: not within spec.claims.tunnelCIDRs",
				"migration-uri qemu+tcp://10.0.0.7/system: not within spec.claims.migrationCIDRs"},
		},
		"AMigrationHostByNameIsRefusedOncePinned": {
			spec: pins(nil, nil, &[]string{"10.0.0.0/8"}), hb: wire.NodeHeartbeat{MigrationURI: "qemu+tls://evil.example/system"},
			wantRefused: []string{"migration-uri qemu+tls://evil.example/system: not an address, and spec.claims.migrationCIDRs is set"},
		},
		"AnIPv6TunnelWithinItsRange": {
			spec: pins(nil, &[]string{"fd00::/64"}, nil), hb: wire.NodeHeartbeat{TunnelAddress: "fd00::5"}, wantTunnel: "fd00::5",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, refused := Admit(tc.spec, tc.hb)
			assert.Equal(t, tc.wantLabels, got.Labels)
			assert.Equal(t, tc.wantPools, got.SharedPools)
			assert.Equal(t, tc.wantTunnel, got.TunnelAddress)
			assert.Equal(t, tc.wantURI, got.MigrationURI)
			var each []string
			for _, r := range refused {
				each = append(each, r.String())
			}
			assert.Equal(t, tc.wantRefused, each)
		})
	}
}
