package v1alpha1

import "fmt"

// A console session carries a guest's serial console or display between the
// agent of the guest's node and the hub over core NATS (not JetStream: a
// console is a stream of bytes, not state). Only the hub opens one:
//
//   - the hub publishes a ConsoleOpen on ConsoleOpenSubject(node);
//   - the node's agent answers, then sends the guest's output, on
//     ConsoleOutSubject(node, session);
//   - the hub sends the input for the guest on ConsoleInSubject(node,
//     session).
//
// Every subject carries the node's token, so the server's permissions keep
// each node to its own sessions (see natswire.AgentPermissions). How bytes
// and control messages travel on them is natswire's.

// ConsoleSubjects is the first part of every console subject.
const ConsoleSubjects = "virtfleet.console"

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

// ConsoleOpen asks a node's agent to connect the hub to a guest's console.
type ConsoleOpen struct {
	ProtocolVersion int `json:"protocolVersion"`
	// Session names the session in its subjects. The hub makes it, random,
	// for every session; it is a single subject token.
	Session string `json:"session"`
	// UID is the guest's.
	UID  string      `json:"uid"`
	Kind ConsoleKind `json:"kind"`
	// Namespace is the VM's: the node shares its sessions out by it, so
	// that one tenant's consoles never hold them all. An older hub names
	// none, and its opens share one namespace.
	Namespace string `json:"namespace,omitempty"`
}

// ConsoleRefusal is why a node's agent did not open a console.
type ConsoleRefusal string

// The reasons a console is refused. A reason this version does not know
// reads as ConsoleFailed.
const (
	// ConsoleNotFound: the guest is not on the node.
	ConsoleNotFound ConsoleRefusal = "NotFound"
	// ConsoleUnavailable: the guest is not running, the backend or the
	// guest has no such console, or another session holds it.
	ConsoleUnavailable ConsoleRefusal = "Unavailable"
	// ConsoleBusy: the node has as many sessions open as it allows.
	ConsoleBusy ConsoleRefusal = "Busy"
	// ConsoleFailed: anything else; the message says what.
	ConsoleFailed ConsoleRefusal = "Failed"
)

func (o *ConsoleOpen) stamp() { o.ProtocolVersion = ProtocolVersion }

// Validate reports whether the ConsoleOpen can be acted on: its session and
// uid are subject tokens and its kind is one this version knows.
func (o ConsoleOpen) Validate() error {
	if err := ValidateToken("session", o.Session); err != nil {
		return err
	}
	if err := ValidateToken("uid", o.UID); err != nil {
		return err
	}
	switch o.Kind {
	case ConsoleSerial, ConsoleVNC:
	default:
		return &DecodeError{Kind: "console open", Err: fmt.Errorf("kind must be %s or %s, got %q", ConsoleSerial, ConsoleVNC, o.Kind)}
	}
	return nil
}

// EncodeConsoleOpen stamps ProtocolVersion and encodes a valid ConsoleOpen.
func EncodeConsoleOpen(o ConsoleOpen) ([]byte, error) { return encode(o) }

// DecodeConsoleOpen decodes and validates a ConsoleOpen; errors as
// DecodeIntent (a *KeyError for an unsafe session too), and a *DecodeError
// for a kind this version does not know.
func DecodeConsoleOpen(b []byte) (ConsoleOpen, error) {
	return decodeValid[ConsoleOpen]("console open", b)
}

// ConsoleNodePrefix is what every console subject of node starts with,
// including the trailing dot: "virtfleet.console.<node>.", the node written
// as its token (NodeToken).
func ConsoleNodePrefix(node string) (string, error) {
	if err := ValidateNodeName(node); err != nil {
		return "", err
	}
	return ConsoleSubjects + "." + NodeToken(node) + ".", nil
}

// ConsoleOpenSubject is where the hub asks node's agent for sessions:
// "virtfleet.console.<node>.open".
func ConsoleOpenSubject(node string) (string, error) {
	prefix, err := ConsoleNodePrefix(node)
	if err != nil {
		return "", err
	}
	return prefix + "open", nil
}

// ConsoleInSubject is where the hub sends a session's input for the guest:
// "virtfleet.console.<node>.<session>.in".
func ConsoleInSubject(node, session string) (string, error) {
	return consoleSessionSubject(node, session, "in")
}

// ConsoleOutSubject is where node's agent answers a session's open and sends
// the guest's output: "virtfleet.console.<node>.<session>.out".
func ConsoleOutSubject(node, session string) (string, error) {
	return consoleSessionSubject(node, session, "out")
}

// consoleSessionSubject is "virtfleet.console.<node>.<session>.<dir>". It
// has one token more than the open subject, so no session, not even one
// called "open", makes a subject of one the other kind.
func consoleSessionSubject(node, session, dir string) (string, error) {
	prefix, err := ConsoleNodePrefix(node)
	if err != nil {
		return "", err
	}
	if err := ValidateToken("session", session); err != nil {
		return "", err
	}
	return prefix + session + "." + dir, nil
}
