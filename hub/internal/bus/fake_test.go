package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

func TestFakeKeepsTheBusContract(t *testing.T) {
	f := bus.NewFake()
	ctx := context.Background()
	in := wire.Intent{UID: "vm-a", Generation: 1}
	rev1, err := bus.Put(ctx, f, wire.GuestIntents, "node1", in.UID, in)
	require.NoError(t, err)
	rev2, err := bus.Put(ctx, f, wire.GuestIntents, "node1", in.UID, in)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replayed write changes nothing")
	_, err = bus.Put(ctx, f, wire.GuestIntents, "node1", "vm*", wire.Intent{UID: "vm*", Generation: 1})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)
	got, ok := bus.Stored(f, wire.GuestIntents, "node1", "vm-a")
	require.True(t, ok)
	assert.Equal(t, wire.ProtocolVersion, got.ProtocolVersion, "stored as encoded")

	f.SetNode(bus.NodeEvent{Node: "node1"})
	events := collect(t, f.WatchNodes)
	assert.Equal(t, "node1", next(t, events, time.Second, func(bus.NodeEvent) bool { return true }).Node, "current state first")
	f.SetNode(bus.NodeEvent{Node: "node1", Lost: true})
	assert.True(t, next(t, events, time.Second, func(bus.NodeEvent) bool { return true }).Lost)

	require.NoError(t, bus.Delete(ctx, f, wire.GuestIntents, "node1", "vm-a"))
	_, ok = bus.Stored(f, wire.GuestIntents, "node1", "vm-a")
	assert.False(t, ok)

	f.SetDown(assert.AnError)
	_, err = bus.Put(ctx, f, wire.GuestIntents, "node1", in.UID, in)
	assert.ErrorIs(t, err, assert.AnError, "a server away fails every write")
}

// TestFakePlaysTheAgents: what a test writes as an agent reaches the
// watchers of its bucket, current state first, and what they refuse is
// counted.
func TestFakePlaysTheAgents(t *testing.T) {
	f := bus.NewFake()
	bus.SetValue(f, wire.VolumeReports, "node1", "vol-a", wire.VolumeReport{UID: "vol-a", Gone: true})
	entries := watch(t, f, wire.BucketReports, func(e bus.Entry) error {
		if e.Key == "node1.refused" {
			return &wire.KeyError{What: "key", Value: e.Key}
		}
		return nil
	})
	first := next(t, entries, time.Second, func(bus.Entry) bool { return true })
	assert.Equal(t, "node1.volume.vol-a", first.Key, "current state first")
	assert.True(t, next(t, entries, time.Second, func(bus.Entry) bool { return true }).Synced, "then synced")

	bus.DeleteValue(f, wire.VolumeReports, "node1", "vol-a")
	del := next(t, entries, time.Second, func(bus.Entry) bool { return true })
	assert.Equal(t, bus.Entry{Key: "node1.volume.vol-a", Revision: del.Revision, Deleted: true}, del)

	f.Set(wire.BucketReports, "node1.refused", []byte("{}"))
	assert.Equal(t, uint64(1), f.Rejections().Count(natswire.ReasonKey))
}
