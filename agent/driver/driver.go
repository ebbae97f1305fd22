// Package driver is the agent's one seam to a hypervisor backend. The agent's
// reconciler knows only the Driver interface; libvirt, nova and kubevirt
// implement it. It imports neither NATS nor the wire package: the agent
// translates intents into Machines and Observations into reports.
package driver

import (
	"context"
	"net/netip"
	"time"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Driver makes guests on one node match the Machines it is given, and reports
// what it sees. Every method is keyed by the VM's uid, is safe for concurrent
// use, and is idempotent: calling it again with the same input converges to the
// same state without duplicating anything. Methods do not wait for slow guest
// transitions (boot, ACPI shutdown); they start them and return, and the caller
// calls again (level-triggered).
//
// Errors: IsNotFound(err) means the guest does not exist; IsTerminal(err)
// means the input cannot succeed as given (unknown network, volume bigger than
// the pool, more vCPUs than the host has, malformed spec) — don't retry, show
// the message to the user; IsFailing(err) means the guest cannot progress for
// a reason the user must see but that may pass (an image that cannot be
// downloaded or fails its checksum, a pool too full for it) — show the message
// as Failed and retry with backoff; any other error is transient — retry with
// backoff.
type Driver interface {
	// Ensure creates the guest if it is absent (its disks' volumes, its
	// networks and its cloud-init seed included) and drives it towards
	// m.Running: it starts a stopped guest, and shuts a running one down
	// gracefully, forcing it off once the backend's grace period has passed.
	//
	// A change of swap, disks or networks on a running guest, or of its
	// MaxVCPU or MaxMemoryBytes, is not applied live; it takes effect at
	// the guest's next start.
	//
	// VCPU and MemoryBytes are applied live where the backend can, within
	// the maximum the guest was started with (MaxVCPU, MaxMemoryBytes): a
	// change within it never makes a guest RestartRequired. A guest asked
	// for more than its maximum runs on as it is, RestartRequired, with
	// the field and its maximum in the Observation's Message, and starts
	// with the new shape (and a maximum that holds it) next time. Memory
	// given back by a balloon is the guest's to release: Observation's
	// MemoryBytes is what the guest holds, which may stay above a smaller
	// MemoryBytes. A backend without live resize (Nova) reports any
	// change of VCPU or MemoryBytes as RestartRequired; one whose own
	// rules refuse some changes live (KubeVirt: fewer vCPUs, memory of a
	// guest it cannot migrate) reports RestartRequired where they do.
	//
	// A disk's size is the exception: a disk whose volume holds less than
	// its SizeBytes is grown to it, on a running guest live (the guest sees
	// the larger disk without a restart), so a size alone never makes a
	// guest RestartRequired. A disk is never shrunk: a volume larger than
	// SizeBytes (made from a larger image, or grown before) is left as it
	// is, without an error, since the API refuses a smaller size and a
	// larger volume is what the guest already uses. An Imported disk is
	// never resized. A grow the backend refuses or cannot do (a pool
	// without room, a backend without online resize) leaves the guest
	// running as it is and says why in the Observation's Message; the next
	// Ensure tries again.
	//
	// Restarts are folded into Ensure: a running guest is restarted once when
	// m.RestartNonce is non-empty and differs from the last nonce it handled.
	// The nonce a guest is created or started with counts as handled, so a
	// new guest never restarts right away. RestartCount grows by one per
	// restart performed.
	//
	// Resets are folded in the same way: a running or paused guest is
	// reset once (restarted at once, as by its reset button: no ACPI, no
	// shutdown inside the guest) when m.ResetNonce is non-empty and differs
	// from the last reset nonce it handled; the nonce a guest is created or
	// started with counts as handled, and each reset performed adds one to
	// RestartCount. A restart and a reset asked for at once are one
	// restart. A reset is recorded before it is made, so it is never made
	// twice. Where the backend resets a guest in place (libvirt, Nova) a
	// new shape still waits for the next start or restart; a backend
	// without a hard reset (KubeVirt) restarts the guest the hardest way it
	// has instead.
	//
	// m.Paused pauses a running guest: its vCPUs stop, its memory is kept,
	// and Observe reports PhasePaused until an Ensure without m.Paused
	// resumes it. It applies only while m.Running is set: a stopped guest
	// stays stopped, running false shuts a paused guest down, and a guest
	// started with m.Paused is paused as soon as it runs (the Ensure that
	// starts it may return before it is paused; a later one pauses it).
	// Without m.Paused a guest paused behind the driver's back is resumed.
	// A restart or reset of a paused guest leaves it paused afterwards. A
	// guest the hypervisor halted on a fault is Failed, never paused nor
	// resumed: only a restart or a stop and start gets it out.
	//
	// A missing disk with an Image is made from that image, which Ensure
	// first makes present on the node: imported once per node however many
	// disks and guests use it, concurrent Ensures sharing one import, verified
	// against its SHA256 before anything is kept. Ensure never waits for an
	// import: while one runs it returns Phase Provisioning with the progress
	// in Message. A failed import returns an IsFailing error and is retried
	// with the driver's own backoff, however often Ensure is called; an
	// import the node refuses (a source outside the image's AllowedSources,
	// over the node's size cap, a qcow2 naming a backing or data file)
	// returns a Terminal one, and is tried again only once the Image
	// itself changes.
	//
	// The returned Observation is the state after Ensure acted; a transitional
	// phase (Provisioning, Starting, Stopping) means: call Ensure again later.
	Ensure(ctx context.Context, m Machine) (Observation, error)

	// Delete removes the guest with the given uid and what the driver made
	// for it alone (cloud-init seed, swap disk, its address reservations).
	// It never deletes the volumes named in Machine.Disks. A network the
	// driver made goes once no guest of the node uses it any more, and one
	// it did not make (Imported, or another's) never does. Deleting an
	// absent guest succeeds.
	Delete(ctx context.Context, uid string) error

	// Observe reports the guest with the given uid, or an error satisfying
	// IsNotFound if there is none.
	Observe(ctx context.Context, uid string) (Observation, error)

	// List reports every guest this driver manages on the node — never guests
	// created by anyone else — so a restarted agent rebuilds its view.
	List(ctx context.Context) ([]Observation, error)

	// Events streams hints that a guest changed. A hint carries no state: the
	// receiver calls Observe or Ensure. Hints may be coalesced or dropped when
	// the receiver lags, and may name guests the driver does not manage; the
	// receiver resyncs periodically and on an EventResync hint. The channel is
	// closed by Close.
	Events() <-chan Event

	// DeleteVolume deletes the volume d.Name in d.Pool (empty: the driver's
	// default pool); only Name and Pool are read. It is idempotent: deleting
	// an absent volume succeeds. It never deletes a volume that a guest of
	// this driver has attached — in its running or its next definition — and
	// returns an error satisfying IsInUse instead: retry once the guest is
	// gone. Where the backend tells, it refuses the same for any other guest
	// of the node (an orphan, or one virtfleet never made). The image the volume was made from is left in place; the driver
	// prunes it with its other unused images once no disk has needed it for
	// the image's PruneAfter.
	DeleteVolume(ctx context.Context, d Disk) error

	// Capacity reports the host's resources and what this driver's guests
	// have been allocated of them, orphans included (see Adopter): a
	// released guest runs on and holds its share until someone deletes it.
	Capacity(ctx context.Context) (Capacity, error)

	// Close releases the driver's connections and closes Events.
	Close() error
}

// Machine is the desired state of one guest.
type Machine struct {
	// UID is the VirtualMachine's metadata.uid, a UUID. It keys the guest.
	UID       string
	Namespace string
	Name      string
	// Generation is the VirtualMachine's generation this Machine was made from.
	Generation int64

	VCPU        int32
	MemoryBytes int64
	// MaxVCPU and MaxMemoryBytes are the most VCPU and MemoryBytes may
	// become while the guest runs (see Ensure); 0 leaves each to the
	// driver: DefaultMaxRatio times VCPU or MemoryBytes when the guest
	// starts, at most the host's. They are left out of the JSON when 0,
	// so a driver's hash of a Machine without them is what it was before
	// they existed.
	MaxVCPU        int32 `json:",omitempty"`
	MaxMemoryBytes int64 `json:",omitempty"`
	// SwapBytes is the size of a swap disk set up by cloud-init; 0 means none.
	SwapBytes int64
	// PublicKey is an OpenSSH public key line authorized in the guest.
	PublicKey string
	// UserData is extra cloud-init user data, applied after the driver's own.
	UserData string
	Firmware Firmware

	// Running is the desired power state.
	Running bool
	// RestartNonce requests one restart per distinct value; empty means none.
	RestartNonce string
	// Paused asks that the running guest be paused (see Ensure).
	//
	// Paused and ResetNonce ask for acts on the running guest, never for
	// its shape, so they are left out of the Machine's JSON, which a
	// driver may hash to tell a changed shape (libvirt's specHash): pausing
	// or resetting a guest never redefines it nor makes it RestartRequired,
	// and guests defined before these fields existed keep their hash.
	Paused bool `json:"-"`
	// ResetNonce requests one hard reset per distinct value; empty means
	// none.
	ResetNonce string `json:"-"`

	// Disks are attached in order; the first is the boot disk.
	Disks []Disk
	// Networks get one interface each, in order.
	Networks []Network

	// Instancetype is the instance type VCPU, MemoryBytes and their
	// maxima came from; nil when the VM sets them itself. A backend with
	// instance types of its own (KubeVirt) runs the guest through one;
	// the others ignore it. It says where the shape came from, not what
	// it is, so it is left out of the JSON a driver may hash (see Paused):
	// a guest defined before the field existed, or whose type is
	// unchanged, keeps its hash.
	Instancetype *Instancetype `json:"-"`
}

// Instancetype names one recorded revision of an instance type.
type Instancetype struct {
	// Cluster is set for a VirtualMachineClusterInstancetype; otherwise it
	// is a VirtualMachineInstancetype of the Machine's Namespace.
	Cluster bool
	Name    string
	// Revision is the type's generation the shape was recorded at.
	Revision int64
}

// Validate returns a Terminal error for a Machine no backend could run:
// the checks every driver shares. Drivers add their own limits after it.
func (m Machine) Validate() error {
	switch {
	case m.UID == "":
		return Terminalf("uid is required")
	case m.VCPU < 1:
		return Terminalf("vcpu must be at least 1, got %d", m.VCPU)
	case m.MemoryBytes <= 0:
		return Terminalf("memory must be greater than 0, got %d bytes", m.MemoryBytes)
	case m.MaxVCPU != 0 && m.MaxVCPU < m.VCPU:
		return Terminalf("vcpu %d is more than maxVcpu %d", m.VCPU, m.MaxVCPU)
	case m.MaxMemoryBytes != 0 && m.MaxMemoryBytes < m.MemoryBytes:
		return Terminalf("memory of %d bytes is more than maxMemory of %d bytes", m.MemoryBytes, m.MaxMemoryBytes)
	case m.SwapBytes < 0:
		return Terminalf("swap must not be negative, got %d bytes", m.SwapBytes)
	case len(m.Disks) == 0:
		return Terminalf("at least one disk is required to boot from")
	case m.Namespace == "" || m.Name == "":
		return Terminalf("namespace and name are required")
	case m.Firmware != "" && m.Firmware != FirmwareBIOS && m.Firmware != FirmwareUEFI:
		return Terminalf("firmware must be bios or uefi, got %q", m.Firmware)
	}
	for _, disk := range m.Disks {
		if disk.Name == "" {
			return Terminalf("every disk needs a name")
		}
	}
	return nil
}

// DefaultMaxRatio is how many times its VCPU and MemoryBytes a guest can
// grow to live when its Machine sets no maximum: KubeVirt's
// MaxHotplugRatio.
const DefaultMaxRatio = 4

// Firmware the guest boots with.
type Firmware string

// Firmwares. Empty means BIOS.
const (
	FirmwareBIOS Firmware = "bios"
	FirmwareUEFI Firmware = "uefi"
)

// Disk is a volume attached to a guest. The driver creates it when it is
// missing — empty, or from Image — and never deletes it.
type Disk struct {
	// Name of the volume on the node.
	Name      string
	SizeBytes int64
	// Format is the volume's format, e.g. qcow2 or raw; empty means qcow2.
	Format string
	// Pool is the storage pool holding the volume; empty means the driver's
	// default pool.
	Pool string
	// Image, if set, fills a disk that does not exist yet. An existing disk
	// is never rewritten from it.
	Image *Image
	// Imported is set for a volume a Volume imports by external name: the
	// disk is that volume as it is, in its own format, never created,
	// resized or filled, nor removed when a new guest's definition fails.
	// A missing one is an error a retry may mend. A driver that cannot
	// attach imported volumes says so with a Terminal error.
	Imported bool
}

// Image is a disk image a node keeps to make disks from. A node holds each
// image once; an image no disk on the node depends on is removed after
// PruneAfter.
type Image struct {
	// UID is the DiskImage's metadata.uid; it names the image on the node.
	UID string
	// Name is the DiskImage's name, for messages.
	Name string
	// Namespace is the namespace whose VM or Volume asked for the image
	// (its intent's): a node shares its import slots out by it, so one
	// tenant's imports never hold them all while another's wait.
	Namespace string
	// URL is the http or https address the image is downloaded from.
	URL string
	// SourceVolume, instead of URL, makes the image a copy of this volume
	// of the node (its name in the driver's default pool), taken when the
	// node first needs the image. A node without the volume fails the image.
	SourceVolume string
	// SourceSnapshot, with SourceVolume, makes the image a copy of that
	// volume as it was in this snapshot of its guest (the
	// VirtualMachineSnapshot's uid, as TakeSnapshot named it), not as it
	// is now; the guest runs on. A driver whose disks hold no snapshot it
	// can read refuses it with a Terminal error.
	SourceSnapshot string
	// ExternalName, instead of URL or SourceVolume, names an image the
	// backend holds already, which the driver uses as it is: never
	// imported, verified, pruned nor deleted, and not reported by Images.
	// A missing one is an error a retry may mend; a backend that keeps no
	// such images refuses it with a Terminal error.
	ExternalName string
	// Backup, instead of the others, makes the image from one disk of a
	// backup in a backup location (Backuper's BackupWriter handed it):
	// a raw image of that disk. A driver that cannot read backups says so
	// with a Terminal error.
	Backup *wire.ImageBackup
	// Held, instead of the others, is an image whose source is gone: the
	// node makes disks of it only from the copy it holds, and a node that
	// holds none fails the disk with a Terminal error, as nothing is left
	// to make the image of.
	Held bool
	// SHA256 is the expected hex digest of the download; empty skips the check.
	SHA256 string
	// Format is qcow2 (disks become copy-on-write overlays of the image) or
	// raw (disks become copies); empty means qcow2.
	Format string
	// PruneAfter is how long the image stays on the node unused; zero means
	// DefaultPruneAfter.
	PruneAfter time.Duration
	// AllowedSources are the networks outside the public internet that
	// URL, and every redirect from it, may be downloaded from. Any other
	// loopback, link-local, private, shared, unique-local, unspecified,
	// multicast or broadcast address is refused when connecting, so a
	// tenant's image cannot read what only the node can reach.
	AllowedSources []netip.Prefix
}

// ImagePhase is the state of an image on the node.
type ImagePhase string

// Image phases.
const (
	ImagePhaseImporting ImagePhase = "Importing"
	ImagePhaseReady     ImagePhase = "Ready"
	ImagePhaseFailed    ImagePhase = "Failed"
)

// ImageStatus is what a driver sees of one image on the node.
type ImageStatus struct {
	// UID is the image's Image.UID.
	UID string
	// Name is the image's Image.Name when the driver knows it; an image
	// found on the node after a restart may have none until a guest asks
	// for it again.
	Name  string
	Phase ImagePhase
	// SizeBytes is the image's size on the node; set when Ready.
	SizeBytes int64
	// Message is the progress while Importing and the reason when Failed.
	Message string
	// ImportStarted and ImportFinished bound the last import of the image
	// this driver finished, on a Ready image it imported and on a Failed
	// one; zero on an image it found on the node and while an import runs.
	// The agent counts each import once, by when it finished.
	ImportStarted, ImportFinished time.Time
}

// DefaultPruneAfter is how long an unused image stays on a node by default.
const DefaultPruneAfter = 24 * time.Hour

// Network is a network a guest has an interface on. The driver creates it
// from CIDR and Mode when it is missing, unless it is Imported.
type Network struct {
	Name string
	// Imported is set for a network that exists outside virtfleet: the
	// driver uses it as it is and never creates, starts, changes or
	// deletes it. A missing or stopped one is an error a retry may mend
	// (its owner may make or start it); one that is not what CIDR, Mode
	// and Bridge say is Terminal.
	Imported bool
	// CIDR is the IPv4 subnet served by DHCP, e.g. 10.10.120.0/24; the host
	// takes the first address. Required to create a nat or isolated network.
	CIDR string
	Mode NetworkMode
	// Bridge is the host bridge a bridge-mode network joins.
	Bridge string
	// UID is the VirtualNetwork's uid, the same on every node: what a
	// network's nodes derive alike from it (the gateway's MAC) is the same
	// everywhere.
	UID string
	// Address is the guest interface's address in CIDR, with the network's
	// prefix length, as the hub allocated it; the zero Prefix when the hub
	// gives none (an imported or bridge-mode network). The driver gives the
	// interface this address (a DHCP reservation for its MAC, or however
	// the backend does it natively) and its network hands out no other.
	Address netip.Prefix
	// VNI, when not 0, joins the network's bridge on this node to the same
	// network on the other nodes (an Overlay driver's peers) as one L2
	// segment; the guest's MTU is the underlay's less the encapsulation.
	VNI int32
	// VLAN, when not 0, is the 802.1Q tag (1 to 4094) a bridge-mode
	// network's guests join on the host bridge Bridge, a trunk the site
	// runs: the driver makes a VLAN device of that id on Bridge and a
	// bridge of its own with it as its port, removed with the network.
	VLAN int32
}

// Overlay is implemented by a Driver whose networks can span nodes (a
// Network with a VNI). The node announces TunnelAddress in its heartbeat;
// the hub sends every node the others' (wire.Fabric) and the agent hands
// them to SetPeers, before the first Ensure and whenever they change.
type Overlay interface {
	// TunnelAddress is the node's address on the underlay; invalid when
	// the node has none configured, and then no Network may have a VNI.
	TunnelAddress() netip.Addr
	// SetPeers sets the other nodes' tunnel addresses: every overlay of the
	// node floods its broadcasts (ARP, DHCP) to each of them, and no other.
	SetPeers(ctx context.Context, peers []netip.Addr) error
}

// NetworkMode is how a network reaches the outside.
type NetworkMode string

// Network modes. Empty means nat.
const (
	NetworkModeNAT      NetworkMode = "nat"
	NetworkModeBridge   NetworkMode = "bridge"
	NetworkModeIsolated NetworkMode = "isolated"
)

// Phase is a guest's lifecycle phase, as in the VirtualMachine's status.
type Phase string

// Phases a driver reports. Pending, Scheduled, Unknown and Deleting are the
// hub's and never come from a driver, but are listed so the sets match.
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

// Phases are every Phase, in the order above.
//
// The phase exists three times, here, in the wire protocol and in the
// VirtualMachine's API, on purpose: the driver seam must not depend on the
// wire (a driver is a library over its backend), the wire is stdlib-only and
// versioned, and the API is the user's contract, validated by its CRD. One
// alias of the other would tie the user's API to a protocol version or a
// driver to the protocol. So the three are spelled alike, which
// TestPhasesAreTheSameAcrossDriverWireAndAPI pins, and each conversion is
// checked: a name its target does not know becomes Unknown.
var Phases = []Phase{PhasePending, PhaseScheduled, PhaseProvisioning, PhaseStarting, PhaseRunning, PhasePaused, PhaseStopping, PhaseStopped, PhaseFailed, PhaseUnknown, PhaseDeleting}

// Observation is what a driver sees of one guest.
type Observation struct {
	UID string
	// ID is the backend's id of the guest (libvirt: the domain UUID).
	ID    string
	Phase Phase
	// Node is the host the guest really runs on.
	Node       string
	Interfaces []Interface
	// RestartCount counts restarts the driver performed plus guest reboots
	// and crashes it observed.
	RestartCount int32
	// RestartRequired is set when the guest runs an older shape (swap,
	// its boot disk or the order of its disks, networks, cloud-init, the
	// maximum vCPUs and memory, or vCPUs or memory beyond that maximum;
	// a data disk added or removed where the backend cannot attach or
	// detach it live, or which the guest has not released) than the last
	// Ensure asked for; the new shape takes effect at its next start or
	// restart. Message names what waits.
	RestartRequired bool
	// Message explains Phase when there is something to explain.
	Message string
	// VCPU and MemoryBytes are the guest's shape as it runs (as the
	// backend defines it when it is off); 0 when the driver does not tell.
	VCPU        int32
	MemoryBytes int64
	// MaxVCPU and MaxMemoryBytes are the most the running guest can grow
	// to live; 0 when the driver does not tell or cannot grow it.
	MaxVCPU        int32
	MaxMemoryBytes int64
	// Disks are the volumes (as Disk.Name names them) attached to the
	// guest as it runs (as the backend defines it when it is off), the
	// boot disk first; nil when the driver does not tell. A disk detached
	// but not yet released by the guest is still among them.
	Disks []string
	// OrphanOf is set by Adopter.Orphans: the VM the guest was released
	// from.
	OrphanOf *VMRef
}

// Interface is one network interface of a guest.
type Interface struct {
	Network string
	MAC     string
	// IPs are the addresses the guest holds on the interface that others
	// can reach it at (Reachable): a link-local or loopback address, which
	// a guest holds before DHCP answers and an IPv6 guest always, is none.
	IPs []string
	// Source says how IPs were learned.
	Source AddressSource
	// LastSeen is when a source last reported IPs.
	LastSeen time.Time
}

// Reachable are the addresses of ips that others can reach a guest at, in
// their order: neither link-local (169.254.0.0/16, fe80::/10), loopback nor
// unparsable.
func Reachable(ips []string) []string {
	var out []string
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil || a.IsLinkLocalUnicast() || a.IsLoopback() || a.IsUnspecified() {
			continue
		}
		out = append(out, ip)
	}
	return out
}

