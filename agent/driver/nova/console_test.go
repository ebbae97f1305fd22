package nova_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/guestconsole"
	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

// openConsole opens console kind of uid, closed at the test's end.
func openConsole(t *testing.T, d *nova.Driver, uid string, kind driver.ConsoleKind) io.ReadWriteCloser {
	t.Helper()
	s, err := d.OpenConsole(context.Background(), uid, kind)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConsoles opens a server's serial console and display through Nova's
// remote consoles and the test cloud's proxies, which answer as a guest
// would.
func TestConsoles(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("console")
	ensure(t, d, m, driver.PhaseRunning)
	prompt := guestconsole.LoginPrompt(c.server(t, m.UID).Name)

	t.Run("TheSerialConsoleCarriesBytesBothWays", func(t *testing.T) {
		s := openConsole(t, d, m.UID, driver.ConsoleSerial)
		guestconsole.ReadUntil(t, s, prompt)
		_, err := s.Write([]byte("root\r"))
		require.NoError(t, err)
		guestconsole.ReadUntil(t, s, prompt)
		require.NoError(t, s.Close())
	})

	t.Run("TheDisplayIsAnRFBServer", func(t *testing.T) {
		guestconsole.ReadUntil(t, openConsole(t, d, m.UID, driver.ConsoleVNC), "RFB 003.008\n")
	})

	t.Run("EachSessionHasAConsoleOfItsOwn", func(t *testing.T) {
		before := len(c.ConsoleTokens())
		first := openConsole(t, d, m.UID, driver.ConsoleSerial)
		second := openConsole(t, d, m.UID, driver.ConsoleSerial)
		guestconsole.ReadUntil(t, first, prompt)
		guestconsole.ReadUntil(t, second, prompt)
		assert.Len(t, c.ConsoleTokens(), before+2, "a token is good for one connection")
	})

	t.Run("APausedServerKeepsItsConsoles", func(t *testing.T) {
		paused := m
		paused.Paused = true
		ensure(t, d, paused, driver.PhasePaused)
		guestconsole.ReadUntil(t, openConsole(t, d, m.UID, driver.ConsoleSerial), prompt)
	})
}

// TestConsoleOverTLS: the console proxies of a cloud served over TLS are
// trusted as the clouds.yaml entry says.
func TestConsoleOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newCloudWith(t, openstacktest.Options{TLS: true}, func(s *openstacktest.Server, e *cloudYAML) {
		e.CACert = filepath.Join(dir, "ca.pem")
		require.NoError(t, os.WriteFile(e.CACert, s.CACertPEM(), 0o600))
	}, password)
	d := c.open(t)
	m := machine("tls")
	ensure(t, d, m, driver.PhaseRunning)
	guestconsole.ReadUntil(t, openConsole(t, d, m.UID, driver.ConsoleVNC), "RFB 003.008\n")
	guestconsole.ReadUntil(t, openConsole(t, d, m.UID, driver.ConsoleSerial), guestconsole.LoginPrompt(c.server(t, m.UID).Name))
}

