package volume

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// within bounds every wait for the controller.
const within = 30 * time.Second

// TestAVolumeTheGuestStillHoldsIsDeletedOnlyOnceItLetsGo pins that a
// Volume removed from a VM's diskAttachments but still listed in its
// status.atProvider.disks (a detach the guest has not acknowledged) is in
// use by that VM: its deletion is refused naming the VM, its node is not
// asked to delete the disk under the guest, and once the VM's status
// drops the disk (a status write alone) the deletion proceeds at once,
// and the Volume goes once its node deleted the disk, each step well
// before the next retry of its backoff.
//
// A user's steps: `kubectl -n team patch vm web --type json -p
// '[{"op":"remove","path":"/spec/forProvider/diskAttachments/1"}]'` on a
// running guest that keeps the disk, then `kubectl -n team delete volume
// data`. Before, the Volume was unused as soon as the spec dropped it, and
// its node deleted the disk the guest still had.
func TestAVolumeTheGuestStillHoldsIsDeletedOnlyOnceItLetsGo(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	e := controllertest.Start(t, []string{"node1"}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		memory := perobject.NewOwner(nil)
		notifier := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.Volume{} })
		e.Fleet.Fleet.Volumes.Subscribe(notifier.Notify)
		return Setup(mgr, o, e.Pool, time.Minute, notifier, memory, nil, nil)
	})
	f := e.Fleet
	f.Agent("node1").Heartbeat(wire.NodeHeartbeat{Backend: "libvirt"})
	ns := e.Namespace(t)

	data := e.Volume(t, ns, "data", "1Gi")
	e.Bind(t, data, "node1")
	// The VM attaches root alone; its guest still holds data.
	vm := e.VM(t, ns, "web", "node1", true, v1alpha1.PhaseRunning)
	vm.Status.AtProvider.Disks = []string{"root", "data"}
	require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))

	controllertest.Await(t, e, data, within, func(c *assert.CollectT, got *v1alpha1.Volume) {
		assert.NotEmpty(c, got.GetFinalizers(), "the controller has taken the Volume")
		inUse := got.GetCondition(inuse.TypeInUse)
		assert.Equal(c, corev1.ConditionTrue, inUse.Status)
		assert.Equal(c, "used by VirtualMachine web", inUse.Message)
		assert.Equal(c, []string{"web"}, got.Status.AtProvider.AttachedTo)
	})

	require.NoError(t, e.Kube.Delete(e.Ctx, data))
	// Refused, again at each retry of its backoff, until a retry is far
	// enough away that a release before it is the guest's letting go
	// waking the Volume.
	const refusals = 9
	nextRetry := apiwrites.BaseDelay << (refusals - 1)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ev := e.Event(t, data, corev1.EventTypeWarning, inuse.ReasonDeletionBlocked)
		assert.Equal(c, "Volume data is used by VirtualMachine web: it is deleted once they no longer use it", ev.Message)
		assert.GreaterOrEqual(c, ev.Count, int32(refusals))
	}, within+nextRetry, 10*time.Millisecond)
	in, ok := controllertest.Stored(t, f, wire.VolumeIntents, "node1", string(data.UID))
	assert.False(t, ok && in.Absent, "the node is not asked to delete the disk the guest holds")

	// The guest lets the disk go: only the VM's status says so.
	e.Get(t, vm)
	vm.Status.AtProvider.Disks = []string{"root"}
	require.NoError(t, e.Kube.Status().Update(e.Ctx, vm))
	require.Eventually(t, func() bool {
		in, ok := controllertest.Stored(t, f, wire.VolumeIntents, "node1", string(data.UID))
		return ok && in.Absent
	}, nextRetry/2, 10*time.Millisecond, "the node is asked to delete the disk once the guest let it go, before the next retry")

	controllertest.Report(t, f.Agent("node1"), wire.VolumeReports, string(data.UID), wire.VolumeReport{UID: string(data.UID), Gone: true})
	require.Eventually(t, func() bool {
		return kerrors.IsNotFound(e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(data), &v1alpha1.Volume{}))
	}, nextRetry/2, 10*time.Millisecond, "the Volume goes once its node deleted the disk, before the next retry")
}
