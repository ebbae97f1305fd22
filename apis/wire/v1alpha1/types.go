package v1alpha1

import (
	"strings"
	"time"
)

// ProtocolVersion is the newest wire version this package understands.
// Writers stamp it on every message; readers refuse anything newer, because a
// field they do not know may change what an older field means.
const ProtocolVersion = 1

// Intent is what the hub wants a node to make true for one guest. It lives in
// BucketIntents under GuestIntents.Key(node, uid); deleting the key means "delete the
// guest". An Intent is complete state, never a delta: an agent that sees the
// same Intent twice does nothing the second time.
type Intent struct {
	ProtocolVersion int    `json:"protocolVersion"`
	UID             string `json:"uid"`
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	// Generation is the VirtualMachine's metadata.generation; the agent echoes
	// it as Report.ObservedGeneration once it has acted on this Intent.
	Generation int64 `json:"generation"`
	Running    bool  `json:"running"`
	// RestartNonce changes once per requested restart; an agent restarts the
	// guest when the nonce differs from the one it last acted on.
	RestartNonce string `json:"restartNonce,omitempty"`
	// Paused asks that a running guest be paused: its vCPUs stopped and its
	// memory kept, until an intent without Paused resumes it. It applies
	// only while Running is set (a stopped guest stays stopped), a guest
	// started while it is set is paused as soon as it runs, and a guest
	// the hypervisor halted stays Failed. The node reports PhasePaused
	// meanwhile. An agent older than Paused ignores it, as it ignores any
	// field it does not know, and the guest keeps running.
	Paused bool `json:"paused,omitempty"`
	// ResetNonce changes once per requested hard reset (the guest restarts
	// at once, without being asked to shut down); an agent resets a running
	// or paused guest when the nonce differs from the one it last acted on,
	// and counts it in Report.RestartCount. The nonce a guest is created or
	// started with counts as handled.
	ResetNonce string `json:"resetNonce,omitempty"`
	// Fence asks the node to destroy the guest when it loses its lease
	// (NodeHeartbeat.FenceAfterMillis): the VM is to be restarted on another
	// node when this one is lost, and two copies must never run.
	Fence   bool          `json:"fence,omitempty"`
	Machine Machine       `json:"machine"`
	Backend BackendParams `json:"backend,omitempty"`
	// Release is the release marker the hub writes in place of the intent
	// of a VM deleted without the Delete management policy: the node stops
	// managing the guest, leaves it exactly as it is and remembers it as
	// orphaned from Namespace/Name. The node confirms with a Report whose
	// Released is set; the hub then deletes the marker. Machine is empty.
	Release bool `json:"release,omitempty"`
	// Seal, on a release marker, is the hub's mark on the release: the node
	// keeps it with the orphan and reports it in Orphan.Seal, and the hub
	// offers for adoption only orphans whose seal it made, so a node cannot
	// draw a VM to itself by reporting an orphan it never was given.
	Seal string `json:"seal,omitempty"`
	// Claim names an existing guest the VM takes over instead of creating
	// one: an orphan to adopt, or a guest imported by its backend's name.
	Claim *Claim `json:"claim,omitempty"`
	// ObserveOnly only reports the claimed guest and never changes it
	// (managementPolicies [Observe]); the guest is not taken over.
	ObserveOnly bool `json:"observeOnly,omitempty"`
	// Migration, on the intent of the node the guest runs on, asks that
	// node to move the running guest live to another node. While it is
	// set the node never creates, starts or stops the guest: it starts the
	// migration once, reports its progress in Report.Migration, and leaves
	// the guest running where it is if the migration fails.
	Migration *Migration `json:"migration,omitempty"`
	// Incoming, on the intent of a migration's target node, asks that node
	// to get ready to receive the guest (Machine is complete) and to report
	// Report.Incoming once it is; it never creates nor starts the guest
	// itself. Once the guest runs there the hub drops Incoming, and the
	// intent is the guest's like any other.
	//
	// An agent older than Migration and Incoming would take either for a
	// plain intent (a target would boot a second copy), so the hub sends
	// them only to nodes announcing NodeHeartbeat.MigrationURI.
	Incoming *Incoming `json:"incoming,omitempty"`
	// Restore asks the node to bring the guest back to one of its
	// snapshots (see Restore). The hub sends it only to nodes announcing
	// NodeHeartbeat.Snapshots.
	Restore *Restore `json:"restore,omitempty"`
}

