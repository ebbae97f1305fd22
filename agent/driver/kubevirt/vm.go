package kubevirt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// What virtfleet writes on the objects it makes in the target cluster.
const (
	// LabelUID carries the virtfleet VirtualMachine's uid, on the KubeVirt
	// VM, its template and so its VMIs. The driver watches only objects
	// with it.
	LabelUID = "virtfleet.io/uid"
	// AnnotationNamespace and AnnotationName say which virtfleet VM it is,
	// for people looking at the target cluster.
	AnnotationNamespace = "virtfleet.io/namespace"
	AnnotationName      = "virtfleet.io/name"
	// AnnotationSeal, on an orphan, is the hub's seal of its release,
	// reported with it.
	AnnotationSeal = "virtfleet.io/seal"
	// AnnotationShape, on the VM's template and so on each VMI, is a hash of
	// the shape (the maximum vCPUs and memory, swap, boot disk, networks
	// and their addresses, cloud-init, firmware) the template was made
	// from: a VMI whose hash differs from the template's runs an older
	// shape and needs a restart. Data disks are hot-plugged, and the vCPUs
	// (CPU sockets) and guest memory within their maximum are live updates
	// (see liveShape), so they are not in it; in a template an older
	// agent made they are (legacyShape).
	AnnotationShape = "virtfleet.io/shape"
	// AnnotationRestartNonce is the last restart nonce handled.
	AnnotationRestartNonce = "virtfleet.io/restart-nonce"
	// AnnotationResetNonce is the last reset nonce handled.
	AnnotationResetNonce = "virtfleet.io/reset-nonce"
	// AnnotationRestarts counts restarts: those the driver performed and
	// VMI recreations it observed.
	AnnotationRestarts = "virtfleet.io/restarts"
	// AnnotationVMI is the uid of the VMI last seen for a running VM, so a
	// new one is known to be a recreation; empty after a stop.
	AnnotationVMI = "virtfleet.io/vmi"
	// AnnotationRestartVMI is the uid of the VMI the driver deleted for the
	// last restart: its replacement is not counted twice, and a restart
	// interrupted between the annotation and the delete is finished.
	AnnotationRestartVMI = "virtfleet.io/restart-vmi"
)

// maxUserData is KubeVirt's limit on inline cloud-init user data
// (cloudInitUserMaxLen in its VMI admission webhook).
const maxUserData = 2048

// VMName is the KubeVirt VirtualMachine of the virtfleet VM with uid:
// "vf-" and the uid, a valid name that never collides between virtfleet
// namespaces nor between a deleted VM and its successor of the same name.
func VMName(uid string) string { return "vf-" + uid }

// ObjectName maps a node-side name of a disk or network, "<namespace>_<name>"
// (wire.NameOnNode), to the Kubernetes name of its PVC or
// NetworkAttachmentDefinition in the target namespace: "<namespace>.<name>".
// A namespace has no dots, so the first dot separates the two and the
// mapping is one-to-one; NodeNameOf undoes it.
func ObjectName(nodeName string) string {
	return strings.Replace(nodeName, "_", ".", 1)
}

// NodeNameOf is the node-side name of the object ObjectName named.
func NodeNameOf(objectName string) string {
	return strings.Replace(objectName, ".", "_", 1)
}

// Names inside the VM spec: disks, volumes and networks are named by
// position, since the objects' own names may not be DNS labels.
func diskName(i int) string    { return fmt.Sprintf("disk%d", i) }
func networkName(i int) string { return fmt.Sprintf("net%d", i) }

// dataDiskName names a data disk's disk and volume in the VM spec after its
// claim: a DNS label whatever the claim's name.
func dataDiskName(claim string) string {
	sum := sha256.Sum256([]byte(claim))
	return "data-" + hex.EncodeToString(sum[:6])
}

// hotplugDisk is the disk name of a hotpluggable volume, the node's volume
// vol: on the SCSI bus, the only one KubeVirt hot-plugs a disk on, with
// the serial the guest finds it by on every backend (driver.DiskSerial).
func hotplugDisk(name, vol string) kubevirtv1.Disk {
	return kubevirtv1.Disk{Name: name, Serial: driver.DiskSerial(vol), DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusSCSI}}}
}

const cloudInitName = "cloudinit"

// validate rejects Machines no KubeVirt cluster could run.
func validate(m driver.Machine) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if errs := append(validation.IsDNS1123Label(VMName(m.UID)), validation.IsValidLabelValue(m.UID)...); len(errs) > 0 {
		return driver.Terminalf("uid %q cannot name a KubeVirt VirtualMachine: %s", m.UID, strings.Join(errs, "; "))
	}
	for _, d := range m.Disks {
		if d.Imported {
			return driver.Terminalf("disk %s is an imported volume, which the kubevirt backend cannot attach yet", d.Name)
		}
		if errs := validation.IsDNS1123Subdomain(ObjectName(d.Name)); d.Name == "" || len(errs) > 0 {
			return driver.Terminalf("disk %q cannot name a PVC: %s", d.Name, strings.Join(errs, "; "))
		}
	}
	for _, n := range m.Networks {
		if n.Imported {
			return driver.Terminalf("network %q is imported by external name, which the kubevirt backend does not support yet; it attaches to the NetworkAttachmentDefinition <namespace>.<VirtualNetwork name>", n.Name)
		}
		if errs := validation.IsDNS1123Subdomain(ObjectName(n.Name)); n.Name == "" || len(errs) > 0 {
			return driver.Terminalf("network %q cannot name a NetworkAttachmentDefinition: %s", n.Name, strings.Join(errs, "; "))
		}
		if n.Address.IsValid() {
			if _, err := n.Subnet(); err != nil {
				return err
			}
		}
	}
	return nil
}

