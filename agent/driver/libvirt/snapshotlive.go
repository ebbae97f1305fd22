package libvirt

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// A running guest's disk-only snapshot is taken by QEMU while the guest
// runs on: one QMP transaction of blockdev-snapshot-internal-sync, an
// internal snapshot of each of its qcow2 disks at one instant. Its vCPUs
// never stop; what the guest notices is the freeze of its filesystems,
// when its agent answers. libvirt 9.0 takes internal snapshots of a running
// guest only with savevm, which stops the guest while its memory is
// written, and refuses them without the memory.
//
// libvirt learns of the snapshot by a redefinition, made before QEMU takes
// it: a snapshot of the guest's disks alone, in the state "shutoff", with
// the definitions the guest runs and starts with. That is what its disks
// hold, and it is how libvirt reverts one (the guest off, qemu-img snapshot
// -a on each disk) and deletes one (delvm on a running guest, qemu-img
// snapshot -d on a stopped one), which also copes with disks that never got
// it. The record stays incomplete until QEMU took it: an agent stopped in
// between leaves a snapshot that the next try deletes, through libvirt,
// and takes again, so QEMU is never left with one libvirt does not know.
//
// The QMP commands go through libvirt's monitor passthrough
// (virDomainQemuMonitorCommand), for which libvirt marks the domain
// tainted ("custom-monitor") in its log; nothing libvirt keeps of the
// domain changes with them.

// liveSnapshotState is the state libvirt is told a live disk-only snapshot
// was taken in: its disks alone, as of a stopped guest's.
const liveSnapshotState = "shutoff"

// qmpCommand is a QMP command as the monitor passthrough takes it.
type qmpCommand struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

// qmpReply is QEMU's answer to a command: its return value, or its error.
type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class       string `json:"class"`
		Description string `json:"desc"`
	} `json:"error"`
}

// qmpBlockDevice is a device of query-block's answer.
type qmpBlockDevice struct {
	// Qdev is the path of the guest device, which ends in libvirt's
	// alias for the disk.
	Qdev     string `json:"qdev"`
	Inserted *struct {
		// NodeName is the top node of the disk's chain: its format.
		NodeName string `json:"node-name"`
	} `json:"inserted"`
}

// qmpTransactionAction is one action of a QMP transaction.
type qmpTransactionAction struct {
	Type string `json:"type"`
	Data any    `json:"data"`
}

// qmpInternalSnapshot names a block node and the internal snapshot to take
// of it (blockdev-snapshot-internal-sync).
type qmpInternalSnapshot struct {
	Device string `json:"device"`
	Name   string `json:"name"`
}

// monitor runs the QMP command execute with args on dom's QEMU, and reads
// what it returns into ret, unless ret is nil.
func monitor(api API, dom golibvirt.Domain, execute string, args, ret any) error {
	cmd, err := json.Marshal(qmpCommand{Execute: execute, Arguments: args})
	if err != nil {
		return errors.Wrapf(err, "cannot marshal QMP command %s", execute)
	}
	out, err := api.QEMUDomainMonitorCommand(dom, string(cmd), 0)
	if err != nil {
		return errors.Wrapf(err, "cannot run QMP command %s", execute)
	}
	var reply qmpReply
	if err := json.Unmarshal([]byte(out), &reply); err != nil {
		return errors.Wrapf(err, "cannot parse QEMU's answer to %s", execute)
	}
	if reply.Error != nil {
		return errors.Errorf("QEMU refused %s: %s (%s)", execute, reply.Error.Description, reply.Error.Class)
	}
	if ret == nil {
		return nil
	}
	return errors.Wrapf(json.Unmarshal(reply.Return, ret), "cannot parse QEMU's answer to %s", execute)
}

// defineLiveSnapshot has libvirt record the snapshot p plans of dom, the
// guest uid's, before QEMU takes it, with record (incomplete) in its
// description.
func (d *Driver) defineLiveSnapshot(api API, dom golibvirt.Domain, uid string, p snapshotPlan, record snapshotRecord) (golibvirt.DomainSnapshot, error) {
	def := p.def
	desc, err := record.description()
	if err != nil {
		return golibvirt.DomainSnapshot{}, err
	}
	def.Description = desc
	def.State = liveSnapshotState
	def.CreationTime = strconv.FormatInt(record.TakenAt.Unix(), 10)
	// The secure definitions: a revert makes them the guest's again and
	// must not drop their secrets.
	if def.Domain, err = d.secureDefinition(api, dom, uid, 0); err != nil {
		return golibvirt.DomainSnapshot{}, err
	}
	inactive, err := d.secureDefinition(api, dom, uid, golibvirt.DomainXMLInactive)
	if err != nil {
		return golibvirt.DomainSnapshot{}, err
	}
	def.InactiveDomain = &libvirtxml.DomainSnapshotInactiveDomain{Domain: *inactive}
	x, err := def.Marshal()
	if err != nil {
		return golibvirt.DomainSnapshot{}, errors.Wrap(err, "cannot marshal snapshot XML")
	}
	h, err := api.DomainSnapshotCreateXML(dom, x, uint32(golibvirt.DomainSnapshotCreateRedefine|golibvirt.DomainSnapshotCreateCurrent))
	return h, errors.Wrapf(err, "cannot record snapshot %s", p.def.Name)
}

// secureDefinition reads dom's definition which, the guest uid's, secrets
// included.
func (d *Driver) secureDefinition(api API, dom golibvirt.Domain, uid string, which golibvirt.DomainXMLFlags) (*libvirtxml.Domain, error) {
	_, x, err := d.describeXML(api, dom, uid, which|golibvirt.DomainXMLSecure)
	if err != nil {
		return nil, err
	}
	var def libvirtxml.Domain
	return &def, errors.Wrap(def.Unmarshal(x), "cannot parse domain XML")
}

// takeInternalSnapshots has dom's QEMU take an internal snapshot named
// name of each disk that p keeps, all at once, while the guest runs.
func takeInternalSnapshots(api API, dom golibvirt.Domain, name string, p snapshotPlan) error {
	var devices []qmpBlockDevice
	if err := monitor(api, dom, "query-block", nil, &devices); err != nil {
		return err
	}
	var actions []qmpTransactionAction
	for _, disk := range p.def.Disks.Disks {
		if disk.Snapshot != "internal" {
			continue
		}
		node, err := nodeOf(devices, p.aliases[disk.Name])
		if err != nil {
			return errors.Wrapf(err, "cannot find disk %s in QEMU", disk.Name)
		}
		actions = append(actions, qmpTransactionAction{Type: "blockdev-snapshot-internal-sync", Data: qmpInternalSnapshot{Device: node, Name: name}})
	}
	if len(actions) == 0 {
		return nil
	}
	return monitor(api, dom, "transaction", map[string]any{"actions": actions}, nil)
}

// nodeOf is the top block node of the guest device libvirt calls alias.
func nodeOf(devices []qmpBlockDevice, alias string) (string, error) {
	if alias == "" {
		return "", errors.New("the disk has no alias in the running definition")
	}
	for _, d := range devices {
		if d.Inserted == nil || d.Inserted.NodeName == "" {
			continue
		}
		// "/machine/peripheral/<alias>/virtio-backend" for virtio-blk,
		// "<alias>" itself for some other devices.
		if d.Qdev == alias || strings.Contains(d.Qdev+"/", "/"+alias+"/") {
			return d.Inserted.NodeName, nil
		}
	}
	return "", errors.Errorf("no block device of QEMU is the guest's %s", alias)
}
