package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// calls records what subscribers were called with.
type calls struct {
	mu   sync.Mutex
	args []string
}

func (c *calls) record(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.args = append(c.args, s)
}

func (c *calls) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.args)
}

// take returns the calls so far and forgets them.
func (c *calls) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.args
	c.args = nil
	return a
}

// testFleet is a Fleet over a fake bus on a settable clock, with every kind
// of subscriber recorded.
type testFleet struct {
	*Fleet
	bus                              *bus.Fake
	clock                            *clock
	guests, volumes, snapshots, node *calls
}

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// newTestFleet runs a Fleet over b until the test ends. It returns once both
// watches deliver; whatever b held before is delivered by then.
func newTestFleet(t *testing.T, b *bus.Fake) *testFleet {
	t.Helper()
	c := &clock{t: t0}
	f := New(b, logging.NewNopLogger())
	f.now, f.started = c.now, t0
	tf := &testFleet{Fleet: f, bus: b, clock: c, guests: &calls{}, volumes: &calls{}, snapshots: &calls{}, node: &calls{}}
	f.Guests.Subscribe(tf.guests.record)
	f.Volumes.Subscribe(tf.volumes.record)
	f.Snapshots.Subscribe(tf.snapshots.record)
	f.SubscribeNodes(tf.node.record)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// Both fake watches deliver the current state when they start: a
	// sentinel in each says they have.
	b.SetNode(bus.NodeEvent{Node: "sentinel", Lost: true})
	bus.DeleteValue(b, wire.GuestReports, "sentinel", "sentinel")
	require.Eventually(t, func() bool {
		return f.Node("sentinel").Lost && tf.guests.count() > 0
	}, 5*time.Second, time.Millisecond)
	tf.guests.take()
	return tf
}

func heartbeat(node string, vcpu int64) bus.NodeEvent {
	return bus.NodeEvent{Node: node, Heartbeat: wire.NodeHeartbeat{
		Backend:  "libvirt",
		Labels:   map[string]string{"kubernetes.io/hostname": node},
		Capacity: wire.Resources{VCPU: vcpu, MemoryBytes: 8 << 30},
	}}
}

// report plays node's agent reporting guest uid in phase.
func report(node, uid string, phase wire.Phase) func(*bus.Fake) {
	return func(b *bus.Fake) {
		bus.SetValue(b, wire.GuestReports, node, uid, wire.Report{UID: uid, Node: node, Phase: phase})
	}
}

// unreport plays node's agent deleting its report of guest uid.
func unreport(node, uid string) func(*bus.Fake) {
	return func(b *bus.Fake) { bus.DeleteValue(b, wire.GuestReports, node, uid) }
}

// assertPhase asserts that node's report of guest uid says phase, or with
// phase "" that there is none, and returns the report.
func assertPhase(t *testing.T, f *testFleet, node, uid string, phase wire.Phase) (Report[wire.Report], bool) {
	t.Helper()
	r, ok := f.Guests.Report(node, uid)
	if phase == "" {
		assert.False(t, ok, "no report of %s from %s: %+v", uid, node, r)
		return r, false
	}
	require.True(t, ok, "a report of %s from %s", uid, node)
	assert.Equal(t, phase, r.Report.Phase)
	return r, true
}

// entry is the entry of node's value v of kind k about uid, as the report
// watch delivers it; with v nil, of its deletion.
func entry[R any](k wire.Kind[R], node, uid string, v *R) bus.Entry {
	key, err := k.Key(node, uid)
	if err != nil {
		panic(err)
	}
	if v == nil {
		return bus.Entry{Key: key, Deleted: true}
	}
	value, err := k.Encode(*v)
	if err != nil {
		panic(err)
	}
	return bus.Entry{Key: key, Value: value}
}

func TestReports(t *testing.T) {
	cases := map[string]struct {
		events []func(*bus.Fake)
		// wantPhase is the phase of guest "g" after; "" means no report.
		wantPhase   wire.Phase
		wantCalls   []string
		wantVolumes []string
	}{
		"AReportIsKeptAndItsGuestNotified": {
			events:    []func(*bus.Fake){report("node1", "g", "Running")},
			wantPhase: "Running",
			wantCalls: []string{"g"},
		},
		"TheLatestReportWins": {
			events:    []func(*bus.Fake){report("node1", "g", "Starting"), report("node1", "g", "Running")},
			wantPhase: "Running",
			wantCalls: []string{"g", "g"},
		},
		"ADeletedReportIsForgottenAndItsGuestNotified": {
			events:    []func(*bus.Fake){report("node1", "g", "Running"), unreport("node1", "g")},
			wantCalls: []string{"g", "g"},
		},
		"AVolumeReportNotifiesVolumesOnly": {
			events: []func(*bus.Fake){func(b *bus.Fake) {
				bus.SetValue(b, wire.VolumeReports, "node1", "g", wire.VolumeReport{UID: "g", Gone: true})
			}},
			// A Volume's uid names no guest.
			wantVolumes: []string{"g"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newTestFleet(t, bus.NewFake())
			for _, play := range tc.events {
				play(f.bus)
			}

			if r, ok := assertPhase(t, f, "node1", "g", tc.wantPhase); ok {
				assert.Equal(t, "node1", r.Node)
				assert.Equal(t, t0, r.ReceivedAt, "received at the fleet's time")
			}
			assert.Equal(t, tc.wantCalls, f.guests.take(), "guest subscribers")
			assert.Equal(t, tc.wantVolumes, f.volumes.take(), "volume subscribers")
		})
	}
}

