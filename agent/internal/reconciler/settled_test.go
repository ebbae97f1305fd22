package reconciler

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/util/workqueue"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// TestAPeriodicResync: the periodic resync observes the node's guests with
// one List and ensures only those the listing does not show as their
// intents ask.
func TestAPeriodicResync(t *testing.T) {
	cases := []struct {
		name string
		// change is made behind the reconciler's back before the resync.
		change func(h *harness)
		// ensured is whether the resync ensures the guest.
		ensured bool
		// ip is the address the guest's report shows after the resync.
		ip string
	}{
		{
			name: "reports a settled guest as listed, without an Ensure",
			change: func(h *harness) {
				h.fake.SetInterfaces("a", []driver.Interface{{Network: "net-db", MAC: "52:54:00:00:00:01", IPs: []string{"10.10.120.9"}}})
			},
			ip: "10.10.120.9",
		},
		{
			name:    "ensures a guest that is not as its intent asks",
			change:  func(h *harness) { h.fake.SetPhase("a", driver.PhaseStopped) },
			ensured: true,
			ip:      "10.10.120.7",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t)
			h.synced()
			h.put(intent("a", func(in *wire.Intent) { in.Machine.Networks[0].Address = "10.10.120.7/24" }))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			ensures := h.calls("Ensure", "a")

			tc.change(h)
			h.rec.sweep(context.Background(), true)
			if tc.ensured {
				require.Eventually(t, func() bool { return h.calls("Ensure", "a") > ensures }, 5*time.Second, 5*time.Millisecond, "the resync ensures the guest")
			}
			h.eventually("a", func(r wire.Report) bool {
				return r.Phase == wire.PhaseRunning && len(r.Interfaces) == 1 && len(r.Interfaces[0].IPs) == 1 && r.Interfaces[0].IPs[0] == tc.ip
			}, "the resync's report")
			if !tc.ensured {
				assert.Equal(t, ensures, h.calls("Ensure", "a"), "the listing stood for the Ensure")
			}
		})
	}
}

// TestAListedObservationStandsOnlyForASettledGuest pins when a periodic
// resync's observation of a guest stands in for its Ensure.
func TestAListedObservationStandsOnlyForASettledGuest(t *testing.T) {
	in := intent("a", func(in *wire.Intent) { in.Machine.Networks[0].Address = "10.10.120.7/24" })
	running := driver.Observation{UID: "a", Phase: driver.PhaseRunning, Interfaces: []driver.Interface{{Network: "net-db", IPs: []string{"10.10.120.7"}}}}
	t0 := time.Unix(1_800_000_000, 0)
	cases := []struct {
		name string
		// ensured is the observation the last Ensure returned, at t0.
		ensured driver.Observation
		// listedAt is when the resync's List began; listed what it found.
		listedAt time.Time
		listed   driver.Observation
		// then happens between the listing and the guest's reconcile.
		then func(r *Reconciler)
		// intent is the intent the guest is reconciled with.
		intent wire.Intent
		want   bool
	}{
		{name: "a settled guest listed as it was stands", ensured: running, listedAt: t0.Add(time.Second), listed: running, intent: in, want: true},
		{name: "a listing begun before the Ensure returned does not", ensured: running, listedAt: t0.Add(-time.Second), listed: running, intent: in},
		{name: "a guest listed otherwise than its intent asks does not", ensured: running, listedAt: t0.Add(time.Second), listed: driver.Observation{UID: "a", Phase: driver.PhaseStopped}, intent: in},
		{name: "a guest last ensured unsettled does not", ensured: driver.Observation{UID: "a", Phase: driver.PhaseStarting}, listedAt: t0.Add(time.Second), listed: running, intent: in},
		{name: "a guest with an interface without an address does not", ensured: running, listedAt: t0.Add(time.Second), listed: driver.Observation{UID: "a", Phase: driver.PhaseRunning, Interfaces: []driver.Interface{{Network: "net-db"}}}, intent: in},
		{name: "a changed intent does not", ensured: running, listedAt: t0.Add(time.Second), listed: running, intent: intent("a", func(in *wire.Intent) { in.Machine.Networks[0].Address = "10.10.120.7/24"; in.Generation = 2 })},
		{name: "a guest a driver event named since does not", ensured: running, listedAt: t0.Add(time.Second), listed: running, then: func(r *Reconciler) { r.forgetSettled("a") }, intent: in},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := New(node, fake.New(node), newReports(node), logging.NewNopLogger(), Options{})
			r.recordSettled(in, tc.ensured, t0)
			r.keepListed([]driver.Observation{tc.listed}, tc.listedAt)
			if tc.then != nil {
				tc.then(r)
			}
			obs, ok := r.takeListed(tc.intent)
			require.Equal(t, tc.want, ok)
			if ok {
				assert.Equal(t, tc.listed, obs)
			}
			_, again := r.takeListed(tc.intent)
			assert.False(t, again, "a listing stands once")
		})
	}
}

// TestAGuestGoneIsNoLongerRemembered: what the reconciler keeps of a
// settled guest goes with its intent, so a node's churn does not grow it.
func TestAGuestGoneIsNoLongerRemembered(t *testing.T) {
	h := start(t)
	h.synced()
	h.put(intent("a", func(in *wire.Intent) { in.Machine.Networks[0].Address = "10.10.120.7/24" }))
	h.eventually("a", phase(wire.PhaseRunning), "guest should run")
	remembered := func() bool {
		h.rec.mu.Lock()
		defer h.rec.mu.Unlock()
		_, ok := h.rec.settled["a"]
		return ok
	}
	require.True(t, remembered(), "a settled guest is remembered")

	h.del("a")
	require.Eventually(t, func() bool { return h.calls("Delete", "a") > 0 }, 5*time.Second, 5*time.Millisecond)
	assert.False(t, remembered())
}

// countingQueue counts what is added to a reconciler's queue.
type countingQueue struct {
	workqueue.TypedRateLimitingInterface[item]
	mu    sync.Mutex
	added map[item]int
}

func (q *countingQueue) Add(it item) {
	q.mu.Lock()
	q.added[it]++
	q.mu.Unlock()
	q.TypedRateLimitingInterface.Add(it)
}

func (q *countingQueue) counts() map[item]int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return maps.Clone(q.added)
}

// TestASweepQueuesEachItemOnce: a guest is the node's by its intent and by
// the listing at once, and a sweep queues it once. Queued twice, a worker
// that takes it up between the two adds reconciles it again once the
// listing's observation is taken, and a settled guest goes through Ensure
// at every periodic resync.
func TestASweepQueuesEachItemOnce(t *testing.T) {
	ctx := context.Background()
	f := fake.New(node)
	rec := New(node, f, newReports(node), logging.NewNopLogger(), Options{})
	q := &countingQueue{TypedRateLimitingInterface: rec.queue, added: map[item]int{}}
	rec.queue = q
	t.Cleanup(q.ShutDown)
	for _, uid := range []string{"a", "b"} {
		in := intent(uid)
		m, err := machine(in)
		require.NoError(t, err)
		_, err = f.Ensure(ctx, m)
		require.NoError(t, err)
		rec.guestIntent(bus.Event[wire.Intent]{UID: uid, Value: in})
	}
	rec.intentsSynced()
	before := q.counts()

	rec.sweep(ctx, true)
	after := q.counts()
	for _, uid := range []string{"a", "b"} {
		assert.Equal(t, 1, after[guest(uid)]-before[guest(uid)], "guest %s is queued once by the sweep", uid)
	}
}
