package nova

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestProxyWebSocketIsWhereNoVNCGoes pins the WebSocket of each console
// URL Nova answers, and that no error quotes the URL's token.
func TestProxyWebSocketIsWhereNoVNCGoes(t *testing.T) {
	cases := []struct {
		name string
		url  string
		kind driver.ConsoleKind
		want string
	}{
		{name: "ASerialConsoleIsItsURL", url: "ws://proxy:6083/?token=secret", kind: driver.ConsoleSerial, want: "ws://proxy:6083/?token=secret"},
		{name: "ASerialConsoleOverTLS", url: "wss://proxy:6083/?token=secret", kind: driver.ConsoleSerial, want: "wss://proxy:6083/?token=secret"},
		{name: "NoVNCsPathParameter", url: "http://proxy:6080/vnc_auto.html?path=%3Ftoken%3Dsecret", kind: driver.ConsoleVNC, want: "ws://proxy:6080/?token=secret"},
		{name: "NoVNCsPathParameterOverTLS", url: "https://proxy/vnc_lite.html?path=%3Ftoken%3Dsecret", kind: driver.ConsoleVNC, want: "wss://proxy/?token=secret"},
		{name: "APathBehindAReverseProxy", url: "https://cloud/novnc/vnc_auto.html?path=novnc%2Fwebsockify%3Ftoken%3Dsecret", kind: driver.ConsoleVNC, want: "wss://cloud/novnc/websockify?token=secret"},
		{name: "AnOlderNovasTokenParameter", url: "http://proxy:6080/vnc_auto.html?token=secret", kind: driver.ConsoleVNC, want: "ws://proxy:6080/?token=secret"},
		{name: "NoTokenAtAll", url: "http://proxy:6080/vnc_auto.html", kind: driver.ConsoleVNC},
		{name: "AnUnknownScheme", url: "ftp://proxy/?token=secret", kind: driver.ConsoleSerial},
		{name: "AURLThatDoesNotParse", url: "ws://proxy/%zz?token=secret", kind: driver.ConsoleSerial},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := proxyWebSocket(tc.url, tc.kind)
			if tc.want == "" {
				require.Error(t, err)
				assert.NotContains(t, err.Error(), "secret")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.String())
		})
	}
}
