package libvirt

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Namespace marks virtfleet's element in a domain's <metadata>. A domain
// without it is not virtfleet's and is never listed, changed or deleted.
const Namespace = "https://virtfleet.io/xmlns/domain/v1"

// metadataKey is the XML prefix libvirt gives virtfleet's element.
const metadataKey = "virtfleet"

// ownership is virtfleet's element in a domain's <metadata>. It holds what the
// driver cannot re-derive from the domain itself, so a restarted agent keeps
// counting restarts and handling each restart nonce once.
type ownership struct {
	XMLName    xml.Name `xml:"https://virtfleet.io/xmlns/domain/v1 vm"`
	UID        string   `xml:"uid"`
	Namespace  string   `xml:"namespace"`
	Name       string   `xml:"name"`
	Generation int64    `xml:"generation"`
	// SpecHash identifies the Machine the definition was made from, so an
	// unchanged Machine costs no redefinition.
	SpecHash string `xml:"specHash"`
	// LastNonce is the last restart nonce handled.
	LastNonce string `xml:"lastNonce,omitempty"`
	// Restarts counts restarts the driver performed.
	Restarts int32 `xml:"restarts"`
	// Orphaned is set when the VM was deleted without its guest: the
	// domain is left as it is, and Namespace/Name say which VM it was.
	Orphaned bool `xml:"orphaned,omitempty"`
	// Seal is the hub's seal of the release, reported with the orphan.
	Seal string `xml:"seal,omitempty"`
	// Imported is set on a domain a VM took over that was not made for a
	// VM of its name: its definition is never rewritten.
	Imported bool `xml:"imported,omitempty"`
	// LastRestore names the last named revert made (RevertRequest.Restore),
	// which is never made again.
	LastRestore string `xml:"lastRestore,omitempty"`
}

func (o ownership) marshal() (string, error) {
	b, err := xml.Marshal(o)
	return string(b), errors.Wrap(err, "cannot marshal virtfleet metadata")
}

// saveOwnership writes changed metadata to the definition and, for a running
// domain, to its live state, which is what Observe reads. The live copy keeps
// liveHash, the shape the domain was started with, so Observe can tell that
// a newer definition waits for the next start.
func (d *Driver) saveOwnership(api API, dom golibvirt.Domain, old, next ownership, liveHash string, active bool) error {
	if old == next {
		return nil
	}
	live := next
	live.SpecHash = liveHash
	if !active || live == next {
		flags := golibvirt.DomainAffectConfig
		if active {
			flags |= golibvirt.DomainAffectLive
		}
		return d.setOwnership(api, dom, next, flags)
	}
	if err := d.setOwnership(api, dom, next, golibvirt.DomainAffectConfig); err != nil {
		return err
	}
	return d.setOwnership(api, dom, live, golibvirt.DomainAffectLive)
}

func (d *Driver) setOwnership(api API, dom golibvirt.Domain, o ownership, flags golibvirt.DomainModificationImpact) error {
	x, err := o.marshal()
	if err != nil {
		return err
	}
	err = api.DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{x}, golibvirt.OptString{metadataKey}, golibvirt.OptString{Namespace}, flags)
	return errors.Wrap(err, "cannot write domain metadata")
}

// domainInfo is what the driver reads back from a domain's XML.
type domainInfo struct {
	owner *ownership
	// vcpu and memory are what the guest has (as the definition read
	// says: running or next), maxVCPU and maxMemory the most it can grow
	// to without a restart.
	vcpu, maxVCPU     int64
	memory, maxMemory int64
	nics              []nic
	firmware          driver.Firmware
	// volumes are the pool volumes the domain's disks are on, and files
	// the paths of the disks given as files.
	volumes []poolVolume
	files   []string
	// disks are the disks on pool volumes with their targets, in target
	// order: what hot-plug compares and picks free targets from.
	disks []domainDisk
	// serialSocket and vncSocket are the unix sockets the first serial
	// port and the VNC display listen on, as libvirtd sees them; empty
	// when the domain has no such socket (a definition from before the
	// driver gave guests consoles, or one it imported), and vncSocket also
	// in a definition that is not running (libvirt names it at start).
	serialSocket string
	vncSocket    string
}

