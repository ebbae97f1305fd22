package fleet

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// natsServer is a real nats-server and the hub's identity on it.
func natsServer(t *testing.T) (*natstest.Server, natswire.Identity) {
	t.Helper()
	hub, _, users := natstest.Identities(t)
	return natstest.New(t, users...), hub
}

// closedPort is an address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "nats://" + addr
}

// testPool is a pool whose dials are counted, each taking at most
// timeout.
func testPool(t *testing.T, timeout time.Duration) (*Pool, *atomic.Int32) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := NewPool(ctx, logging.NewNopLogger(), event.NewNopRecorder(), natswire.BucketConfig{}, nil)
	p.timeout = timeout
	dials := &atomic.Int32{}
	dial := p.connect
	p.connect = func(ctx context.Context, t Target) (bus.Bus, func(), error) {
		dials.Add(1)
		return dial(ctx, t)
	}
	return p, dials
}

// A tenant's ProviderConfig names an address that accepts and never
// answers; before, the hub dialled it under the one lock every controller
// and the placement loop take to find their fleet, so every VM of every
// namespace waited on it. Now its callers wait at most joinWait, and
// everyone else not at all.
func TestAServerThatNeverAnswersDelaysNoOtherTarget(t *testing.T) {
	srv, hub := natsServer(t)
	addr, accepted := natstest.BlackHole(t)
	hole := "nats://" + addr
	p, _ := testPool(t, time.Minute)

	_, err := p.Get(context.Background(), Target{URL: hole, Namespace: "tenant"})
	var connecting *ConnectingError
	require.ErrorAs(t, err, &connecting, "the tenant's caller is told to come back")
	assert.NoError(t, connecting.Last, "the first attempt is still under way")
	require.Eventually(t, func() bool { return accepted.Load() == 1 }, 10*time.Second, 10*time.Millisecond, "the hub dialled the address")

	f, err := p.Get(context.Background(), Target{URL: srv.URL(), Seed: hub.Seed})
	require.NoError(t, err, "another target connects while the first hangs")
	require.NotNil(t, f)
	assert.Equal(t, []*Fleet{f}, p.Fleets(), "the fleets are listed while the first hangs, and it is none of them")

	p.mu.Lock()
	pending := p.targets[Target{URL: hole}.key()].attempt != nil
	p.mu.Unlock()
	assert.True(t, pending, "the black hole's attempt was still under way throughout")
	_, err = p.Get(context.Background(), Target{URL: hole, Namespace: "tenant"})
	require.ErrorAs(t, err, &connecting)
	assert.Equal(t, int32(1), accepted.Load(), "a second caller joins the attempt under way, it does not dial again")
}

func TestAFailingTargetBacksOff(t *testing.T) {
	p, dials := testPool(t, 2*time.Second)
	url := closedPort(t)
	var connecting *ConnectingError
	require.Eventually(t, func() bool {
		_, err := p.Get(context.Background(), Target{URL: url})
		return errors.As(err, &connecting) && connecting.Last != nil
	}, 10*time.Second, 10*time.Millisecond, "the attempt fails")
	assert.Positive(t, connecting.RetryIn)
	assert.Contains(t, connecting.Error(), "cannot connect to NATS at "+url+" (next try in")
	for range 20 {
		_, err := p.Get(context.Background(), Target{URL: url})
		require.ErrorAs(t, err, &connecting)
		require.Error(t, connecting.Last, "the last failure is said again")
	}
	assert.Equal(t, int32(1), dials.Load(), "no caller dials again before the backoff ends")

	cases := map[string]struct {
		failures int
		min, max time.Duration
	}{
		"TheFirstFailureWaitsAboutASecond": {failures: 1, min: time.Second, max: 1200 * time.Millisecond},
		"EachMoreWaitsTwiceAsLong":         {failures: 3, min: 4 * time.Second, max: 4800 * time.Millisecond},
		"ManyWaitAFewMinutesAtMost":        {failures: 40, min: 3 * time.Minute, max: 3*time.Minute + 36*time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := retryDelay(tc.failures)
			assert.GreaterOrEqual(t, d, tc.min)
			assert.LessOrEqual(t, d, tc.max)
		})
	}
}

func TestANamespaceOpensFewTargets(t *testing.T) {
	srv, hub := natsServer(t)
	p, _ := testPool(t, time.Minute)
	ctx := context.Background()
	// The namespace's slots held by servers that never answer: each
	// attempt is under way for as long as the test.
	for i := range FleetsPerNamespace {
		addr, _ := natstest.BlackHole(t)
		_, err := p.Get(ctx, Target{URL: "nats://" + addr, Namespace: "tenant"})
		var connecting *ConnectingError
		require.ErrorAs(t, err, &connecting, "target %d of %d is tried", i+1, FleetsPerNamespace)
	}
	// In order: the targets open stay open for the next cases.
	cases := []struct {
		name    string
		target  Target
		refused bool
	}{
		{name: "OneMoreOfItsOwnIsRefused", target: Target{URL: closedPort(t), Namespace: "tenant"}, refused: true},
		{name: "AnotherNamespaceIsNotHeldBack", target: Target{URL: srv.URL(), Seed: hub.Seed, Namespace: "other"}},
		{name: "AClusterProviderConfigIsNotEither", target: Target{URL: srv.URL(), Seed: hub.Seed}},
		{name: "ATargetAlreadyOpenIsShared", target: Target{URL: srv.URL(), Seed: hub.Seed, Namespace: "tenant"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Get(ctx, tc.target)
			if tc.refused {
				var tooMany *TooManyError
				require.ErrorAs(t, err, &tooMany)
				assert.Contains(t, err.Error(), "namespace tenant")
				return
			}
			require.NoError(t, err)
		})
	}
}

// A namespace whose servers failed is not held to them: a failed target
// holds no connection, and the namespace may name others.
func TestFailedTargetsHoldNoSlot(t *testing.T) {
	p, _ := testPool(t, 2*time.Second)
	ctx := context.Background()
	for i := range FleetsPerNamespace + 2 {
		url := closedPort(t)
		require.Eventually(t, func() bool {
			_, err := p.Get(ctx, Target{URL: url, Namespace: "tenant"})
			var connecting *ConnectingError
			return errors.As(err, &connecting) && connecting.Last != nil
		}, 10*time.Second, 10*time.Millisecond, "target %d fails, and is not refused as one too many", i+1)
	}
}

// TestAHubStillReadingItsFleetRetriesQuietly pins which errors a hub that
// is starting keeps from the user: connecting with no attempt failed yet,
// and its records unread; a failed connection is the user's to see.
func TestAHubStillReadingItsFleetRetriesQuietly(t *testing.T) {
	cases := map[string]struct {
		err      error
		starting bool
	}{
		"RecordsNotRead":       {err: errors.Wrap(ErrRecordsNotSynced, "cannot observe"), starting: true},
		"FirstAttemptUnderWay": {err: &ConnectingError{URL: "nats://127.0.0.1:4222"}, starting: true},
		"AnAttemptFailed":      {err: &ConnectingError{URL: "nats://127.0.0.1:4222", Last: errors.New("connection refused"), RetryIn: time.Second}},
		"AnythingElse":         {err: errors.New("cannot publish")},
		"NoError":              {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.starting, Starting(tc.err))
			got := QuietWhileStarting(tc.err)
			assert.Equal(t, tc.starting, kerrors.IsConflict(got), "retried without a word")
			if tc.err != nil {
				assert.ErrorIs(t, got, tc.err, "the error itself is kept")
			} else {
				assert.NoError(t, got)
			}
		})
	}
}
