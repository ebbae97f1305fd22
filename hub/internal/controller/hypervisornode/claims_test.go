package hypervisornode_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/hypervisornode"
	"github.com/virtfleet/virtfleet/hub/internal/controller/migration"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fabric"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// The nodes of the claims tests. node-a and node-c are honest; node-b and
// node-d are nodes whose NATS credentials an attacker stole.
const (
	honestA, attackerB, honestC, attackerD = "node-a", "node-b", "node-c", "node-d"
	secureZone                             = v1alpha1.ReservedLabelPrefix + "zone"
	// attackerAddr is where the attacker wants overlay frames and guests'
	// memory sent: outside every CIDR the administrator allowed.
	attackerAddr = "203.0.113.66"
)

// startClaims runs a hub's placement loop, migration controller and
// HypervisorNode controller over a real API server and a real NATS server,
// with HypervisorNodes for node-a, node-b and node-d as an administrator
// writes them before the nodes join:
//
//   - node-a carries the reserved label node-restriction.virtfleet.io/zone
//     =secure in spec.labels, and may claim the shared pool ceph;
//   - node-b may claim no shared pool, and tunnel and migration addresses
//     only in 10.0.0.0/24;
//   - node-d may claim a tunnel address only in 10.0.0.0/24.
//
// node-c has no HypervisorNode of the administrator's: its claims count
// as it makes them, but for reserved labels.
//
// Then every node heartbeats, the attackers as in each test's comment:
// node-b with the reserved label, the pools ceph and vault, and migration
// URI qemu+tcp://203.0.113.66/system; node-d with tunnel address
// 203.0.113.66. node-b is the emptiest node, so placement would prefer it
// wherever its claims counted.
func startClaims(t *testing.T) *controllertest.Env {
	t.Helper()
	allowances := fleet.NewAllowances()
	e := controllertest.StartAllowing(t, []string{honestA, attackerB, honestC, attackerD}, allowances, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		changes := hypervisornode.NewChanges()
		e.Fleet.SubscribeNodeChanges(changes.Notify)
		if err := hypervisornode.Setup(mgr, o, e.Pool.Fleets, changes, allowances); err != nil {
			return err
		}
		s := virtualmachine.NewScheduler(mgr.GetClient(), mgr.GetCache(), e.Pool, placement.New(), quota.NewCounter(mgr.GetCache(), e.Pool.Fleets), event.NewNopRecorder(), logging.NewNopLogger(), false)
		e.Fleet.SubscribeNodes(s.RetryUnplaced)
		e.Fleet.SubscribeSynced(func() { s.RetryUnplaced("") })
		if err := mgr.Add(s); err != nil {
			return err
		}
		notifier := wake.NewNotifierFor(perobject.NewOwner(nil), func() client.Object { return &v1alpha1.VirtualMachineMigration{} })
		e.Fleet.Guests.Subscribe(notifier.Notify)
		return migration.Setup(mgr, o, migration.Options{Pool: e.Pool, Placer: placement.New(), Notifier: notifier})
	})
	admin := map[string]v1alpha1.HypervisorNodeSpec{
		honestA:   {Labels: map[string]string{secureZone: "secure"}, Claims: &v1alpha1.NodeClaims{SharedPools: &[]string{"ceph"}}},
		attackerB: {Claims: &v1alpha1.NodeClaims{SharedPools: &[]string{}, TunnelCIDRs: &[]string{"10.0.0.0/24"}, MigrationCIDRs: &[]string{"10.0.0.0/24"}}},
		attackerD: {Claims: &v1alpha1.NodeClaims{TunnelCIDRs: &[]string{"10.0.0.0/24"}}},
	}
	for name, spec := range admin {
		require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}))
	}
	room := func(vcpu int64) wire.Resources { return wire.Resources{VCPU: vcpu, MemoryBytes: vcpu << 30} }
	beats := map[string]wire.NodeHeartbeat{
		honestA: {Capacity: room(4), SharedPools: []string{"ceph"}, TunnelAddress: "10.0.0.1", MigrationURI: "qemu+tcp://10.0.0.1/system"},
		attackerB: {Capacity: room(64), Labels: map[string]string{secureZone: "secure"}, SharedPools: []string{"ceph", "vault"},
			TunnelAddress: "10.0.0.2", MigrationURI: "qemu+tcp://" + attackerAddr + "/system"},
		honestC:   {Capacity: room(8), TunnelAddress: "10.0.0.3", MigrationURI: "qemu+tcp://10.0.0.3/system"},
		attackerD: {Capacity: room(8), TunnelAddress: attackerAddr},
	}
	for node, hb := range beats {
		hb.Backend = "libvirt"
		e.Fleet.Agent(node).Heartbeat(hb)
	}
	return e
}

