package driver

import (
	"context"
	"time"
)

// Migrator is implemented by a Driver that moves a running guest to another
// node of the same backend while it runs (live migration). The hub drives
// a migration in two steps, each level-triggered like Ensure:
//
//  1. The target node's agent calls PrepareIncoming until it succeeds, and
//     announces that it is ready.
//  2. The source node's agent then calls Migrate, again and again, until
//     the status it returns is final (Succeeded or Failed).
//
// A guest exists on exactly one node at every instant the driver can tell:
// the source guest keeps running until the target one runs, and a
// migration that fails or is cancelled leaves the guest running where it
// was. Neither method ever creates a guest from its disks.
type Migrator interface {
	// PrepareIncoming makes this node ready to receive guest m by a live
	// migration: everything the guest needs that the migration itself
	// does not carry (its networks and the reservation of its addresses,
	// its cloud-init seed, the storage pool its disks go to), never the
	// guest nor its disks' data: a backend may make the volumes the
	// migration copies into, empty, where its own would not do (libvirt's
	// are qcow2 version 2, without dirty bitmaps). What it makes stays
	// while the migration may still come, and goes with Delete(m.UID)
	// when it does not. It is idempotent, and succeeds at once when the
	// guest already runs here.
	PrepareIncoming(ctx context.Context, m Machine) error

	// Migrate starts the live migration of the running guest m.UID to the
	// node t names, or reports on the one it started with t.ID. It never
	// waits for the migration: the first call starts it and returns phase
	// MigrationRunning, later calls return its progress, and once it is
	// over its final status (kept by ID while the process lives).
	//
	// Disks of the node (every disk in m.Disks) are copied to the target
	// while the guest runs, and once the guest runs there what it left on
	// this node goes: its definition, its disks, its seed and swap. A
	// migration that fails leaves the guest running here, as it was, and
	// the target without it.
	//
	// A guest that is not on the node returns a NotFound error (unless a
	// migration with t.ID moved it away: its status then); a guest that
	// is not running, or a Machine the backend cannot move live (an
	// imported disk the target cannot have), a Terminal one.
	Migrate(ctx context.Context, m Machine, t MigrationTarget) (MigrationStatus, error)
}

// MigrationTarget is where a migration goes.
type MigrationTarget struct {
	// ID names the migration; a new ID is a new attempt.
	ID string
	// Node is the target node's name, for messages.
	Node string
	// URI is the target's hypervisor as the target node announced it (on
	// libvirt the URI the source's libvirtd connects to, such as
	// qemu+tls://host/system); the guest's memory and disks go to its
	// host.
	URI string
	// Cancel asks to abort the migration with ID if it still runs: it then
	// ends Failed with the guest running here, as before. A migration that
	// is over stays as it ended, and one not started yet never starts.
	Cancel bool
}

// MigrationPhase is how far a migration got.
type MigrationPhase string

// Migration phases a driver reports.
const (
	MigrationRunning   MigrationPhase = "Running"
	MigrationSucceeded MigrationPhase = "Succeeded"
	MigrationFailed    MigrationPhase = "Failed"
)

// MigrationStatus is what a driver tells of one migration, as its backend
// reports it.
type MigrationStatus struct {
	ID    string
	Phase MigrationPhase
	// StartedAt and FinishedAt bound the migration on this node; FinishedAt
	// is zero while it runs.
	StartedAt, FinishedAt time.Time
	// TotalBytes is what is to be transferred (memory and disks), so far as
	// the backend knows; ProcessedBytes what was.
	TotalBytes, ProcessedBytes int64
	// Downtime is how long the guest was paused for the switch-over, once
	// Succeeded; zero where the backend does not tell.
	Downtime time.Duration
	// Message says why a migration failed, or what it is doing.
	Message string
}

// HostMigrator is implemented by a Driver whose node is a cloud or a
// cluster of many hosts (Nova, KubeVirt): it moves a guest live between
// the backend's own hosts, as Nova's live migration and KubeVirt's
// VirtualMachineInstanceMigration do, and the guest stays on the node,
// managed by the same agent.
type HostMigrator interface {
	// MigrateHost starts, or reports on, the live migration with the given
	// id of the running guest m.UID to another host of the backend: host,
	// or one the backend's scheduler chooses when host is empty. Like
	// Migrator.Migrate it never waits: the first call asks the backend,
	// later calls return the progress, and a final status (Succeeded or
	// Failed) is kept by id while the process lives. Once Succeeded,
	// Observe reports the guest's new host in Observation.Node. A
	// migration that fails leaves the guest running where it was.
	//
	// A guest that is not on the node returns a NotFound error; one that
	// is not running, or a host the backend does not know, a Terminal one.
	MigrateHost(ctx context.Context, m Machine, id, host string) (MigrationStatus, error)
}