// poolVolume is a volume in a storage pool.
type poolVolume struct{ pool, name string }

// domainDisk is a disk of a domain on a pool volume, and its target.
type domainDisk struct {
	poolVolume
	dev string
}

// nic is an interface as defined, keyed by MAC.
type nic struct {
	network string
	mac     string
}

// parseDomain reads a domain's XML. owner is nil when the domain is not
// virtfleet's.
func parseDomain(x string) (domainInfo, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		return domainInfo{}, errors.Wrap(err, "cannot parse domain XML")
	}
	info := domainInfo{}
	if d.Metadata != nil {
		o, err := findOwnership(d.Metadata.XML)
		if err != nil {
			return domainInfo{}, err
		}
		info.owner = o
	}
	if d.VCPU != nil {
		// libvirt leaves current out when it is the maximum.
		info.maxVCPU = int64(d.VCPU.Value)
		info.vcpu = int64(cmp.Or(d.VCPU.Current, d.VCPU.Value))
	}
	if d.Memory != nil {
		info.maxMemory = bytesOf(d.Memory.Value, d.Memory.Unit)
		info.memory = info.maxMemory
	}
	if d.CurrentMemory != nil {
		info.memory = bytesOf(d.CurrentMemory.Value, d.CurrentMemory.Unit)
	}
	if d.OS != nil && d.OS.Firmware == "efi" {
		info.firmware = driver.FirmwareUEFI
	}
	if d.Devices != nil {
		for _, disk := range d.Devices.Disks {
			switch {
			case disk.Source == nil:
			case disk.Source.Volume != nil:
				v := poolVolume{pool: disk.Source.Volume.Pool, name: disk.Source.Volume.Volume}
				info.volumes = append(info.volumes, v)
				dd := domainDisk{poolVolume: v}
				if disk.Target != nil {
					dd.dev = disk.Target.Dev
				}
				info.disks = append(info.disks, dd)
			case disk.Source.File != nil:
				info.files = append(info.files, disk.Source.File.File)
			}
		}
		for _, i := range d.Devices.Interfaces {
			n := nic{}
			if i.MAC != nil {
				n.mac = strings.ToLower(i.MAC.Address)
			}
			if i.Source != nil && i.Source.Network != nil {
				n.network = i.Source.Network.Network
			}
			info.nics = append(info.nics, n)
		}
		info.serialSocket, info.vncSocket = consoleSockets(d.Devices)
	}
	// libvirt keeps disks in target order; a domain defined elsewhere
	// need not.
	slices.SortStableFunc(info.disks, func(a, b domainDisk) int { return cmp.Compare(diskIndex(a.dev), diskIndex(b.dev)) })
	return info, nil
}

// consoleSockets finds the unix sockets the first serial port and the VNC
// display listen on. Only the first serial port counts: it is the one
// firmware and kernel write to.
func consoleSockets(devs *libvirtxml.DomainDeviceList) (serial, vnc string) {
	if len(devs.Serials) > 0 {
		if src := devs.Serials[0].Source; src != nil && src.UNIX != nil && src.UNIX.Mode == "bind" {
			serial = src.UNIX.Path
		}
	}
	for _, g := range devs.Graphics {
		if g.VNC == nil {
			continue
		}
		for _, l := range g.VNC.Listeners {
			if l.Socket != nil && l.Socket.Socket != "" {
				return serial, l.Socket.Socket
			}
		}
		if g.VNC.Socket != "" {
			return serial, g.VNC.Socket
		}
	}
	return serial, ""
}

// findOwnership finds virtfleet's element among the <metadata> children,
// which may hold other tools' elements too.
func findOwnership(inner string) (*ownership, error) {
	o := &ownership{}
	found, err := findElement(inner, xml.Name{Space: Namespace, Local: "vm"}, o)
	if !found || err != nil {
		return nil, errors.Wrap(err, "cannot parse domain metadata")
	}
	// Marshal sets the name from the tag; clearing it lets a decoded
	// ownership compare equal to a built one.
	o.XMLName = xml.Name{}
	return o, nil
}

