package virtualmachine

import (
	"context"
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
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/internal/testing/controlplane"
)

// oneFleet is a pool of the one fleet every ProviderConfig names.
type oneFleet struct{ f *fleet.Fleet }

func (o oneFleet) Get(context.Context, fleet.Target) (*fleet.Fleet, error) { return o.f, nil }

// TestSchedulerPlacesAVMAsSoonAsTheFleetChanges runs the placement loop
// against a real API server and informer cache. A VM no node can take says
// why in its status, and is placed the moment a node joins, not when a
// backoff expires: the loop's backoff here is an hour.
func TestSchedulerPlacesAVMAsSoonAsTheFleetChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	informers, ctx := cp.InformersForTest(t)

	require.NoError(t, cp.Client.Create(ctx, &apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec:       apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://unused", Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
	}))
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	rec := &fleettest.Recorder{}
	s := NewScheduler(cp.Client, informers, oneFleet{f}, placement.New(), rec, logging.NewNopLogger(), false).
		withBackoff(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](time.Hour, time.Hour))
	f.SubscribeNodes(s.RetryUnplaced)
	go func() { _ = s.Start(ctx) }()

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