// Migration is a live migration the source node carries out.
type Migration struct {
	// ID is the VirtualMachineMigration's uid; a new ID is a new attempt.
	ID string `json:"id"`
	// TargetNode is the node the guest moves to. The node itself means a
	// move between its backend's own hosts (NodeHeartbeat.HostMigration):
	// the guest stays on the node, and no other node takes part.
	TargetNode string `json:"targetNode"`
	// TargetURI is where the source's hypervisor reaches the target's, as
	// the target announced it (NodeHeartbeat.MigrationURI); empty for a
	// move within the node.
	TargetURI string `json:"targetURI,omitempty"`
	// TargetHost, for a move within the node, is the backend's host to go
	// to; empty lets the backend choose.
	TargetHost string `json:"targetHost,omitempty"`
	// Cancel asks the source to abort the migration if it still runs (its
	// VirtualMachineMigration was deleted): it then ends Failed with the
	// guest running where it was. One that is over stays as it ended.
	Cancel bool `json:"cancel,omitempty"`
}

// Incoming is a live migration the target node receives.
type Incoming struct {
	// ID is the migration's, as in Migration.ID.
	ID string `json:"id"`
	// SourceNode is the node the guest comes from, for messages.
	SourceNode string `json:"sourceNode"`
}

// Claim names an existing guest; exactly one field is set.
type Claim struct {
	// Orphan is the uid of the orphaned guest to adopt: the UID of the
	// Report carrying its Orphan.
	Orphan string `json:"orphan,omitempty"`
	// ExternalName is the backend's name or id of the guest (a libvirt
	// domain name or UUID, a Nova server id, a KubeVirt VirtualMachine
	// name), made by virtfleet or not.
	ExternalName string `json:"externalName,omitempty"`
}

// Orphan says which VM an orphaned guest was released from.
type Orphan struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Seal is the release marker's Seal, as the node kept it.
	Seal string `json:"seal,omitempty"`
}

// Machine is the guest's shape with every reference already resolved by the
// hub, so the agent never needs to read the Kubernetes API.
type Machine struct {
	VCPU        int32 `json:"vcpu"`
	MemoryBytes int64 `json:"memoryBytes"`
	// MaxVCPU and MaxMemoryBytes are the most VCPU and MemoryBytes may
	// grow to on the running guest; 0 leaves it to the node.
	MaxVCPU        int32     `json:"maxVcpu,omitempty"`
	MaxMemoryBytes int64     `json:"maxMemoryBytes,omitempty"`
	SwapBytes      int64     `json:"swapBytes,omitempty"`
	PublicKey      string    `json:"publicKey,omitempty"`
	UserData       string    `json:"userData,omitempty"`
	Firmware       Firmware  `json:"firmware,omitempty"`
	Disks          []Disk    `json:"disks,omitempty"`
	Networks       []Network `json:"networks,omitempty"`
	// Instancetype is the instance type VCPU, MemoryBytes and their
	// maxima came from, as the hub recorded it; nil for a VM that sets
	// them itself. It adds nothing to the shape: a backend with instance
	// types of its own (KubeVirt) runs the guest through one, and an
	// agent that does not know the field runs the same shape without it.
	Instancetype *InstancetypeRevision `json:"instancetype,omitempty"`
}

// InstancetypeRevision names one recorded revision of an instance type.
type InstancetypeRevision struct {
	// Kind is VirtualMachineClusterInstancetype or
	// VirtualMachineInstancetype (of the VM's namespace).
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Revision is the type's generation the shape was recorded at: a
	// new revision may be another shape under the same name.
	Revision int64 `json:"revision"`
}

// The kinds of instance type.
const (
	ClusterInstancetypeKind = "VirtualMachineClusterInstancetype"
	InstancetypeKind        = "VirtualMachineInstancetype"
)

// Firmware the guest boots with.
type Firmware string

// Firmwares.
const (
	FirmwareBIOS Firmware = "bios"
	FirmwareUEFI Firmware = "uefi"
)