// findElement decodes the element called name among the children of a
// <metadata> (of a domain or a network) into into, and says whether it was
// there.
func findElement(inner string, name xml.Name, into any) (bool, error) {
	dec := xml.NewDecoder(strings.NewReader(inner))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name != name {
			continue
		}
		if err := dec.DecodeElement(into, &se); err != nil {
			return false, errors.Wrapf(err, "cannot parse virtfleet's %s element", name.Local)
		}
		return true, nil
	}
}

// bytesOf converts a libvirt memory value to bytes.
func bytesOf(v uint, unit string) int64 {
	mult := map[string]int64{
		"": 1 << 10, "k": 1 << 10, "KiB": 1 << 10, "b": 1, "bytes": 1, "KB": 1000,
		"M": 1 << 20, "MiB": 1 << 20, "MB": 1000 * 1000,
		"G": 1 << 30, "GiB": 1 << 30, "GB": 1000 * 1000 * 1000,
	}[unit]
	if mult == 0 {
		mult = 1 << 10
	}
	return int64(v) * mult
}

// definitionLayout names what domainXML makes of a Machine besides the
// Machine itself. Raising it changes every spec hash, so every guest is
// redefined at its next Ensure and gets the new devices (a running one
// reports RestartRequired until its next start, which applies them): 2 gave
// guests their console and VNC sockets; 3 a maximum of vCPUs and memory
// and a balloon, so both change live.
const definitionLayout = 3

// specHash identifies the parts of m that shape the domain definition (not
// its power state, restart nonce or generation, nor its disks' sizes, which
// growDisks applies live, nor its vCPUs and memory, which resize applies
// live within their maximum, nor its data disks, which plugDisks attaches
// and detaches live), and the definitionLayout it is made with.
func specHash(m driver.Machine) string {
	return hashShape(m, hashPlugged)
}

// upToDate is whether a domain whose definition carries hash, and can
// grow to maxVCPU and maxMemory, is what m asks for, so Ensure need not
// define it again: its data disks (of the default pool) may differ from
// m's by disks added at the end or removed, which plugDisks does. A hash an earlier agent wrote counts while it matches,
// so an upgraded agent redefines no guest (and makes none
// RestartRequired) for what it learned to apply live.
func upToDate(hash string, m driver.Machine, defined domainInfo, pool string) bool {
	if beyond(m, defined) {
		// Only a new definition holds it: its next start gets it.
		return false
	}
	if !disksFollow(defined, m, pool) {
		// Data disks reordered: only a new definition holds them.
		return false
	}
	if hash == specHash(m) || hash == hashShape(m, hashLive) {
		return true
	}
	// An earlier agent defined the guest with its shape as the maximum
	// and hashed that shape; resize moves the guest within it.
	was := m
	was.VCPU = int32(defined.maxVCPU)
	if kib(m.MemoryBytes) != kib(defined.maxMemory) {
		was.MemoryBytes = defined.maxMemory
	}
	return hash == hashShape(was, hashFixed) || hash == hashShape(was, hashSized)
}

// beyond is whether m asks for more vCPUs or memory than the definition
// info can grow to.
func beyond(m driver.Machine, info domainInfo) bool {
	return int64(m.VCPU) > info.maxVCPU || m.MemoryBytes > info.maxMemory
}

// kib is libvirt's unit of memory: a size in bytes, rounded up to it.
func kib(b int64) uint64 { return uint64((b + 1023) / 1024) }

// hashEra is what a spec hash covered when it was written.
type hashEra int

const (
	// hashSized is the hash from before disks grew live: with the disks'
	// sizes, the vCPUs and memory, and layout 2.
	hashSized hashEra = iota
	// hashFixed is the hash from before vCPUs and memory changed live:
	// with them, and layout 2.
	hashFixed
	// hashLive is the hash from before data disks were attached live:
	// with all disks.
	hashLive
	// hashPlugged is today's: with the boot disk only.
	hashPlugged
)