// newVM is the KubeVirt VirtualMachine for m in namespace. Its template
// carries the shape hash; the caller sets the restart bookkeeping. prev is
// the template of the VM as it is (nil for a new one), whose maxima hold
// while m sets none and they hold m's shape (see maxima).
//
// The vCPUs are sockets of one core and one thread each, and the memory is
// the guest's with no request beside it: KubeVirt's LiveUpdate rollout
// hot-plugs a change of spec.template.spec.domain.cpu.sockets up to
// cpu.maxSockets, and of memory.guest up to memory.maxGuest, into the
// running VMI, and would call a changed request a restart.
func newVM(m driver.Machine, namespace string, prev *kubevirtv1.VirtualMachineInstanceTemplateSpec) (*kubevirtv1.VirtualMachine, error) {
	userData, err := userData(m)
	if err != nil {
		return nil, err
	}
	if len(userData) > maxUserData {
		return nil, driver.Terminalf("cloud-init user data is %d bytes with virtfleet's own; KubeVirt takes at most %d inline", len(userData), maxUserData)
	}
	maxSockets, maxGuest := maxima(m, prev)
	spec := kubevirtv1.VirtualMachineInstanceSpec{
		Domain: kubevirtv1.DomainSpec{
			CPU:    &kubevirtv1.CPU{Sockets: uint32(m.VCPU), Cores: 1, Threads: 1, MaxSockets: maxSockets}, //nolint:gosec // validated ≥ 1
			Memory: &kubevirtv1.Memory{Guest: resource.NewQuantity(m.MemoryBytes, resource.BinarySI), MaxGuest: maxGuest},
		},
	}
	if m.Firmware == driver.FirmwareUEFI {
		spec.Domain.Firmware = &kubevirtv1.Firmware{Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr(false)}}}
	}
	var data []kubevirtv1.Volume
	var dataDisks []kubevirtv1.Disk
	for i, d := range m.Disks {
		source := kubevirtv1.VolumeSource{
			PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: ObjectName(d.Name)}},
		}
		if d.Image != nil {
			// Its DataVolume's PVC, which KubeVirt attaches once CDI has
			// filled it (or at once, where it is no DataVolume's).
			source = kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: ObjectName(d.Name)}}
		}
		if i == 0 {
			spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{
				Name: diskName(0), BootOrder: ptr(uint(1)), DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}},
			})
			spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: diskName(0), VolumeSource: source})
			continue
		}
		// A data disk is hotpluggable, so it can be attached and detached
		// while the guest runs (see hotplug), and is named after its claim:
		// its name stays when another disk comes or goes.
		if source.PersistentVolumeClaim != nil {
			source.PersistentVolumeClaim.Hotpluggable = true
		} else {
			source.DataVolume.Hotpluggable = true
		}
		name := dataDiskName(ObjectName(d.Name))
		data = append(data, kubevirtv1.Volume{Name: name, VolumeSource: source})
		dataDisks = append(dataDisks, hotplugDisk(name, d.Name))
	}
	// The network data is part of the spec and so of the shape hash: a
	// changed address is a shape change, applied at the next restart.
	networkData, err := networkData(m)
	if err != nil {
		return nil, err
	}
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: cloudInitName, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}})
	spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: cloudInitName, VolumeSource: kubevirtv1.VolumeSource{
		CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: string(userData), NetworkData: string(networkData)},
	}})
	// The guest's interfaces are exactly its networks, as on libvirt: each
	// a Multus network, the first the default one (eth0, the default
	// route), and no pod network besides. When the hub gave addresses,
	// each interface has the MAC the network data finds it by; otherwise
	// KubeVirt's, as before.
	for i, n := range m.Networks {
		iface := kubevirtv1.Interface{
			Name: networkName(i), InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
		}
		if networkData != nil {
			iface.MacAddress = macFor(m.UID, i)
		}
		spec.Domain.Devices.Interfaces = append(spec.Domain.Devices.Interfaces, iface)
		spec.Networks = append(spec.Networks, kubevirtv1.Network{Name: networkName(i), NetworkSource: kubevirtv1.NetworkSource{
			Multus: &kubevirtv1.MultusNetwork{NetworkName: ObjectName(n.Name), Default: i == 0},
		}})
	}
	if len(m.Networks) == 0 {
		spec.Domain.Devices.AutoattachPodInterface = ptr(false)
	}

	// The data disks are not shape: they are hot-plugged.
	hash, err := shapeHash(liveShape(spec))
	if err != nil {
		return nil, err
	}
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, dataDisks...)
	spec.Volumes = append(spec.Volumes, data...)
	labels := map[string]string{LabelUID: m.UID}
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{
			Name:        VMName(m.UID),
			Namespace:   namespace,
			Labels:      labels,
			Annotations: map[string]string{AnnotationNamespace: m.Namespace, AnnotationName: m.Name},
		},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr(runStrategy(m.Running)),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{AnnotationShape: hash}},
				Spec:       spec,
			},
		},
	}, nil
}

