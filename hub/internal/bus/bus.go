// Package bus is the hub's side of the wire: it publishes intents and keeps
// the hub informed of reports and node heartbeats, over NATS JetStream
// key-value buckets (NATS) or in memory (Fake).
package bus

import (
	"context"
	"fmt"
	"io"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Bus is what the hub needs from the wire.
//
// Every method is idempotent: writing the intent that is already stored
// changes nothing and returns its revision, deleting an absent intent
// succeeds. Writes are compare-and-set against the revision read just before,
// so a concurrent writer yields a *ConflictError (retry after re-reading)
// rather than a lost update. Node names and uids that are not key-safe yield a
// *wire.KeyError before anything is sent. Any other error is transient and
// the caller retries.
//
// The Watch methods block until ctx is done, first delivering the current
// state of every key, then every change. They survive reconnects and server
// restarts and resume from the last revision seen, so a watcher may see a key
// again but never misses its latest state. A value that cannot be decoded, has
// a newer protocol version, or is stored under a key that does not match its
// content is logged, counted (natswire.Rejections), and skipped: bad input never stops
// a watch.
type Bus interface {
	// PutIntent makes in the stored intent of guest in.UID on node.
	PutIntent(ctx context.Context, node string, in wire.Intent) (revision uint64, err error)
	// DeleteIntent removes the intent of guest uid on node, which tells the
	// node's agent to delete the guest.
	DeleteIntent(ctx context.Context, node, uid string) error
	// PutVolumeIntent makes v the stored intent of Volume v.UID on node.
	PutVolumeIntent(ctx context.Context, node string, v wire.VolumeIntent) (revision uint64, err error)
	// DeleteVolumeIntent removes the intent of Volume uid on node; the node's
	// agent then removes the Volume's report.
	DeleteVolumeIntent(ctx context.Context, node, uid string) error
	// DeleteVolumeReport removes the report of Volume uid on node. The agent
	// removes it itself when it sees the intent deleted; the hub does it
	// only for a Volume that no longer exists, whose agent may have missed
	// that (it was down when the intent went).
	DeleteVolumeReport(ctx context.Context, node, uid string) error
	// PutFabric makes f the stored Fabric of node.
	PutFabric(ctx context.Context, node string, f wire.Fabric) (revision uint64, err error)
	// WatchReports calls fn for every report change, of guests, of Volumes
	// (ReportEvent.Volume) and of images on nodes (ReportEvent.Image).
	WatchReports(ctx context.Context, fn func(ReportEvent)) error
	// WatchNodes calls fn for every heartbeat and every node lost.
	WatchNodes(ctx context.Context, fn func(NodeEvent)) error
	// OpenConsole opens a session to console open.Kind of guest open.UID
	// on node, through that node's agent, and returns its stream (see
	// natswire.DialConsole): reads yield the guest's output, writes reach
	// the guest, Close ends the session. An open without a session gets a
	// fresh one. ctx bounds the opening only. A node that refuses returns a
	// *natswire.ConsoleRefusedError; one that does not answer, an error
	// saying so.
	OpenConsole(ctx context.Context, node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error)
}

// ReportEvent is the state of one guest's report key, or, with Volume set,
// of one Volume's, or, with Image set, of one image's on one node.
type ReportEvent struct {
	// Synced marks the end of the reports that existed when the watch
	// began; every other field is empty.
	Synced    bool
	Node, UID string
	Revision  uint64
	// Deleted is true when the agent removed the report (the guest is gone).
	Deleted bool
	// Report is set unless Deleted.
	Report wire.Report
	// Volume is set for a Volume's report key ("<node>.volume.<uid>"); the
	// fields above are then empty.
	Volume *VolumeReportEvent
	// Image is set for an image's report key ("<node>.image.<uid>"); the
	// fields above are then empty.
	Image *ImageReportEvent
}

// ImageReportEvent is the state of one image's report key on one node.
type ImageReportEvent struct {
	Node, UID string
	Revision  uint64
	// Deleted is true when the agent removed the report: the image is no
	// longer on the node.
	Deleted bool
	// Report is set unless Deleted.
	Report wire.ImageReport
}

// VolumeReportEvent is the state of one Volume's report key.
type VolumeReportEvent struct {
	Node, UID string
	Revision  uint64
	// Deleted is true when the agent removed the report, after the hub
	// deleted the Volume's intent.
	Deleted bool
	// Report is set unless Deleted.
	Report wire.VolumeReport
}

// NodeEvent is the state of one node's heartbeat key.
type NodeEvent struct {
	Node     string
	Revision uint64
	// Lost is true when the heartbeat expired or was removed.
	Lost      bool
	Heartbeat wire.NodeHeartbeat
}

// ConflictError means the key changed between read and write.
type ConflictError struct {
	Key string
	Err error
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("intent %s was changed concurrently: %v", e.Key, e.Err)
}

func (e *ConflictError) Unwrap() error { return e.Err }
