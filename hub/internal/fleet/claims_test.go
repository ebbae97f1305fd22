package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
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

// A fleet given Allowances reads no heartbeat before they are synced, so a
// pinned node's claims never count for want of its spec, and no node
// counts as lost meanwhile; a spec that changes applies to the node's
// latest heartbeat at once, and wakes whoever waits for room.
func TestAllowancesBoundTheFleetFromItsFirstHeartbeat(t *testing.T) {
	const zone = v1alpha1.ReservedLabelPrefix + "zone"
	b := bus.NewFake()
	a := NewAllowances()
	c := &clock{t: t0}
	f := New(b, logging.NewNopLogger()).WithAllowances(a)
	f.now, f.started = c.now, t0
	joined := &calls{}
	f.SubscribeNodes(joined.record)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	b.SetNode(bus.NodeEvent{Node: "node1", Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", SharedPools: []string{"ceph"}, Labels: map[string]string{zone: "secure"}}})
	c.advance(time.Hour)
	assert.False(t, f.Node("node1").Lost, "no node is lost while the fleet waits for its allowances")
	_, heard := f.Heard("node1")
	assert.False(t, heard, "nor heard")

	a.Set("node1", &v1alpha1.HypervisorNodeSpec{Claims: &v1alpha1.NodeClaims{SharedPools: &[]string{}}})
	a.MarkSynced()
	require.Eventually(t, func() bool { _, ok := f.Heard("node1"); return ok }, 5*time.Second, time.Millisecond)
	s := f.Node("node1")
	assert.Empty(t, s.Heartbeat.SharedPools, "the first heartbeat read is bounded")
	assert.Empty(t, s.Heartbeat.Labels)
	assert.Equal(t, []string{"ceph"}, s.Claimed.SharedPools, "and kept as claimed")
	assert.Len(t, s.Refused, 2)
	joined.take()

	a.Set("node1", &v1alpha1.HypervisorNodeSpec{Labels: map[string]string{zone: "secure"}, Claims: &v1alpha1.NodeClaims{SharedPools: &[]string{"ceph"}}})
	s = f.Node("node1")
	assert.Equal(t, []string{"ceph"}, s.Heartbeat.SharedPools, "a pool allowed now counts at once")
	assert.Equal(t, map[string]string{zone: "secure"}, s.Heartbeat.Labels)
	assert.Len(t, s.Refused, 1, "the reserved label stays refused as a claim: only spec.labels sets it")
	assert.Equal(t, []string{"node1"}, joined.take(), "VMs waiting for room hear of it")
}
