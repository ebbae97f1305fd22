// Package metrics names every Prometheus metric virtfleet exports: the hub's
// on its metrics endpoint (controller-runtime's registry, beside the
// controllers' own), the agent's on its own. Both commands, the README's
// table, the dashboard and the alert rules in cluster/monitoring read these
// names, so they are declared here once; the code that observes them lives
// with what it observes.
//
// No metric has a label per VirtualMachine, Volume or image: a fleet's
// series grow with its nodes, phases and operations, never with its guests.
package metrics

import (
	"runtime"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/virtfleet/virtfleet/internal/version"
)

// Values of the labels below that are not taken from the API.
const (
	// BackendNone is the backend label of a VM on no node yet.
	BackendNone = "none"

	ResultSuccess = "success"
	ResultFailure = "failure"
	// Results of a live migration (Migrations).
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"

	// Results of a backup verification (BackupVerifications): every
	// chunk read back as written, some did not, or the backup could not
	// be read.
	ResultIntact  = "intact"
	ResultCorrupt = "corrupt"
	ResultError   = "error"
	// Outcomes of a backup's chunk (BackupChunks): new to the location,
	// or there already.
	ChunkWritten = "written"
	ChunkReused  = "reused"

	// ReasonForeignNode is the ReportsIgnored reason of a report from a
	// node the resource is not placed on; the other reasons are
	// natswire's.
	ReasonForeignNode = "foreign-node"

	// Reasons the sweep deleted a stray intent (StrayIntentsDeleted): no
	// VirtualMachine has its uid, or the one that has binds it elsewhere.
	ReasonVMGone   = "vm-gone"
	ReasonNotBound = "not-bound"
)

// Hub metrics computed when scraped, from the hub's cache and its view of
// the nodes' heartbeats.
var (
	VMs = desc("virtfleet_hub_vms",
		"VirtualMachines by status phase and by the backend of the node they are placed on (none before placement).",
		"phase", "backend")
	DiskImages = desc("virtfleet_hub_diskimages",
		"DiskImages by status phase.",
		"phase")
	VMSnapshots = desc("virtfleet_hub_vm_snapshots",
		"VirtualMachineSnapshots by status phase.",
		"phase")
	VMBackups = desc("virtfleet_hub_vm_backups",
		"VirtualMachineBackups by status phase.",
		"phase")
	NodeCapacity = desc("virtfleet_hub_node_capacity",
		"What a node offers to guests, as its latest heartbeat says (resource vcpu in cores, memory and storage in bytes).",
		"node", "backend", "resource", "unit")
	NodeAllocated = desc("virtfleet_hub_node_allocated",
		"What a node's guests use, as its latest heartbeat says.",
		"node", "backend", "resource", "unit")
	NodeVMs = desc("virtfleet_hub_node_vms",
		"VirtualMachines placed on a node.",
		"node")
	NodeReady = desc("virtfleet_hub_node_ready",
		"1 while a node's heartbeats arrive, 0 once the hub counts it lost; a lost node stays until the hub restarts.",
		"node")
	NodeLastHeartbeat = desc("virtfleet_hub_node_last_heartbeat_timestamp_seconds",
		"When the hub last received a node's heartbeat, in seconds since the epoch.",
		"node")
	BucketBytes = desc("virtfleet_hub_nats_bucket_bytes",
		"Bytes a JetStream bucket of the wire (intents, reports, nodes) stores, by the NATS servers holding it (their cluster's name, or the server's).",
		"nats", "bucket")
	BucketMaxBytes = desc("virtfleet_hub_nats_bucket_max_bytes",
		"A bucket's limit in bytes: past it JetStream refuses new values (intents and reports cannot be written).",
		"nats", "bucket")
	BucketValues = desc("virtfleet_hub_nats_bucket_values",
		"Messages a bucket stores: current values and the markers of deleted and expired ones.",
		"nats", "bucket")
	NodeReportValues = desc("virtfleet_hub_node_reports_values",
		"Report keys a node's own reports stream holds: its reports and the markers of deleted ones.",
		"nats", "node")
	NodeReportMaxValues = desc("virtfleet_hub_node_reports_max_values",
		"The keys a node's reports may hold: past it the node's new reports are refused, and no other node's.",
		"nats", "node")
	NodeReportBytes = desc("virtfleet_hub_node_reports_bytes",
		"Bytes a node's own reports stream stores.",
		"nats", "node")
	NodeReportMaxBytes = desc("virtfleet_hub_node_reports_max_bytes",
		"The bytes a node's reports may take: past it the node's new reports are refused, and no other node's.",
		"nats", "node")
)

