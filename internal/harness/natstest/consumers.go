package natstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// DeleteConsumers deletes every consumer of stream, as the loss of the
// server that held them does, while the watches' connections stay up. It
// fails t unless there was at least one.
func DeleteConsumers(t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	var names []string
	for c := range s.ListConsumers(ctx).Info() {
		names = append(names, c.Name)
	}
	require.NotEmpty(t, names, "stream %s has consumers", stream)
	for _, name := range names {
		require.NoError(t, s.DeleteConsumer(ctx, name))
	}
}
