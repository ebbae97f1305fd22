package fleet

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	spoof := func(f *testFleet, phase wire.Phase) { f.bus.SetReport(report("node1", "g", phase)) }
	unspoof := func(f *testFleet) { f.bus.SetReport(bus.ReportEvent{Node: "node1", UID: "g", Deleted: true}) }
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
			do:        func(f *testFleet) { f.bus.SetReport(report("node2", "g", "Running")) },
			wantPhase: "Running",
		},
		"AnotherNodesReportIsNotReadAndIsFlaggedOnce": {
			do: func(f *testFleet) {
				f.bus.SetReport(report("node2", "g", "Running"))
				spoof(f, "Failed")
				f.FlagForeign(KindVM, vm, "node2")
			},
			wantPhase: "Running",
			wantFlags: []string{put},
			wantPuts:  1,
		},
		"EachRevisionOfAForeignReportIsFlagged": {
			do: func(f *testFleet) {
				spoof(f, "Failed")
				f.FlagForeign(KindVM, vm, "node2")
				spoof(f, "Stopped")
			},
			wantFlags: []string{put, put},
			wantPuts:  2,
		},
		"AForeignDeleteCannotTakeThePlacedNodesReport": {
			do: func(f *testFleet) {
				f.bus.SetReport(report("node2", "g", "Running"))
				spoof(f, "Failed")
				f.FlagForeign(KindVM, vm, "node2")
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
				f.FlagForeign(KindVM, vm)
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
			f.FlagForeign(KindVM, vm, "node2")

			r, ok := f.Report("node2", "g")
			if tc.wantPhase == "" {
				assert.False(t, ok, "no report of g from node2: %+v", r)
			} else {
				require.True(t, ok)
				assert.Equal(t, tc.wantPhase, r.Report.Phase)
			}
			assert.Equal(t, tc.wantFlags, rec.messages())
			assert.Equal(t, tc.wantPuts, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("VirtualMachine", "node1", OperationPut)))
			assert.Equal(t, tc.wantDels, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("VirtualMachine", "node1", OperationDelete)))
			f.FlagForeign(KindVM, vm, "node2")
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

	f.bus.SetVolumeReport(bus.VolumeReportEvent{Node: "node1", UID: "v", Report: wire.VolumeReport{UID: "v", Gone: true}})
	f.FlagForeign(KindVolume, v, "node2")
	_, ok := f.VolumeReport("node2", "v")
	assert.False(t, ok, "node1 saying the volume is gone does not make it gone on node2")

	for _, n := range []string{"node1", "node2", "node3"} {
		f.bus.SetImageReport(bus.ImageReportEvent{Node: n, UID: "i", Report: wire.ImageReport{UID: "i", Node: n, Phase: wire.ImagePhaseReady}})
	}
	f.FlagForeign(KindImage, img, "node2", "node3")
	got := f.ImageReports("i", "node2", "node3")
	require.Len(t, got, 2)
	assert.Equal(t, []string{"node2", "node3"}, []string{got[0].Node, got[1].Node})

	assert.Equal(t, []string{
		"Warning ForeignReport: node node1 sent a report of this Volume, which is placed on node node2; the hub ignores it",
		"Warning ForeignReport: node node1 sent a report of this DiskImage, which is placed on node node2, node3; the hub ignores it",
	}, rec.messages())
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("Volume", "node1", OperationPut)))
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.ForeignReports.WithLabelValues("DiskImage", "node1", OperationPut)))
}