// A stolen node credential attracts no VM: what node-b claims of labels and
// pools counts only as far as its HypervisorNode allows.
//
// The attacker holds node-b's NATS credentials (an nkey seed taken from
// the agent's host) and nothing else. It:
//
//  1. publishes node-b's heartbeat to $KV.nodes.node-b with labels
//     {"node-restriction.virtfleet.io/zone": "secure"}, sharedPools
//     ["ceph", "vault"] and the most free capacity in the fleet, every
//     250 ms;
//  2. waits for tenants' VMs that select zone=secure, or whose Volumes
//     live in ceph or vault, to be placed on node-b, where it reads their
//     disks and memory.
//
// Before issue 51 each of these VMs was placed on node-b (the emptiest
// node claiming what they need). Now the reserved label counts only from
// node-a's spec.labels, node-b may claim no pool, and the VMs go to node-a
// or, for vault, which no node may claim, stay Pending.
func TestAStolenNodeCredentialAttractsNoVM(t *testing.T) {
	refusedBefore := testutil.ToFloat64(metrics.NodeClaimsRefused.WithLabelValues(fleet.ClaimLabel))
	e := startClaims(t)
	ns := e.Namespace(t)

	cases := map[string]struct {
		vm       string
		selector map[string]string
		pool     string
		// wantNode is where the VM goes; "" keeps it Pending.
		wantNode string
	}{
		"AReservedLabelCountsOnlyFromTheAdministrator": {vm: "secure", selector: map[string]string{secureZone: "secure"}, wantNode: honestA},
		"APoolTheNodeMayNotClaim":                      {vm: "on-ceph", pool: "ceph", wantNode: honestA},
		"APoolOnlyTheAttackerClaims":                   {vm: "on-vault", pool: "vault"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vol := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.vm + "-root"}}
			vol.Spec.ForProvider.Size = resource.MustParse("1Gi")
			vol.Spec.ForProvider.StoragePool = tc.pool
			require.NoError(t, e.Kube.Create(e.Ctx, vol))
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.vm}}
			vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{Vcpu: 1, Memory: resource.MustParse("512Mi"),
				DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(vol.Name)}}, NodeSelector: tc.selector}
			require.NoError(t, e.Kube.Create(e.Ctx, vm))
			got := controllertest.Await(t, e, vm, within, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
				if tc.wantNode == "" {
					assert.Equal(c, v1alpha1.PhasePending, got.Status.AtProvider.Phase)
					return
				}
				assert.NotEmpty(c, got.GetAnnotations()[v1alpha1.AnnotationNode])
			})
			assert.Equal(t, tc.wantNode, got.GetAnnotations()[v1alpha1.AnnotationNode])
		})
	}

	b := controllertest.Await(t, e, &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: attackerB}}, within, func(c *assert.CollectT, got *v1alpha1.HypervisorNode) {
		assert.True(c, hasCondition(got, v1alpha1.NodeConditionClaimsAllowed, metav1.ConditionFalse))
	})
	msg := conditionOf(b, v1alpha1.NodeConditionClaimsAllowed).Message
	for _, claim := range []string{secureZone + "=secure", "shared-pool ceph", "shared-pool vault", "qemu+tcp://" + attackerAddr} {
		assert.Contains(t, msg, claim, "the refused claims are shown on the node")
	}
	assert.NotContains(t, b.Status.Labels, secureZone, "the node's labels are those that count")
	assert.Greater(t, testutil.ToFloat64(metrics.NodeClaimsRefused.WithLabelValues(fleet.ClaimLabel)), refusedBefore, "and counted")
	a := controllertest.Await(t, e, &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: honestA}}, within, func(c *assert.CollectT, got *v1alpha1.HypervisorNode) {
		assert.True(c, hasCondition(got, v1alpha1.NodeConditionClaimsAllowed, metav1.ConditionTrue))
	})
	assert.Equal(t, "secure", a.Status.Labels[secureZone], "the administrator's label is the node's")
}

