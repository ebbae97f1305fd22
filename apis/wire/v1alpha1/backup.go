package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// backupToken sets a node's backup keys apart: "<node>.backup.<uid>".
const backupToken = "backup"

// BackupIntent is what the hub wants a node to do for one
// VirtualMachineBackup: copy the disks of one of its guests to a backup
// location. It lives in BucketIntents under BackupIntents.Key(node, uid),
// on the node of the guest it is of.
//
// A present intent asks the node to take the backup once: a node that has
// reported it Succeeded or Failed does not take it again for the same
// intent, and a node that finds a backup it was taking when it stopped
// (the agent was killed) reports it Failed, never complete. The hub
// deletes the intent once the report is final; the node then deletes its
// report. Nothing of a backup stays on the node but the checkpoint the
// next backup reads changes since.
//
// The hub writes backup intents only to nodes whose heartbeat announces
// NodeHeartbeat.Backups.
type BackupIntent struct {
	ProtocolVersion int `json:"protocolVersion"`
	// UID is the VirtualMachineBackup's metadata.uid: it names the backup
	// in its location and its checkpoint on the node.
	UID string `json:"uid"`
	// Namespace and Name are the VirtualMachineBackup's; the backup is
	// kept under its namespace in the location.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// VM is the uid of the guest backed up, a guest of this node, and
	// VMName its VirtualMachine's name.
	VM     string `json:"vm"`
	VMName string `json:"vmName"`
	// Since is the uid of the VM's last backup that is whole in the same
	// location, in the same namespace: the node reads only what changed
	// since it, where its checkpoint is still on the node. Empty asks for
	// a full backup.
	Since string `json:"since,omitempty"`
	// Location is where the backup is written.
	Location BackupLocation `json:"location"`
	// Spec is the VirtualMachine's spec as it is, kept with the backup so
	// that a restore can make the VM again.
	Spec json.RawMessage `json:"spec,omitempty"`
}

// BackupLocation is an S3-compatible bucket and the credentials to write
// to it. It travels only in a node's own intents, which only that node
// and the hub can read.
type BackupLocation struct {
	// Endpoint is host:port; Insecure reaches it over plain HTTP.
	Endpoint string `json:"endpoint"`
	Insecure bool   `json:"insecure,omitempty"`
	Region   string `json:"region,omitempty"`
	Bucket   string `json:"bucket"`
	Prefix   string `json:"prefix,omitempty"`
	// Credentials are the location's; never logged.
	Credentials BackupCredentials `json:"credentials"`
}

// BackupCredentials are a location's S3 credentials and the optional key
// chunks are encrypted with before they leave the node.
type BackupCredentials struct {
	AccessKeyID     string `json:"accessKeyID"`
	SecretAccessKey string `json:"secretAccessKey"`
	// EncryptionKey is 32 bytes, or empty for chunks stored as they are.
	EncryptionKey []byte `json:"encryptionKey,omitempty"`
}

// String keeps the credentials out of every log line and error that
// prints a BackupIntent.
func (BackupCredentials) String() string { return "[redacted]" }

// GoString is String, for %#v.
func (c BackupCredentials) GoString() string { return c.String() }

// BackupPhase is how far a backup got on its node.
type BackupPhase string

// Backup phases a node reports.
const (
	// BackupPhaseRunning: the node is copying the guest's disks.
	BackupPhaseRunning BackupPhase = "Running"
	// BackupPhaseSucceeded: the backup is whole in its location.
	BackupPhaseSucceeded BackupPhase = "Succeeded"
	// BackupPhaseFailed: the backup is not in its location; Message says
	// why.
	BackupPhaseFailed BackupPhase = "Failed"
)

// BackupReport is what a node's agent observed of one BackupIntent. It
// lives in BucketReports under BackupReports.Key(node, uid).
type BackupReport struct {
	ProtocolVersion int `json:"protocolVersion"`
	// UID is the backup's, as in BackupIntent.UID.
	UID string `json:"uid"`
	// Node is the reporting node, set by the node's own bus.
	Node  string      `json:"node"`
	VM    string      `json:"vm"`
	Phase BackupPhase `json:"phase"`
	// Full: the disks were read whole; Parent is the backup whose
	// changes since were read otherwise. Frozen: the guest agent froze
	// the guest's filesystems for it.
	Full   bool   `json:"full,omitempty"`
	Parent string `json:"parent,omitempty"`
	Frozen bool   `json:"frozen,omitempty"`
	// StartedAt and FinishedAt bound the backup; FinishedAt is unset
	// while it runs.
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// DiskBytes is the size of the disks backed up; BytesRead what was
	// read of them so far, BytesWritten what was written to the location
	// (new chunks), ChunksWritten and ChunksReused how many chunks were
	// new to it and how many it had.
	DiskBytes     int64 `json:"diskBytes,omitempty"`
	BytesRead     int64 `json:"bytesRead,omitempty"`
	BytesWritten  int64 `json:"bytesWritten,omitempty"`
	ChunksWritten int64 `json:"chunksWritten,omitempty"`
	ChunksReused  int64 `json:"chunksReused,omitempty"`
	// Message says why the backup failed.
	Message    string    `json:"message,omitempty"`
	ObservedAt time.Time `json:"observedAt"`
}

