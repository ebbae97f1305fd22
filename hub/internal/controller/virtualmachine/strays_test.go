package virtualmachine

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/uuid"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// straySweep is the sweep's period in these tests: short, so that a stray
// goes within a test's patience.
const straySweep = 200 * time.Millisecond

// TestStraysAreSwept pins that every guest intent no VirtualMachine binds
// to its node is deleted by the periodic sweep (and with it, by the node's
// agent, its guest), and that no intent a VM binds is.
//
// No VM controller runs here: the hub that published the intents is
// stopped, as in the first case, and nothing but the sweep deletes them.
// The attacks and accidents, one per case marked stray:
//   - VMGoneWhileTheHubWasStopped: the hub is stopped; an operator
//     removes the VM's finalizer and deletes it (kubectl patch vm x
//     --type=merge -p '{"metadata":{"finalizers":null}}'; kubectl
//     delete vm x), or deletes its namespace so; the hub comes back.
//   - BindingEditedByHand: a tenant with edit rights in its namespace
//     rewrites the running VM's node annotation to another node
//     (kubectl annotate vm x --overwrite compute.virtfleet.io/node=node2),
//     hoping for a second guest while the first runs on, unbound.
//   - IntentOfNoVM: someone holding the hub's NATS credentials writes an
//     intent for a uid no VM has (nats kv put intents node1.<uid> ...).
//   - IntentReplayedFromAnEarlierBinding: the same writes back the intent
//     a VM had on node1 before it moved to node2.
//   - LeftoversWrittenByHand: a hub stopped half-way through a move left
//     a running VM's intent on node3; a tenant with edit rights, to keep
//     that second guest, lists node3 among the nodes the VM left
//     (kubectl annotate vm x compute.virtfleet.io/leftovers=node3). The
//     list carries no seal, so it keeps nothing; before leftovers were
//     sealed, the sweep kept that intent for good.
//
// Before the sweep, each stray intent stayed, and its guest ran, for
// good.
func TestStraysAreSwept(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	nodes := []string{"node1", "node2", "node3"}
	env := controllertest.Start(t, nodes, func(mgr ctrl.Manager, _ controller.Options, e *controllertest.Env) error {
		return mgr.Add(NewStrays(mgr.GetCache(), mgr.GetAPIReader(), e.Pool.Fleets, straySweep, logging.NewNopLogger()))
	})
	f := env.Fleet
	ns := env.Namespace(t)
	put := func(node, uid string) {
		t.Helper()
		_, err := bus.Put(env.Ctx, f.Bus, wire.GuestIntents, node, uid, wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: uid, Namespace: ns, Running: true})
		require.NoError(t, err)
	}
	annotate := func(vm *v1alpha1.VirtualMachine, a map[string]string) {
		t.Helper()
		require.NoError(t, Annotate(env.Ctx, env.Kube, vm, func(have map[string]string) {
			for k, v := range a {
				if v == "" {
					delete(have, k)
					continue
				}
				have[k] = v
			}
		}))
	}

	type intent struct{ node, uid string }
	var kept, stray []intent

	// Kept: a VM on its sealed node; the target of its sealed migration
	// and a node it left (the VM controller deletes that one itself);
	// a Volume's intent on a node, which is no guest's.
	placed := env.VM(t, ns, "placed", "node1", true, v1alpha1.PhaseRunning)
	moving := env.VM(t, ns, "moving", "node1", true, v1alpha1.PhaseRunning)
	m := Migration{ID: "m1", Target: "node2"}
	annotate(moving, map[string]string{
		v1alpha1.AnnotationMigration: m.String(), v1alpha1.AnnotationMigrationSeal: MigrationSeal(f.Fleet, string(moving.UID), m),
		v1alpha1.AnnotationLeftovers: "node3", v1alpha1.AnnotationLeftoversSeal: LeftoversSeal(f.Fleet, string(moving.UID), "node3"),
	})
	kept = append(kept, intent{"node1", string(placed.UID)}, intent{"node1", string(moving.UID)}, intent{"node2", string(moving.UID)}, intent{"node3", string(moving.UID)})
	for _, in := range kept {
		put(in.node, in.uid)
	}
	volumeUID := string(uuid.NewUUID())
	_, err := bus.Put(env.Ctx, f.Bus, wire.VolumeIntents, "node1", volumeUID, wire.VolumeIntent{ProtocolVersion: wire.ProtocolVersion, UID: volumeUID, Disk: "root", Absent: true})
	require.NoError(t, err)

	// The size the hub recorded of a Volume that exists is kept; that of
	// a Volume gone without its disk (deleted without the Delete
	// management policy, or while its ProviderConfig could not be read)
	// goes.
	sized := env.Volume(t, ns, "sized", "1Gi")
	require.NoError(t, f.RecordSize(env.Ctx, string(sized.UID), 1<<30))
	unsized := string(uuid.NewUUID())
	require.NoError(t, f.RecordSize(env.Ctx, unsized, 1<<30))

	goneBefore := testutil.ToFloat64(metrics.StrayIntentsDeleted.WithLabelValues(metrics.ReasonVMGone))
	unboundBefore := testutil.ToFloat64(metrics.StrayIntentsDeleted.WithLabelValues(metrics.ReasonNotBound))

	// VMGoneWhileTheHubWasStopped.
	gone := env.VM(t, ns, "gone", "node1", true, v1alpha1.PhaseRunning)
	put("node1", string(gone.UID))
	require.NoError(t, env.Kube.Delete(env.Ctx, gone))
	// BindingEditedByHand.
	edited := env.VM(t, ns, "edited", "node1", true, v1alpha1.PhaseRunning)
	put("node1", string(edited.UID))
	annotate(edited, map[string]string{v1alpha1.AnnotationNode: "node2"})
	// IntentReplayedFromAnEarlierBinding: the VM is on node2 now.
	moved := env.VM(t, ns, "moved", "node2", true, v1alpha1.PhaseRunning)
	put("node2", string(moved.UID))
	kept = append(kept, intent{"node2", string(moved.UID)})
	put("node1", string(moved.UID))
	// LeftoversWrittenByHand.
	lingering := env.VM(t, ns, "lingering", "node1", true, v1alpha1.PhaseRunning)
	put("node1", string(lingering.UID))
	kept = append(kept, intent{"node1", string(lingering.UID)})
	put("node3", string(lingering.UID))
	annotate(lingering, map[string]string{v1alpha1.AnnotationLeftovers: "node3"})
	// IntentOfNoVM.
	nobody := string(uuid.NewUUID())
	put("node3", nobody)
	stray = append(stray, intent{"node1", string(gone.UID)}, intent{"node1", string(edited.UID)}, intent{"node1", string(moved.UID)}, intent{"node3", string(lingering.UID)}, intent{"node3", nobody})

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, in := range stray {
			_, ok := controllertest.Stored(t, f, wire.GuestIntents, in.node, in.uid)
			assert.False(c, ok, "the stray intent of %s on %s is deleted", in.uid, in.node)
		}
	}, 10*straySweep+5*time.Second, 10*time.Millisecond)
	// The last stray went in a sweep that began after every kept intent
	// was written.
	for _, in := range kept {
		_, ok := controllertest.Stored(t, f, wire.GuestIntents, in.node, in.uid)
		assert.True(t, ok, "the intent of %s on %s, which its VM binds, is kept", in.uid, in.node)
	}
	_, ok := controllertest.Stored(t, f, wire.VolumeIntents, "node1", volumeUID)
	assert.True(t, ok, "a Volume's intent is no guest's, and is kept")
	sizeRecorded := func(uid string) bool {
		key, err := wire.SizeKey(uid)
		require.NoError(t, err)
		entries, err := f.Bus.List(env.Ctx, wire.BucketIntents)
		require.NoError(t, err)
		return slices.ContainsFunc(entries, func(e bus.Entry) bool { return e.Key == key })
	}
	assert.True(t, sizeRecorded(string(sized.UID)), "the size record of a Volume that exists is kept")
	assert.Eventually(t, func() bool { return !sizeRecorded(unsized) }, 10*straySweep+5*time.Second, 10*time.Millisecond,
		"the size record of a Volume gone is swept")
	assert.GreaterOrEqual(t, testutil.ToFloat64(metrics.StrayIntentsDeleted.WithLabelValues(metrics.ReasonVMGone))-goneBefore, 2.0, "the intents of no VM are counted")
	assert.GreaterOrEqual(t, testutil.ToFloat64(metrics.StrayIntentsDeleted.WithLabelValues(metrics.ReasonNotBound))-unboundBefore, 2.0, "the intents of VMs bound elsewhere are counted")
}

