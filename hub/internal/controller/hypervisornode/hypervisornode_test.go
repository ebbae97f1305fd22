package hypervisornode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpmeta "github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
)

type harness struct {
	t    *testing.T
	kube client.Client
	bus  *bus.Fake
	f    *fleet.Fleet
	r    *Reconciler
	now  time.Time
}

// newHarness serves objs; each VM among them that names a node is sealed
// there, placed by the hub.
func newHarness(t *testing.T, objs ...client.Object) *harness {
	scheme := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(scheme))
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	for _, o := range objs {
		if node := o.GetAnnotations()[v1alpha1.AnnotationNode]; node != "" {
			xpmeta.AddAnnotations(o, map[string]string{v1alpha1.AnnotationSeal: f.Seal(string(o.GetUID()), node, "")})
		}
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&v1alpha1.HypervisorNode{}).
		WithIndex(&v1alpha1.VirtualMachine{}, index.NodeUsers.Index, index.NodeUsers.Uses).
		WithIndex(&v1alpha1.VirtualMachineMigration{}, index.MigrationsOfVM.Index, index.MigrationsOfVM.Uses).
		WithIndex(&v1alpha1.VirtualMachineSnapshot{}, index.SnapshotsOfVM.Index, index.SnapshotsOfVM.Uses).
		WithStatusSubresource(&v1alpha1.VirtualMachineMigration{}).
		WithObjects(objs...).Build()
	h := &harness{t: t, kube: kube, bus: b, f: f, now: time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)}
	h.r = NewReconciler(kube, func() []*fleet.Fleet { return []*fleet.Fleet{f} }, logging.NewNopLogger())
	h.r.now = func() time.Time { return h.now }
	return h
}

func (h *harness) heartbeat(node string, allocatedVCPU int64) {
	h.bus.SetNode(bus.NodeEvent{Node: node, Heartbeat: wire.NodeHeartbeat{
		Node: node, Backend: "libvirt", AgentVersion: "v1", Labels: map[string]string{"zone": "a"},
		Capacity:  wire.Resources{VCPU: 8, MemoryBytes: 16 << 30},
		Allocated: wire.Resources{VCPU: allocatedVCPU, MemoryBytes: 1 << 30},
	}})
	require.Eventually(h.t, func() bool {
		s, ok := h.f.Heard(node)
		return ok && !s.Lost && s.Heartbeat.Allocated.VCPU == allocatedVCPU
	}, 5*time.Second, time.Millisecond)
}

func (h *harness) reconcile(node string) reconcile.Result {
	res, err := h.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Name: node}})
	require.NoError(h.t, err)
	return res
}

func (h *harness) get(node string) *v1alpha1.HypervisorNode {
	n := &v1alpha1.HypervisorNode{}
	require.NoError(h.t, h.kube.Get(context.Background(), client.ObjectKey{Name: node}, n))
	return n
}

func vmOn(name, node string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{v1alpha1.AnnotationNode: node}}}
}

// TestANodeThatSendsHeartbeatsIsShown pins what a HypervisorNode shows, and
// that a heartbeat saying the same again writes nothing.
func TestANodeThatSendsHeartbeatsIsShown(t *testing.T) {
	h := newHarness(t, vmOn("a", "node1"), vmOn("b", "node1"), vmOn("c", "node2"))
	h.heartbeat("node1", 2)

	h.reconcile("node1") // creates it and writes its status
	n := h.get("node1")
	assert.Equal(t, "libvirt", n.Status.Backend)
	assert.Equal(t, "v1", n.Status.AgentVersion)
	assert.Equal(t, map[string]string{"zone": "a"}, n.Status.Labels)
	assert.Equal(t, int64(8), n.Status.Capacity.VCPU)
	assert.True(t, resource.MustParse("16Gi").Equal(n.Status.Capacity.Memory))
	assert.Nil(t, n.Status.Capacity.Storage, "a node that says nothing of storage")
	assert.Equal(t, int32(2), n.Status.VirtualMachines, "the VMs placed on node1, not node2's")
	assert.Equal(t, "2/8 vCPU, 1Gi/16Gi", n.Status.Summary)
	ready := meta.FindStatusCondition(n.Status.Conditions, v1alpha1.NodeConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, metav1.ConditionTrue, ready.Status)

	rv := n.ResourceVersion
	h.now = h.now.Add(time.Minute)
	h.heartbeat("node1", 2)
	res := h.reconcile("node1")
	assert.Equal(t, rv, h.get("node1").ResourceVersion, "the same heartbeat again writes nothing")
	assert.Equal(t, resyncEvery, res.RequeueAfter)
}

// TestWritesAreSpacedPerNode pins the write economy: a change within
// MinInterval of the last write waits for it, then is written once.
func TestWritesAreSpacedPerNode(t *testing.T) {
	h := newHarness(t)
	h.heartbeat("node1", 1)
	h.reconcile("node1")
	rv := h.get("node1").ResourceVersion

	h.now = h.now.Add(MinInterval / 4)
	h.heartbeat("node1", 3)
	res := h.reconcile("node1")
	assert.Equal(t, rv, h.get("node1").ResourceVersion, "not written within MinInterval")
	assert.Equal(t, MinInterval*3/4, res.RequeueAfter, "but requeued for when it may be")

	h.now = h.now.Add(MinInterval)
	h.reconcile("node1")
	assert.Equal(t, int64(3), h.get("node1").Status.Allocated.VCPU)
}

// TestALostNodeIsNotReady pins the Ready condition of a lost node, with the
// time it was lost, and that a lost node's HypervisorNode is not created
// again once deleted.
func TestALostNodeIsNotReady(t *testing.T) {
	h := newHarness(t)
	h.heartbeat("node1", 1)
	h.reconcile("node1")

	h.bus.SetNode(bus.NodeEvent{Node: "node1", Lost: true})
	require.Eventually(t, func() bool { return h.f.Node("node1").Lost }, 5*time.Second, time.Millisecond)
	h.now = h.now.Add(time.Minute)
	h.reconcile("node1")
	n := h.get("node1")
	ready := meta.FindStatusCondition(n.Status.Conditions, v1alpha1.NodeConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, metav1.ConditionFalse, ready.Status)
	assert.Equal(t, v1alpha1.NodeReasonLost, ready.Reason)
	assert.Contains(t, ready.Message, "No heartbeat since")
	assert.Equal(t, h.f.Node("node1").LostSince.Unix(), ready.LastTransitionTime.Unix())
	assert.Equal(t, "libvirt", n.Status.Backend, "a lost node keeps what it last said")

	require.NoError(t, h.kube.Delete(context.Background(), n))
	h.reconcile("node1")
	assert.True(t, kerrors.IsNotFound(h.kube.Get(context.Background(), client.ObjectKey{Name: "node1"}, &v1alpha1.HypervisorNode{})),
		"an administrator deleted a lost node: it stays deleted")
}

// TestANodeNeverHeardIsNotCreated pins that only heartbeats create
// HypervisorNodes.
func TestANodeNeverHeardIsNotCreated(t *testing.T) {
	h := newHarness(t)
	h.reconcile("ghost")
	assert.True(t, kerrors.IsNotFound(h.kube.Get(context.Background(), client.ObjectKey{Name: "ghost"}, &v1alpha1.HypervisorNode{})))
}