// Disk is a resolved Volume attachment; the first disk is the boot disk.
type Disk struct {
	Name      string `json:"name"`
	VolumeUID string `json:"volumeUID"`
	SizeBytes int64  `json:"sizeBytes"`
	// Image is the DiskImage the volume is created from, if any.
	Image *ImageRef `json:"image,omitempty"`
	// ExternalName is set when the Volume imports a volume of the node by
	// external name (VolumeIntent.ExternalName): the disk is that volume,
	// attached as it is and never created, resized or filled; SizeBytes is
	// its size as the node reported it. Empty means the node's volume
	// NameOnNode(Namespace, Name). The hub sends it only once the node
	// reported the import, and never with Image.
	ExternalName string `json:"externalName,omitempty"`
	// Pool is the shared storage pool (NodeHeartbeat.SharedPools) holding
	// the volume; empty means the node's own default pool. A volume in a
	// shared pool that another node made is opened as it is, never made
	// again.
	Pool string `json:"pool,omitempty"`
}

// ImageRef is a resolved DiskImage. The node imports it once, however many
// disks use it, and prunes it once no disk there has needed it for
// PruneAfterSeconds. It comes from exactly one of URL, SourceVolume,
// SourceSnapshot, ExternalName or Backup, or is Held.
type ImageRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
	// URL is the http or https address the image is downloaded from. An
	// agent older than SourceVolume sees it empty and refuses the image.
	URL string `json:"url,omitempty"`
	// SourceVolume makes the image a copy of that Volume's disk on the node,
	// taken when the node first needs the image. The hub sends it only to
	// the node the Volume is bound to.
	SourceVolume *SourceVolume `json:"sourceVolume,omitempty"`
	// SourceSnapshot, instead of SourceVolume, makes the image a copy of
	// a Volume's disk as it was in one of its VM's snapshots, which the
	// disk holds. It is a field of its own, not one more of SourceVolume:
	// an agent older than it sees no source and refuses the image rather
	// than copy the disk as it is now.
	SourceSnapshot *SourceSnapshot `json:"sourceSnapshot,omitempty"`
	// ExternalName, instead of URL or SourceVolume, is an image that exists
	// on the node's backend already (a Glance image's name or id), which
	// the DiskImage imports by its crossplane.io/external-name: the node
	// uses it as it is and never deletes it. An agent older than
	// ExternalName sees neither URL nor SourceVolume and refuses the image.
	ExternalName string `json:"externalName,omitempty"`
	// Backup, instead of the others, makes the image from one disk of a
	// backup in a backup location: a raw image of that disk as it was
	// backed up. An agent older than Backup sees no source and refuses
	// the image.
	Backup *ImageBackup `json:"backup,omitempty"`
	// Held, instead of the others, is an image cloned from a source that
	// is gone: nothing is left to make it of, so the node makes a disk of
	// it only from the copy it holds, and fails one it cannot (never an
	// empty disk). The hub sends it only for a disk the node made already
	// or to a node that reported the image Ready. An agent older than Held
	// sees no source and refuses the image.
	Held bool `json:"held,omitempty"`
	// Checksum is the expected lowercase hex SHA-256 of the download; empty
	// skips the check.
	Checksum string `json:"checksum,omitempty"`
	// Format is qcow2 or raw; empty means qcow2.
	Format string `json:"format,omitempty"`
	// PruneAfterSeconds is how long the image stays on a node unused; 0
	// means the agent's default (24 h).
	PruneAfterSeconds int64 `json:"pruneAfterSeconds,omitempty"`
	// AllowedSources are the CIDRs outside the public internet a cluster
	// administrator allowed the DiskImage's namespace to download from
	// (TenantGrant.ImageSources). The agent refuses to connect to any
	// other loopback, link-local, private, shared, unique-local,
	// unspecified or multicast address, after every redirect.
	AllowedSources []string `json:"allowedSources,omitempty"`
}

