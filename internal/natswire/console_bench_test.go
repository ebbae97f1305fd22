package natswire_test

import (
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// BenchmarkConsoleKeystroke is the round trip of one keystroke through a
// console session, hub to node to guest and back, as a terminal echoes
// it; BenchmarkNATSEcho is the floor under it, the same two connections
// echoing one message over the same subjects with nothing of the session. Their ratio is
// what the session's framing and pacing cost a keystroke.
func BenchmarkConsoleKeystroke(b *testing.B) {
	f := newConsoleFleet(b)
	be := newBackend()
	f.serve(b, "node1", natswire.ConsoleLimits{}, be)
	s := f.dial(b, f.hub, "node1", wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleSerial})
	g := be.next(b)
	go func() { _, _ = io.Copy(g.end, g.end) }() // the guest echoes
	key := []byte{'x'}
	echo := make([]byte, 1)
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Write(key); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(s, echo); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNATSEcho(b *testing.B) {
	f := newConsoleFleet(b)
	agent, _ := natstest.Connect(b, f.srv, f.agents["node1"])
	in, err := wire.ConsoleInSubject("node1", "bench")
	require.NoError(b, err)
	out, err := wire.ConsoleOutSubject("node1", "bench")
	require.NoError(b, err)
	echo, err := agent.Subscribe(in, func(m *nats.Msg) { _ = agent.Publish(out, m.Data) })
	require.NoError(b, err)
	b.Cleanup(func() { _ = echo.Unsubscribe() })
	require.NoError(b, agent.Flush())
	replies, err := f.hub.SubscribeSync(out)
	require.NoError(b, err)
	b.Cleanup(func() { _ = replies.Unsubscribe() })
	require.NoError(b, f.hub.Flush())
	key := []byte{'x'}
	b.ResetTimer()
	for b.Loop() {
		if err := f.hub.Publish(in, key); err != nil {
			b.Fatal(err)
		}
		if _, err := replies.NextMsg(5 * time.Second); err != nil {
			b.Fatal(err)
		}
	}
}
