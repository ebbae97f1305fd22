package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// TestDeleteVolumeReport pins that the hub, with its own credentials, can
// remove a Volume's report its agent left behind, and that doing it twice is
// harmless.
func TestDeleteVolumeReport(t *testing.T) {
	b, js, _, _ := newHub(t)
	events := collect(t, b.WatchReports)
	ctx := context.Background()
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	v, err := wire.EncodeVolumeReport(wire.VolumeReport{UID: "vol-a", Gone: true})
	require.NoError(t, err)
	_, err = reports.Put(ctx, "node1.volume.vol-a", v)
	require.NoError(t, err)
	next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Volume != nil && e.Volume.Report.Gone })

	require.NoError(t, b.DeleteVolumeReport(ctx, "node1", "vol-a"))
	ev := next(t, events, 5*time.Second, func(e bus.ReportEvent) bool { return e.Volume != nil })
	assert.True(t, ev.Volume.Deleted)
	assert.Equal(t, bus.VolumeReportEvent{Node: "node1", UID: "vol-a", Revision: ev.Volume.Revision, Deleted: true}, *ev.Volume)
	require.NoError(t, b.DeleteVolumeReport(ctx, "node1", "vol-a"), "deleting an absent report succeeds")
	require.NoError(t, b.DeleteVolumeReport(ctx, "node1", "never"), "deleting a report never written succeeds")

	var ke *wire.KeyError
	assert.ErrorAs(t, b.DeleteVolumeReport(ctx, "node1", "a.b"), &ke, "an unsafe uid is refused before anything is sent")
}
