package virtualmachine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// oneFleet is a pool of the one fleet every ProviderConfig names.
type oneFleet struct{ f *fleet.Fleet }

func (o oneFleet) Get(context.Context, fleet.Target) (*fleet.Fleet, error) { return o.f, nil }

// schedulerLoop is a placement loop running against a real API server over
// the fake bus b.
type schedulerLoop struct {
	cp  *controlplane.ControlPlane
	ctx context.Context
	b   *bus.Fake
	f   *fleet.Fleet
	rec *fleettest.Recorder
	s   *Scheduler
}

// startScheduler starts a placement loop with the ClusterProviderConfig
// every VM names by default; backoff, if set, replaces its retry delays.
func startScheduler(t *testing.T, policies bool, backoff workqueue.TypedRateLimiter[types.NamespacedName]) schedulerLoop {
	t.Helper()
	cp := controlplane.StartForTest(t)
	informers, ctx := cp.InformersForTest(t)
	require.NoError(t, index.Register(ctx, informers), "the hub's field indexes, as its manager has them")
	require.NoError(t, cp.Client.Create(ctx, &apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec:       apisv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://unused", Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}}},
	}))
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	rec := &fleettest.Recorder{}
	s := NewScheduler(cp.Client, informers, oneFleet{f}, placement.New(), quota.NewCounter(informers, func() []*fleet.Fleet { return []*fleet.Fleet{f} }), rec, logging.NewNopLogger(), policies)
	if backoff != nil {
		s = s.withBackoff(backoff)
	}
	f.SubscribeNodes(s.RetryUnplaced)
	f.SubscribeSynced(func() { s.RetryUnplaced("") })
	go func() { _ = s.Start(ctx) }()
	return schedulerLoop{cp: cp, ctx: ctx, b: b, f: f, rec: rec, s: s}
}

