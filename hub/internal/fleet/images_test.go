package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// imageFleet runs a Fleet over a fake bus and records the image uids its
// Images subscribers are called with.
type imageFleet struct {
	*Fleet
	bus *bus.Fake

	mu    sync.Mutex
	woken []string
}

func startImageFleet(t *testing.T) *imageFleet {
	t.Helper()
	b := bus.NewFake()
	f := &imageFleet{Fleet: New(b, logging.NewNopLogger()), bus: b}
	f.Images.Subscribe(func(uid string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.woken = append(f.woken, uid)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *imageFleet) wokenFor(uid string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.woken {
		if w == uid {
			n++
		}
	}
	return n
}

func (f *imageFleet) report(node, uid string, phase wire.ImagePhase, size int64, msg string) {
	bus.SetValue(f.bus, wire.ImageReports, node, uid, wire.ImageReport{
		UID: uid, Node: node, Phase: phase, SizeBytes: size, Message: msg,
	})
}

func (f *imageFleet) gone(node, uid string) {
	bus.DeleteValue(f.bus, wire.ImageReports, node, uid)
}

// reported is the nodes and phases Images.All returns for uid.
func (f *imageFleet) reported(uid string) map[string]wire.ImagePhase {
	out := map[string]wire.ImagePhase{}
	for _, r := range f.Images.All(uid) {
		out[r.Node] = r.Report.Phase
	}
	return out
}

func TestImageReports(t *testing.T) {
	cases := map[string]func(t *testing.T, f *imageFleet){
		"ReportsAreKeptPerNodeAndSortedByNode": func(t *testing.T, f *imageFleet) {
			f.report("node2", "img-1", wire.ImagePhaseReady, 4, "")
			f.report("node1", "img-1", wire.ImagePhaseImporting, 0, "importing image ubuntu: 1 of 4 bytes")
			f.report("node1", "img-2", wire.ImagePhaseReady, 8, "")
			require.Eventually(t, func() bool { return len(f.Images.All("img-1")) == 2 }, 5*time.Second, 5*time.Millisecond)
			got := f.Images.All("img-1")
			assert.Equal(t, []string{"node1", "node2"}, []string{got[0].Node, got[1].Node})
			assert.Equal(t, "importing image ubuntu: 1 of 4 bytes", got[0].Report.Message)
			assert.Equal(t, int64(4), got[1].Report.SizeBytes)
			assert.False(t, got[1].ReceivedAt.IsZero())
			assert.Equal(t, map[string]wire.ImagePhase{"node1": wire.ImagePhaseReady}, f.reported("img-2"), "another image's reports are its own")
		},
		"ALaterReportReplacesTheNodesEarlierOne": func(t *testing.T, f *imageFleet) {
			f.report("node1", "img-1", wire.ImagePhaseImporting, 0, "importing")
			f.report("node1", "img-1", wire.ImagePhaseReady, 4, "")
			require.Eventually(t, func() bool { return f.reported("img-1")["node1"] == wire.ImagePhaseReady }, 5*time.Second, 5*time.Millisecond)
			assert.Len(t, f.Images.All("img-1"), 1)
		},
		"ADeletedReportTakesOnlyThatNodesCopy": func(t *testing.T, f *imageFleet) {
			f.report("node1", "img-1", wire.ImagePhaseReady, 4, "")
			f.report("node2", "img-1", wire.ImagePhaseReady, 4, "")
			f.gone("node1", "img-1")
			require.Eventually(t, func() bool { return len(f.Images.All("img-1")) == 1 }, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, map[string]wire.ImagePhase{"node2": wire.ImagePhaseReady}, f.reported("img-1"))
			f.gone("node2", "img-1")
			require.Eventually(t, func() bool { return len(f.Images.All("img-1")) == 0 }, 5*time.Second, 5*time.Millisecond)
			assert.NotNil(t, f.Images.All("img-1"), "no reports is an empty list")
		},
		"EveryChangeWakesTheImagesSubscribers": func(t *testing.T, f *imageFleet) {
			f.report("node1", "img-1", wire.ImagePhaseImporting, 0, "importing")
			require.Eventually(t, func() bool { return f.wokenFor("img-1") == 1 }, 5*time.Second, 5*time.Millisecond)
			f.report("node1", "img-1", wire.ImagePhaseReady, 4, "")
			require.Eventually(t, func() bool { return f.wokenFor("img-1") == 2 }, 5*time.Second, 5*time.Millisecond)
			f.gone("node1", "img-1")
			require.Eventually(t, func() bool { return f.wokenFor("img-1") == 3 }, 5*time.Second, 5*time.Millisecond)
			assert.Zero(t, f.wokenFor("img-2"))
		},
		"ImageReportsAreNotGuestOrVolumeReports": func(t *testing.T, f *imageFleet) {
			f.report("node1", "img-1", wire.ImagePhaseReady, 4, "")
			require.Eventually(t, func() bool { return len(f.Images.All("img-1")) == 1 }, 5*time.Second, 5*time.Millisecond)
			_, isGuest := f.Guests.Report("node1", "img-1")
			_, isVolume := f.Volumes.Report("node1", "img-1")
			assert.False(t, isGuest)
			assert.False(t, isVolume)
		},
		"ALostNodesImagesStayListed": func(t *testing.T, f *imageFleet) {
			f.bus.SetNode(bus.NodeEvent{Node: "node1", Heartbeat: wire.NodeHeartbeat{Node: "node1"}})
			f.report("node1", "img-1", wire.ImagePhaseReady, 4, "")
			f.bus.SetNode(bus.NodeEvent{Node: "node1", Lost: true})
			require.Eventually(t, func() bool { return f.Node("node1").Lost }, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, map[string]wire.ImagePhase{"node1": wire.ImagePhaseReady}, f.reported("img-1"), "the image is still on the lost node's disk")
		},
		"ReportsWrittenBeforeTheWatchStartedAreDelivered": func(t *testing.T, f *imageFleet) {
			// The fake's watch delivers the current state first, as a
			// restarted hub reads the bucket.
			b := bus.NewFake()
			bus.SetValue(b, wire.ImageReports, "node3", "img-9", wire.ImageReport{UID: "img-9", Node: "node3", Phase: wire.ImagePhaseReady})
			g := New(b, logging.NewNopLogger())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { g.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			require.Eventually(t, func() bool { return len(g.Images.All("img-9")) == 1 }, 5*time.Second, 5*time.Millisecond)
		},
	}
	for name, run := range cases {
		t.Run(name, func(t *testing.T) { run(t, startImageFleet(t)) })
	}
}