// The backup kinds.
var (
	// BackupIntents are what the hub wants of each backup of a node's
	// guests.
	BackupIntents = Kind[BackupIntent]{
		Name: "backup intent", Bucket: BucketIntents, Token: backupToken,
		Encode: EncodeBackupIntent, Decode: DecodeBackupIntent,
		Identity: func(b BackupIntent) (string, string) { return "", b.UID },
	}
	// BackupReports are what a node observes of each backup it takes.
	BackupReports = Kind[BackupReport]{
		Name: "backup report", Bucket: BucketReports, Token: backupToken,
		Encode: EncodeBackupReport, Decode: DecodeBackupReport,
		Identity: func(r BackupReport) (string, string) { return r.Node, r.UID },
		Same:     sameBackupReport,
	}
)

func (b *BackupIntent) stamp() { b.ProtocolVersion = ProtocolVersion }
func (r *BackupReport) stamp() { r.ProtocolVersion = ProtocolVersion }

// EncodeBackupIntent stamps ProtocolVersion and encodes a valid
// BackupIntent.
func EncodeBackupIntent(b BackupIntent) ([]byte, error) { return encode(b) }

// DecodeBackupIntent decodes and validates a BackupIntent; errors as
// DecodeIntent.
func DecodeBackupIntent(b []byte) (BackupIntent, error) {
	return decodeValid[BackupIntent]("backup intent", b)
}

// EncodeBackupReport stamps ProtocolVersion and encodes a valid
// BackupReport.
func EncodeBackupReport(r BackupReport) ([]byte, error) { return encode(r) }

// DecodeBackupReport decodes and validates a BackupReport; errors as
// DecodeIntent, and a *DecodeError for an unknown phase or a negative
// figure.
func DecodeBackupReport(b []byte) (BackupReport, error) {
	return decodeValid[BackupReport]("backup report", b)
}

// Validate reports whether the BackupIntent can be keyed and acted on: it
// names the guest it is of, the namespace it is kept under and a whole
// location.
func (b BackupIntent) Validate() error {
	for _, f := range []struct{ what, v string }{{"uid", b.UID}, {"vm", b.VM}, {"namespace", b.Namespace}} {
		if err := ValidateToken(f.what, f.v); err != nil {
			return err
		}
	}
	if b.Since != "" {
		if err := ValidateToken("since", b.Since); err != nil {
			return err
		}
	}
	if err := validateLocation(b.Location); err != nil {
		return &DecodeError{Kind: "backup intent", Err: err}
	}
	return nil
}

// validateLocation reports whether a location can be reached and read.
func validateLocation(l BackupLocation) error {
	switch {
	case l.Endpoint == "", l.Bucket == "":
		return errors.New("location.endpoint and location.bucket are required")
	case l.Credentials.AccessKeyID == "", l.Credentials.SecretAccessKey == "":
		return errors.New("location.credentials are required")
	case len(l.Credentials.EncryptionKey) != 0 && len(l.Credentials.EncryptionKey) != 32:
		return fmt.Errorf("location.credentials.encryptionKey must be 32 bytes, got %d", len(l.Credentials.EncryptionKey))
	}
	return nil
}

// Validate reports whether the BackupReport can be keyed and read. A phase
// this version does not define is refused.
func (r BackupReport) Validate() error {
	if err := ValidateToken("uid", r.UID); err != nil {
		return err
	}
	if err := ValidateNodeName(r.Node); err != nil {
		return err
	}
	switch r.Phase {
	case BackupPhaseRunning, BackupPhaseSucceeded, BackupPhaseFailed:
	default:
		return &DecodeError{Kind: "backup report", Err: fmt.Errorf("phase must be Running, Succeeded or Failed, got %q", r.Phase)}
	}
	for _, n := range []int64{r.DiskBytes, r.BytesRead, r.BytesWritten, r.ChunksWritten, r.ChunksReused} {
		if n < 0 {
			return &DecodeError{Kind: "backup report", Err: errors.New("sizes and counts must not be negative")}
		}
	}
	return nil
}

// Final is whether the backup is over on its node.
func (r BackupReport) Final() bool {
	return r.Phase == BackupPhaseSucceeded || r.Phase == BackupPhaseFailed
}

// sameBackupReport leaves out when a report was observed, as sameReport
// does.
func sameBackupReport(a, b BackupReport) bool {
	if !sameTime(a.StartedAt, b.StartedAt) || !sameTime(a.FinishedAt, b.FinishedAt) {
		return false
	}
	a.StartedAt, b.StartedAt, a.FinishedAt, b.FinishedAt = nil, nil, nil, nil
	a.ObservedAt, b.ObservedAt = time.Time{}, time.Time{}
	a.ProtocolVersion, b.ProtocolVersion = 0, 0
	return a == b
}
