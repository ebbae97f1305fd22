package virtualmachine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// The intents a VM's nodes hold during a migration: the target is told to
// get ready, the source to migrate once the target is ready and from then
// on, and a migration annotation the hub did not seal changes nothing.
func TestPlanDuringAMigration(t *testing.T) {
	const target, uri = "node2", "qemu+tcp://node2/system"
	cases := map[string]struct {
		seal func(f *fleet.Fleet, m Migration) string
		// reports are what the nodes report about the VM.
		reports map[string]wire.Report
		// want is, per node, whether its intent carries Incoming and
		// Migration.
		want map[string][2]bool
		// within moves the VM between the node's own hosts.
		within bool
	}{
		"NoMigration": {
			seal: func(*fleet.Fleet, Migration) string { return "" },
			want: map[string][2]bool{testNode: {false, false}},
		},
		"AHandWrittenMigrationIsIgnored": {
			seal: func(*fleet.Fleet, Migration) string { return "forged" },
			want: map[string][2]bool{testNode: {false, false}},
		},
		"TheTargetGetsReadyFirst": {
			seal: func(f *fleet.Fleet, m Migration) string { return MigrationSeal(f, testUID, m) },
			want: map[string][2]bool{testNode: {false, false}, target: {true, false}},
		},
		"TheSourceMigratesOnceTheTargetIsReady": {
			seal:    func(f *fleet.Fleet, m Migration) string { return MigrationSeal(f, testUID, m) },
			reports: map[string]wire.Report{target: {Phase: wire.PhasePending, Incoming: "m1"}},
			want:    map[string][2]bool{testNode: {false, true}, target: {true, false}},
		},
		"AMoveWithinTheNodeTakesTheNodeAlone": {
			seal:   func(f *fleet.Fleet, m Migration) string { return MigrationSeal(f, testUID, m) },
			within: true,
			want:   map[string][2]bool{testNode: {false, true}},
		},
		"TheSourceKeepsMigratingOnceItStarted": {
			seal:    func(f *fleet.Fleet, m Migration) string { return MigrationSeal(f, testUID, m) },
			reports: map[string]wire.Report{testNode: {Phase: wire.PhaseRunning, Migration: &wire.MigrationReport{ID: "m1", Phase: wire.MigrationSucceeded}}},
			want:    map[string][2]bool{testNode: {false, true}, target: {true, false}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			e := testExternal(t, b, &fleettest.Recorder{}, wake.NewNotifier(perobject.NewOwner(nil)))
			b.SetNode(bus.NodeEvent{Node: target, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", MigrationURI: uri}})
			require.Eventually(t, func() bool { return e.fleet.Node(target).Heartbeat.MigrationURI == uri }, 5*time.Second, time.Millisecond)
			for node, r := range tc.reports {
				r.ProtocolVersion, r.UID, r.Node = wire.ProtocolVersion, testUID, node
				bus.SetValue(b, wire.GuestReports, node, testUID, r)
				require.Eventually(t, func() bool { _, ok := e.fleet.Guests.Report(node, testUID); return ok }, 5*time.Second, time.Millisecond)
			}
			m := Migration{ID: "m1", Target: target}
			if tc.within {
				m.Target = testNode
			}
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: testUID, Annotations: map[string]string{
				v1alpha1.AnnotationNode: testNode, v1alpha1.AnnotationMigration: m.String(), v1alpha1.AnnotationMigrationSeal: tc.seal(e.fleet, m),
			}}}
			vm.Spec.ForProvider.Vcpu, vm.Spec.ForProvider.Memory = 1, resource.MustParse("1Gi")

			p := e.plan(vm, dependencies{}, testNode)
			got := map[string][2]bool{}
			for node, in := range p {
				got[node] = [2]bool{in.Incoming != nil, in.Migration != nil}
				assert.Equal(t, testUID, in.UID)
			}
			assert.Equal(t, tc.want, got)
			if in := p[testNode]; in.Migration != nil {
				want := wire.Migration{ID: "m1", TargetNode: target, TargetURI: uri}
				if tc.within {
					want = wire.Migration{ID: "m1", TargetNode: testNode}
				}
				assert.Equal(t, want, *in.Migration)
			}
			if in, ok := p[target]; ok {
				assert.Equal(t, wire.Incoming{ID: "m1", SourceNode: testNode}, *in.Incoming)
			}
			assert.Equal(t, len(p) == 1, planFingerprint(p, testNode) == fingerprint(p[testNode]), "a plan of one node is fingerprinted as its intent")
		})
	}
}

// The hub deletes the VM's intent on each node it left until that node's
// report is gone, and never on the VM's own node or its migration's
// target, whatever a tenant writes in the annotation.
func TestLeftoversAreClearedButNeverTheVMsOwnNode(t *testing.T) {
	b := bus.NewFake()
	e := testExternal(t, b, &fleettest.Recorder{}, wake.NewNotifier(perobject.NewOwner(nil)))
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: testUID, Annotations: map[string]string{
		v1alpha1.AnnotationNode: testNode, v1alpha1.AnnotationLeftovers: testNode + ",node2",
		v1alpha1.AnnotationLeftoversSeal: LeftoversSeal(e.fleet, testUID, testNode+",node2"),
	}}}
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.SchemeBuilder.AddToScheme(scheme))
	e.kube = fake.NewClientBuilder().WithScheme(scheme).WithObjects(vm).Build()
	ctx := t.Context()
	for _, n := range []string{testNode, "node2"} {
		_, err := bus.Put(ctx, b, wire.GuestIntents, n, testUID, wire.Intent{UID: testUID})
		require.NoError(t, err)
	}
	bus.SetValue(b, wire.GuestReports, "node2", testUID, wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: testUID, Node: "node2", Phase: wire.PhaseRunning})
	require.Eventually(t, func() bool { _, ok := e.fleet.Guests.Report("node2", testUID); return ok }, 5*time.Second, time.Millisecond)

	require.NoError(t, e.clearLeftovers(ctx, vm, testNode))
	_, kept := bus.Stored(b, wire.GuestIntents, testNode, testUID)
	assert.True(t, kept, "the VM's own node keeps its intent")
	_, gone := bus.Stored(b, wire.GuestIntents, "node2", testUID)
	assert.False(t, gone, "the node the VM left does not")
	got := &v1alpha1.VirtualMachine{}
	require.NoError(t, e.kube.Get(ctx, client.ObjectKeyFromObject(vm), got))
	assert.Equal(t, []string{"node2"}, Leftovers(got), "node2 still reports the guest; the VM's own node was never a leftover")

	bus.DeleteValue(b, wire.GuestReports, "node2", testUID)
	require.Eventually(t, func() bool { _, ok := e.fleet.Guests.Report("node2", testUID); return !ok }, 5*time.Second, time.Millisecond)
	require.NoError(t, e.clearLeftovers(ctx, got, testNode))
	require.NoError(t, e.kube.Get(ctx, client.ObjectKeyFromObject(vm), got))
	assert.Empty(t, Leftovers(got), "nothing is left once node2's report is gone")
}