// Hub metrics observed as things happen.
var (
	CreateToRunning = histogram(prometheus.HistogramOpts{
		Name: "virtfleet_hub_vm_create_to_running_seconds",
		Help: "From a VirtualMachine's creation to the first report of its guest Running, for VMs started as created (never stopped, restarted or edited on the way).",
		// From the test driver's seconds to a real guest's minutes
		// under TCG.
		Buckets: []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200},
	}, "backend")
	VMObserves = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_vm_observes_total",
		Help: "Times the hub compared a VirtualMachine with its node's report: one per reconcile that got past the hub's reconcile rate limit and found the hub's view of the VM's fleet read. After a restart, the new hub has looked at every VM once it counted as many as there are VMs.",
	})
	PlacementDuration = histogram(prometheus.HistogramOpts{
		Name:    "virtfleet_hub_placement_duration_seconds",
		Help:    "From a VirtualMachine's creation to the hub recording the node it chose.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300},
	})
	Migrations = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_migrations_total",
		Help: "Live migrations (VirtualMachineMigrations) that ended, by result: succeeded, or failed (the VM runs where it ran).",
	}, "result")
	MigrationDuration = histogram(prometheus.HistogramOpts{
		Name: "virtfleet_hub_migration_duration_seconds",
		Help: "How long a live migration that succeeded took, from the source starting it to the guest running on the target, as the nodes report it.",
		// A move within a cloud takes seconds; one that copies disks over
		// a slow link, many minutes.
		Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800},
	})
	MigrationDowntime = histogram(prometheus.HistogramOpts{
		Name:    "virtfleet_hub_migration_downtime_seconds",
		Help:    "How long the guest of a live migration that succeeded was paused to switch over, as the hypervisor reports it; not observed where the hypervisor does not tell (Nova, KubeVirt).",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5},
	})
	RestartsElsewhere = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_vm_restarts_elsewhere_total",
		Help: "VirtualMachines with availability Restart the hub moved off a lost node, once the node's lease and the fencing margin ran out.",
	})
	LostToRestart = histogram(prometheus.HistogramOpts{
		Name: "virtfleet_hub_vm_lost_to_restart_seconds",
		Help: "From the last heartbeat the hub received from a lost node to the hub moving one of its VMs with availability Restart to another node: the node's lease, the margin and how long the hub took.",
		// A lease of seconds to a minute, and a margin of seconds.
		Buckets: []float64{5, 10, 15, 20, 30, 45, 60, 90, 120, 300},
	})
	StrayIntentsDeleted = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_stray_intents_deleted_total",
		Help: "Guest intents the hub's periodic sweep deleted, and with them their guests, because no VirtualMachine binds them to their node, by reason: vm-gone (no VirtualMachine has the uid) or not-bound (the VM is bound to another node or to none).",
	}, "reason")
	PlacementRefusals = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_placement_refusals_total",
		Help: "Placement attempts refused, by reason: one count per reason that kept some node from taking the VM (vcpu, memory, selector, backend, volume-node, image-node, storage-pool, stale-node, cordoned), no-nodes, forbidden (not granted to the namespace), waiting (for a Volume, network or image that does not exist yet, or a cloned image's source or holder), or other.",
	}, "reason")
	ReportsIgnored = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_reports_ignored_total",
		Help: "Reports and heartbeats the hub read from NATS and ignored, by reason (decode, protocol-version, key, key-content-mismatch, foreign-node).",
	}, "reason")
	NodeClaimsRefused = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_node_claims_refused_total",
		Help: "Claims of a node's heartbeat the hub ignores because its HypervisorNode does not allow them, by claim (label, shared-pool, tunnel-address, migration-uri); counted once each time a refusal begins.",
	}, "claim")
	ForeignReports = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_foreign_reports_total",
		Help: "Reports about a VirtualMachine, Volume, DiskImage or VirtualMachineSnapshot from a node it is not placed on; the hub ignores them.",
	}, "kind", "node", "operation")
	EventsDropped = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_events_dropped_total",
		Help: "Normal Kubernetes events the hub did not record because they exceeded its budget of Normal events (--normal-events-per-second), by event reason; Warning events are never dropped.",
	}, "reason")
	Backups = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_backups_total",
		Help: "VirtualMachineBackups that ended, by result: succeeded, or failed (nothing of it can be restored); counted by the hub when the node's final report reaches the backup's status.",
	}, "result")
	BackupReadBytes = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_backup_read_bytes_total",
		Help: "Bytes nodes read of VMs' disks for backups that ended, succeeded or failed, as the node's final report says; counted when the backup ends.",
	})
	BackupWrittenBytes = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_backup_written_bytes_total",
		Help: "Bytes of chunks new to their location that nodes wrote for backups that ended, succeeded or failed (sealed size where encrypted); counted when the backup ends.",
	})
	BackupChunks = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_backup_chunks_total",
		Help: "Chunks of backups that ended, by outcome: written (new to the location) or reused (the location held them already: unchanged or shared data, not uploaded); counted when the backup ends.",
	}, "outcome")
	BackupVerifications = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_backup_verifications_total",
		Help: "VirtualMachineBackupVerifications that ended, by result: intact (every chunk read back as written), corrupt (some chunk missing or not matching), or error (the backup could not be read).",
	}, "result")
	BackupVerificationCorruptChunks = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_backup_verification_corrupt_chunks_total",
		Help: "Chunks that verifications found missing from their location or not matching their name.",
	})
	UndecodableObjects = counter(prometheus.CounterOpts{
		Name: "virtfleet_hub_undecodable_objects_total",
		Help: "Objects the API server holds that the hub cannot decode into its types, found when a watch failed, by kind.",
	}, "kind")
	// HubBuildInfo is the hub's build, as Prometheus's own *_build_info:
	// one series of value 1, whose labels change as an upgrade replaces
	// the replicas.
	HubBuildInfo = gauge(prometheus.GaugeOpts{
		Name: "virtfleet_hub_build_info",
		Help: "Always 1; version is the hub's version (a release build's, or the Go module version it was built from), goversion the Go it was built with.",
	}, "version", "goversion")
)