// AddressSource says how an interface's addresses were learned.
type AddressSource string

// Address sources, from most to least authoritative on libvirt.
const (
	AddressSourceLease      AddressSource = "lease"
	AddressSourceGuestAgent AddressSource = "guest-agent"
	AddressSourceARP        AddressSource = "arp"
	AddressSourceBackend    AddressSource = "backend"
)

// Event hints that a guest changed.
type Event struct {
	// UID of the guest; empty for EventResync.
	UID  string
	Kind EventKind
}

// EventKind says what happened.
type EventKind string

// Event kinds.
const (
	EventDefined   EventKind = "Defined"
	EventUndefined EventKind = "Undefined"
	EventStarted   EventKind = "Started"
	EventStopped   EventKind = "Stopped"
	EventSuspended EventKind = "Suspended"
	EventResumed   EventKind = "Resumed"
	EventCrashed   EventKind = "Crashed"
	EventRebooted  EventKind = "Rebooted"
	EventChanged   EventKind = "Changed"
	// EventResync asks for a full resync: the driver reconnected to its
	// backend and may have missed events.
	EventResync EventKind = "Resync"
)

// Capacity is a host's resources and this driver's share of them.
type Capacity struct {
	VCPU        int64
	MemoryBytes int64
	// Hypervisor is how the backend runs guests, where it can tell: on
	// libvirt the domain type (kvm, qemu for emulation without KVM, test).
	Hypervisor string

	AllocatedVCPU        int64
	AllocatedMemoryBytes int64
}

