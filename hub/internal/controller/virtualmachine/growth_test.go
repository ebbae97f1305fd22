package virtualmachine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

func TestHoldBeyond(t *testing.T) {
	has := placement.Resources{VCPU: 2, MemoryBytes: 1 << 30}
	cases := map[string]struct {
		vcpu    int32
		memory  int64
		free    placement.Resources
		want    [2]int64
		message []string
	}{
		"AGrowTheNodeHasRoomForGoesAsDeclared": {vcpu: 4, memory: 2 << 30, free: placement.Resources{VCPU: 2, MemoryBytes: 1 << 30}, want: [2]int64{4, 2 << 30}},
		"AShrinkGoesOnAFullNode":               {vcpu: 1, memory: 512 << 20, want: [2]int64{1, 512 << 20}},
		"vCPUsBeyondTheRoomKeepTheGuestsAndSaySo": {vcpu: 4, memory: 2 << 30, free: placement.Resources{VCPU: 1, MemoryBytes: 1 << 30}, want: [2]int64{2, 2 << 30},
			message: []string{"vcpu 4 needs 2 vCPUs more than the guest has and node node1 has 1 free: the guest keeps 2"}},
		"MemoryBeyondTheRoomKeepsTheGuestsAndSaysSo": {vcpu: 2, memory: 3 << 30, free: placement.Resources{VCPU: 8, MemoryBytes: 1 << 30}, want: [2]int64{2, 1 << 30},
			message: []string{"memory of 3221225472 bytes needs 2147483648 bytes more than the guest has and node node1 has 1073741824 free: the guest keeps 1073741824"}},
		"AnOvercommittedNodeShowsNoNegativeRoom": {vcpu: 3, memory: 1 << 30, free: placement.Resources{VCPU: -2}, want: [2]int64{2, 1 << 30},
			message: []string{"node node1 has 0 free", "it grows once the node has room"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := wire.Machine{VCPU: tc.vcpu, MemoryBytes: tc.memory}
			why := holdBeyond(&m, has, tc.free, testNode)
			assert.Equal(t, tc.want, [2]int64{int64(m.VCPU), m.MemoryBytes})
			if len(tc.message) == 0 {
				assert.Empty(t, why)
			}
			for _, want := range tc.message {
				assert.Contains(t, why, want)
			}
		})
	}
}

// TestAGrowTheNodeCannotHoldKeepsTheRunningShape: a running VM asks for
// more vCPUs than its node has free. The hub sends the node the vCPUs the
// guest has (and the memory that fits), says why in Ready, and asks for no
// restart; once the node reports the new shape, nothing is held. Room
// reserved on the node for a VM on its way counts as taken.
func TestAGrowTheNodeCannotHoldKeepsTheRunningShape(t *testing.T) {
	b := bus.NewFake()
	e := testExternal(t, b, &fleettest.Recorder{}, wake.NewNotifier(perobject.NewOwner(nil)))
	e.opts.Placer = placement.New()
	b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt",
		Capacity: wire.Resources{VCPU: 4, MemoryBytes: 4 << 30}, Allocated: wire.Resources{VCPU: 3, MemoryBytes: 2 << 30}}})
	require.Eventually(t, func() bool { return e.fleet.Node(testNode).Heartbeat.Capacity.VCPU == 4 }, 5*time.Second, time.Millisecond)
	running := func(vcpu int32, memory int64) {
		bus.SetValue(b, wire.GuestReports, testNode, testUID, wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: testUID, Node: testNode, Phase: wire.PhaseRunning, VCPU: vcpu, MemoryBytes: memory})
		require.Eventually(t, func() bool { r, ok := e.fleet.Guests.Report(testNode, testUID); return ok && r.Report.VCPU == vcpu }, 5*time.Second, time.Millisecond)
	}
	running(2, 1<<30)
	v := vm(func(v *v1alpha1.VirtualMachine) {
		v.UID = types.UID(testUID)
		v.Spec.ForProvider.Vcpu, v.Spec.ForProvider.Memory = 4, resource.MustParse("2Gi")
	})
	sent := func() wire.Machine { return e.plan(v, dependencies{}, testNode)[testNode].Machine }
	ready := func() xpv2.Condition {
		e.setConditions(v, v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseRunning}, testNode, e.fleet.Node(testNode))
		return condition(v, xpv2.TypeReady)
	}

	m := sent()
	assert.Equal(t, int32(2), m.VCPU, "2 vCPUs more do not fit in the 1 free")
	assert.Equal(t, int64(2<<30), m.MemoryBytes, "1Gi more fits in the 2Gi free")
	r := ready()
	assert.Equal(t, corev1.ConditionTrue, r.Status, "the guest runs on")
	assert.Contains(t, r.Message, "vcpu 4 needs 2 vCPUs more than the guest has and node node1 has 1 free: the guest keeps 2")
	assert.Equal(t, corev1.ConditionFalse, condition(v, TypeRestartRequired).Status, "room, not a restart, is what it waits for")

	_, err := e.opts.Placer.Place(e.fleet.Nodes(), placement.Request{UID: "uid-arriving", Resources: placement.Resources{VCPU: 1, MemoryBytes: 3 << 29}})
	require.NoError(t, err)
	m = sent()
	assert.Equal(t, int64(1<<30), m.MemoryBytes, "a VM placed there meanwhile took the room")
	assert.Contains(t, ready().Message, "memory of 2147483648 bytes needs 1073741824 bytes more")
	e.opts.Placer.Release("uid-arriving")

	running(4, 2<<30)
	m = sent()
	assert.Equal(t, [2]int64{4, 2 << 30}, [2]int64{int64(m.VCPU), m.MemoryBytes}, "a shape the node runs is no growth")
	assert.Empty(t, ready().Message)
}