func hashShape(m driver.Machine, era hashEra) string {
	shape := m
	shape.Running, shape.RestartNonce, shape.Generation = false, "", 0
	// An image only fills a disk once; changing it changes no guest.
	disks := m.Disks
	if era == hashPlugged && len(disks) > 1 {
		disks = disks[:1]
	}
	shape.Disks = make([]driver.Disk, len(disks))
	for i, disk := range disks {
		disk.Image = nil
		if era != hashSized {
			disk.SizeBytes = 0
		}
		shape.Disks[i] = disk
	}
	layout := definitionLayout
	if era >= hashLive {
		shape.VCPU, shape.MemoryBytes = 0, 0
	} else {
		// A maximum of 0 is left out of the JSON: the Machine hashes as
		// it did before maxima existed.
		layout = 2
	}
	b, _ := json.Marshal(struct {
		Machine driver.Machine
		Layout  int
	}{shape, layout}) //nolint:errchkjson // plain struct of strings and numbers
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

// parseUUID turns a VM uid into libvirt's binary UUID.
func parseUUID(uid string) (golibvirt.UUID, error) {
	var u golibvirt.UUID
	b, err := hex.DecodeString(strings.ReplaceAll(uid, "-", ""))
	if err != nil || len(b) != len(u) || len(uid) != 36 {
		return u, driver.Terminalf("uid %q is not a UUID", uid)
	}
	copy(u[:], b)
	return u, nil
}

func formatUUID(u golibvirt.UUID) string { return uuid.UUID(u).String() }

// domainName is unique per VM (the uid suffix) and readable in virsh.
func domainName(m driver.Machine) string {
	return fmt.Sprintf("%s_%s-%s", m.Namespace, m.Name, m.UID[:8])
}

// macFor derives an interface's MAC from the uid and its index, so a
// redefinition keeps MACs and the addresses remembered for them.
func macFor(uid string, index int) string {
	s := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", uid, index)))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", s[0], s[1], s[2])
}

// Names of the volumes the driver makes for a guest alone.
func seedVolume(uid string) string { return uid + seedSuffix }
func swapVolume(uid string) string { return uid + swapSuffix }

const (
	seedSuffix = "-seed.iso"
	swapSuffix = "-swap.img"
)

// Serials name the driver's own disks inside the guest (/dev/disk/by-id/virtio-…).
const (
	swapSerial = "vf-swap"
	seedSerial = "vf-seed"
)

// domainSpec is what the domain definition is built from.
type domainSpec struct {
	machine driver.Machine
	owner   ownership
	// domainType is what the host's capabilities offer: "kvm" where it
	// has KVM, else "qemu" (TCG); "test" on libvirt's test driver.
	domainType string
	pool       string
	// overlayMTU is the MTU of the interfaces on networks joined to the
	// overlay (a VNI); 0 when the machine has none.
	overlayMTU int
	// consoleDir is where the guest's serial console socket goes, as
	// libvirtd sees it (Config.ConsoleDir); empty means DefaultConsoleDir.
	consoleDir string
	// swapFormat is the format of the guest's swap volume as it is on the
	// node; empty means swapFormat's default.
	swapFormat string
	// maxVCPU and maxMemory are the most the guest can grow to live
	// (maxima); at least the machine's VCPU and MemoryBytes.
	maxVCPU   int64
	maxMemory int64
}

// maxima are the most vCPUs and memory a guest of m defined on a host with
// hostCPUs and hostMemory can grow to live: m's own maxima, else
// driver.DefaultMaxRatio times its shape within the host's, never less
// than its shape. A maximum beyond the host's is Terminal, as vcpu is.
func maxima(m driver.Machine, hostCPUs, hostMemory int64, node string) (vcpu, memory int64, err error) {
	if int64(m.MaxVCPU) > hostCPUs {
		return 0, 0, driver.Terminalf("maxVcpu %d is more than the %d CPUs of node %s", m.MaxVCPU, hostCPUs, node)
	}
	if m.MaxMemoryBytes > hostMemory {
		return 0, 0, driver.Terminalf("maxMemory of %d bytes is more than the %d bytes of node %s", m.MaxMemoryBytes, hostMemory, node)
	}
	vcpu, memory = int64(m.MaxVCPU), m.MaxMemoryBytes
	if vcpu == 0 {
		vcpu = max(int64(m.VCPU), min(driver.DefaultMaxRatio*int64(m.VCPU), hostCPUs))
	}
	if memory == 0 {
		memory = max(m.MemoryBytes, min(driver.DefaultMaxRatio*m.MemoryBytes, hostMemory))
	}
	return vcpu, memory, nil
}

