package reconciler

import (
	"net/netip"
	"slices"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// machine turns an intent into the Driver's input. An intent the hub should
// never have written (no disk, no memory) is refused as terminal, with a
// message naming the field, rather than half-created.
func machine(in wire.Intent) (driver.Machine, error) {
	spec := in.Machine
	switch {
	case spec.VCPU < 1:
		return driver.Machine{}, driver.Terminalf("malformed intent: machine.vcpu is %d, need at least 1", spec.VCPU)
	case spec.MemoryBytes <= 0:
		return driver.Machine{}, driver.Terminalf("malformed intent: machine.memoryBytes is %d, need more than 0", spec.MemoryBytes)
	case spec.SwapBytes < 0:
		return driver.Machine{}, driver.Terminalf("malformed intent: machine.swapBytes is %d, must not be negative", spec.SwapBytes)
	case len(spec.Disks) == 0:
		return driver.Machine{}, driver.Terminalf("malformed intent: machine.disks is empty, need a boot disk")
	}
	m := driver.Machine{
		UID:            in.UID,
		Namespace:      in.Namespace,
		Name:           in.Name,
		Generation:     in.Generation,
		VCPU:           spec.VCPU,
		MemoryBytes:    spec.MemoryBytes,
		MaxVCPU:        spec.MaxVCPU,
		MaxMemoryBytes: spec.MaxMemoryBytes,
		SwapBytes:      spec.SwapBytes,
		PublicKey:      spec.PublicKey,
		UserData:       spec.UserData,
		Firmware:       driver.Firmware(spec.Firmware),
		Running:        in.Running,
		RestartNonce:   in.RestartNonce,
		Paused:         in.Paused,
		ResetNonce:     in.ResetNonce,
	}
	for i, d := range spec.Disks {
		if d.Name == "" {
			return driver.Machine{}, driver.Terminalf("malformed intent: machine.disks[%d].name is empty", i)
		}
		disk := driver.Disk{Name: nodeDisk(in.Namespace, d), SizeBytes: d.SizeBytes, Imported: d.ExternalName != "", Pool: d.Pool}
		if disk.Imported && d.Image != nil {
			return driver.Machine{}, driver.Terminalf("malformed intent: machine.disks[%d] imports volume %q and has an image to fill it from", i, d.ExternalName)
		}
		if im := d.Image; im != nil {
			if err := im.Validate(); im.UID == "" || err != nil {
				why := ""
				if err != nil {
					why = ": " + err.Error()
				}
				return driver.Machine{}, driver.Terminalf("malformed intent: machine.disks[%d].image needs a uid and one of a url, a sourceVolume, a sourceSnapshot, an externalName, a backup or held%s", i, why)
			}
			disk.Format = im.Format
			disk.Image = &driver.Image{
				UID:          im.UID,
				Name:         im.Name,
				Namespace:    in.Namespace,
				URL:          im.URL,
				ExternalName: im.ExternalName,
				SHA256:       im.Checksum,
				Format:       im.Format,
				PruneAfter:   time.Duration(im.PruneAfterSeconds) * time.Second,
				Held:         im.Held,
			}
			if src := im.SourceVolume; src != nil {
				disk.Image.SourceVolume = wire.NameOnNode(in.Namespace, src.Name)
			}
			if src := im.SourceSnapshot; src != nil {
				disk.Image.SourceVolume = wire.NameOnNode(in.Namespace, src.Volume.Name)
				disk.Image.SourceSnapshot = src.Snapshot
			}
			if b := im.Backup; b != nil {
				b := *b
				disk.Image.Backup = &b
			}
			for j, cidr := range im.AllowedSources {
				p, err := netip.ParsePrefix(cidr)
				if err != nil {
					return driver.Machine{}, driver.Terminalf("malformed intent: machine.disks[%d].image.allowedSources[%d] %q is not a CIDR such as 10.0.0.0/8", i, j, cidr)
				}
				disk.Image.AllowedSources = append(disk.Image.AllowedSources, p.Masked())
			}
		}
		m.Disks = append(m.Disks, disk)
	}
	for i, n := range spec.Networks {
		if n.Name == "" {
			return driver.Machine{}, driver.Terminalf("malformed intent: machine.networks[%d].name is empty", i)
		}
		net := driver.Network{
			Name:     nodeNetwork(in.Namespace, n),
			Imported: n.ExternalName != "",
			CIDR:     n.CIDR,
			Mode:     driver.NetworkMode(n.Mode),
			Bridge:   n.Bridge,
			UID:      n.UID,
			VNI:      n.VNI,
			VLAN:     n.VLAN,
		}
		if n.VNI < 0 || n.VNI >= 1<<24 {
			return driver.Machine{}, driver.Terminalf("malformed intent: machine.networks[%d].vni %d is not a VXLAN network identifier (0 to 16777215)", i, n.VNI)
		}
		if n.VLAN < 0 || n.VLAN > 4094 {
			return driver.Machine{}, driver.Terminalf("malformed intent: machine.networks[%d].vlan %d is not a VLAN id (0 to 4094)", i, n.VLAN)
		}
		if n.Address != "" {
			p, err := netip.ParsePrefix(n.Address)
			if err != nil || !p.Addr().Is4() {
				return driver.Machine{}, driver.Terminalf("malformed intent: machine.networks[%d].address %q is not an IPv4 address with prefix length such as 10.10.120.7/24", i, n.Address)
			}
			net.Address = p
		}
		m.Networks = append(m.Networks, net)
	}
	if it := spec.Instancetype; it != nil {
		if (it.Kind != wire.ClusterInstancetypeKind && it.Kind != wire.InstancetypeKind) || it.Name == "" || it.Revision < 1 {
			return driver.Machine{}, driver.Terminalf("malformed intent: machine.instancetype needs a kind (%s or %s), a name and a revision of at least 1", wire.ClusterInstancetypeKind, wire.InstancetypeKind)
		}
		m.Instancetype = &driver.Instancetype{Cluster: it.Kind == wire.ClusterInstancetypeKind, Name: it.Name, Revision: it.Revision}
	}
	return m, nil
}

// nodeDisk is the node's name of the volume of disk d: the one its Volume
// imports, or the Volume's own.
func nodeDisk(namespace string, d wire.Disk) string {
	return importedOr(d.ExternalName, namespace, d.Name)
}

// nodeNetwork is the node's name of the network n: the one it imports, or
// the one made for it.
func nodeNetwork(namespace string, n wire.Network) string {
	return importedOr(n.ExternalName, namespace, n.Name)
}

// importedOr is the node's name of a Volume's or VirtualNetwork's storage or
// network: the one it imports by external name, else wire.NameOnNode's.
func importedOr(externalName, namespace, name string) string {
	if externalName != "" {
		return externalName
	}
	return wire.NameOnNode(namespace, name)
}

// report turns what the driver observed into the wire report for in.
// Interfaces are reported under the VirtualNetwork names the user wrote.
func report(in wire.Intent, obs driver.Observation) wire.Report {
	userName := map[string]string{}
	for _, n := range in.Machine.Networks {
		userName[nodeNetwork(in.Namespace, n)] = n.Name
	}
	r := wire.Report{
		UID:                in.UID,
		ObservedGeneration: in.Generation,
		Phase:              wirePhase(obs.Phase),
		ID:                 obs.ID,
		Host:               obs.Node,
		RestartCount:       obs.RestartCount,
		RestartRequired:    obs.RestartRequired,
		Message:            obs.Message,
		VCPU:               obs.VCPU,
		MemoryBytes:        obs.MemoryBytes,
		MaxVCPU:            obs.MaxVCPU,
		MaxMemoryBytes:     obs.MaxMemoryBytes,
	}
	if len(obs.Disks) > 0 {
		volume := map[string]string{}
		for _, d := range in.Machine.Disks {
			volume[nodeDisk(in.Namespace, d)] = d.Name
		}
		for _, name := range obs.Disks {
			v, ok := volume[name]
			if !ok {
				// A Volume removed from the intent whose detach the guest
				// has not acknowledged yet is still attached, so it is
				// reported until the guest lets it go. One the name does
				// not tell (another namespace's, an imported volume's
				// own) is left out rather than misnamed.
				v, ok = wire.NameFromNode(in.Namespace, name)
			}
			if ok {
				r.Disks = append(r.Disks, v)
			}
		}
	}
	for _, i := range obs.Interfaces {
		network := i.Network
		if n, ok := userName[network]; ok {
			network = n
		}
		r.Interfaces = append(r.Interfaces, wire.Interface{
			Network:  network,
			MAC:      i.MAC,
			IPs:      append([]string(nil), i.IPs...),
			Source:   wire.AddressSource(i.Source),
			LastSeen: i.LastSeen,
		})
	}
	return r
}

// failed is the report of a guest whose intent cannot succeed as given.
func failed(in wire.Intent, node string, err error) wire.Report {
	return wire.Report{
		UID:                in.UID,
		ObservedGeneration: in.Generation,
		Phase:              wire.PhaseFailed,
		Node:               node,
		Message:            err.Error(),
	}
}

// wirePhase is the wire's name for a driver's phase (see driver.Phases); a
// phase the protocol does not know is reported Unknown.
func wirePhase(p driver.Phase) wire.Phase {
	if w := wire.Phase(p); slices.Contains(wire.Phases, w) {
		return w
	}
	return wire.PhaseUnknown
}
