package virtualnetwork

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/kubeclient"
	"github.com/virtfleet/virtfleet/internal/testing/controlplane"
)

// TestWhatTheHubRemembersOfANetworkGoesWithIt runs the VirtualNetwork
// controller against a real API server: what a controller of the inuse kinds
// and the hub's client remember by uid is forgotten once the object is gone,
// and not while it still exists: when the controller removes its finalizer,
// and when a user stripped it by hand, so that the object goes without a
// last write of the hub's. Without it the hub holds an entry for every
// object it ever reconciled.
func TestWhatTheHubRemembersOfANetworkGoesWithIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: cp.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	require.NoError(t, err)
	mgr = kubeclient.ForManager(mgr)
	kc, ok := mgr.GetClient().(*kubeclient.Client)
	require.True(t, ok, "the manager's client is the hub's")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, index.Setup(ctx, mgr))
	forgotten := make(chan string, 16)
	k := Kind
	k.Forget = func(uid string) { forgotten <- uid }
	o := controller.Options{
		Logger:                  logging.NewNopLogger(),
		MaxConcurrentReconciles: 1,
		PollInterval:            time.Minute,
		GlobalRateLimiter:       ratelimiter.NewGlobal(100),
		Features:                &feature.Flags{},
	}
	require.NoError(t, inuse.Setup(mgr, o, k))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	for _, tc := range []struct {
		name string
		// strip removes the controller's finalizer by hand before the
		// deletion, as users do with a resource stuck in deletion: the
		// object goes without a last write of the hub's.
		strip bool
	}{
		{name: "FinalizedByTheController"},
		{name: "ItsFinalizerStrippedByHand", strip: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{GenerateName: "net-", Namespace: "default"}}
			n.Spec.ForProvider.CIDR = "10.10.120.0/24"
			require.NoError(t, cp.Client.Create(ctx, n))
			key := client.ObjectKeyFromObject(n)
			got := &v1alpha1.VirtualNetwork{}
			require.Eventually(t, func() bool {
				return cp.Client.Get(ctx, key, got) == nil && len(got.GetFinalizers()) > 0
			}, 30*time.Second, 50*time.Millisecond, "the controller never took the network in hand (no finalizer)")
			assert.Empty(t, forgotten, "forgotten while the network exists")
			// The finalizer shows on the API server a moment before the
			// hub's client has recorded its own write.
			require.Eventually(t, func() bool { return kc.Remembers(n.UID) }, 10*time.Second, 10*time.Millisecond,
				"the client remembers nothing of a network it wrote (its finalizer)")

			if tc.strip {
				// The controller writes the network's status meanwhile.
				require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
					if err := cp.Client.Get(ctx, key, got); err != nil {
						return err
					}
					got.SetFinalizers(nil)
					return cp.Client.Update(ctx, got)
				}))
			}
			require.NoError(t, cp.Client.Delete(ctx, n))
			require.Eventually(t, func() bool {
				return kerrors.IsNotFound(cp.Client.Get(ctx, key, &v1alpha1.VirtualNetwork{}))
			}, 30*time.Second, 50*time.Millisecond, "the network was never finalized")
			select {
			case uid := <-forgotten:
				assert.Equal(t, string(n.UID), uid)
			case <-time.After(10 * time.Second):
				t.Fatal("the network is gone, and the controller still remembers it")
			}
			assert.Empty(t, forgotten, "forgotten more than once")
			assert.False(t, kc.Remembers(n.UID), "the network is gone, and the client still remembers it")
		})
	}
}
