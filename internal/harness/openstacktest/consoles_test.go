package openstacktest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/guestconsole"
	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

// remoteConsole creates a remote console of server id at microversion mv
// with body as is.
func (c *session) remoteConsole(t *testing.T, id, mv string, body any) (map[string]string, error) {
	t.Helper()
	cl := *c.compute
	cl.Microversion = mv
	var out struct {
		RemoteConsole map[string]string `json:"remote_console"`
	}
	_, err := cl.Post(context.Background(), cl.ServiceURL("servers", id, "remote-consoles"), body, &out, &gophercloud.RequestOpts{OkCodes: []int{http.StatusOK}})
	return out.RemoteConsole, err
}

func consoleBody(protocol, typ string) map[string]any {
	return map[string]any{"remote_console": map[string]string{"protocol": protocol, "type": typ}}
}

// message is the message of Nova's error body of a failed call.
func message(t *testing.T, err error) string {
	t.Helper()
	var code gophercloud.ErrUnexpectedResponseCode
	require.True(t, errors.As(err, &code), "an HTTP error: %v", err)
	var body map[string]struct {
		Message string `json:"message"`
	}
	require.NoError(t, json.Unmarshal(code.Body, &body))
	for _, e := range body {
		return e.Message
	}
	return ""
}

// dialConsole opens a console's WebSocket as a websockify client does,
// offering the subprotocol binary.
func dialConsole(t *testing.T, raw string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{"binary"}}
	conn, _, err := d.DialContext(context.Background(), raw, nil)
	require.NoError(t, err, "the proxy upgrades before it looks at the token")
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// dropped asserts the proxy dropped the connection without a word, as
// Nova's does for a token it refuses.
func dropped(t *testing.T, conn *websocket.Conn) {
	t.Helper()
	_, data, err := conn.ReadMessage()
	assert.Empty(t, data)
	assert.True(t, websocket.IsCloseError(err, websocket.CloseAbnormalClosure), "dropped without a close message: %v", err)
}

// vncWebSocket is the WebSocket noVNC opens for a VNC console's URL: at
// the page's host, path "/" and the path parameter's query.
func vncWebSocket(t *testing.T, page string) string {
	t.Helper()
	u, err := url.Parse(page)
	require.NoError(t, err)
	p := u.Query().Get("path")
	require.NotEmpty(t, p, "the token is in the path parameter")
	return "ws://" + u.Host + "/" + p
}

