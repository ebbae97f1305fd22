package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver/fake"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

func TestWriterWritesOnlyWhatChanged(t *testing.T) {
	ctx := t.Context()
	r := newReports(node)
	key, err := wire.VolumeReports.Key(node, "vol-a")
	require.NoError(t, err)
	var counted []int
	w := newWriter(wire.VolumeReports, r, func(written map[string]wire.VolumeReport) { counted = append(counted, len(written)) })

	rep := wire.VolumeReport{UID: "vol-a", Message: "importing", ObservedAt: time.Unix(1, 0).UTC()}
	require.NoError(t, w.put(ctx, "vol-a", rep))
	rep.ObservedAt = time.Unix(2, 0).UTC()
	require.NoError(t, w.put(ctx, "vol-a", rep))
	assert.Equal(t, 1, r.Writes(key), "a report that says the same but when is not written")
	rep.Message = "imported"
	require.NoError(t, w.put(ctx, "vol-a", rep))
	assert.Equal(t, 2, r.Writes(key))
	got, _ := r.volume("vol-a")
	assert.Equal(t, "imported", got.Message)

	require.Error(t, w.put(ctx, "vol-b", rep), "a report under another uid's key is refused")
	last, _ := w.last("vol-a")
	assert.Equal(t, rep, last, "what is remembered is what was written")
	assert.Equal(t, []string{"vol-a"}, w.uids())

	require.NoError(t, w.delete(ctx, "vol-a"))
	_, ok := r.volume("vol-a")
	assert.False(t, ok)
	assert.Empty(t, w.uids())
	assert.Equal(t, []int{0, 1, 1, 0}, counted, "changed sees every change, from the start")
}

func TestGuestReportsAreTheNodesAndSayWhenObserved(t *testing.T) {
	now := time.Unix(100, 0).UTC()
	reports := newReports(node)
	rec := New(node, fake.New(node), reports, logging.NewNopLogger(), Options{Now: func() time.Time { return now }})

	require.NoError(t, rec.report(t.Context(), wire.Report{UID: "a", Phase: wire.PhaseRunning}))
	got, ok := reports.get("a")
	require.True(t, ok)
	assert.Equal(t, node, got.Node)
	assert.Equal(t, now, got.ObservedAt)

	now = now.Add(time.Minute)
	withLastSeen := wire.Report{UID: "a", Phase: wire.PhaseRunning, Interfaces: []wire.Interface{{Network: "net-db", LastSeen: now}}}
	require.NoError(t, rec.report(t.Context(), withLastSeen))
	now = now.Add(time.Minute)
	withLastSeen.Interfaces[0].LastSeen = now
	require.NoError(t, rec.report(t.Context(), withLastSeen))
	assert.Equal(t, 2, reports.putCount("a"), "a new address's LastSeen alone is no change")
}

// TestWriterLastOrStored: what this process wrote is what it goes by;
// before it wrote anything, what an earlier agent stored; and nothing for
// a value it cannot read.
func TestWriterLastOrStored(t *testing.T) {
	ctx := t.Context()
	earlier := wire.SnapshotReport{UID: "s1", Node: node, VM: "a", Phase: wire.SnapshotPhaseFailed, Message: "no room"}
	cases := map[string]struct {
		stored     []byte // as an earlier agent left it; nil for none
		write      *wire.SnapshotReport
		want       wire.SnapshotPhase
		wantStored bool
	}{
		"NothingAnywhereIsNothing": {},
		"AnEarlierAgentsReportIsRead": {
			stored: mustEncode(t, earlier), want: wire.SnapshotPhaseFailed, wantStored: true,
		},
		"ThisProcesssWriteWins": {
			stored: mustEncode(t, earlier), write: &wire.SnapshotReport{UID: "s1", VM: "a", Phase: wire.SnapshotPhaseReady}, want: wire.SnapshotPhaseReady,
		},
		"AReportOfANewerProtocolIsNothingToGoBy": {
			stored: []byte(`{"protocolVersion":99,"uid":"s1","node":"node1","phase":"Ready"}`),
		},
		"AReportOfAnotherSnapshotIsNothingToGoBy": {
			stored: mustEncode(t, wire.SnapshotReport{UID: "s2", Node: node, VM: "a", Phase: wire.SnapshotPhaseReady}),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := newReports(node)
			if tc.stored != nil {
				key, err := wire.SnapshotReports.Key(node, "s1")
				require.NoError(t, err)
				_, err = r.Put(ctx, key, tc.stored)
				require.NoError(t, err)
			}
			w := newWriter(wire.SnapshotReports, r, nil)
			if tc.write != nil {
				tc.write.Node = node
				require.NoError(t, w.put(ctx, "s1", *tc.write))
			}
			got, stored, err := w.lastOrStored(ctx, "s1")
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Phase)
			assert.Equal(t, tc.wantStored, stored)
		})
	}
}

func mustEncode(t *testing.T, r wire.SnapshotReport) []byte {
	t.Helper()
	b, err := wire.EncodeSnapshotReport(r)
	require.NoError(t, err)
	return b
}
