package app_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/hub/internal/app"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// leaseKey is the hub's leader election Lease, in the namespace the tests
// give it.
var leaseKey = client.ObjectKey{Namespace: "default", Name: "virtfleet-hub"}

// A hub takes the Lease a killed hub left once it expired, and not before
// (a killed hub releases nothing; a candidate counts the Lease's duration
// from when it first saw the Lease, not from its renewTime, as clocks
// differ). One hub, as a process runs one: a hub that stops (its pod's
// SIGTERM) gives up the Lease before it exits, well inside a pod's
// termination grace, so that the next hub leads at once.
func TestTheHubsLeaseHandOver(t *testing.T) {
	cp := controlplane.StartForTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const duration = 60 * time.Second
	now := metav1.NowMicro()
	require.NoError(t, cp.Client.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: leaseKey.Namespace, Name: leaseKey.Name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("killed-hub"),
			LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}))
	started := time.Now()
	done := startHub(ctx, t, cp)
	holder := awaitHolder(ctx, t, cp, 2*duration, "killed-hub")
	took := time.Since(started)
	assert.GreaterOrEqual(t, took, duration, "the hub took the killed hub's Lease before it expired")
	t.Logf("hub %s took the killed hub's Lease %s after it started", holder, took.Round(time.Millisecond))
	// The Lease names the hub as soon as the API server stored its
	// acquisition, which may be before the hub read the answer: a hub
	// stopped in between never learns it leads, and has nothing to give up
	// (client-go's acquire ends with the context, and release only gives
	// up a Lease its elector knows it holds). A renewal comes only from a
	// hub that knows.
	awaitRenewal(ctx, t, cp)

	stop := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * app.ShutdownTimeout):
		t.Fatalf("the hub did not stop within %s", 2*app.ShutdownTimeout)
	}
	t.Logf("hub stopped %s after its context was cancelled", time.Since(stop).Round(time.Millisecond))
	var lease coordinationv1.Lease
	require.NoError(t, cp.Client.Get(context.Background(), leaseKey, &lease))
	assert.Empty(t, ptr.Deref(lease.Spec.HolderIdentity, ""), "the stopped hub still holds the Lease")
}

// startHub runs a hub with leader election on cp until ctx is done; Run's
// error comes on the channel.
func startHub(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, app.Config{
			Rest: cp.Config, LeaderElection: true, LeaderElectionNamespace: leaseKey.Namespace,
			MetricsAddress: "0", HealthAddress: "0", LogOutput: testLog{t},
		})
	}()
	return done
}

// awaitHolder waits up to timeout until the Lease has a holder other than
// those in not, and returns it.
func awaitHolder(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, timeout time.Duration, not ...string) string {
	t.Helper()
	lease, err := awaitLease(ctx, cp, timeout, func(l *coordinationv1.Lease) bool {
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		return holder != "" && !slices.Contains(not, holder)
	})
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	require.NoError(t, err, "no hub took the Lease: held by %q", holder)
	return holder
}

// awaitRenewal waits until the Lease's holder renewed it since it took it.
func awaitRenewal(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	_, err := awaitLease(ctx, cp, time.Minute, func(l *coordinationv1.Lease) bool {
		acquired, renewed := l.Spec.AcquireTime, l.Spec.RenewTime
		return acquired != nil && renewed != nil && renewed.After(acquired.Time)
	})
	require.NoError(t, err, "the hub never renewed the Lease it took")
}

// awaitLease reads the Lease until done says it is as wanted, up to
// timeout, and returns it as last read.
func awaitLease(ctx context.Context, cp *controlplane.ControlPlane, timeout time.Duration, done func(*coordinationv1.Lease) bool) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		// Read afresh: a decode leaves a field the answer lacks as it was.
		*lease = coordinationv1.Lease{}
		if err := cp.Client.Get(ctx, leaseKey, lease); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return done(lease), nil
	})
	return lease, err
}

// testLog is the hub's log in the test's.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