func init() {
	HubBuildInfo.WithLabelValues(version.Get(), runtime.Version()).Set(1)
	// The backups' series exist from the start, at 0, so that increase()
	// over them sees the first backup that fails and the first corrupt
	// chunk (the alert rules rely on it).
	BackupReadBytes.WithLabelValues()
	BackupWrittenBytes.WithLabelValues()
	BackupVerificationCorruptChunks.WithLabelValues()
	for _, r := range []string{ResultSucceeded, ResultFailed} {
		Backups.WithLabelValues(r)
	}
	for _, o := range []string{ChunkWritten, ChunkReused} {
		BackupChunks.WithLabelValues(o)
	}
	for _, r := range []string{ResultIntact, ResultCorrupt, ResultError} {
		BackupVerifications.WithLabelValues(r)
	}
}

// AgentMetrics are one agent's metrics. A process runs one agent, which
// observes into the package's (DefaultAgent, whose collectors are also the
// variables below); a test that runs several agents in one process gives
// each its own (NewAgentMetrics), so one agent's guest counts do not
// overwrite another's.
type AgentMetrics struct {
	DriverCalls         *prometheus.HistogramVec
	ResyncDuration      *prometheus.HistogramVec
	Guests              *prometheus.GaugeVec
	ImageImports        *prometheus.CounterVec
	ImageImportBytes    *prometheus.CounterVec
	ImageImportDuration *prometheus.HistogramVec
	IntentsIgnored      *prometheus.CounterVec
	FencedGuests        *prometheus.CounterVec
	// BuildInfo is the agent's build, as HubBuildInfo is the hub's.
	BuildInfo *prometheus.GaugeVec
}

