package hypervisornode_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/hypervisornode"
)

// TestANodeRemovedForGoodLeavesNothingBehind plays an administrator
// removing a node for good, against a real API server and a real
// nats-server: node1 and node2 join and each reports a guest the hub has
// no VM for; node1's machine goes away (its agent stops) and the node is
// lost; the administrator deletes its HypervisorNode. The hub deletes
// node1's report (and the stream its reports landed in, which held the
// node's bound of the JetStream store: see natswire and bus's tests),
// forgets the node and lets the HypervisorNode go. node2's report stays.
func TestANodeRemovedForGoodLeavesNothingBehind(t *testing.T) {
	nodes := []string{"node1", "node2"}
	e := controllertest.Start(t, nodes, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		changes := hypervisornode.NewChanges()
		e.Fleet.SubscribeNodeChanges(changes.Notify)
		return hypervisornode.Setup(mgr, o, e.Pool.Fleets, changes, nil)
	})
	for _, n := range nodes {
		a := e.Fleet.Agent(n)
		a.Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
		controllertest.Report(t, a, wire.GuestReports, "orphan", wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: "orphan", Node: n, Phase: wire.PhaseRunning})
	}
	node1 := &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}
	controllertest.Await(t, e, node1, 30*time.Second, func(c *assert.CollectT, got *v1alpha1.HypervisorNode) {
		assert.Contains(c, got.Finalizers, hypervisornode.Finalizer)
	})
	require.Eventually(t, func() bool {
		_, reported := e.Fleet.Guests.Report("node1", "orphan")
		return reported
	}, 10*time.Second, 10*time.Millisecond, "the hub hears node1's report")

	e.Fleet.Agent("node1").Stop()
	require.Eventually(t, func() bool {
		s, _ := e.Fleet.Heard("node1")
		return s.Lost
	}, 5*controllertest.NodeTTL, 10*time.Millisecond, "node1 is lost")
	require.NoError(t, e.Kube.Delete(e.Ctx, node1))

	require.Eventually(t, func() bool {
		return kerrors.IsNotFound(e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(node1), node1))
	}, 30*time.Second, 10*time.Millisecond, "the hub lets node1's HypervisorNode go")
	_, stored := controllertest.Stored(t, e.Fleet, wire.GuestReports, "node1", "orphan")
	assert.False(t, stored, "node1's report is deleted")
	_, reported := e.Fleet.Guests.Report("node1", "orphan")
	assert.False(t, reported, "the hub no longer holds node1's report")
	_, heard := e.Fleet.Heard("node1")
	assert.False(t, heard, "the hub forgot node1")
	_, stored = controllertest.Stored(t, e.Fleet, wire.GuestReports, "node2", "orphan")
	assert.True(t, stored, "node2's report stays")
	_, heard = e.Fleet.Heard("node2")
	assert.True(t, heard)
}