// SourceVolume is the Volume a cloned image copies. Volumes are named on the
// node by namespace and name (NameOnNode), so the agent needs the name; the
// uid says which incarnation of that name the hub meant.
type SourceVolume struct {
	// Name is the Volume's name, in the intent's namespace.
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// SourceSnapshot is a Volume's disk as it was in a snapshot of its VM.
type SourceSnapshot struct {
	// Volume is the Volume whose disk holds the snapshot.
	Volume SourceVolume `json:"volume"`
	// Snapshot is the VirtualMachineSnapshot's uid, which names the
	// snapshot on the node (SnapshotIntent.UID).
	Snapshot string `json:"snapshot"`
}

// ImageBackup is one disk of a backup, and where the backup is.
type ImageBackup struct {
	// Location is the backup's location, with the credentials to read
	// it; it travels only in the intents of the node that reads it.
	Location BackupLocation `json:"location"`
	// Namespace keeps the backup in its location: always the namespace
	// of the DiskImage that reads it.
	Namespace string `json:"namespace"`
	// ID is the backup's: the uid of the VirtualMachineBackup that took
	// it.
	ID string `json:"id"`
	// Disk is the disk of the backup the image is made of, "root" for
	// the disk its VM booted from.
	Disk string `json:"disk"`
}

// Network is a resolved VirtualNetwork attachment.
type Network struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
	// Mode is nat or bridge on libvirt; other backends map it as they can.
	Mode   string `json:"mode,omitempty"`
	CIDR   string `json:"cidr,omitempty"`
	Bridge string `json:"bridge,omitempty"`
	// ExternalName is set when the VirtualNetwork imports a network by
	// external name: the node's network of that name (a libvirt network,
	// a Neutron network's name or id) is used as it is, never created,
	// changed or deleted, and it must be what Mode, CIDR and Bridge say.
	// Empty means the node's network NameOnNode(Namespace, Name), made from
	// Mode, CIDR and Bridge when missing.
	ExternalName string `json:"externalName,omitempty"`
	// Address is the interface's address, with the network's prefix length
	// ("10.10.120.7/24"), as the hub allocated it: the node serves it to
	// the interface's MAC by DHCP (or configures it where the backend does
	// so natively) and its DHCP serves no other address. Empty on an
	// imported or bridge-mode network, whose addresses are not the hub's.
	Address string `json:"address,omitempty"`
	// VNI is the VXLAN network identifier joining the network's bridges on
	// every libvirt node into one segment; 0 keeps the network local to the
	// node. The peers are the Fabric's.
	VNI int32 `json:"vni,omitempty"`
	// VLAN, on a bridge-mode network, is the 802.1Q tag (1 to 4094) guests
	// join on the host bridge Bridge, a trunk: the node makes a VLAN device
	// of that id on it and a bridge of its own for the guests. 0 joins the
	// host bridge untagged.
	VLAN int32 `json:"vlan,omitempty"`
}

// Fabric is what a node needs to join the fleet's overlay: the tunnel
// addresses of the other nodes. It lives in BucketIntents under
// Fabrics.Key(node, FabricUID), written by the hub whenever a node announces, changes or
// loses its NodeHeartbeat.TunnelAddress. A node floods a network's
// broadcasts to every peer, as a VXLAN zone with a peer list does; a peer
// without the network drops them.
type Fabric struct {
	ProtocolVersion int `json:"protocolVersion"`
	// Peers are the other nodes' tunnel addresses, sorted.
	Peers []string `json:"peers,omitempty"`
}

// BackendParams selects and parameterises the node's Driver.
type BackendParams struct {
	// Type is libvirt, nova or kubevirt; empty means the node's default.
	Type   string            `json:"type,omitempty"`
	Params map[string]string `json:"params,omitempty"`
}

// Phase is the lifecycle phase of a guest as the agent observes it.
type Phase string

// Phases, in the order a healthy guest walks through them.
const (
	PhasePending      Phase = "Pending"
	PhaseScheduled    Phase = "Scheduled"
	PhaseProvisioning Phase = "Provisioning"
	PhaseStarting     Phase = "Starting"
	PhaseRunning      Phase = "Running"
	PhasePaused       Phase = "Paused"
	PhaseStopping     Phase = "Stopping"
	PhaseStopped      Phase = "Stopped"
	PhaseFailed       Phase = "Failed"
	PhaseUnknown      Phase = "Unknown"
	PhaseDeleting     Phase = "Deleting"
)

// Phases are the phases this protocol version knows, in the order above.
// A new phase needs no new protocol version: a hub shows a phase it does
// not know as Unknown (see the hub's apiPhase), so a hub older than Paused
// shows a paused guest Unknown rather than refusing its report.
var Phases = []Phase{PhasePending, PhaseScheduled, PhaseProvisioning, PhaseStarting, PhaseRunning, PhasePaused, PhaseStopping, PhaseStopped, PhaseFailed, PhaseUnknown, PhaseDeleting}

