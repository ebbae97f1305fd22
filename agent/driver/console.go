package driver

import (
	"context"
	"io"
)

// ConsoleKind is a way into a running guest.
type ConsoleKind string

// The consoles a guest may have.
const (
	// ConsoleSerial is the guest's first serial port: bytes both ways, as
	// a terminal would send and receive them.
	ConsoleSerial ConsoleKind = "serial"
	// ConsoleVNC is the guest's display: an RFB (VNC) server's end of the
	// stream, from its ProtocolVersion handshake on.
	ConsoleVNC ConsoleKind = "vnc"
)

// Consoler is implemented by a Driver that can connect to a guest's
// consoles. Only the agent of the guest's own node calls it, for a session
// the hub asked for.
type Consoler interface {
	// OpenConsole connects to console kind of the running guest uid and
	// returns its stream: what the guest writes is read from it, what is
	// written to it reaches the guest. Closing it ends the session and
	// frees the console for the next one; the guest is not touched. What a
	// backend logs of the console (the boot log) goes on being logged
	// whether a session is open or not.
	//
	// A guest that is not on the node returns a NotFound error; a guest
	// that is not running, a backend or guest without that console, or a
	// console another session holds, a Terminal one naming why. Other
	// errors are transient.
	OpenConsole(ctx context.Context, uid string, kind ConsoleKind) (io.ReadWriteCloser, error)
}
