package v1alpha1

import (
	"errors"
	"fmt"
	"time"
)

// snapshotToken sets a node's snapshot keys apart, as volumeToken does its
// volume keys: "<node>.snapshot.<uid>".
const snapshotToken = "snapshot"

// SnapshotIntent is what the hub wants a node to make true for one
// VirtualMachineSnapshot. It lives in BucketIntents under
// SnapshotIntents.Key(node, uid), on the node of the guest it is of.
//
// A present intent asks the node to take the snapshot of guest VM once:
// a node that has it already (it took it, or finds it after a restart)
// only reports it, and one that failed to take it reports Failed and does
// not try again for the same intent. Absent asks the node to delete the
// snapshot, which it reports Gone; the hub then deletes the key, and the
// node its report.
//
// The hub writes snapshot intents only to nodes whose heartbeat announces
// NodeHeartbeat.Snapshots, so an agent older than them never sees one.
type SnapshotIntent struct {
	ProtocolVersion int `json:"protocolVersion"`
	// UID is the VirtualMachineSnapshot's metadata.uid; it names the
	// snapshot on the node.
	UID string `json:"uid"`
	// Namespace and Name are the VirtualMachineSnapshot's, for messages.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// VM is the uid of the guest the snapshot is of, a guest of this node.
	VM string `json:"vm"`
	// Memory asks for the running guest's memory with its disks.
	Memory bool `json:"memory,omitempty"`
	// Absent asks that the snapshot be deleted.
	Absent bool `json:"absent,omitempty"`
}

// SnapshotPhase is the state of a snapshot on its node.
type SnapshotPhase string

// Snapshot phases a node reports.
const (
	// SnapshotPhaseTaking: the node is taking the snapshot.
	SnapshotPhaseTaking SnapshotPhase = "Taking"
	// SnapshotPhaseReady: the snapshot is taken and whole on the node.
	SnapshotPhaseReady SnapshotPhase = "Ready"
	// SnapshotPhaseFailed: no snapshot was kept; Message says why.
	SnapshotPhaseFailed SnapshotPhase = "Failed"
	// SnapshotPhaseGone: the node has no such snapshot (deleted, as an
	// absent intent asked, or lost with the guest's disks).
	SnapshotPhaseGone SnapshotPhase = "Gone"
)

// SnapshotReport is what a node's agent observed of one SnapshotIntent. It
// lives in BucketReports under SnapshotReports.Key(node, uid).
type SnapshotReport struct {
	ProtocolVersion int `json:"protocolVersion"`
	// UID is the snapshot's, as in SnapshotIntent.UID.
	UID string `json:"uid"`
	// Node is the reporting node, set by the node's own bus.
	Node  string        `json:"node"`
	VM    string        `json:"vm"`
	Phase SnapshotPhase `json:"phase"`
	// CreatedAt is the moment the snapshot holds; set once Ready.
	CreatedAt *time.Time `json:"createdAt,omitempty"`
	// DurationMilliseconds is how long taking it took.
	DurationMilliseconds int64 `json:"durationMilliseconds,omitempty"`
	// SizeBytes is what the snapshot holds on the node, as far as the
	// backend tells (its memory image at least).
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Online: the guest ran while the snapshot was taken. Memory: the
	// snapshot holds its memory. Frozen: the guest agent froze its
	// filesystems for it.
	Online bool `json:"online,omitempty"`
	Memory bool `json:"memory,omitempty"`
	Frozen bool `json:"frozen,omitempty"`
	// Message says why the snapshot failed or is not deleted yet.
	Message    string    `json:"message,omitempty"`
	ObservedAt time.Time `json:"observedAt"`
}

// Restore, on a guest's intent, asks its node to bring the guest back to
// one of its snapshots once: the guest is stopped, its disks (and, with
// the snapshot's memory, the running guest) are the snapshot's, and it is
// then driven to the intent's Running as ever. The node reports the
// restore's progress in Report.Restore and does not restore again for the
// same ID; the hub drops Restore once the report is final.
type Restore struct {
	// ID is the VirtualMachineRestore's uid; a new ID is a new restore.
	ID string `json:"id"`
	// Snapshot is the uid of the snapshot, one of this guest's on the node.
	Snapshot string `json:"snapshot"`
}

// RestorePhase is how far a restore got on its node.
type RestorePhase string

// Restore phases.
const (
	RestoreRunning   RestorePhase = "Running"
	RestoreSucceeded RestorePhase = "Succeeded"
	RestoreFailed    RestorePhase = "Failed"
)