// ImageKeeper is a Driver that keeps disk images on the node, imported
// once and shared by the disks made from them (Disk.Image). The agent
// reports them so the hub can tell which nodes hold an image; a Driver that
// is no ImageKeeper keeps none, and its node reports none.
type ImageKeeper interface {
	// Images reports every image present (Ready, with its size), every
	// import running (Importing, with its progress in Message) and every
	// import whose last attempt failed while the image is absent (Failed,
	// with the reason). An image absent from the list is not on the node:
	// pruned, or never imported. It only reads — no import starts, nothing
	// is pruned — and is cheap enough to call every few seconds.
	Images(ctx context.Context) ([]ImageStatus, error)
}

// Adopter is implemented by a Driver that lets a guest outlive its VM and
// hands an existing guest to a VM: an orphan released earlier, or a guest
// named by the backend's own name, made by virtfleet or not. A node whose
// driver is no Adopter refuses release markers and claims with a message.
//
// As KubeVirt orphans a VirtualMachineInstance on a delete with
// propagationPolicy Orphan and adopts it again by name, a released guest
// keeps running as it is and remembers the namespace/name it was released
// from; Claim hands it to the next VM of that name.
type Adopter interface {
	// Release stops managing the guest uid and leaves it exactly as it is:
	// not stopped, not redefined. It is remembered as orphaned from its
	// namespace/name, with seal (the hub's mark on the release, opaque to
	// the driver); from then on List, Observe and Ensure of uid do not see
	// it, Delete(uid) leaves it alone, and Orphans reports it with both.
	// Releasing an absent or already released guest succeeds.
	Release(ctx context.Context, uid, seal string) error

	// Orphans reports the released guests of the node, each with the uid
	// it was released under and OrphanOf set.
	Orphans(ctx context.Context) ([]Observation, error)

	// Claim makes the guest ref names managed as m.UID (m.Namespace,
	// m.Name) without changing it: the same disks, addresses and restart
	// count; a later Ensure with m drives it, and a shape that differs
	// from the guest's shows as RestartRequired. Claiming a guest already
	// managed as m.UID succeeds. A guest another VM manages is refused
	// with a Terminal error naming that VM; a ref naming no guest returns
	// a NotFound error.
	Claim(ctx context.Context, m Machine, ref Ref) error

	// ObserveRef reports the guest ref names, managed or not, without
	// changing it or taking it over.
	ObserveRef(ctx context.Context, ref Ref) (Observation, error)
}

