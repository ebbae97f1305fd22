package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
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

// message is what the codec needs of every wire type: a pointer to it can
// stamp its version and validate itself.
type message[T any] interface {
	*T
	stamp()
	Validate() error
}

func (in *Intent) stamp()       { in.ProtocolVersion = ProtocolVersion }
func (r *Report) stamp()        { r.ProtocolVersion = ProtocolVersion }
func (h *NodeHeartbeat) stamp() { h.ProtocolVersion = ProtocolVersion }
func (v *VolumeIntent) stamp()  { v.ProtocolVersion = ProtocolVersion }
func (v *VolumeReport) stamp()  { v.ProtocolVersion = ProtocolVersion }
func (r *ImageReport) stamp()   { r.ProtocolVersion = ProtocolVersion }
func (f *Fabric) stamp()        { f.ProtocolVersion = ProtocolVersion }

// encode stamps ProtocolVersion on a copy of v and encodes it if it is valid.
func encode[T any, P message[T]](v T) ([]byte, error) {
	P(&v).stamp()
	if err := P(&v).Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// decodeValid decodes and validates a message; kind names it in errors.
func decodeValid[T any, P message[T]](kind string, b []byte) (T, error) {
	var v T
	if err := decode(kind, b, &v); err != nil {
		var zero T
		return zero, err
	}
	return v, P(&v).Validate()
}

// EncodeIntent stamps ProtocolVersion and encodes a valid Intent.
func EncodeIntent(in Intent) ([]byte, error) { return encode(in) }

// EncodeReport stamps ProtocolVersion and encodes a valid Report.
func EncodeReport(r Report) ([]byte, error) { return encode(r) }

// EncodeNodeHeartbeat stamps ProtocolVersion and encodes a valid NodeHeartbeat.
func EncodeNodeHeartbeat(h NodeHeartbeat) ([]byte, error) { return encode(h) }

// EncodeVolumeIntent stamps ProtocolVersion and encodes a valid VolumeIntent.
func EncodeVolumeIntent(v VolumeIntent) ([]byte, error) { return encode(v) }

// EncodeVolumeReport stamps ProtocolVersion and encodes a valid VolumeReport.
func EncodeVolumeReport(v VolumeReport) ([]byte, error) { return encode(v) }

// EncodeImageReport stamps ProtocolVersion and encodes a valid ImageReport.
func EncodeImageReport(r ImageReport) ([]byte, error) { return encode(r) }

// DecodeIntent decodes and validates an Intent. Unknown fields are ignored.
// It returns a *VersionError for a newer or missing protocol version, a
// *DecodeError for malformed bytes and a *KeyError for an unsafe uid.
func DecodeIntent(b []byte) (Intent, error) { return decodeValid[Intent]("intent", b) }

// DecodeReport decodes and validates a Report; errors as DecodeIntent.
func DecodeReport(b []byte) (Report, error) { return decodeValid[Report]("report", b) }

// DecodeNodeHeartbeat decodes and validates a NodeHeartbeat; errors as
// DecodeIntent.
func DecodeNodeHeartbeat(b []byte) (NodeHeartbeat, error) {
	return decodeValid[NodeHeartbeat]("node heartbeat", b)
}

// DecodeVolumeIntent decodes and validates a VolumeIntent; errors as
// DecodeIntent, and a *DecodeError for a present intent that imports
// nothing.
func DecodeVolumeIntent(b []byte) (VolumeIntent, error) {
	return decodeValid[VolumeIntent]("volume intent", b)
}

// DecodeVolumeReport decodes and validates a VolumeReport; errors as
// DecodeIntent.
func DecodeVolumeReport(b []byte) (VolumeReport, error) {
	return decodeValid[VolumeReport]("volume report", b)
}

// DecodeImageReport decodes and validates an ImageReport; errors as
// DecodeIntent, and a *DecodeError for an unknown phase or a negative size.
func DecodeImageReport(b []byte) (ImageReport, error) {
	return decodeValid[ImageReport]("image report", b)
}

// EncodeFabric stamps ProtocolVersion and encodes a valid Fabric.
func EncodeFabric(f Fabric) ([]byte, error) { return encode(f) }

// DecodeFabric decodes and validates a Fabric; errors as DecodeIntent, and
// a *DecodeError for a peer that is not an IP address.
func DecodeFabric(b []byte) (Fabric, error) {
	return decodeValid[Fabric]("fabric", b)
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
	if c := in.Claim; c != nil && (c.Orphan == "") == (c.ExternalName == "") {
		return &DecodeError{Kind: "intent", Err: errors.New("claim needs exactly one of orphan or externalName")}
	}
	if err := in.Restore.validate(); err != nil {
		return err
	}
	if mc := in.Machine; mc.VCPU < 0 || mc.MemoryBytes < 0 || mc.SwapBytes < 0 || mc.MaxVCPU < 0 || mc.MaxMemoryBytes < 0 {
		return &DecodeError{Kind: "intent", Err: errors.New("machine resources must not be negative")}
	}
	for i, d := range in.Machine.Disks {
		if d.Pool != "" {
			if err := ValidateToken(fmt.Sprintf("machine.disks[%d].pool", i), d.Pool); err != nil {
				return err
			}
		}
		if d.Image == nil {
			continue
		}
		if err := d.Image.Validate(); err != nil {
			return &DecodeError{Kind: "intent", Err: fmt.Errorf("machine.disks[%d].image: %w", i, err)}
		}
	}
	return nil
}

// Validate reports whether the node can tell where the image comes from:
// exactly one of URL, SourceVolume, SourceSnapshot, ExternalName or
// Backup, or Held, and a checksum only for a download.
func (r ImageRef) Validate() error {
	sources := 0
	for _, set := range []bool{r.URL != "", r.SourceVolume != nil, r.SourceSnapshot != nil, r.ExternalName != "", r.Backup != nil, r.Held} {
		if set {
			sources++
		}
	}
	switch {
	case sources > 1:
		return errors.New("set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more")
	case sources == 0:
		return errors.New("set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held")
	case r.SourceVolume != nil && (r.SourceVolume.Name == "" || r.SourceVolume.UID == ""):
		return errors.New("sourceVolume needs a name and a uid")
	case r.SourceSnapshot != nil && (r.SourceSnapshot.Volume.Name == "" || r.SourceSnapshot.Volume.UID == ""):
		return errors.New("sourceSnapshot needs a volume's name and uid")
	case r.URL == "" && r.Checksum != "":
		return errors.New("checksum verifies a download and goes with url")
	case r.Backup != nil:
		return r.Backup.validate()
	case r.SourceSnapshot != nil:
		// The name goes into a node's tools' options (qemu-img's
		// snapshot.name=), where a comma would start another option.
		return ValidateToken("sourceSnapshot.snapshot", r.SourceSnapshot.Snapshot)
	}
	return nil
}

// validate reports whether the node can find the backup and read it.
func (b *ImageBackup) validate() error {
	for _, f := range []struct{ what, v string }{{"backup.namespace", b.Namespace}, {"backup.id", b.ID}, {"backup.disk", b.Disk}} {
		if err := ValidateToken(f.what, f.v); err != nil {
			return err
		}
	}
	return validateLocation(b.Location)
}

// Validate reports whether the Report can be keyed.
func (r Report) Validate() error {
	if err := ValidateToken("uid", r.UID); err != nil {
		return err
	}
	if err := ValidateNodeName(r.Node); err != nil {
		return err
	}
	return r.Restore.validate()
}

// Validate reports whether the NodeHeartbeat can be keyed and read: a lease
// is never negative, and every shared pool is named by a token.
func (h NodeHeartbeat) Validate() error {
	if err := ValidateNodeName(h.Node); err != nil {
		return err
	}
	if h.FenceAfterMillis < 0 {
		return &DecodeError{Kind: "node heartbeat", Err: fmt.Errorf("fenceAfterMillis must not be negative, got %d", h.FenceAfterMillis)}
	}
	for i, p := range h.SharedPools {
		if err := ValidateToken(fmt.Sprintf("sharedPools[%d]", i), p); err != nil {
			return err
		}
	}
	return nil
}

// Validate reports whether the VolumeIntent can be keyed and acted on: a
// present intent is defined only as an import, and an import names the
// volume as its Disk.
func (v VolumeIntent) Validate() error {
	if err := ValidateToken("uid", v.UID); err != nil {
		return err
	}
	if v.Pool != "" {
		if err := ValidateToken("pool", v.Pool); err != nil {
			return err
		}
	}
	switch {
	case v.Disk == "":
		return &DecodeError{Kind: "volume intent", Err: errors.New("disk must not be empty")}
	case !v.Absent && v.ExternalName == "":
		return &DecodeError{Kind: "volume intent", Err: errors.New("a present volume intent needs the externalName of the volume it imports")}
	case v.ExternalName != "" && v.Disk != v.ExternalName:
		return &DecodeError{Kind: "volume intent", Err: errors.New("an imported volume's disk must be its externalName")}
	}
	return nil
}

// Validate reports whether every peer is an IP address.
func (f Fabric) Validate() error {
	for i, p := range f.Peers {
		if _, err := netip.ParseAddr(p); err != nil {
			return &DecodeError{Kind: "fabric", Err: fmt.Errorf("peers[%d] %q is not an IP address", i, p)}
		}
	}
	return nil
}

// Validate reports whether the VolumeReport can be keyed.
func (v VolumeReport) Validate() error {
	return ValidateToken("uid", v.UID)
}

// Validate reports whether the ImageReport can be keyed and read. A phase
// this version does not define is refused: a new phase comes with a new
// protocol version.
func (r ImageReport) Validate() error {
	if err := ValidateToken("uid", r.UID); err != nil {
		return err
	}
	if err := ValidateNodeName(r.Node); err != nil {
		return err
	}
	switch r.Phase {
	case ImagePhaseImporting, ImagePhaseReady, ImagePhaseFailed:
	default:
		return &DecodeError{Kind: "image report", Err: fmt.Errorf("phase must be Importing, Ready or Failed, got %q", r.Phase)}
	}
	if r.SizeBytes < 0 {
		return &DecodeError{Kind: "image report", Err: errors.New("sizeBytes must not be negative")}
	}
	return nil
}