// TestAGrowthWhoseRecordFailsIsForgotten pins that a growth admitted
// against the namespace's quota stops counting when its size record
// cannot be written: the node is sent nothing larger, so nothing larger
// may hold the quota, and another Volume's growth that fits without it is
// admitted. Once the record is written, the record counts it.
func TestAGrowthWhoseRecordFailsIsForgotten(t *testing.T) {
	ctx := context.Background()
	b := bus.NewFake()
	e := testExternal(t, b, &fleettest.Recorder{}, wake.NewNotifier(perobject.NewOwner(nil)))
	// Two 8Gi Volumes on the node, both asking for 12Gi, under a quota of
	// 20Gi: one growth fits.
	var volumes []v1alpha1.Volume
	objs := []client.Object{&apisv1alpha1.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "q"},
		Spec:       apisv1alpha1.TenantQuotaSpec{Namespace: "default", Hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse("20Gi"))}},
	}}
	for _, name := range []string{"a", "b"} {
		v := v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{v1alpha1.AnnotationNode: testNode}}}
		v.Spec.ForProvider.Size = resource.MustParse("12Gi")
		require.NoError(t, e.fleet.RecordSize(ctx, string(v.UID), 8<<30))
		volumes = append(volumes, v)
		objs = append(objs, &v)
	}
	counter := quota.NewCounter(kube(t, objs...), func() []*fleet.Fleet { return []*fleet.Fleet{e.fleet} })
	e.opts.Quotas = counter
	a, other := volumes[0], &volumes[1]
	d := dependencies{volumes: []v1alpha1.Volume{a}, sizes: map[types.UID]int64{a.UID: 8 << 30}, grows: map[types.UID]int64{a.UID: 12 << 30}}

	b.SetDown(errors.New("nats: connection closed"))
	require.Error(t, e.recordGrowth(ctx, &d), "the record is not written")
	require.NoError(t, counter.FitsGrowth(ctx, other, 8<<30), "a's growth no longer counts")

	b.SetDown(nil)
	d = dependencies{volumes: []v1alpha1.Volume{a}, sizes: map[types.UID]int64{a.UID: 8 << 30}, grows: map[types.UID]int64{a.UID: 12 << 30}}
	require.NoError(t, e.recordGrowth(ctx, &d))
	var exceeded *quota.ExceededError
	require.ErrorAs(t, counter.FitsGrowth(ctx, other, 8<<30), &exceeded, "a's record counts its growth")
	used, err := counter.Used(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, int64(20<<30), used.StorageBytes, "the record, not the record and the admission")
}