// RestoreReport is a restore as the guest's node sees it.
type RestoreReport struct {
	ID    string       `json:"id"`
	Phase RestorePhase `json:"phase"`
	// StartedAt and FinishedAt bound the restore; FinishedAt is unset
	// while it runs.
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// Message says why the restore failed.
	Message string `json:"message,omitempty"`
}

// The snapshot kinds.
var (
	// SnapshotIntents are what the hub wants of each snapshot of a node's
	// guests.
	SnapshotIntents = Kind[SnapshotIntent]{
		Name: "snapshot intent", Bucket: BucketIntents, Token: snapshotToken,
		Encode: EncodeSnapshotIntent, Decode: DecodeSnapshotIntent,
		Identity: func(s SnapshotIntent) (string, string) { return "", s.UID },
	}
	// SnapshotReports are what a node observes of each snapshot it holds.
	SnapshotReports = Kind[SnapshotReport]{
		Name: "snapshot report", Bucket: BucketReports, Token: snapshotToken,
		Encode: EncodeSnapshotReport, Decode: DecodeSnapshotReport,
		Identity: func(r SnapshotReport) (string, string) { return r.Node, r.UID },
		Same:     sameSnapshotReport,
	}
)

func (s *SnapshotIntent) stamp() { s.ProtocolVersion = ProtocolVersion }
func (r *SnapshotReport) stamp() { r.ProtocolVersion = ProtocolVersion }

// EncodeSnapshotIntent stamps ProtocolVersion and encodes a valid
// SnapshotIntent.
func EncodeSnapshotIntent(s SnapshotIntent) ([]byte, error) { return encode(s) }

// DecodeSnapshotIntent decodes and validates a SnapshotIntent; errors as
// DecodeIntent.
func DecodeSnapshotIntent(b []byte) (SnapshotIntent, error) {
	return decodeValid[SnapshotIntent]("snapshot intent", b)
}

// EncodeSnapshotReport stamps ProtocolVersion and encodes a valid
// SnapshotReport.
func EncodeSnapshotReport(r SnapshotReport) ([]byte, error) { return encode(r) }

// DecodeSnapshotReport decodes and validates a SnapshotReport; errors as
// DecodeIntent, and a *DecodeError for an unknown phase or a negative
// figure.
func DecodeSnapshotReport(b []byte) (SnapshotReport, error) {
	return decodeValid[SnapshotReport]("snapshot report", b)
}

// Validate reports whether the SnapshotIntent can be keyed and acted on:
// it names the guest it is of.
func (s SnapshotIntent) Validate() error {
	if err := ValidateToken("uid", s.UID); err != nil {
		return err
	}
	return ValidateToken("vm", s.VM)
}

// Validate reports whether the SnapshotReport can be keyed and read. A
// phase this version does not define is refused.
func (r SnapshotReport) Validate() error {
	if err := ValidateToken("uid", r.UID); err != nil {
		return err
	}
	if err := ValidateNodeName(r.Node); err != nil {
		return err
	}
	switch r.Phase {
	case SnapshotPhaseTaking, SnapshotPhaseReady, SnapshotPhaseFailed, SnapshotPhaseGone:
	default:
		return &DecodeError{Kind: "snapshot report", Err: fmt.Errorf("phase must be Taking, Ready, Failed or Gone, got %q", r.Phase)}
	}
	if r.SizeBytes < 0 || r.DurationMilliseconds < 0 {
		return &DecodeError{Kind: "snapshot report", Err: errors.New("sizeBytes and durationMilliseconds must not be negative")}
	}
	return nil
}

// validate reports whether the Restore can be acted on.
func (r *Restore) validate() error {
	if r == nil {
		return nil
	}
	if err := ValidateToken("restore.id", r.ID); err != nil {
		return err
	}
	return ValidateToken("restore.snapshot", r.Snapshot)
}

// validate reports whether the RestoreReport can be read.
func (r *RestoreReport) validate() error {
	if r == nil {
		return nil
	}
	switch r.Phase {
	case RestoreRunning, RestoreSucceeded, RestoreFailed:
	default:
		return &DecodeError{Kind: "report", Err: fmt.Errorf("restore.phase must be Running, Succeeded or Failed, got %q", r.Phase)}
	}
	return nil
}

// sameSnapshotReport leaves out when a report was observed, as
// sameReport does.
func sameSnapshotReport(a, b SnapshotReport) bool {
	if !sameTime(a.CreatedAt, b.CreatedAt) {
		return false
	}
	a.CreatedAt, b.CreatedAt = nil, nil
	a.ObservedAt, b.ObservedAt = time.Time{}, time.Time{}
	a.ProtocolVersion, b.ProtocolVersion = 0, 0
	return a == b
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}