// Report is what a node's agent observes about one guest. It lives in
// BucketReports under GuestReports.Key(node, uid) and only that node's agent writes it.
type Report struct {
	ProtocolVersion    int    `json:"protocolVersion"`
	UID                string `json:"uid"`
	ObservedGeneration int64  `json:"observedGeneration"`
	Phase              Phase  `json:"phase"`
	ID                 string `json:"id,omitempty"`
	// Node is the reporting node, set by the node's own bus: the name the
	// hub checks against the node the VM is placed on.
	Node string `json:"node"`
	// Host is the machine the guest really runs on when the backend has a
	// name of its own for it (Nova's OS-EXT-SRV-ATTR:host, the KubeVirt
	// VMI's node); on libvirt it is Node. It is what NODE shows, and it is
	// never used to decide who may speak for the guest.
	Host            string      `json:"host,omitempty"`
	Interfaces      []Interface `json:"interfaces,omitempty"`
	RestartCount    int32       `json:"restartCount"`
	RestartRequired bool        `json:"restartRequired,omitempty"`
	Message         string      `json:"message,omitempty"`
	ObservedAt      time.Time   `json:"observedAt"`
	// VCPU and MemoryBytes are the guest's real shape, as the backend
	// defines it; 0 when the backend does not tell.
	VCPU        int32 `json:"vcpu,omitempty"`
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// MaxVCPU and MaxMemoryBytes are the most the running guest can grow
	// to without a restart; 0 when the backend cannot grow it live.
	MaxVCPU        int32 `json:"maxVcpu,omitempty"`
	MaxMemoryBytes int64 `json:"maxMemoryBytes,omitempty"`
	// Disks name the Volumes (Disk.Name) attached to the guest as it
	// runs, the boot disk first, in the order the backend has them. A
	// Volume removed from the intent stays until the guest has released
	// it, named by NameFromNode; a disk no Volume of the intent's
	// namespace names that way is left out. Nil when the backend does not
	// tell.
	Disks []string `json:"disks,omitempty"`
	// Released confirms a release marker: the node no longer manages the
	// guest and left it as it was.
	Released bool `json:"released,omitempty"`
	// Orphan is set on the report of a guest no VM manages any more. The
	// node keeps that report as long as the guest is there, so a VM of the
	// same namespace and name can find and adopt it (Intent.Claim).
	Orphan *Orphan `json:"orphan,omitempty"`
	// Migration is the progress of the migration Intent.Migration asked
	// for, on the source node's report.
	Migration *MigrationReport `json:"migration,omitempty"`
	// Incoming, on a migration target's report, is the ID of the migration
	// the node is ready to receive (Intent.Incoming). The report's phase
	// is Pending until the guest arrives, and the guest's once it runs
	// there.
	Incoming string `json:"incoming,omitempty"`
	// Restore is the progress of the restore Intent.Restore asked for.
	Restore *RestoreReport `json:"restore,omitempty"`
}

// MigrationPhase is how far a live migration got on its source node.
type MigrationPhase string

// Migration phases.
const (
	MigrationRunning   MigrationPhase = "Running"
	MigrationSucceeded MigrationPhase = "Succeeded"
	MigrationFailed    MigrationPhase = "Failed"
)

// MigrationReport is a live migration as its source node sees it, with the
// figures the hypervisor reports.
type MigrationReport struct {
	ID    string         `json:"id"`
	Phase MigrationPhase `json:"phase"`
	// StartedAt and FinishedAt bound the migration; FinishedAt is unset
	// while it runs.
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// TotalBytes is what is to be transferred (memory and disks) as far as
	// the hypervisor knows, ProcessedBytes what was.
	TotalBytes     int64 `json:"totalBytes,omitempty"`
	ProcessedBytes int64 `json:"processedBytes,omitempty"`
	// DowntimeMilliseconds is how long the guest was paused to switch
	// over, once Succeeded; 0 where the hypervisor does not tell.
	DowntimeMilliseconds int64 `json:"downtimeMilliseconds,omitempty"`
	// Message says why the migration failed, or what it is doing.
	Message string `json:"message,omitempty"`
}

// AddressSource says how an interface's addresses were learned.
type AddressSource string

// Address sources, most to least authoritative on libvirt.
const (
	AddressSourceLease      AddressSource = "lease"
	AddressSourceGuestAgent AddressSource = "guest-agent"
	AddressSourceARP        AddressSource = "arp"
	AddressSourceBackend    AddressSource = "backend"
)

