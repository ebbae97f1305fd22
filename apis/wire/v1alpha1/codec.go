package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
)

// VersionError is returned when a message was written with a protocol version
// this reader does not understand. The message is refused, never guessed at:
// the reader must be upgraded.
type VersionError struct {
	Kind    string
	Got     int
	Highest int
}

func (e *VersionError) Error() string {
	if e.Got < 1 {
		return fmt.Sprintf("%s has no valid protocolVersion (got %d)", e.Kind, e.Got)
	}
	return fmt.Sprintf("%s has protocolVersion %d but this reader understands up to %d; upgrade it", e.Kind, e.Got, e.Highest)
}

// DecodeError is returned for bytes that are not a well-formed message.
type DecodeError struct {
	Kind string
	Err  error
}

func (e *DecodeError) Error() string { return fmt.Sprintf("cannot decode %s: %v", e.Kind, e.Err) }

// Unwrap returns the underlying cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// EncodeIntent stamps ProtocolVersion and encodes a valid Intent.
func EncodeIntent(in Intent) ([]byte, error) {
	in.ProtocolVersion = ProtocolVersion
	if err := in.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(in)
}

// EncodeReport stamps ProtocolVersion and encodes a valid Report.
func EncodeReport(r Report) ([]byte, error) {
	r.ProtocolVersion = ProtocolVersion
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// EncodeNodeHeartbeat stamps ProtocolVersion and encodes a valid NodeHeartbeat.
func EncodeNodeHeartbeat(h NodeHeartbeat) ([]byte, error) {
	h.ProtocolVersion = ProtocolVersion
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(h)
}

// DecodeIntent decodes and validates an Intent. Unknown fields are ignored.
// It returns a *VersionError for a newer or missing protocol version, a
// *DecodeError for malformed bytes and a *KeyError for an unsafe uid.
func DecodeIntent(b []byte) (Intent, error) {
	var in Intent
	if err := decode("intent", b, &in); err != nil {
		return Intent{}, err
	}
	return in, in.Validate()
}

// DecodeReport decodes and validates a Report; errors as DecodeIntent.
func DecodeReport(b []byte) (Report, error) {
	var r Report
	if err := decode("report", b, &r); err != nil {
		return Report{}, err
	}
	return r, r.Validate()
}

// DecodeNodeHeartbeat decodes and validates a NodeHeartbeat; errors as
// DecodeIntent.
func DecodeNodeHeartbeat(b []byte) (NodeHeartbeat, error) {
	var h NodeHeartbeat
	if err := decode("node heartbeat", b, &h); err != nil {
		return NodeHeartbeat{}, err
	}
	return h, h.Validate()
}

// decode reads the version before the body, so that a newer message whose
// fields changed type is reported as "too new" rather than as garbage.
func decode(kind string, b []byte, into any) error {
	var v struct {
		ProtocolVersion int `json:"protocolVersion"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return &DecodeError{Kind: kind, Err: err}
	}
	if v.ProtocolVersion < 1 || v.ProtocolVersion > ProtocolVersion {
		return &VersionError{Kind: kind, Got: v.ProtocolVersion, Highest: ProtocolVersion}
	}
	if err := json.Unmarshal(b, into); err != nil {
		return &DecodeError{Kind: kind, Err: err}
	}
	return nil
}

// Validate reports whether the Intent can be keyed and acted on.
func (in Intent) Validate() error {
	if err := ValidateToken("uid", in.UID); err != nil {
		return err
	}
	if in.Machine.VCPU < 0 || in.Machine.MemoryBytes < 0 || in.Machine.SwapBytes < 0 {
		return &DecodeError{Kind: "intent", Err: errors.New("machine resources must not be negative")}
	}
	return nil
}

// Validate reports whether the Report can be keyed.
func (r Report) Validate() error {
	if err := ValidateToken("uid", r.UID); err != nil {
		return err
	}
	return ValidateToken("node", r.Node)
}

// Validate reports whether the NodeHeartbeat can be keyed.
func (h NodeHeartbeat) Validate() error {
	return ValidateToken("node", h.Node)
}