// domainXML builds the domain definition.
func domainXML(s domainSpec) (string, error) {
	m := s.machine
	meta, err := s.owner.marshal()
	if err != nil {
		return "", err
	}
	d := &libvirtxml.Domain{
		Type:     s.domainType,
		Name:     domainName(m),
		UUID:     m.UID,
		Metadata: &libvirtxml.DomainMetadata{XML: meta},
		// The guest starts with its maximum of memory and of vCPUs, the
		// balloon holding what it is not to have, and the vCPUs beyond
		// VCPU hot-pluggable: resize moves both within it, live.
		Memory:        &libvirtxml.DomainMemory{Value: uint(max(s.maxMemory, m.MemoryBytes)), Unit: "b"},
		CurrentMemory: &libvirtxml.DomainCurrentMemory{Value: uint(m.MemoryBytes), Unit: "b"},
		VCPU:          &libvirtxml.DomainVCPU{Value: uint(max(s.maxVCPU, int64(m.VCPU))), Current: uint(m.VCPU)},
		OS:            &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
		OnPoweroff:    "destroy",
		OnReboot:      "restart",
		OnCrash:       "destroy",
		// Without ACPI libvirt starts QEMU with -no-acpi: a shutdown request
		// reaches no guest (it is forced off after the grace) and a reboot
		// request returns success while nothing reboots.
		Features: &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		Devices:  &libvirtxml.DomainDeviceList{},
	}
	if m.Firmware == driver.FirmwareUEFI {
		d.OS.Firmware = "efi"
	} else {
		// SeaBIOS writes to the serial port too, so the console shows the
		// boot from its first line (and why a disk did not boot). The
		// setting is SeaBIOS's alone: UEFI firmware has none.
		d.OS.BIOS = &libvirtxml.DomainBIOS{UseSerial: "yes"}
	}
	for i, disk := range m.Disks {
		dd := volumeDisk(cmp.Or(disk.Pool, s.pool), disk.Name, cmp.Or(disk.Format, defaultFormat), virtioDev(i))
		if i == 0 {
			dd.Boot = &libvirtxml.DomainDeviceBoot{Order: 1}
		}
		d.Devices.Disks = append(d.Devices.Disks, dd)
	}
	if m.SwapBytes > 0 {
		dd := volumeDisk(s.pool, swapVolume(m.UID), cmp.Or(s.swapFormat, swapFormat), virtioDev(len(m.Disks)))
		dd.Serial = swapSerial
		d.Devices.Disks = append(d.Devices.Disks, dd)
	}
	// The seed is a read-only virtio disk: stock cloud kernels (Debian's
	// cloud kernel has no AHCI) see no SATA cdrom, and cloud-init finds the
	// seed by its cidata label on any block device.
	seed := volumeDisk(s.pool, seedVolume(m.UID), "raw", virtioDev(len(d.Devices.Disks)))
	seed.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
	seed.Serial = seedSerial
	d.Devices.Disks = append(d.Devices.Disks, seed)
	for i, n := range m.Networks {
		ifc := libvirtxml.DomainInterface{
			MAC:    &libvirtxml.DomainInterfaceMAC{Address: macFor(m.UID, i)},
			Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: n.Name}},
			Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		}
		if n.VNI != 0 && s.overlayMTU > 0 {
			// virtio tells the guest's driver the MTU (host_mtu), so the
			// guest has it from boot, whatever its DHCP client does with
			// the network's MTU option.
			ifc.MTU = &libvirtxml.DomainInterfaceMTU{Size: uint(s.overlayMTU)}
		}
		d.Devices.Interfaces = append(d.Devices.Interfaces, ifc)
	}
	dir := cmp.Or(s.consoleDir, DefaultConsoleDir)
	serial := serialSocket(dir, m.UID)
	if len(serial) > maxSocketPath {
		// QEMU could not start the guest: the node's configuration must
		// change, and the guest is defined once it has.
		return "", driver.Failingf("the console directory %s is too long for the guest's serial console socket (%s is over %d bytes): configure a shorter one", dir, serial, maxSocketPath)
	}
	// The serial console listens on a unix socket the agent connects to
	// for a console session, one at a time (QEMU serves one client). It
	// is logged by virtlogd next to QEMU's log, session or not: that log
	// is what a guest that never comes up on the network can be diagnosed
	// from.
	d.Devices.Serials = []libvirtxml.DomainSerial{{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: serial}},
		Log:    &libvirtxml.DomainChardevLog{File: ConsoleLog(d.Name), Append: "on"},
	}}
	// The display, for VNC sessions through the agent: on a unix socket
	// only, never on a TCP port, where anyone reaching the host could
	// watch and type. libvirt makes the socket at each start, in the
	// guest's own directory under its QEMU directory (/var/lib/libvirt/
	// qemu/domain-<id>-<name>/vnc.sock), and names it in the running
	// definition: libvirt 9.0 drops a VNC socket path given under that
	// directory (it takes it for one its old vnc_auto_unix_socket made)
	// and listens on TCP instead. A plain VGA adapter is all a firmware
	// and a text console need, and every guest kernel drives it.
	d.Devices.Graphics = []libvirtxml.DomainGraphic{{VNC: &libvirtxml.DomainGraphicVNC{
		Listeners: []libvirtxml.DomainGraphicListener{{Socket: &libvirtxml.DomainGraphicListenerSocket{}}},
	}}}
	d.Devices.Videos = []libvirtxml.DomainVideo{{Model: libvirtxml.DomainVideoModel{Type: "vga", Heads: 1, Primary: "yes"}}}
	// The balloon is how a running guest's memory changes: inflated, it
	// takes memory from the guest (MemTotal falls), deflated it gives it
	// back, up to the maximum. Every stock kernel has its driver.
	d.Devices.MemBalloon = &libvirtxml.DomainMemBalloon{Model: "virtio"}
	// The guest agent channel lets DomainInterfaceAddresses ask the guest.
	d.Devices.Channels = []libvirtxml.DomainChannel{{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "org.qemu.guest_agent.0"}},
	}}
	x, err := d.Marshal()
	return x, errors.Wrap(err, "cannot marshal domain XML")
}