// TestRemoteConsoles pins POST /servers/{id}/remote-consoles as the
// compute API reference has it and the proxies behind its URLs.
func TestRemoteConsoles(t *testing.T) {
	t.Parallel()
	c := start(t)
	vol, net := c.bootable(t)
	id := c.boot(t, vol, net)
	c.waitStatus(t, id, openstacktest.StatusActive)
	prompt := guestconsole.LoginPrompt("vm")

	var serialURL string
	t.Run("ASerialConsoleIsAGettyBehindTheSerialProxy", func(t *testing.T) {
		rc, err := c.remoteConsole(t, id, "2.6", consoleBody("serial", "serial"))
		require.NoError(t, err)
		assert.Equal(t, "serial", rc["protocol"])
		assert.Equal(t, "serial", rc["type"])
		serialURL = rc["url"]
		u, err := url.Parse(serialURL)
		require.NoError(t, err)
		assert.Equal(t, "ws", u.Scheme)
		assert.Equal(t, "/", u.Path)
		assert.Regexp(t, `^[0-9a-f-]{36}$`, u.Query().Get("token"))
		assert.Contains(t, c.s.ConsoleTokens(), u.Query().Get("token"))

		conn := dialConsole(t, serialURL)
		assert.Equal(t, "binary", conn.Subprotocol(), "websockify's subprotocol")
		guestconsole.ReadMessagesUntil(t, conn, prompt)
		require.NoError(t, conn.WriteMessage(websocket.BinaryMessage, []byte("root\r")))
		guestconsole.ReadMessagesUntil(t, conn, prompt)
		require.NoError(t, conn.WriteMessage(websocket.BinaryMessage, []byte("a\nb\r")))
		guestconsole.ReadMessagesUntil(t, conn, prompt+prompt)
	})

	var vncURL string
	t.Run("AVNCConsoleIsANoVNCPageWhoseWebSocketIsAtTheRoot", func(t *testing.T) {
		rc, err := c.remoteConsole(t, id, "2.60", consoleBody("vnc", "novnc"))
		require.NoError(t, err)
		vncURL = rc["url"]
		assert.Regexp(t, `^http://127\.0\.0\.1:\d+/vnc_auto\.html\?path=%3Ftoken%3D[0-9a-f-]{36}$`, vncURL)
		conn := dialConsole(t, vncWebSocket(t, vncURL))
		guestconsole.ReadMessagesUntil(t, conn, "RFB 003.008\n")
	})

	t.Run("TheProxiesRefuseAToken", func(t *testing.T) {
		fresh, err := c.remoteConsole(t, id, "2.6", consoleBody("serial", "serial"))
		require.NoError(t, err)
		u, err := url.Parse(fresh["url"])
		require.NoError(t, err)
		token := u.Query().Get("token")
		vnc, err := url.Parse(vncWebSocket(t, vncURL))
		require.NoError(t, err)
		cases := map[string]string{
			"UsedAlready":     serialURL,
			"UsedAlreadyVNC":  vnc.String(),
			"Unknown":         "ws://" + u.Host + "/?token=00000000-0000-4000-8000-000000000000",
			"Missing":         "ws://" + u.Host + "/",
			"OfTheOtherProxy": "ws://" + vnc.Host + "/?token=" + token,
		}
		for name, raw := range cases {
			t.Run(name, func(t *testing.T) { dropped(t, dialConsole(t, raw)) })
		}
	})

	cases := []struct {
		name, id, mv string
		body         any
		status       int
		message      string
	}{
		{name: "BeforeMicroversion2.6", id: id, mv: "2.5", body: consoleBody("serial", "serial"), status: http.StatusNotFound, message: "The resource could not be found."},
		{name: "NoRemoteConsole", id: id, mv: "2.6", body: map[string]any{}, status: http.StatusBadRequest, message: "Invalid input for field/attribute remote_console. Value: None. 'remote_console' is a required property"},
		{name: "AnUnknownProtocol", id: id, mv: "2.6", body: consoleBody("mks", "webmks"), status: http.StatusBadRequest, message: "Invalid input for field/attribute protocol. Value: mks. 'mks' is not one of ['rdp', 'serial', 'spice', 'vnc']"},
		{name: "AnUnknownType", id: id, mv: "2.8", body: consoleBody("serial", "telnet"), status: http.StatusBadRequest, message: "Invalid input for field/attribute type. Value: telnet. 'telnet' is not one of ['novnc', 'rdp-html5', 'serial', 'spice-html5', 'webmks', 'xvpvnc']"},
		{name: "ATypeOfAnotherProtocol", id: id, mv: "2.6", body: consoleBody("serial", "novnc"), status: http.StatusBadRequest, message: "Invalid console type novnc"},
		{name: "AConsoleTheCloudDoesNotServe", id: id, mv: "2.8", body: consoleBody("spice", "spice-html5"), status: http.StatusBadRequest, message: "Unavailable console type spice-html5."},
		{name: "AnUnknownServer", id: "nothing", mv: "2.6", body: consoleBody("serial", "serial"), status: http.StatusNotFound, message: "Instance nothing could not be found."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.remoteConsole(t, tc.id, tc.mv, tc.body)
			require.Error(t, err)
			assert.Equal(t, tc.status, status(err))
			assert.Equal(t, tc.message, message(t, err))
		})
	}

	t.Run("AServerThatStoppedHasNoConsole", func(t *testing.T) {
		rc, err := c.remoteConsole(t, id, "2.6", consoleBody("serial", "serial"))
		require.NoError(t, err)
		require.NoError(t, c.s.SetServerStatus(id, openstacktest.StatusShutoff, ""))
		dropped(t, dialConsole(t, rc["url"]))
		_, err = c.remoteConsole(t, id, "2.6", consoleBody("serial", "serial"))
		assert.Equal(t, http.StatusConflict, status(err))
		assert.Equal(t, "Cannot 'create' instance "+id+" while it is in vm_state stopped", message(t, err))

		require.NoError(t, c.s.SetServerStatus(id, openstacktest.StatusPaused, ""))
		_, err = c.remoteConsole(t, id, "2.6", consoleBody("serial", "serial"))
		assert.NoError(t, err, "a paused server has its consoles")
	})

	t.Run("ADisabledConsoleIsUnavailable", func(t *testing.T) {
		c.s.DisableConsole(openstacktest.ConsoleProtocolSerial)
		_, err := c.remoteConsole(t, id, "2.6", consoleBody("serial", "serial"))
		assert.Equal(t, http.StatusBadRequest, status(err))
		assert.Equal(t, "Unavailable console type serial.", message(t, err))
		_, err = c.remoteConsole(t, id, "2.6", consoleBody("vnc", "novnc"))
		assert.NoError(t, err, "the other protocols stay")
	})
}
