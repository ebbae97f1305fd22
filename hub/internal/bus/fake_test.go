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

func TestFakeKeepsTheBusContract(t *testing.T) {
	f := bus.NewFake()
	ctx := context.Background()
	in := wire.Intent{UID: "vm-a", Generation: 1}
	rev1, err := f.PutIntent(ctx, "node1", in)
	require.NoError(t, err)
	rev2, err := f.PutIntent(ctx, "node1", in)
	require.NoError(t, err)
	assert.Equal(t, rev1, rev2, "replayed write changes nothing")
	_, err = f.PutIntent(ctx, "node1", wire.Intent{UID: "vm*", Generation: 1})
	var ke *wire.KeyError
	assert.ErrorAs(t, err, &ke)

	f.SetNode(bus.NodeEvent{Node: "node1"})
	events := collect(t, f.WatchNodes)
	assert.Equal(t, "node1", next(t, events, time.Second, func(bus.NodeEvent) bool { return true }).Node, "current state first")
	f.SetNode(bus.NodeEvent{Node: "node1", Lost: true})
	assert.True(t, next(t, events, time.Second, func(bus.NodeEvent) bool { return true }).Lost)

	require.NoError(t, f.DeleteIntent(ctx, "node1", "vm-a"))
	_, ok := f.Intent("node1", "vm-a")
	assert.False(t, ok)
}
