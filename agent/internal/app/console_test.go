package app

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// consoler is a driver.Consoler that answers every open with err, or a pipe
// whose other end it keeps.
type consoler struct {
	err error

	mu       sync.Mutex
	uid      string
	kind     driver.ConsoleKind
	guestEnd net.Conn
}

func (c *consoler) OpenConsole(_ context.Context, uid string, kind driver.ConsoleKind) (io.ReadWriteCloser, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.uid, c.kind = uid, kind
	if c.err != nil {
		return nil, c.err
	}
	agentEnd, guestEnd := net.Pipe()
	c.guestEnd = guestEnd
	return agentEnd, nil
}

// TestConsoleRefusalsFollowTheDriversErrors opens consoles from the hub's
// side, over a real nats-server, of an agent whose driver answers with each
// kind of error: the hub reads the refusal the error means.
func TestConsoleRefusalsFollowTheDriversErrors(t *testing.T) {
	hub, agents, users := natstest.Identities(t, "n1")
	srv := natstest.New(t, users...)
	hubConn, _ := natstest.Connect(t, srv, hub)

	cases := map[string]struct {
		err         error
		wantReason  wire.ConsoleRefusal
		wantMessage string
	}{
		"NoSuchGuestIsNotFound": {
			err:        driver.NotFoundf("no domain vm-a"),
			wantReason: wire.ConsoleNotFound, wantMessage: "no domain vm-a",
		},
		"ATerminalErrorIsUnavailable": {
			err:        errors.Wrap(driver.Terminalf("guest vm-a is not running"), "cannot open console"),
			wantReason: wire.ConsoleUnavailable, wantMessage: "cannot open console: guest vm-a is not running",
		},
		"AnyOtherErrorFails": {
			err:        errors.New("libvirtd is restarting"),
			wantReason: wire.ConsoleFailed, wantMessage: "libvirtd is restarting",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := &consoler{err: tc.err}
			serveConsoles(t, srv, agents["n1"], c)
			_, err := natswire.DialConsole(context.Background(), hubConn, "n1", wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleSerial})
			var re *natswire.ConsoleRefusedError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, tc.wantReason, re.Reason)
			assert.Equal(t, tc.wantMessage, re.Message)
		})
	}

	t.Run("ABackendWithoutConsolesSaysSo", func(t *testing.T) {
		serveConsoles(t, srv, agents["n1"], (*consoler)(nil))
		_, err := natswire.DialConsole(context.Background(), hubConn, "n1", wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleSerial})
		var re *natswire.ConsoleRefusedError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, wire.ConsoleUnavailable, re.Reason)
		assert.Contains(t, re.Message, "the test backend of this node serves no consoles")
	})

	t.Run("AnOpenConsoleIsTheDriversStream", func(t *testing.T) {
		c := &consoler{}
		serveConsoles(t, srv, agents["n1"], c)
		s, err := natswire.DialConsole(context.Background(), hubConn, "n1", wire.ConsoleOpen{UID: "vm-a", Kind: wire.ConsoleVNC})
		require.NoError(t, err)
		defer s.Close()
		c.mu.Lock()
		uid, kind, guest := c.uid, c.kind, c.guestEnd
		c.mu.Unlock()
		assert.Equal(t, "vm-a", uid)
		assert.Equal(t, driver.ConsoleVNC, kind)
		go func() { _, _ = guest.Write([]byte("RFB 003.008\n")) }()
		got := make([]byte, 12)
		_, err = io.ReadFull(s, got)
		require.NoError(t, err)
		assert.Equal(t, "RFB 003.008\n", string(got))
	})
}

// serveConsoles runs the agent's console server for id's node over c until
// the test ends, and returns once it receives opens.
func serveConsoles(t *testing.T, srv *natstest.Server, id natswire.Identity, c driver.Consoler) {
	t.Helper()
	if cc, ok := c.(*consoler); ok && cc == nil {
		c = nil // a driver without consoles
	}
	t.Helper()
	nc, _ := natstest.Connect(t, srv, id)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- natswire.ServeConsoles(ctx, nc, id.Name, natswire.ConsoleLimits{}, logging.NewNopLogger(), openConsole(c, "test"))
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool { return nc.NumSubscriptions() > 0 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, nc.Flush())
}

func TestConsoleSettingsMustNotBeNegative(t *testing.T) {
	valid := func() Config {
		return Config{Node: "n1", NATSURLs: []string{"nats://127.0.0.1:4222"}, Seed: []byte("seed")}
	}
	cases := map[string]struct {
		change  func(*Config)
		wantErr string
	}{
		"ZeroMeansTheDefaults":   {change: func(*Config) {}},
		"SetLimits":              {change: func(c *Config) { c.ConsoleSessions, c.ConsoleBytesPerSecond = 2, 64<<10 }},
		"NegativeSessions":       {change: func(c *Config) { c.ConsoleSessions = -1 }, wantErr: "--console-sessions"},
		"NegativeBytesPerSecond": {change: func(c *Config) { c.ConsoleBytesPerSecond = -1 }, wantErr: "--console-bytes-per-second"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := valid()
			tc.change(&c)
			err := c.validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}
