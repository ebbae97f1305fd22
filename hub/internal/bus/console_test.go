package bus_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// TestOpenConsoleOverNATS opens a console through the bus to node1's agent
// serving its consoles on a real nats-server, with the permissions each has
// in production.
func TestOpenConsoleOverNATS(t *testing.T) {
	b, _, srv, agents := newHub(t)
	nc, _ := natstest.Connect(t, srv, agents["node1"])
	guests := make(chan net.Conn, 1)
	open := func(_ context.Context, o wire.ConsoleOpen) (io.ReadWriteCloser, error) {
		if o.UID != "vm-a" {
			return nil, &natswire.ConsoleRefusedError{Reason: wire.ConsoleNotFound, Message: "no guest " + o.UID}
		}
		agentEnd, guestEnd := net.Pipe()
		guests <- guestEnd
		return agentEnd, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- natswire.ServeConsoles(ctx, nc, "node1", natswire.ConsoleLimits{}, logging.NewNopLogger(), open)
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool { return nc.NumSubscriptions() > 0 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, nc.Flush())

	_, err := b.OpenConsole(context.Background(), "node1", wire.ConsoleOpen{UID: "vm-b", Kind: wire.ConsoleSerial})
	var re *natswire.ConsoleRefusedError
	require.ErrorAs(t, err, &re, "the node's refusal comes through")
	assert.Equal(t, wire.ConsoleNotFound, re.Reason)

	s, err := b.OpenConsole(context.Background(), "node1", wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleSerial})
	require.NoError(t, err)
	defer s.Close()
	var guest net.Conn
	select {
	case guest = <-guests:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not open the console")
	}
	defer guest.Close()

	go func() { _, _ = s.Write([]byte("root\n")) }()
	got := make([]byte, 5)
	_, err = io.ReadFull(guest, got)
	require.NoError(t, err)
	assert.Equal(t, "root\n", string(got))
	go func() { _, _ = guest.Write([]byte("login: ")) }()
	got = make([]byte, 7)
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	assert.Equal(t, "login: ", string(got))
}

func TestFakeOpenConsole(t *testing.T) {
	stream := &struct{ io.ReadWriteCloser }{}
	var got wire.ConsoleOpen
	answer := func(node string, o wire.ConsoleOpen) (io.ReadWriteCloser, error) {
		got = o
		if node != "node1" {
			return nil, &natswire.ConsoleRefusedError{Reason: wire.ConsoleNotFound}
		}
		return stream, nil
	}
	cases := map[string]struct {
		hook       func(string, wire.ConsoleOpen) (io.ReadWriteCloser, error)
		down       error
		node       string
		open       wire.ConsoleOpen
		wantStream bool
		wantErr    func(t *testing.T, err error)
	}{
		"AnswersWithTheHooksStream": {hook: answer, node: "node1", open: wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleVNC}, wantStream: true},
		"PassesTheHooksRefusal": {hook: answer, node: "node2", open: wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleVNC}, wantErr: func(t *testing.T, err error) {
			var re *natswire.ConsoleRefusedError
			require.ErrorAs(t, err, &re)
		}},
		"WithoutAHookNoNodeAnswers": {node: "node1", open: wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleVNC}, wantErr: func(t *testing.T, err error) {
			assert.ErrorContains(t, err, "did not answer")
		}},
		"RefusesAnUnsafeUID": {hook: answer, node: "node1", open: wire.ConsoleOpen{UID: "vm.a", Kind: wire.ConsoleVNC}, wantErr: func(t *testing.T, err error) {
			var ke *wire.KeyError
			require.ErrorAs(t, err, &ke)
		}},
		"RefusesAnUnknownKind": {hook: answer, node: "node1", open: wire.ConsoleOpen{UID: "vm-a", Kind: "spice"}, wantErr: func(t *testing.T, err error) {
			var de *wire.DecodeError
			require.ErrorAs(t, err, &de)
		}},
		"RefusesAnInvalidNode": {hook: answer, node: "", open: wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleVNC}, wantErr: func(t *testing.T, err error) {
			var ke *wire.KeyError
			require.ErrorAs(t, err, &ke)
		}},
		"FailsWhileTheServerIsAway": {hook: answer, down: errors.New("no servers"), node: "node1", open: wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleVNC}, wantErr: func(t *testing.T, err error) {
			assert.ErrorContains(t, err, "no servers")
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got = wire.ConsoleOpen{}
			f := bus.NewFake()
			f.Consoles = tc.hook
			f.SetDown(tc.down)
			s, err := f.OpenConsole(context.Background(), tc.node, tc.open)
			if tc.wantErr != nil {
				require.Error(t, err)
				tc.wantErr(t, err)
				return
			}
			require.NoError(t, err)
			assert.Same(t, stream, s)
			assert.Equal(t, wire.ProtocolVersion, got.ProtocolVersion)
			assert.Equal(t, tc.open.UID, got.UID)
			assert.NoError(t, wire.ValidateToken("session", got.Session), "an open without a session gets one")
		})
	}
}