// TestConsoleRefusals pins what a console that cannot be had returns, each
// case on a running server of a cloud of its own.
func TestConsoleRefusals(t *testing.T) {
	t.Parallel()
	remoteConsoles := openstacktest.ComputePath + "/servers/*/remote-consoles"
	cases := []struct {
		name string
		// refuse makes the console of m's server refused, and returns the
		// uid and kind to open.
		refuse   func(t *testing.T, c *cloud, d *nova.Driver, m driver.Machine) (string, driver.ConsoleKind)
		notFound bool
		terminal bool
		message  string
	}{
		{name: "AServerNotOnTheNodeIsNotFound", notFound: true, message: "no server with virtfleet-uid 00000000-0000-4000-8000-999999999999",
			refuse: func(*testing.T, *cloud, *nova.Driver, driver.Machine) (string, driver.ConsoleKind) {
				return "00000000-0000-4000-8000-999999999999", driver.ConsoleSerial
			}},
		{name: "AStoppedServerHasNoConsole", terminal: true, message: "server is SHUTOFF: Nova serves the consoles of an ACTIVE or PAUSED server only",
			refuse: func(t *testing.T, _ *cloud, d *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				m.Running = false
				ensure(t, d, m, driver.PhaseStopped)
				return m.UID, driver.ConsoleSerial
			}},
		{name: "AnUnknownKindIsNoConsole", terminal: true, message: `no console of kind "spice"`,
			refuse: func(_ *testing.T, _ *cloud, _ *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				return m.UID, "spice"
			}},
		{name: "AServerStoppedBehindTheViewGetsNovasMessage", terminal: true, message: "Cannot 'create' instance",
			refuse: func(t *testing.T, c *cloud, _ *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				require.NoError(t, c.SetServerStatus(c.server(t, m.UID).ID, openstacktest.StatusShutoff, ""))
				return m.UID, driver.ConsoleVNC
			}},
		{name: "ASerialConsoleTurnedOffIsUnavailable", terminal: true, message: "Unavailable console type serial. (HTTP 400)",
			refuse: func(_ *testing.T, c *cloud, _ *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				c.DisableConsole(openstacktest.ConsoleProtocolSerial)
				return m.UID, driver.ConsoleSerial
			}},
		{name: "APolicyThatForbidsConsolesIsTerminal", terminal: true, message: "(HTTP 403)",
			refuse: func(_ *testing.T, c *cloud, _ *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				c.FailNext(http.MethodPost, remoteConsoles, 1, http.StatusForbidden, 0)
				return m.UID, driver.ConsoleSerial
			}},
		{name: "AHypervisorWithoutConsolesIsTerminal", terminal: true, message: "(HTTP 501)",
			refuse: func(_ *testing.T, c *cloud, _ *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				c.FailNext(http.MethodPost, remoteConsoles, 1, http.StatusNotImplemented, 0)
				return m.UID, driver.ConsoleVNC
			}},
		{name: "AServerDeletedBehindTheViewIsNotFound", notFound: true, message: "(HTTP 404)",
			refuse: func(_ *testing.T, c *cloud, _ *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				c.FailNext(http.MethodPost, remoteConsoles, 1, http.StatusNotFound, 0)
				return m.UID, driver.ConsoleSerial
			}},
		{name: "NovaFailingIsTransient", message: "(HTTP 500)",
			refuse: func(_ *testing.T, c *cloud, _ *nova.Driver, m driver.Machine) (string, driver.ConsoleKind) {
				c.FailNext(http.MethodPost, remoteConsoles, 1, http.StatusInternalServerError, 0)
				return m.UID, driver.ConsoleSerial
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCloud(t, password)
			// The view is refreshed by hand only: what the cloud does
			// behind the driver's back stays unseen.
			d := c.openPolling(t, time.Hour)
			m := machine("refused")
			ensure(t, d, m, driver.PhaseRunning)
			uid, kind := tc.refuse(t, c, d, m)
			_, err := d.OpenConsole(context.Background(), uid, kind)
			require.Error(t, err)
			assert.Equal(t, tc.notFound, driver.IsNotFound(err), "NotFound: %v", err)
			assert.Equal(t, tc.terminal, driver.IsTerminal(err), "Terminal: %v", err)
			assert.Contains(t, err.Error(), tc.message)
		})
	}
}

// TestNoConsoleTokenInLogs opens consoles that succeed and consoles Nova
// refuses, with all log output captured, and checks that no console token
// shows in it or in an error.
func TestNoConsoleTokenInLogs(t *testing.T) {
	var out bytes.Buffer
	log.SetOutput(&out)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	record := func(err error) {
		require.Error(t, err)
		fmt.Fprintln(&out, err)
	}
	c := newCloud(t, password)
	d := c.openPolling(t, time.Hour)
	m := machine("token")
	ensure(t, d, m, driver.PhaseRunning)
	ctx := context.Background()

	for _, kind := range []driver.ConsoleKind{driver.ConsoleSerial, driver.ConsoleVNC} {
		s, err := d.OpenConsole(ctx, m.UID, kind)
		require.NoError(t, err)
		require.NoError(t, s.Close())
	}
	for _, status := range []int{http.StatusInternalServerError, http.StatusNotFound, http.StatusForbidden} {
		c.FailNext(http.MethodPost, openstacktest.ComputePath+"/servers/*/remote-consoles", 1, status, 0)
		_, err := d.OpenConsole(ctx, m.UID, driver.ConsoleSerial)
		record(err)
	}
	c.DisableConsole(openstacktest.ConsoleProtocolSerial)
	_, err := d.OpenConsole(ctx, m.UID, driver.ConsoleSerial)
	record(err)
	require.NoError(t, c.SetServerStatus(c.server(t, m.UID).ID, openstacktest.StatusShutoff, ""))
	_, err = d.OpenConsole(ctx, m.UID, driver.ConsoleVNC)
	record(err)

	tokens := c.ConsoleTokens()
	require.Len(t, tokens, 2)
	for _, tok := range tokens {
		assert.NotContains(t, out.String(), tok)
	}
}