// NewAgentMetrics returns a new set of the agent's metrics, registered
// nowhere.
func NewAgentMetrics() *AgentMetrics {
	m := &AgentMetrics{
		DriverCalls: histogram(prometheus.HistogramOpts{
			Name:    "virtfleet_agent_driver_call_duration_seconds",
			Help:    "Calls of the agent into its backend's driver, by operation (ensure, delete, list, images, capacity, ...) and result (success or failure: the call returned an error).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
		}, "operation", "result"),
		ResyncDuration: histogram(prometheus.HistogramOpts{
			Name:    "virtfleet_agent_resync_duration_seconds",
			Help:    "How long one full resync took: listing the node's guests (and orphans) from the backend and queueing every guest and Volume; the guests' own reconciles are counted as driver calls.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}),
		Guests: gauge(prometheus.GaugeOpts{
			Name: "virtfleet_agent_guests",
			Help: "Guests of this node by the phase the agent last reported.",
		}, "phase"),
		ImageImports: counter(prometheus.CounterOpts{
			Name: "virtfleet_agent_image_imports_total",
			Help: "Image imports (download and verification) this node finished, by result (success or failure); every failed attempt counts.",
		}, "result"),
		ImageImportBytes: counter(prometheus.CounterOpts{
			Name: "virtfleet_agent_image_import_bytes_total",
			Help: "Bytes of the images this node imported successfully.",
		}),
		ImageImportDuration: histogram(prometheus.HistogramOpts{
			Name:    "virtfleet_agent_image_import_duration_seconds",
			Help:    "How long an image import took, successful or not.",
			Buckets: []float64{1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}, "result"),
		IntentsIgnored: counter(prometheus.CounterOpts{
			Name: "virtfleet_agent_intents_ignored_total",
			Help: "Intents and fabric values the agent read from NATS and ignored, by reason (decode, protocol-version, key, key-content-mismatch).",
		}, "reason"),
		FencedGuests: counter(prometheus.CounterOpts{
			Name: "virtfleet_agent_fenced_guests_total",
			Help: "Guests the agent destroyed because it had stored no heartbeat for its lease (--fence-after): the hub may restart them on another node.",
		}),
		BuildInfo: gauge(prometheus.GaugeOpts{
			Name: "virtfleet_agent_build_info",
			Help: "Always 1; version is the agent's version, the one its heartbeat reports, goversion the Go it was built with.",
		}, "version", "goversion"),
	}
	m.BuildInfo.WithLabelValues(version.Get(), runtime.Version()).Set(1)
	// The series without labels exist from the start, at 0, so a rate
	// over them is defined before the first observation.
	m.ResyncDuration.WithLabelValues()
	m.ImageImportBytes.WithLabelValues()
	m.FencedGuests.WithLabelValues()
	return m
}

// Collectors are m's collectors, for the agent to register.
func (m *AgentMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.DriverCalls, m.ResyncDuration, m.Guests, m.ImageImports, m.ImageImportBytes, m.ImageImportDuration, m.IntentsIgnored, m.FencedGuests, m.BuildInfo}
}

var defaultAgent = NewAgentMetrics()

// DefaultAgent are the agent metrics of this process.
func DefaultAgent() *AgentMetrics { return defaultAgent }

var (
	mu    sync.Mutex
	names = map[string]bool{}
)

// Names are the names of every metric declared here, sorted. A histogram's
// series add _bucket, _sum and _count to its name.
func Names() []string {
	mu.Lock()
	defer mu.Unlock()
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func declare(name string) {
	mu.Lock()
	defer mu.Unlock()
	names[name] = true
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	declare(name)
	return prometheus.NewDesc(name, help, labels, nil)
}

func counter(o prometheus.CounterOpts, labels ...string) *prometheus.CounterVec {
	declare(o.Name)
	return prometheus.NewCounterVec(o, labels)
}

func gauge(o prometheus.GaugeOpts, labels ...string) *prometheus.GaugeVec {
	declare(o.Name)
	return prometheus.NewGaugeVec(o, labels)
}

func histogram(o prometheus.HistogramOpts, labels ...string) *prometheus.HistogramVec {
	declare(o.Name)
	return prometheus.NewHistogramVec(o, labels)
}

// HubObserved are the hub's metrics observed as things happen, for the hub
// to register; the scraped ones it serves from its own collector.
func HubObserved() []prometheus.Collector {
	return []prometheus.Collector{CreateToRunning, VMObserves, PlacementDuration, PlacementRefusals, ReportsIgnored, NodeClaimsRefused, ForeignReports, UndecodableObjects, EventsDropped, Migrations, MigrationDuration, MigrationDowntime, RestartsElsewhere, LostToRestart, StrayIntentsDeleted,
		Backups, BackupReadBytes, BackupWrittenBytes, BackupChunks, BackupVerifications, BackupVerificationCorruptChunks, HubBuildInfo}
}
