// Package guestconsole plays a guest at the far end of a console
// WebSocket, for the test servers that stand in for a backend's console
// proxies (kubevirttest's virt-api, openstacktest's Nova proxies): its
// serial console behaves like a getty waiting for a login, its display
// greets like an RFB server.
package guestconsole

import "github.com/gorilla/websocket"

// RFBVersion is what a guest's display sends first: an RFB server's
// ProtocolVersion.
const RFBVersion = "RFB 003.008\n"

// LoginPrompt is what a guest's serial console shows when a session opens
// and after each line the user enters: a getty's prompt for the guest's
// host, name.
func LoginPrompt(name string) string { return "\r\n" + name + " login: " }

// Serial answers on conn as the serial console of guest name: the login
// prompt at once and again for every "\r" or "\n" it reads, in binary
// messages, until the client leaves.
func Serial(conn *websocket.Conn, name string) {
	prompt := []byte(LoginPrompt(name))
	if conn.WriteMessage(websocket.BinaryMessage, prompt) != nil {
		return
	}
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			return
		}
		for _, b := range data {
			if b != '\r' && b != '\n' {
				continue
			}
			if conn.WriteMessage(websocket.BinaryMessage, prompt) != nil {
				return
			}
		}
	}
}

// Display answers on conn as a guest's display: RFBVersion, then it reads
// until the client leaves.
func Display(conn *websocket.Conn) {
	if conn.WriteMessage(websocket.BinaryMessage, []byte(RFBVersion)) != nil {
		return
	}
	for {
		if _, _, err := conn.ReadMessage(); err != nil {
			return
		}
	}
}
