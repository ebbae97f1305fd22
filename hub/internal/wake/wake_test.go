package wake_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
