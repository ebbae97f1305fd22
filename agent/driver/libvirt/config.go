package libvirt

import (
	"net/netip"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// Config configures the libvirt backend.
type Config struct {
	// Node is the name of the node the agent runs on, reported in
	// Observation.Node.
	Node string
	// Socket is libvirtd's unix socket; empty means /run/libvirt/libvirt-sock.
	Socket string
	// URI is the libvirt connection URI; empty means qemu:///system.
	URI string
	// Pool is the storage pool for volumes without one, the cloud-init seed
	// and swap; empty means "default".
	Pool string
	// DomainType is the libvirt domain type of every guest: empty picks kvm
	// where the host offers it, else qemu; "qemu" forces QEMU's own
	// emulation (TCG) on a host whose KVM is offered but cannot run guests,
	// as nested KVM often cannot (KubeVirt's useEmulation); "kvm" refuses
	// to start on a host without KVM rather than run guests slowly.
	DomainType string
	// ShutdownGrace is how long a guest may take to shut down on ACPI before
	// it is forced off; zero means two minutes.
	ShutdownGrace time.Duration
	// Images are the limits of the node's image downloads and where they
	// are kept until verified and imported (imageimport.Config); its Dir
	// must be writable.
	Images imageimport.Config
	// ImagePruneInterval is how often unused images are looked for and
	// pruned once past their PruneAfter; zero means one minute. An image
	// thus goes at most one interval after its PruneAfter.
	ImagePruneInterval time.Duration
	// TunnelAddress is the node's address on the underlay its overlays
	// (networks with a VNI) run over: the local end of their VXLAN
	// devices. The link holding it, in Netns, gives their MTU. Invalid
	// means the node joins no overlay, and a network with a VNI is refused.
	TunnelAddress netip.Addr
	// Netns is the path of the network namespace holding libvirtd's
	// bridges (/run/netns/NAME), where the overlays' devices are made;
	// empty means the agent's own. libvirtd makes its networks' bridges in
	// its own namespace, which need not be the agent's.
	Netns string
	// ConsoleDir is the directory, as libvirtd sees it, where each guest's
	// serial console listens on a unix socket named from its uid
	// (vf-<uid>.serial); empty means DefaultConsoleDir. libvirtd must be
	// able to create sockets there, and a socket's path must fit in 107
	// bytes. Changing it moves the sockets of guests defined from then on;
	// a guest keeps the socket it was started with until its next start.
	//
	// A guest's VNC display listens on a socket libvirt makes in the
	// guest's own directory under its QEMU directory,
	// /var/lib/libvirt/qemu/domain-<id>-<name>/vnc.sock: libvirt 9.0
	// drops a VNC socket path given under that directory, and makes one
	// nowhere else. So with the default ConsoleDir, ConsoleLocalDir
	// serves both sockets; with another, the agent must see
	// /var/lib/libvirt/qemu where libvirtd does.
	ConsoleDir string
	// ConsoleLocalDir is ConsoleDir as the agent sees it: a socket
	// libvirtd names under ConsoleDir is connected to under
	// ConsoleLocalDir. Empty means ConsoleDir. It differs when libvirtd
	// runs in a mount namespace of its own, or in a container whose
	// directory the agent mounts elsewhere.
	ConsoleLocalDir string
}

// DefaultConsoleDir is libvirt's directory of its QEMU driver, which
// libvirtd and QEMU (as its unprivileged user) can create sockets in.
const DefaultConsoleDir = "/var/lib/libvirt/qemu"
