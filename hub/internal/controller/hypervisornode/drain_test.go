package hypervisornode

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// A drain makes one migration per VM of the node that may move, counts
// them, names the VMs it waits for, and is done once the node has no VM.
func TestADrainMigratesEveryVMThatMayMove(t *testing.T) {
	stays := vmOn("db", "node1")
	none := v1alpha1.EvictionNone
	stays.Spec.ForProvider.EvictionStrategy = &none
	h := newHarness(t, vmOn("web", "node1"), stays, vmOn("other", "node2"))
	h.heartbeat("node1", 2)
	h.reconcile("node1")
	n := h.get("node1")
	assert.Nil(t, n.Status.Drain, "no drain asked for")
	n.Spec.Drain = true
	require.NoError(t, h.kube.Update(context.Background(), n))

	h.now = h.now.Add(MinInterval)
	res := h.reconcile("node1")
	assert.Equal(t, drainEvery, res.RequeueAfter)
	d := h.get("node1").Status.Drain
	require.NotNil(t, d)
	assert.Equal(t, v1alpha1.DrainStatus{Phase: v1alpha1.DrainDraining, Remaining: 2, Migrating: 1, Message: "waiting for default/db stays (evictionStrategy None)"}, *d)
	migs := &v1alpha1.VirtualMachineMigrationList{}
	require.NoError(t, h.kube.List(context.Background(), migs))
	require.Len(t, migs.Items, 1, "one migration, for the VM that may move")
	m := migs.Items[0]
	assert.Equal(t, v1alpha1.LocalName("web"), m.Spec.VMName)
	assert.Empty(t, m.Spec.TargetNode, "the hub chooses the target")
	assert.Equal(t, drainLabel("node1"), m.Labels[LabelDrain])

	h.now = h.now.Add(MinInterval)
	h.reconcile("node1")
	require.NoError(t, h.kube.List(context.Background(), migs))
	assert.Len(t, migs.Items, 1, "a drain looked at again makes no second migration")

	m.Status = v1alpha1.VirtualMachineMigrationStatus{Phase: v1alpha1.MigrationFailed, Message: "no node can take the VM"}
	require.NoError(t, h.kube.Status().Update(context.Background(), &m))
	h.now = h.now.Add(MinInterval)
	h.reconcile("node1")
	d = h.get("node1").Status.Drain
	assert.Equal(t, v1alpha1.DrainBlocked, d.Phase)
	assert.Contains(t, d.Message, "default/web: migration "+m.Name+" failed (no node can take the VM); delete it to try again")

	for _, name := range []string{"web", "db"} {
		require.NoError(t, h.kube.Delete(context.Background(), vmOn(name, "node1")))
	}
	h.now = h.now.Add(MinInterval)
	res = h.reconcile("node1")
	assert.Equal(t, v1alpha1.DrainStatus{Phase: v1alpha1.DrainDrained}, *h.get("node1").Status.Drain)
	assert.Equal(t, resyncEvery, res.RequeueAfter)
}

// A VM whose snapshots live on the node blocks its drain, which names
// them and says what to do, and makes no migration the hub would only
// refuse; once they are deleted, the drain moves it.
func TestADrainIsBlockedByAVMWithSnapshots(t *testing.T) {
	web := vmOn("web", "node1")
	snap := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "before-upgrade"}, Spec: v1alpha1.VirtualMachineSnapshotSpec{VMName: "web"}}
	snap.Status = v1alpha1.VirtualMachineSnapshotStatus{Phase: v1alpha1.SnapshotSucceeded, Node: "node1", SourceUID: string(web.UID)}
	h := newHarness(t, web, snap)
	h.heartbeat("node1", 2)
	h.reconcile("node1")
	n := h.get("node1")
	n.Spec.Drain = true
	require.NoError(t, h.kube.Update(context.Background(), n))

	h.now = h.now.Add(MinInterval)
	h.reconcile("node1")
	d := h.get("node1").Status.Drain
	require.NotNil(t, d)
	assert.Equal(t, v1alpha1.DrainStatus{Phase: v1alpha1.DrainBlocked, Remaining: 1,
		Message: "waiting for default/web: VM has snapshots before-upgrade on node node1 that cannot move with it: delete them first"}, *d)
	migs := &v1alpha1.VirtualMachineMigrationList{}
	require.NoError(t, h.kube.List(context.Background(), migs))
	assert.Empty(t, migs.Items, "no migration the hub would refuse")

	require.NoError(t, h.kube.Delete(context.Background(), snap))
	h.now = h.now.Add(MinInterval)
	h.reconcile("node1")
	assert.Equal(t, v1alpha1.DrainDraining, h.get("node1").Status.Drain.Phase)
	require.NoError(t, h.kube.List(context.Background(), migs))
	assert.Len(t, migs.Items, 1)
}

// A drain whose migration finds no node to go to (a placement group's
// rule, no room) is Blocked saying why, and Draining again once the
// migration goes on.
func TestADrainIsBlockedByAMigrationWithNowhereToGo(t *testing.T) {
	h := newHarness(t, vmOn("web-0", "node1"))
	h.heartbeat("node1", 2)
	h.reconcile("node1")
	n := h.get("node1")
	n.Spec.Drain = true
	require.NoError(t, h.kube.Update(context.Background(), n))
	h.now = h.now.Add(MinInterval)
	h.reconcile("node1")
	migs := &v1alpha1.VirtualMachineMigrationList{}
	require.NoError(t, h.kube.List(context.Background(), migs))
	require.Len(t, migs.Items, 1)
	m := migs.Items[0]

	cases := []struct {
		name    string
		status  v1alpha1.VirtualMachineMigrationStatus
		phase   v1alpha1.DrainPhase
		message string
	}{
		{
			name:    "NoNodeCanTakeTheVM",
			status:  v1alpha1.VirtualMachineMigrationStatus{Phase: v1alpha1.MigrationPending, Message: v1alpha1.MigrationNoTarget + ": no node fits: node2: placement group web (anti-affinity) has a VM in node node2 already"},
			phase:   v1alpha1.DrainBlocked,
			message: "waiting for default/web-0: migration " + m.Name + " waits: no node can take the VM: no node fits: node2: placement group web (anti-affinity)",
		},
		{
			name:   "WaitingForASlotIsStillDraining",
			status: v1alpha1.VirtualMachineMigrationStatus{Phase: v1alpha1.MigrationPending, Message: "node node1 moves 2 VMs at once already"},
			phase:  v1alpha1.DrainDraining,
		},
		{
			name:   "MovingIsDraining",
			status: v1alpha1.VirtualMachineMigrationStatus{Phase: v1alpha1.MigrationRunning, SourceNode: "node1", TargetNode: "node3"},
			phase:  v1alpha1.DrainDraining,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, h.kube.Get(context.Background(), client.ObjectKeyFromObject(&m), &m))
			m.Status = tc.status
			require.NoError(t, h.kube.Status().Update(context.Background(), &m))
			h.now = h.now.Add(MinInterval)
			h.reconcile("node1")
			d := h.get("node1").Status.Drain
			require.NotNil(t, d)
			assert.Equal(t, tc.phase, d.Phase)
			if tc.message != "" {
				assert.Contains(t, d.Message, tc.message)
			} else {
				assert.Empty(t, d.Message)
			}
		})
	}
}