// TestStraySweepSparesWhatTheCacheHasNotSeen pins that an intent whose VM
// the cache does not show yet (a binding just written) is confirmed with
// the API server before it is deleted, and kept.
func TestStraySweepSparesWhatTheCacheHasNotSeen(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	f := env.Fleet
	ns := env.Namespace(t)
	vm := env.VM(t, ns, "fresh", "node1", true, v1alpha1.PhaseRunning)
	_, err := bus.Put(env.Ctx, f.Bus, wire.GuestIntents, "node1", string(vm.UID), wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: string(vm.UID)})
	require.NoError(t, err)

	// A cache that holds no VM at all stands for one behind the write.
	s := NewStrays(emptyReader{env.Kube}, env.Kube, func() []*fleet.Fleet { return []*fleet.Fleet{f.Fleet} }, time.Hour, logging.NewNopLogger())
	require.NoError(t, s.Sweep(env.Ctx, f.Fleet))
	_, ok := controllertest.Stored(t, f, wire.GuestIntents, "node1", string(vm.UID))
	assert.True(t, ok, "the intent of a VM the API server binds there is kept")
}

// emptyReader is a cache that has seen no VirtualMachine yet.
type emptyReader struct{ client.Reader }

func (r emptyReader) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	if _, ok := l.(*v1alpha1.VirtualMachineList); ok {
		return nil
	}
	return r.Reader.List(ctx, l, opts...)
}