// VolumeImporter is implemented by a Driver whose existing volumes a Volume
// can import by name: made by virtfleet or not, the volume is observed and
// never changed; DeleteVolume deletes it once the Volume is deleted with
// the Delete management policy. A node whose driver is no VolumeImporter
// refuses such an import with a message.
type VolumeImporter interface {
	// ObserveVolume reports the volume d.Name in d.Pool (empty: the
	// driver's default pool) without changing it; only Name and Pool are
	// read. A volume that is not there returns a NotFound error; one the
	// driver keeps for itself (an image, a guest's seed or swap) a
	// Terminal error: no Volume may take it.
	ObserveVolume(ctx context.Context, d Disk) (VolumeObservation, error)
}

// VolumeObservation is what a driver sees of one volume.
type VolumeObservation struct {
	// ID is the backend's id of the volume (libvirt: its key).
	ID        string
	SizeBytes int64
}

// Ref names an existing guest; exactly one field is set.
type Ref struct {
	// Orphan is the uid an orphan was released under.
	Orphan string
	// ExternalName is the backend's name or id of the guest: a libvirt
	// domain name or UUID, a Nova server id, a KubeVirt VirtualMachine name.
	ExternalName string
}

func (r Ref) String() string {
	if r.Orphan != "" {
		return "orphan " + r.Orphan
	}
	return r.ExternalName
}

// VMRef is a VirtualMachine's namespace and name.
type VMRef struct {
	Namespace string
	Name      string
	// Seal is the seal the guest was released with (Adopter.Release).
	Seal string
}