// Interface is one guest network interface.
type Interface struct {
	Network  string        `json:"network"`
	MAC      string        `json:"mac"`
	IPs      []string      `json:"ips,omitempty"`
	Source   AddressSource `json:"source,omitempty"`
	LastSeen time.Time     `json:"lastSeen"`
}

// NodeHeartbeat is a node's liveness and capacity. It lives in BucketNodes
// under NodeKey(node); the bucket's TTL purges it when the agent stops
// refreshing it, and that purge is how the hub learns a node is lost.
type NodeHeartbeat struct {
	ProtocolVersion int    `json:"protocolVersion"`
	Node            string `json:"node"`
	Backend         string `json:"backend"`
	// Hypervisor is how the node runs guests where its backend tells: on
	// libvirt the domain type, kvm or qemu (emulation, no KVM on the host).
	Hypervisor   string            `json:"hypervisor,omitempty"`
	Capacity     Resources         `json:"capacity"`
	Allocated    Resources         `json:"allocated"`
	Labels       map[string]string `json:"labels,omitempty"`
	AgentVersion string            `json:"agentVersion,omitempty"`
	// TunnelAddress is the node's address on the underlay, where the other
	// nodes send its overlay traffic; empty on a node without an overlay.
	TunnelAddress string `json:"tunnelAddress,omitempty"`
	// MigrationURI is where another node's hypervisor reaches this one's to
	// migrate a guest here (on libvirt a URI such as
	// qemu+tls://host/system); empty on a node that receives no live
	// migration. Announcing it also says the agent understands
	// Intent.Migration and Intent.Incoming.
	MigrationURI string `json:"migrationURI,omitempty"`
	// HostMigration says the node moves guests live between its backend's
	// own hosts (a Nova cloud's compute hosts, a KubeVirt cluster's nodes),
	// the guest staying on the node; it also says the agent understands
	// Intent.Migration.
	HostMigration bool `json:"hostMigration,omitempty"`
	// FenceAfterMillis is the node's lease: an agent that has not stored a
	// heartbeat for this long destroys every guest whose intent sets Fence,
	// and starts none of them again until it has read its intents afresh.
	// The hub restarts such a guest on another node only once the node has
	// been silent for longer than the lease and a margin, so the old copy
	// is dead before the new one starts. 0 (an agent that does not fence
	// itself) means the hub never restarts the node's guests elsewhere.
	FenceAfterMillis int64 `json:"fenceAfterMillis,omitempty"`
	// SharedPools are the storage pools on shared storage the node reaches
	// (an administrator's pools, by name, the same on every node that
	// reaches them): a disk in one of them can be opened by any of these
	// nodes, so its guest can be restarted on any of them.
	SharedPools []string `json:"sharedPools,omitempty"`
	// Snapshots says the node's backend keeps snapshots of its guests and
	// the agent understands SnapshotIntents and Intent.Restore; the hub
	// sends neither to a node without it.
	Snapshots bool `json:"snapshots,omitempty"`
	// Backups says the node's backend can copy its guests' disks to a
	// backup location and the agent understands BackupIntents; the hub
	// sends none to a node without it.
	Backups bool      `json:"backups,omitempty"`
	SentAt  time.Time `json:"sentAt"`
}

// Resources is an amount of node capacity.
type Resources struct {
	VCPU         int64 `json:"vcpu"`
	MemoryBytes  int64 `json:"memoryBytes"`
	StorageBytes int64 `json:"storageBytes,omitempty"`
}

// NameOnNode is the name a namespaced resource (a Volume or VirtualNetwork)
// has on a node. Kubernetes names are DNS labels without "_", so the
// separator keeps names from different namespaces apart, and they never clash
// with the node's own volumes (images are "image_<uid>").
func NameOnNode(namespace, name string) string {
	return namespace + "_" + name
}

// NameFromNode is the inverse of NameOnNode for one namespace: the name of
// the resource of namespace that has onNode on a node. It is false for a
// name of another namespace and for one NameOnNode cannot have made (a
// name that is no DNS subdomain, an imported volume's own name), so a
// caller never puts a wrong name on what it found on the node.
func NameFromNode(namespace, onNode string) (string, bool) {
	name, ok := strings.CutPrefix(onNode, namespace+"_")
	if namespace == "" || !ok || !isDNSSubdomain(name) {
		return "", false
	}
	return name, true
}