// A stolen node credential receives no overlay frames: the peers the hub
// writes the other nodes carry no tunnel address the node's HypervisorNode
// does not allow.
//
// The attacker holds node-d's NATS credentials and nothing else. It:
//
//  1. publishes node-d's heartbeat to $KV.nodes.node-d with tunnelAddress
//     203.0.113.66, a host it controls outside the fleet's underlay;
//  2. waits for the hub to write 203.0.113.66 into every other node's
//     <node>.fabric.peers, so that they flood their networks' broadcasts
//     (and unknown unicasts) to it.
//
// Before issue 51 node-a's peers were 10.0.0.2, 10.0.0.3 and 203.0.113.66.
// Now node-d may claim a tunnel address only in 10.0.0.0/24: node-a's peers
// are the other two, and node-d's HypervisorNode shows the refusal.
func TestAStolenNodeCredentialReceivesNoOverlayFrames(t *testing.T) {
	refusedBefore := testutil.ToFloat64(metrics.NodeClaimsRefused.WithLabelValues(fleet.ClaimTunnel))
	e := startClaims(t)
	fabric.New(e.Fleet.Fleet, e.Fleet.Bus, logging.NewNopLogger()).Sync(e.Ctx)

	for _, node := range []string{honestA, attackerB, honestC} {
		peers, ok := controllertest.Stored(t, e.Fleet, wire.Fabrics, node, wire.FabricUID)
		require.True(t, ok, "%s's peers are written", node)
		assert.NotContains(t, peers.Peers, attackerAddr, "%s never floods to the attacker", node)
		assert.Len(t, peers.Peers, 2, "%s's peers are the other honest tunnels", node)
	}
	_, ok := controllertest.Stored(t, e.Fleet, wire.Fabrics, attackerD, wire.FabricUID)
	assert.False(t, ok, "a node whose tunnel does not count is no overlay end")

	d := controllertest.Await(t, e, &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: attackerD}}, within, func(c *assert.CollectT, got *v1alpha1.HypervisorNode) {
		assert.True(c, hasCondition(got, v1alpha1.NodeConditionClaimsAllowed, metav1.ConditionFalse))
	})
	assert.Contains(t, conditionOf(d, v1alpha1.NodeConditionClaimsAllowed).Message, "tunnel-address "+attackerAddr+": not within spec.claims.tunnelCIDRs")
	assert.Greater(t, testutil.ToFloat64(metrics.NodeClaimsRefused.WithLabelValues(fleet.ClaimTunnel)), refusedBefore, "and counted")
}

// A stolen node credential attracts no guest's memory: a migration never
// targets a migration URI the node's HypervisorNode does not allow.
//
// The attacker holds node-b's NATS credentials and nothing else. It:
//
//  1. publishes node-b's heartbeat to $KV.nodes.node-b with migrationURI
//     qemu+tcp://203.0.113.66/system, a host it controls, and the most
//     free capacity in the fleet;
//  2. waits for an administrator's drain, or a tenant's
//     VirtualMachineMigration, to pick node-b as the target, so that the
//     source's libvirtd streams the guest's memory and disks to
//     203.0.113.66.
//
// Before issue 51 the migration of a VM on node-a chose node-b. Now
// node-b's URI does not count, node-b takes no migration, and the VM goes
// to node-c, whose URI lies where no administrator pinned it.
func TestAStolenNodeCredentialAttractsNoMigration(t *testing.T) {
	e := startClaims(t)
	ns := e.Namespace(t)
	vol := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "root"}}
	vol.Spec.ForProvider.Size = resource.MustParse("1Gi")
	require.NoError(t, e.Kube.Create(e.Ctx, vol))
	e.Bind(t, vol, honestA)
	vm := e.VM(t, ns, "web", honestA, true, v1alpha1.PhaseRunning)
	// The migration refuses at once a VM its cache does not show Running.
	controllertest.AwaitCached(t, e, vm, func(cached *v1alpha1.VirtualMachine) bool {
		return cached.Status.AtProvider.Phase == v1alpha1.PhaseRunning
	})

	mig := &v1alpha1.VirtualMachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"}}
	mig.Spec.VMName = v1alpha1.LocalName(vm.Name)
	require.NoError(t, e.Kube.Create(e.Ctx, mig))
	got := controllertest.Await(t, e, mig, within, func(c *assert.CollectT, got *v1alpha1.VirtualMachineMigration) {
		assert.NotEmpty(c, got.Status.TargetNode, "the migration is %q: %s", got.Status.Phase, got.Status.Message)
	})
	assert.Equal(t, honestC, got.Status.TargetNode, "not node-b, whose migration URI does not count")
	var moving virtualmachine.Migration
	controllertest.Await(t, e, vm, within, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
		var ok bool
		moving, ok = virtualmachine.MigrationOf(got, e.Fleet.Fleet)
		assert.True(c, ok, "the VM carries the hub's sealed migration")
	})
	assert.Equal(t, honestC, moving.Target)
	assert.Equal(t, "qemu+tcp://10.0.0.3/system", e.Fleet.Node(moving.Target).Heartbeat.MigrationURI, "the URI the source is sent")
	assert.Empty(t, e.Fleet.Node(attackerB).Heartbeat.MigrationURI, "node-b's URI is not one the hub would send")
}

func conditionOf(n *v1alpha1.HypervisorNode, typ string) metav1.Condition {
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

func hasCondition(n *v1alpha1.HypervisorNode, typ string, status metav1.ConditionStatus) bool {
	return conditionOf(n, typ).Status == status
}