// ConsoleLog is where a domain's serial console is logged on its host.
func ConsoleLog(domain string) string { return "/var/log/libvirt/qemu/" + domain + "-console.log" }

// serialSocket is where the serial console of the guest uid listens, in
// dir.
func serialSocket(dir, uid string) string {
	return path.Join(dir, "vf-"+uid+"."+string(driver.ConsoleSerial))
}

// maxSocketPath is the longest path a unix socket can have: sun_path holds
// 108 bytes, the last of them NUL.
const maxSocketPath = 107

// volumeDisk is the disk of volume vol of pool under target dev, with the
// serial driver.DiskSerial gives the volume.
func volumeDisk(pool, vol, format, dev string) libvirtxml.DomainDisk {
	return libvirtxml.DomainDisk{
		Device: "disk",
		Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format},
		Source: &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: pool, Volume: vol}},
		Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: "virtio"},
		Serial: driver.DiskSerial(vol),
	}
}

// Guests defined before serials were given get theirs (driver.DiskSerial)
// at their next definition (a spec change): adding one to every guest at
// once would make every running guest RestartRequired.

// defaultFormat is a disk's format when its intent names none.
const defaultFormat = "qcow2"

// swapFormat is the format a new swap volume is made in: qcow2, so that an
// internal snapshot, which QEMU takes only when every writable disk can
// keep one, can include a guest's swap with its memory. Swap volumes made
// raw before keep their format (domainSpec.swapFormat).
const swapFormat = "qcow2"

// virtioDev names the i-th virtio disk as libvirt does: vda … vdz, vdaa …
func virtioDev(i int) string {
	name := ""
	for i++; i > 0; i = (i - 1) / 26 {
		name = string(rune('a'+(i-1)%26)) + name
	}
	return "vd" + name
}

// diskIndex is the index virtioDev names dev by; -1 for another name.
func diskIndex(dev string) int {
	letters, ok := strings.CutPrefix(dev, "vd")
	if !ok || letters == "" {
		return -1
	}
	i := 0
	for _, r := range letters {
		if r < 'a' || r > 'z' {
			return -1
		}
		i = i*26 + int(r-'a') + 1
	}
	return i - 1
}
