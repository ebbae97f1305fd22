package fleet

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// events records the events a Fleet shows.
type events struct {
	mu  sync.Mutex
	got []event.Event
}

func (r *events) Event(_ runtime.Object, e event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, e)
}

func (r *events) WithAnnotations(...string) event.Recorder { return r }

func (r *events) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.got {
		out = append(out, string(e.Type)+" "+string(e.Reason)+": "+e.Message)
	}
	r.got = nil
	return out
}

// TestForeignReports pins that a node speaks only for what is placed on it:
// what it says of anything else is never read as status, cannot hasten or
// hold up a deletion, and is counted and shown once per revision.
func TestForeignReports(t *testing.T) {
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", UID: types.UID("g")}}
	spoof := func(f *testFleet, phase wire.Phase) { report("node1", "g", phase)(f.bus) }
	unspoof := func(f *testFleet) { unreport("node1", "g")(f.bus) }
	put := "Warning ForeignReport: node node1 sent a report of this VirtualMachine, which is placed on node node2; the hub ignores it"
	del := "Warning ForeignReport: node node1 deleted its report of this VirtualMachine, which is placed on node node2; the hub ignores it"

	cases := map[string]struct {
		do func(f *testFleet)
		// wantPhase is node2's report of g after do; "" means none.
		wantPhase wire.Phase
		wantFlags []string
		wantPuts  float64
		wantDels  float64
	}{
		"TheNodeItIsPlacedOnIsRead": {
			do:        func(f *testFleet) { report("node2", "g", "Running")(f.bus) },
			wantPhase: "Running",
		},
		"AnotherNodesReportIsNotReadAndIsFlaggedOnce": {
			do: func(f *testFleet) {
				report("node2", "g", "Running")(f.bus)
				spoof(f, "Failed")
				f.Guests.FlagForeign(vm, "node2")
			},
			wantPhase: "Running",
			wantFlags: []string{put},
			wantPuts:  1,
		},
		"EachRevisionOfAForeignReportIsFlagged": {
			do: func(f *testFleet) {
				spoof(f, "Failed")
				f.Guests.FlagForeign(vm, "node2")
				spoof(f, "Stopped")
			},
			wantFlags: []string{put, put},
			wantPuts:  2,
		},
		"AForeignDeleteCannotTakeThePlacedNodesReport": {
			do: func(f *testFleet) {
				report("node2", "g", "Running")(f.bus)
				spoof(f, "Failed")
				f.Guests.FlagForeign(vm, "node2")
				unspoof(f)
			},
			wantPhase: "Running",
			wantFlags: []string{put, del},
			wantPuts:  1,
			wantDels:  1,
		},
		"ADeleteOfAReportNeverHeldSaysNothing": {
			do:        unspoof,
			wantFlags: nil,
		},
		"NothingIsFlaggedBeforeItIsPlaced": {
			do: func(f *testFleet) {
				spoof(f, "Running")
				f.Guests.FlagForeign(vm)
			},
			// Flagged once the VM is placed: the check below.
			wantFlags: []string{put},
			wantPuts:  1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			metrics.ForeignReports.Reset()
			rec := &events{}
			f := newTestFleet(t, bus.NewFake())
			f.WithRecorder(rec)

			tc.do(f)
			f.Guests.FlagForeign(vm, "node2")

			assertPhase(t, f, "node2", "g", tc.wantPhase)
			assert.Equal(t, tc.wantFlags, rec.messages())
			assert.Equal(t, tc.wantPuts, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("VirtualMachine", "node1", OperationPut)))
			assert.Equal(t, tc.wantDels, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("VirtualMachine", "node1", OperationDelete)))
			f.Guests.FlagForeign(vm, "node2")
			assert.Empty(t, rec.messages(), "each report is flagged once")
		})
	}
}

// TestForeignVolumeAndImageReports pins the same for Volumes (one node) and
// images (the nodes their Volumes are on).
func TestForeignVolumeAndImageReports(t *testing.T) {
	metrics.ForeignReports.Reset()
	rec := &events{}
	f := newTestFleet(t, bus.NewFake())
	f.WithRecorder(rec)
	v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "data", UID: types.UID("v")}}
	img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "ubuntu", UID: types.UID("i")}}

	bus.SetValue(f.bus, wire.VolumeReports, "node1", "v", wire.VolumeReport{UID: "v", Gone: true})
	f.Volumes.FlagForeign(v, "node2")
	_, ok := f.Volumes.Report("node2", "v")
	assert.False(t, ok, "node1 saying the volume is gone does not make it gone on node2")

	for _, n := range []string{"node1", "node2", "node3"} {
		bus.SetValue(f.bus, wire.ImageReports, n, "i", wire.ImageReport{UID: "i", Node: n, Phase: wire.ImagePhaseReady})
	}
	f.Images.FlagForeign(img, "node2", "node3")
	assert.Equal(t, []string{"node1", "node2", "node3"}, f.Images.Reporters("i"), "every node's report is kept")

	assert.Equal(t, []string{
		"Warning ForeignReport: node node1 sent a report of this Volume, which is placed on node node2; the hub ignores it",
		"Warning ForeignReport: node node1 sent a report of this DiskImage, which is placed on node node2, node3; the hub ignores it",
	}, rec.messages())
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("Volume", "node1", OperationPut)))
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("DiskImage", "node1", OperationPut)))
}