// isDNSSubdomain tells whether s can be a Kubernetes object's name: at most
// 253 characters, dot-separated labels of lowercase letters, digits and
// '-', each starting and ending with a letter or digit.
func isDNSSubdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			if !keptInToken(label[i]) {
				return false
			}
		}
	}
	return true
}

// VolumeIntent is what the hub wants a node to make true for one Volume. It
// lives in BucketIntents under VolumeIntents.Key(node, uid).
//
// The hub writes one when the volume must be gone (Absent): volumes are
// made by the guest intents that attach them. The hub deletes the key once
// the node reported the volume Gone; an agent that sees the key deleted
// removes its VolumeReport.
//
// An intent with Absent false is defined only with ExternalName: the Volume
// imports that existing volume of the node, which the node then reports
// (VolumeReport.Imported) and never changes; an Absent intent with
// ExternalName deletes it. Any other present intent is refused as invalid.
// An agent older than ExternalName refuses both as malformed (a present
// intent was invalid, and an absent one names a Disk other than
// NameOnNode(Namespace, Name)), so it never deletes a volume it does not know
// it may.
type VolumeIntent struct {
	ProtocolVersion int `json:"protocolVersion"`
	// UID is the Volume's metadata.uid.
	UID string `json:"uid"`
	// Namespace and Name are the Volume's, for messages.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Disk is the volume's name on the node: NameOnNode(Namespace, Name), or
	// ExternalName for an imported volume.
	Disk string `json:"disk"`
	// Pool is the storage pool holding it; empty means the node's default.
	Pool   string `json:"pool,omitempty"`
	Absent bool   `json:"absent"`
	// ExternalName is the backend's name of the existing volume the Volume
	// imports (its crossplane.io/external-name): a libvirt storage volume
	// name, made by virtfleet or not. Disk is then the same name.
	ExternalName string `json:"externalName,omitempty"`
}

// VolumeReport is what a node's agent observed about one VolumeIntent. It
// lives in BucketReports under VolumeReports.Key(node, uid).
type VolumeReport struct {
	ProtocolVersion int    `json:"protocolVersion"`
	UID             string `json:"uid"`
	// Gone is set once the volume no longer exists on the node.
	Gone bool `json:"gone"`
	// Message says why the volume is not gone yet (still attached, the
	// backend failed or cannot delete volumes), or why an imported one
	// cannot be observed (not on the node).
	Message string `json:"message,omitempty"`
	// Imported answers a present intent: the node observes the volume the
	// Volume imports, and SizeBytes and ID are that volume's once found.
	Imported bool `json:"imported,omitempty"`
	// SizeBytes is the imported volume's capacity.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// ID is the backend's id of the imported volume (libvirt: its key, the
	// path of its file).
	ID         string    `json:"id,omitempty"`
	ObservedAt time.Time `json:"observedAt"`
}

// ImagePhase is the state of a DiskImage on one node.
type ImagePhase string

// Image phases a node reports. An image that is not on the node and not
// being imported has no report.
const (
	// ImagePhaseImporting: the image is being downloaded and verified.
	ImagePhaseImporting ImagePhase = "Importing"
	// ImagePhaseReady: the image is on the node; disks can be made from it.
	ImagePhaseReady ImagePhase = "Ready"
	// ImagePhaseFailed: the last import failed; the node retries it with
	// backoff while a guest needs the image.
	ImagePhaseFailed ImagePhase = "Failed"
)

// ImageReport is what a node's agent observes of one DiskImage on the node.
// It lives in BucketReports under ImageReports.Key(node, uid); the agent
// writes it when the image's state there changes and deletes the key once
// the image is gone from the node (pruned after its pruneAfter).
type ImageReport struct {
	ProtocolVersion int `json:"protocolVersion"`
	// UID is the DiskImage's metadata.uid.
	UID string `json:"uid"`
	// Name is the DiskImage's name, for messages; empty when the node no
	// longer knows it (an image found on the node after an agent restart).
	Name  string     `json:"name,omitempty"`
	Node  string     `json:"node"`
	Phase ImagePhase `json:"phase"`
	// SizeBytes is the size of the image on the node; set once Ready.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Message is the import's progress while Importing and the failure
	// when Failed.
	Message    string    `json:"message,omitempty"`
	ObservedAt time.Time `json:"observedAt"`
}