func TestVolumeReports(t *testing.T) {
	f := newTestFleet(t, bus.NewFake())

	bus.SetValue(f.bus, wire.VolumeReports, "node1", "v", wire.VolumeReport{UID: "v", Message: "in use"})
	r, ok := f.Volumes.Report("node1", "v")
	require.True(t, ok)
	assert.Equal(t, "in use", r.Report.Message)
	assert.False(t, r.Report.Gone)

	f.clock.advance(time.Second)
	bus.SetValue(f.bus, wire.VolumeReports, "node1", "v", wire.VolumeReport{UID: "v", Gone: true})
	r, ok = f.Volumes.Report("node1", "v")
	require.True(t, ok)
	assert.True(t, r.Report.Gone, "the latest report wins")
	assert.Equal(t, "node1", r.Node)
	assert.Equal(t, t0.Add(time.Second), r.ReceivedAt)

	bus.DeleteValue(f.bus, wire.VolumeReports, "node1", "v")
	_, ok = f.Volumes.Report("node1", "v")
	assert.False(t, ok, "a deleted report is forgotten")

	assert.Equal(t, []string{"v", "v", "v"}, f.volumes.take(), "every change notifies the Volume")
	assert.Empty(t, f.guests.take(), "guests are not told about Volumes")
	_, ok = f.Guests.Report("node1", "v")
	assert.False(t, ok, "a Volume report is no guest report")
}

func TestReportsPresentAtStartAreDelivered(t *testing.T) {
	b := bus.NewFake()
	report("node1", "g", "Running")(b)
	bus.SetValue(b, wire.VolumeReports, "node1", "v", wire.VolumeReport{UID: "v", Gone: true})
	b.SetNode(heartbeat("node1", 4))

	f := newTestFleet(t, b)

	_, ok := f.Guests.Report("node1", "g")
	assert.True(t, ok, "a guest report stored before the hub started")
	_, ok = f.Volumes.Report("node1", "v")
	assert.True(t, ok, "a Volume report stored before the hub started")
	assert.Contains(t, f.volumes.take(), "v", "Volume subscribers hear of reports present at start")
	assert.False(t, f.Node("node1").Lost)
}

