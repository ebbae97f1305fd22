package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// TestNotifyOnSync: a VM whose write to the bus failed while the server was
// away is reconciled once the fleet's watch has caught up with the server
// again, once, and not before.
func TestNotifyOnSync(t *testing.T) {
	f := newTestFleet(t, bus.NewFake())
	n := NewNotifier(perobject.NewOwner(nil))
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web"}}
	n.Remember(vm)
	notified := func() []types.NamespacedName {
		var out []types.NamespacedName
		for {
			select {
			case e := <-n.events:
				out = append(out, client.ObjectKeyFromObject(e.Object))
			case <-time.After(50 * time.Millisecond):
				return out
			}
		}
	}

	f.bus.SetDown(assert.AnError)
	n.NotifyOnSync(f.Fleet, "uid-web")
	assert.Empty(t, notified(), "not while the server is away")

	f.bus.SetDown(nil)
	require.Equal(t, []types.NamespacedName{{Namespace: "default", Name: "web"}}, notified(), "once it is back")

	f.bus.SetDown(assert.AnError)
	f.bus.SetDown(nil)
	assert.Empty(t, notified(), "once only")
}
