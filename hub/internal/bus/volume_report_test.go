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
	entries := watch(t, b, wire.BucketReports, nil)
	ctx := context.Background()
	reports, err := js.KeyValue(ctx, wire.BucketReports)
	require.NoError(t, err)
	v, err := wire.EncodeVolumeReport(wire.VolumeReport{UID: "vol-a", Gone: true})
	require.NoError(t, err)
	_, err = reports.Put(ctx, "node1.volume.vol-a", v)
	require.NoError(t, err)
	put := next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node1.volume.vol-a" })
	assert.Equal(t, v, put.Value)

	require.NoError(t, bus.Delete(ctx, b, wire.VolumeReports, "node1", "vol-a"))
	del := next(t, entries, 5*time.Second, func(e bus.Entry) bool { return e.Key == "node1.volume.vol-a" })
	assert.Equal(t, bus.Entry{Key: "node1.volume.vol-a", Revision: del.Revision, Deleted: true}, del)
	assert.Greater(t, del.Revision, put.Revision)
	require.NoError(t, bus.Delete(ctx, b, wire.VolumeReports, "node1", "vol-a"), "deleting an absent report succeeds")
	require.NoError(t, bus.Delete(ctx, b, wire.VolumeReports, "node1", "never"), "deleting a report never written succeeds")

	var ke *wire.KeyError
	assert.ErrorAs(t, bus.Delete(ctx, b, wire.VolumeReports, "node1", "a.b"), &ke, "an unsafe uid is refused before anything is sent")
}
