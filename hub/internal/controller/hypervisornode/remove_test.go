package hypervisornode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// TestARemovedNodeIsForgottenOnceLost pins what deleting a HypervisorNode
// does: a node removed for good (lost) leaves nothing on the wire, its
// keys deleted and its reports stream dropped, and nothing in the hub's
// memory, once no VM is bound to it; a node that still sends heartbeats is
// only shown again; another node's keys are never touched.
func TestARemovedNodeIsForgottenOnceLost(t *testing.T) {
	cases := map[string]struct {
		lost bool
		// vm is bound to node1 when set.
		vm bool
		// wantForgotten: node1's keys deleted, its stream dropped, the hub
		// no longer knowing it.
		wantForgotten bool
		// wantHeld: the HypervisorNode stays, held by the hub.
		wantHeld bool
	}{
		"ALostNode":                      {lost: true, wantForgotten: true},
		"ALostNodeWithAVMBoundToIt":      {lost: true, vm: true, wantHeld: true},
		"ANodeThatStillSendsHeartbeats":  {},
		"ANodeWithAVMThatSendsHeartbeat": {vm: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var objs []client.Object
			if tc.vm {
				objs = append(objs, vmOn("a", "node1"))
			}
			h := newHarness(t, objs...)
			h.heartbeat("node1", 2)
			h.heartbeat("node2", 2)
			h.reconcile("node1")
			assert.True(t, controllerutil.ContainsFinalizer(h.get("node1"), Finalizer), "the hub holds the HypervisorNodes it makes")
			for _, node := range []string{"node1", "node2"} {
				bus.SetValue(h.bus, wire.GuestReports, node, "orphan", wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: "orphan", Node: node, Phase: wire.PhaseRunning})
				bus.SetValue(h.bus, wire.GuestIntents, node, "left", wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: "left"})
			}
			if tc.lost {
				h.bus.SetNode(bus.NodeEvent{Node: "node1", Lost: true})
				require.Eventually(t, func() bool { s, _ := h.f.Heard("node1"); return s.Lost }, 5*time.Second, time.Millisecond)
			}

			require.NoError(t, h.kube.Delete(context.Background(), h.get("node1")))
			h.reconcile("node1")
			if tc.lost {
				// The first pass deleted the keys; the reports' markers
				// reach the bucket through the node's stream, which goes
				// after.
				h.reconcile("node1")
			}

			n := &v1alpha1.HypervisorNode{}
			err := h.kube.Get(context.Background(), client.ObjectKey{Name: "node1"}, n)
			if tc.wantHeld {
				require.NoError(t, err)
				assert.True(t, controllerutil.ContainsFinalizer(n, Finalizer))
			} else {
				assert.True(t, kerrors.IsNotFound(err), "the HypervisorNode is gone: %v", err)
			}
			_, reported := bus.Stored(h.bus, wire.GuestReports, "node1", "orphan")
			_, intended := bus.Stored(h.bus, wire.GuestIntents, "node1", "left")
			_, heard := h.f.Heard("node1")
			assert.Equal(t, tc.wantForgotten, !reported, "node1's report deleted")
			assert.Equal(t, tc.wantForgotten, !intended, "node1's intent deleted")
			assert.Equal(t, tc.wantForgotten, !heard, "the hub forgot node1")
			if tc.wantForgotten {
				assert.Equal(t, []string{"node1"}, h.bus.Dropped())
			} else {
				assert.Empty(t, h.bus.Dropped())
			}
			_, reported = bus.Stored(h.bus, wire.GuestReports, "node2", "orphan")
			_, intended = bus.Stored(h.bus, wire.GuestIntents, "node2", "left")
			assert.True(t, reported && intended, "node2's keys stay")

			if tc.wantHeld {
				require.NoError(t, h.kube.Delete(context.Background(), vmOn("a", "node1")))
				h.reconcile("node1")
				h.reconcile("node1")
				err := h.kube.Get(context.Background(), client.ObjectKey{Name: "node1"}, n)
				assert.True(t, kerrors.IsNotFound(err), "the HypervisorNode goes with the last VM bound to it: %v", err)
				assert.Equal(t, []string{"node1"}, h.bus.Dropped())
			}
			if !tc.lost {
				h.heartbeat("node1", 2)
				h.reconcile("node1")
				assert.True(t, controllerutil.ContainsFinalizer(h.get("node1"), Finalizer), "a node that sends heartbeats is shown again")
			}
		})
	}
}

// TestAHypervisorNodeMadeBeforeIsHeld: a HypervisorNode without the
// hub's finalizer (made by an older hub, or by hand) gets it.
func TestAHypervisorNodeMadeBeforeIsHeld(t *testing.T) {
	h := newHarness(t, &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{Name: "node1"}})
	h.heartbeat("node1", 2)
	h.reconcile("node1")
	assert.True(t, controllerutil.ContainsFinalizer(h.get("node1"), Finalizer))
}