// TestSchedulerPlacesAVMAsSoonAsTheFleetChanges runs the placement loop
// against a real API server and informer cache. A VM no node can take says
// why in its status, and is placed the moment a node joins, not when a
// backoff expires: the loop's backoff here is an hour.
func TestSchedulerPlacesAVMAsSoonAsTheFleetChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	sl := startScheduler(t, false, workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](time.Hour, time.Hour))
	cp, ctx, b, rec, s := sl.cp, sl.ctx, sl.b, sl.rec, sl.s

	require.NoError(t, cp.Client.Create(ctx, vol("root", "")))
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "waits-for-a-node"},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Vcpu: 1, Memory: resource.MustParse("512Mi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: "root"}},
		}},
	}
	require.NoError(t, cp.Client.Create(ctx, vm))
	key := client.ObjectKeyFromObject(vm)
	got := &v1alpha1.VirtualMachine{}
	require.Eventually(t, func() bool {
		return cp.Client.Get(ctx, key, got) == nil && got.Status.AtProvider.Phase == v1alpha1.PhasePending
	}, 30*time.Second, 10*time.Millisecond, "a VM no node can take is Pending")
	assert.Contains(t, got.GetCondition(xpv2.TypeReady).Message, "no node has sent a heartbeat")
	assert.Contains(t, got.GetCondition(xpv2.TypeSynced).Message, "no node has sent a heartbeat")
	assert.Empty(t, got.GetAnnotations()[v1alpha1.AnnotationNode])
	rec.AssertWarning(t, ReasonFailedScheduling)
	assert.Equal(t, 1, s.Unplaced())

	b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{
		Backend: "libvirt", Capacity: wire.Resources{VCPU: 4, MemoryBytes: 8 << 30},
	}})
	require.Eventually(t, func() bool {
		return cp.Client.Get(ctx, key, got) == nil && got.GetAnnotations()[v1alpha1.AnnotationNode] == testNode
	}, 30*time.Second, 10*time.Millisecond, "the VM is placed when the node joins, not after the hour's backoff")
	assert.True(t, meta.FinalizerExists(got, managed.FinalizerName), "node and finalizer in one write")
	// The loop forgets the VM and records the event once its write
	// returned, a moment after the API server holds it.
	scheduled := func() []string {
		var out []string
		for _, e := range rec.Events() {
			if e.Reason == ReasonScheduled {
				out = append(out, e.Message)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(scheduled()) > 0 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, []string{"Placed on node " + testNode}, scheduled())
	assert.Zero(t, s.Unplaced())
}

// TestSchedulerAdoptsOrphans runs the placement loop against a real API
// server: a VM named like an orphaned guest is bound to that guest's node,
// whatever its policies let the hub create, in the one write that records
// the node, the orphan, the managed finalizer and, for a VM that keeps its
// guest, FinalizerKeep; a VM importing a guest by external name is never
// bound here.
func TestSchedulerAdoptsOrphans(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	sl := startScheduler(t, true, nil)
	cp, ctx, b, f, rec := sl.cp, sl.ctx, sl.b, sl.f, sl.rec
	// The orphans' node is full, so only adoption puts a VM there.
	const orphanNode = "node2"
	b.SetNode(bus.NodeEvent{Node: orphanNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 0, MemoryBytes: 0}}})
	b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 64, MemoryBytes: 64 << 30}}})
	orphan := func(name string) string {
		uid := "orphan-of-" + name
		bus.SetValue(b, wire.GuestReports, orphanNode, uid, wire.Report{
			ProtocolVersion: wire.ProtocolVersion, UID: uid, Node: orphanNode, Phase: wire.PhaseRunning,
			Released: true, Orphan: &wire.Orphan{Namespace: "default", Name: name, Seal: f.OrphanSeal(uid, orphanNode, "default", name)},
		})
		require.Eventually(t, func() bool { _, found, _ := f.Orphan("default", name); return found }, 5*time.Second, time.Millisecond)
		return uid
	}
	newVM := func(name string, policies xpv2.ManagementPolicies, annotations map[string]string) *v1alpha1.VirtualMachine {
		vm := &v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: annotations},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Vcpu: 1, Memory: resource.MustParse("512Mi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(name + "-root")}},
			}},
		}
		vm.SetManagementPolicies(policies)
		require.NoError(t, cp.Client.Create(ctx, vm))
		return vm
	}
	keep := xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize}

	// Created first, so the loop has seen it by the time the adopters are
	// bound.
	imp := newVM("imports", xpv2.ManagementPolicies{xpv2.ManagementActionAll}, map[string]string{meta.AnnotationKeyExternalName: "legacy-db"})

	cases := map[string]struct {
		policies xpv2.ManagementPolicies
		wantKeep bool
	}{
		"AFullPolicyVM":            {policies: xpv2.ManagementPolicies{xpv2.ManagementActionAll}},
		"AVMThatKeepsItsGuest":     {policies: keep, wantKeep: true},
		"AnObserveOnlyVMAdoptsToo": {policies: xpv2.ManagementPolicies{xpv2.ManagementActionObserve}, wantKeep: true},
	}
	i := 0
	for name, tc := range cases {
		i++
		vmName := fmt.Sprintf("adopter-%d", i)
		t.Run(name, func(t *testing.T) {
			uid := orphan(vmName)
			vm := newVM(vmName, tc.policies, nil)
			got := &v1alpha1.VirtualMachine{}
			require.Eventually(t, func() bool {
				return cp.Client.Get(ctx, client.ObjectKeyFromObject(vm), got) == nil && got.GetAnnotations()[v1alpha1.AnnotationNode] != ""
			}, 30*time.Second, 10*time.Millisecond)
			assert.Equal(t, orphanNode, got.GetAnnotations()[v1alpha1.AnnotationNode], "the orphan's node, full as it is")
			assert.Equal(t, uid, got.GetAnnotations()[v1alpha1.AnnotationAdopted], "the orphan recorded with the node")
			assert.True(t, meta.FinalizerExists(got, managed.FinalizerName), "the managed finalizer in the same write")
			assert.Equal(t, tc.wantKeep, meta.FinalizerExists(got, FinalizerKeep), "FinalizerKeep in the same write")
		})
	}
	require.Eventually(t, func() bool {
		n := 0
		for _, e := range rec.Events() {
			if e.Reason == ReasonAdopted {
				n++
			}
		}
		return n == len(cases)
	}, 10*time.Second, 10*time.Millisecond, "an Adopted event each")
	got := &v1alpha1.VirtualMachine{}
	require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(imp), got))
	assert.Empty(t, got.GetAnnotations()[v1alpha1.AnnotationNode], "an import is never placed by the loop")
}

// Unplaced is how many VMs wait for a node.
func (s *Scheduler) Unplaced() int {
	n := 0
	s.unplaced.Range(func(any, any) bool { n++; return true })
	return n
}