func TestNodes(t *testing.T) {
	f := newTestFleet(t, bus.NewFake())
	report("node1", "on-1", "Running")(f.bus)
	report("node2", "on-2", "Running")(f.bus)
	bus.SetValue(f.bus, wire.SnapshotReports, "node1", "snap-1", wire.SnapshotReport{UID: "snap-1", Node: "node1", VM: "on-1", Phase: wire.SnapshotPhaseReady})
	bus.SetValue(f.bus, wire.VolumeReports, "node1", "vol-1", wire.VolumeReport{UID: "vol-1"})
	f.guests.take()
	require.Equal(t, []string{"snap-1"}, f.snapshots.take())
	f.volumes.take()

	t.Run("AHeartbeatMakesANodeLiveAndJoinsIt", func(t *testing.T) {
		f.bus.SetNode(heartbeat("node1", 4))
		f.bus.SetNode(heartbeat("node2", 8))
		n := f.Node("node1")
		assert.False(t, n.Lost)
		assert.Equal(t, t0, n.LastSeen)
		assert.Equal(t, int64(4), n.Heartbeat.Capacity.VCPU)
		assert.Equal(t, []string{"node1", "node2"}, f.node.take(), "node subscribers hear of joins")
		assert.ElementsMatch(t, []string{"on-1", "on-2"}, f.guests.take(), "guests hear that their node is known")
		assert.Equal(t, []string{"snap-1"}, f.snapshots.take(), "so do snapshots")
	})

	t.Run("ARepeatedHeartbeatRefreshesButNotifiesNobody", func(t *testing.T) {
		f.clock.advance(2 * time.Second)
		f.bus.SetNode(heartbeat("node1", 4))
		n := f.Node("node1")
		assert.Equal(t, t0.Add(2*time.Second), n.LastSeen)
		assert.Empty(t, f.node.take())
		assert.Empty(t, f.guests.take())
	})

	t.Run("MoreRoomNotifiesNodeSubscribersButNoGuest", func(t *testing.T) {
		f.bus.SetNode(heartbeat("node1", 6))
		assert.Equal(t, int64(6), f.Node("node1").Heartbeat.Capacity.VCPU)
		assert.Equal(t, []string{"node1"}, f.node.take(), "guests waiting for room may fit now")
		assert.Empty(t, f.guests.take())
		f.bus.SetNode(heartbeat("node1", 6))
		assert.Empty(t, f.node.take(), "the same room again is no news")
	})

	t.Run("AHeartbeatLateEnoughForPlacementToPassTheNodeOverBringsItBack", func(t *testing.T) {
		f.clock.advance(placement.DefaultStaleAfter + time.Second)
		f.bus.SetNode(heartbeat("node1", 6))
		assert.Equal(t, []string{"node1"}, f.node.take(), "guests waiting for a node may fit on it again")
		assert.Empty(t, f.guests.take())
	})

	t.Run("LiveNodesAreOfferedToPlacementSortedByName", func(t *testing.T) {
		nodes := f.Nodes()
		require.Len(t, nodes, 2, "the lost sentinel is not offered")
		assert.Equal(t, "node1", nodes[0].Name)
		assert.Equal(t, placement.Resources{VCPU: 6, MemoryBytes: 8 << 30}, nodes[0].Capacity)
		assert.Equal(t, "libvirt", nodes[0].Backend)
		assert.Equal(t, "node2", nodes[1].Name)
	})

	t.Run("AnExpiredHeartbeatLosesTheNodeAndNotifiesItsGuests", func(t *testing.T) {
		f.clock.advance(10 * time.Second)
		lostAt := f.clock.now()
		f.bus.SetNode(bus.NodeEvent{Node: "node1", Lost: true})
		n := f.Node("node1")
		assert.True(t, n.Lost)
		assert.Equal(t, lostAt, n.LostSince)
		assert.Equal(t, int64(6), n.Heartbeat.Capacity.VCPU, "the last heartbeat is kept")
		assert.Equal(t, []string{"on-1"}, f.guests.take(), "only the lost node's guests")
		assert.Equal(t, []string{"snap-1"}, f.snapshots.take(), "and its snapshots, which cannot be restored while it is lost")
		assert.Empty(t, f.volumes.take(), "a Volume's state does not follow its node's liveness")
		assert.Empty(t, f.node.take(), "a lost node joins nothing")
		assert.Len(t, f.Nodes(), 1)
		assert.Equal(t, "node2", f.Nodes()[0].Name)
	})

	t.Run("ARepeatedLossKeepsWhenTheNodeWasLost", func(t *testing.T) {
		since := f.Node("node1").LostSince
		f.clock.advance(5 * time.Second)
		f.bus.SetNode(bus.NodeEvent{Node: "node1", Lost: true})
		assert.Equal(t, since, f.Node("node1").LostSince)
		assert.Empty(t, f.guests.take())
	})

	t.Run("AHeartbeatBringsALostNodeBack", func(t *testing.T) {
		f.bus.SetNode(heartbeat("node1", 6))
		n := f.Node("node1")
		assert.False(t, n.Lost)
		assert.True(t, n.LostSince.IsZero())
		assert.Equal(t, []string{"node1"}, f.node.take(), "waiting guests may fit on it again")
		assert.Equal(t, []string{"on-1"}, f.guests.take())
		assert.Equal(t, []string{"snap-1"}, f.snapshots.take())
	})
}

func TestAnUnknownNode(t *testing.T) {
	cases := map[string]struct {
		sinceStart time.Duration
		wantLost   bool
	}{
		"IsNotLostWhileLiveNodesMayStillBeUnheardOf": {sinceStart: natswire.DefaultNodeTTL - time.Second},
		"IsLostOnceEveryLiveNodeHasHadTimeToBeHeard": {sinceStart: natswire.DefaultNodeTTL + time.Second, wantLost: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newTestFleet(t, bus.NewFake())
			f.clock.advance(tc.sinceStart)
			n := f.Node("never-heard")
			assert.Equal(t, tc.wantLost, n.Lost)
			if tc.wantLost {
				assert.Equal(t, t0.Add(f.unknownAfter), n.LostSince, "lost since it should have been heard")
			}
			assert.Empty(t, f.Nodes(), "an unknown node is never offered")
		})
	}
}