func runStrategy(running bool) kubevirtv1.VirtualMachineRunStrategy {
	if running {
		return kubevirtv1.RunStrategyAlways
	}
	return kubevirtv1.RunStrategyHalted
}

// KubeVirt's limits on what it hot-plugs: memory in blocks of
// HotplugBlockAlignmentBytes, and only into a guest with at least 1Gi
// (ValidateLiveUpdateMemory, which its VM admission refuses a maxGuest
// beyond); at most maxVCPUs where it computes maxSockets itself.
const (
	hotplugBlock     = 2 << 20
	minHotplugMemory = 1 << 30
	maxVCPUs         = 512
)

// maxima are the maxSockets and maxGuest of m's template: m's own
// maximum, else the one of the template as it is (prev) while it holds
// m's shape, so a live change keeps it, else driver.DefaultMaxRatio times
// m's shape (within maxVCPUs), as KubeVirt would compute it. maxGuest is
// rounded down to KubeVirt's block, and nil where KubeVirt cannot
// hot-plug the guest's memory: the guest memory then changes only at a
// restart.
func maxima(m driver.Machine, prev *kubevirtv1.VirtualMachineInstanceTemplateSpec) (uint32, *resource.Quantity) {
	sockets := int64(m.MaxVCPU)
	if sockets == 0 && prev != nil && prev.Spec.Domain.CPU != nil && int64(prev.Spec.Domain.CPU.MaxSockets) >= int64(m.VCPU) {
		sockets = int64(prev.Spec.Domain.CPU.MaxSockets)
	}
	if sockets == 0 {
		sockets = max(int64(m.VCPU), min(driver.DefaultMaxRatio*int64(m.VCPU), maxVCPUs))
	}
	memory := m.MaxMemoryBytes
	if memory == 0 && prev != nil && prev.Spec.Domain.Memory != nil && prev.Spec.Domain.Memory.MaxGuest != nil && prev.Spec.Domain.Memory.MaxGuest.Value() >= m.MemoryBytes {
		memory = prev.Spec.Domain.Memory.MaxGuest.Value()
	}
	if memory == 0 {
		memory = driver.DefaultMaxRatio * m.MemoryBytes
	}
	memory -= memory % hotplugBlock
	if m.MemoryBytes%hotplugBlock != 0 || m.MemoryBytes < minHotplugMemory || memory < m.MemoryBytes {
		return uint32(sockets), nil //nolint:gosec // at most 1024 (the API's bound) or maxVCPUs
	}
	return uint32(sockets), resource.NewQuantity(memory, resource.BinarySI) //nolint:gosec // as above
}

// liveShape is spec without what KubeVirt changes in a running guest: its
// vCPUs (sockets) and guest memory, each within a maximum that is shape.
func liveShape(spec kubevirtv1.VirtualMachineInstanceSpec) kubevirtv1.VirtualMachineInstanceSpec {
	out := *spec.DeepCopy()
	out.Domain.CPU.Sockets = 0
	out.Domain.Memory.Guest = nil
	return out
}

// legacyShape is the shape hash an agent from before live resize gave a
// VM for m, whose template want (made by newVM for m) is now: its vCPUs
// were cores of one socket, and its memory was requested as well as
// given, without maxima, and all of it was shape. A template carrying it
// is what m asks for, so an upgraded agent neither rewrites it nor
// makes its guest RestartRequired.
func legacyShape(m driver.Machine, want *kubevirtv1.VirtualMachineInstanceTemplateSpec) (string, error) {
	spec := want.Spec.DeepCopy()
	data := dataVolumes(want)
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v kubevirtv1.Volume) bool {
		return slices.ContainsFunc(data, func(d kubevirtv1.Volume) bool { return d.Name == v.Name })
	})
	spec.Domain.Devices.Disks = slices.DeleteFunc(spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool {
		return slices.ContainsFunc(data, func(v kubevirtv1.Volume) bool { return v.Name == d.Name })
	})
	memory := resource.NewQuantity(m.MemoryBytes, resource.BinarySI)
	spec.Domain.CPU = &kubevirtv1.CPU{Cores: uint32(m.VCPU), Sockets: 1, Threads: 1} //nolint:gosec // validated ≥ 1
	spec.Domain.Memory = &kubevirtv1.Memory{Guest: memory}
	spec.Domain.Resources = kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: *memory}}
	return shapeHash(*spec)
}

// shapeHash identifies a VMI spec: a template and a VMI made from it carry
// the same one.
func shapeHash(spec kubevirtv1.VirtualMachineInstanceSpec) (string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return "", errors.Wrap(err, "cannot hash the VM's shape")
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

func ptr[T any](v T) *T { return &v }
