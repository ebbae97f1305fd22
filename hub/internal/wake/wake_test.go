package wake_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// TestNotifyOnSync: a VM whose write to the bus failed while the server was
// away is reconciled once the fleet's watch has caught up with the server
// again, once, and not before.
func TestNotifyOnSync(t *testing.T) {
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	n := wake.NewNotifier(perobject.NewOwner(nil))
	wakeUps := fleettest.WakeUps(t, n)
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web"}}
	n.Remember(vm)
	notified := func() []types.NamespacedName {
		var out []types.NamespacedName
		for {
			select {
			case req := <-wakeUps:
				out = append(out, req.NamespacedName)
			case <-time.After(50 * time.Millisecond):
				return out
			}
		}
	}

	b.SetDown(assert.AnError)
	n.NotifyOnSync(f, "uid-web")
	assert.Empty(t, notified(), "not while the server is away")

	b.SetDown(nil)
	require.Equal(t, []types.NamespacedName{{Namespace: "default", Name: "web"}}, notified(), "once it is back")

	b.SetDown(assert.AnError)
	b.SetDown(nil)
	assert.Empty(t, notified(), "once only")
}

// TestReportsAreServedBeforeQueuedWork: in a controller's priority queue a
// notification is reconciled before the objects queued by the API server's
// events, even those queued first.
func TestReportsAreServedBeforeQueuedWork(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("wake-test")
	t.Cleanup(q.ShutDown)
	req := func(name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}
	}
	q.Add(req("placed-1"))
	q.Add(req("placed-2"))
	n := wake.NewNotifier(perobject.NewOwner(nil))
	n.Remember(&v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "running", UID: "uid-running"}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, n.Source().Start(ctx, q))

	n.Notify("uid-running")
	require.Eventually(t, func() bool { return q.Len() == 3 }, 5*time.Second, time.Millisecond)
	var order []string
	for range 3 {
		r, _ := q.Get()
		order = append(order, r.Name)
		q.Done(r)
	}
	assert.Equal(t, []string{"running", "placed-1", "placed-2"}, order)
}
