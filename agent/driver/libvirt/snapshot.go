package libvirt

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Snapshots on libvirt are internal qcow2 snapshots, named by the
// snapshot's ID: libvirt 9.0 reverts internal snapshots only (reverting
// external ones came in later releases), and an internal snapshot keeps,
// inside each qcow2 disk, the disk at the snapshot's moment and, in one of
// them, the guest's memory and device state (QEMU's savevm). A stopped
// guest's disks are snapshotted by qemu-img, through libvirt.
//
// A running guest's disk-only snapshot is taken by QEMU while the guest
// runs on, and recorded in libvirt as a snapshot of its disks alone
// (snapshotlive.go): libvirt 9.0 would take it only with the guest's memory,
// stopping the guest while the memory is written. Its revert powers the
// guest off and brings its disks back, so its next start boots them cold:
// what a disk-only snapshot promises. On libvirt's test driver, which has
// no QEMU, it is taken as libvirt takes it, with the memory, marked as not
// asked for (snapshotRecord.Memory) and never resumed.

var _ driver.Snapshotter = (*Driver)(nil)

// snapshotMark begins the description of every snapshot the driver takes,
// followed by its snapshotRecord in JSON. A snapshot without it was not
// taken by virtfleet and is never listed, reverted or deleted.
const snapshotMark = "virtfleet snapshot "

// snapshotRecord is what the driver keeps in a snapshot's description:
// what libvirt's own account of it does not say, and what the driver must
// read back after an agent restart.
type snapshotRecord struct {
	// VM is the uid of the guest it was taken of: an adopted domain may
	// have another VM's snapshots from before.
	VM string `json:"vm"`
	// TakenAt is the moment it holds, finer than libvirt's creationTime
	// (whole seconds), so that snapshots taken in one second are listed in
	// the order they were taken.
	TakenAt time.Time `json:"takenAt"`
	// Memory: it was asked for with the running guest's memory. Only
	// one with Memory is ever resumed: on the test driver a disk-only
	// snapshot of a running guest holds the memory too (see above).
	Memory bool `json:"memory"`
	// Online: the guest ran. libvirt's own account says so of the
	// snapshots it took, not of those QEMU took (snapshotlive.go).
	Online bool `json:"online,omitempty"`
	Frozen bool `json:"frozen"`
	// SizeBytes is how much the guest's disks grew when it was taken (see
	// growth).
	SizeBytes int64 `json:"sizeBytes"`
	// Complete is written last, once the filesystems were thawed and the
	// size measured. A snapshot without it is one whose taking was cut
	// short (the agent stopped): not one the guest has, so it is taken
	// again, and its retaking thaws what the cut left frozen.
	Complete bool `json:"complete"`
}

func (r snapshotRecord) description() (string, error) {
	b, err := json.Marshal(r)
	return snapshotMark + string(b), errors.Wrap(err, "cannot marshal the snapshot's record")
}

// recordOf reads the record in a snapshot's description; false for a
// snapshot virtfleet did not take.
func recordOf(description string) (snapshotRecord, bool) {
	j, ok := strings.CutPrefix(description, snapshotMark)
	if !ok {
		return snapshotRecord{}, false
	}
	var r snapshotRecord
	if err := json.Unmarshal([]byte(j), &r); err != nil {
		return snapshotRecord{}, false
	}
	return r, true
}

// snapshotCreateFlags make libvirt check the snapshot's XML against its
// schema and take it whole or not at all.
const snapshotCreateFlags = uint32(golibvirt.DomainSnapshotCreateAtomic | golibvirt.DomainSnapshotCreateValidate)

// snapshotRefusals are the errors of a snapshot libvirt will never take as
// asked: a disk that cannot keep one ("internal snapshot for disk vdb
// unsupported for storage type raw"), or what the domain has that
// snapshots do not go with.
var snapshotRefusals = append(slices.Clone(permanentCodes), golibvirt.ErrOperationUnsupported)

// guestSnapshot is one of a guest's snapshots as libvirt keeps it.
type guestSnapshot struct {
	handle golibvirt.DomainSnapshot
	def    libvirtxml.DomainSnapshot
	record snapshotRecord
	// ours: virtfleet took it of this guest.
	ours bool
}

// snapshot reads snapshot id of dom, the guest uid's; false when dom has
// none of that name.
func snapshot(api API, dom golibvirt.Domain, uid, id string) (guestSnapshot, bool, error) {
	h, err := api.DomainSnapshotLookupByName(dom, id, 0)
	switch {
	case isCode(err, golibvirt.ErrNoDomainSnapshot):
		return guestSnapshot{}, false, nil
	case isCode(err, golibvirt.ErrNoDomain):
		return guestSnapshot{}, false, driver.NotFoundf("no domain with uuid %s", uid)
	case err != nil:
		return guestSnapshot{}, false, errors.Wrapf(err, "cannot look up snapshot %s", id)
	}
	s, err := readSnapshot(api, h, uid)
	if isCode(err, golibvirt.ErrNoDomainSnapshot) {
		return guestSnapshot{}, false, nil
	}
	return s, err == nil, err
}

// readSnapshot reads snapshot h of the guest uid.
func readSnapshot(api API, h golibvirt.DomainSnapshot, uid string) (guestSnapshot, error) {
	x, err := api.DomainSnapshotGetXMLDesc(h, 0)
	if err != nil {
		return guestSnapshot{}, errors.Wrapf(err, "cannot read snapshot %s", h.Name)
	}
	s := guestSnapshot{handle: h}
	if err := s.def.Unmarshal(x); err != nil {
		return guestSnapshot{}, errors.Wrapf(err, "cannot parse snapshot %s", h.Name)
	}
	var virtfleet bool
	s.record, virtfleet = recordOf(s.def.Description)
	s.ours = virtfleet && s.record.VM == uid
	return s, nil
}

// taken is whether the guest has the snapshot: virtfleet took it of this
// guest, to the end.
func (s guestSnapshot) taken() bool { return s.ours && s.record.Complete }

// holdsMemory is whether the snapshot holds the guest's memory, asked for
// or not: a revert without REVERT_PAUSED would run it.
func (s guestSnapshot) holdsMemory() bool {
	return s.def.Memory != nil && s.def.Memory.Snapshot == "internal"
}

func (s guestSnapshot) report() driver.Snapshot {
	return driver.Snapshot{
		ID:        s.handle.Name,
		CreatedAt: s.record.TakenAt,
		SizeBytes: s.record.SizeBytes,
		Online:    s.def.State != "shutoff" || s.record.Online,
		Memory:    s.record.Memory,
		Frozen:    s.record.Frozen,
	}
}

// TakeSnapshot implements driver.Snapshotter.
func (d *Driver) TakeSnapshot(_ context.Context, uid string, r driver.SnapshotRequest) (taken driver.Snapshot, err error) {
	if r.ID == "" {
		return driver.Snapshot{}, driver.Terminalf("a snapshot of guest %s needs an ID", uid)
	}
	api, _, err := d.api()
	if err != nil {
		return driver.Snapshot{}, err
	}
	api = rememberPools(api)
	dom, err := d.domainOf(api, uid)
	if err != nil {
		return driver.Snapshot{}, err
	}
	switch s, found, err := snapshot(api, dom, uid, r.ID); {
	case err != nil:
		return driver.Snapshot{}, err
	case found && s.taken():
		return s.report(), nil
	case found && !s.ours:
		return driver.Snapshot{}, driver.Terminalf("domain %s has a snapshot named %s that is not guest %s's", dom.Name, r.ID, uid)
	case found:
		// Cut short by an agent that stopped: taken again from the start.
		if err := deleteSnapshot(api, s.handle); err != nil {
			return driver.Snapshot{}, err
		}
	}
	plan, err := d.planSnapshot(api, dom, uid, r)
	if err != nil {
		return driver.Snapshot{}, err
	}
	if err := dropCheckpoints(api, dom, uid, plan.online); err != nil {
		return driver.Snapshot{}, err
	}
	volumes, before, err := allocations(api, plan.vols)
	if err != nil {
		return driver.Snapshot{}, err
	}
	record := snapshotRecord{VM: uid, Memory: r.Memory && plan.online, Online: plan.online}
	began := d.now()
	var made *golibvirt.DomainSnapshot
	defer func() {
		if err != nil && made != nil {
			// A retry would find it incomplete and take it again
			// anyway: the error says what went wrong.
			_ = deleteSnapshot(api, *made)
		}
	}()
	if plan.live {
		// Recorded before QEMU takes it, so that libvirt can delete
		// what an agent stopped midway left (snapshotlive.go).
		record.TakenAt = d.now().UTC().Round(0)
		h, err := d.defineLiveSnapshot(api, dom, uid, plan, record)
		if err != nil {
			return driver.Snapshot{}, err
		}
		made = &h
	}
	err = whileFrozen(api, dom, plan.freeze, func(frozen bool) error {
		// In UTC without a monotonic reading: as it reads back.
		record.Frozen, record.TakenAt = frozen, d.now().UTC().Round(0)
		if plan.live {
			return takeInternalSnapshots(api, dom, r.ID, plan)
		}
		h, err := createSnapshot(api, dom, uid, plan, record)
		if err == nil {
			made = &h
		}
		return err
	})
	if err != nil {
		return driver.Snapshot{}, err
	}
	after, err := allocated(api, volumes)
	if err != nil {
		return driver.Snapshot{}, err
	}
	record.SizeBytes, record.Complete = growth(before, after), true
	s, err := completeSnapshot(api, *made, record)
	if err != nil {
		return driver.Snapshot{}, err
	}
	taken = s.report()
	taken.Duration = d.now().Sub(began)
	return taken, nil
}

// dropCheckpoints deletes the backup checkpoints of dom, the guest uid's,
// for a snapshot: QEMU 7.2 refuses to revert an internal snapshot of a
// disk with dirty bitmaps (see backup.go). They go as a commit of a backup
// the guest does not have would make them go, and the guest's next backup
// is full. libvirt 9.0 deletes checkpoints of running guests only, so a
// stopped guest with checkpoints is refused; so is one with checkpoints
// virtfleet did not make, which it never deletes.
func dropCheckpoints(api API, dom golibvirt.Domain, uid string, online bool) error {
	switch n, err := checkpointCount(api, dom); {
	case err != nil:
		return err
	case n == 0:
		return nil
	case !online:
		return driver.Terminalf("guest %s is stopped and has backup checkpoints (%d), which libvirt 9.0 deletes on running guests only, and QEMU 7.2 refuses to revert an internal snapshot of a disk with dirty bitmaps (\"Device has active dirty bitmaps\"): start the guest to snapshot it; its checkpoints are then deleted first, and its next backup reads its disks whole", uid, n)
	}
	if err := forgetCheckpointsBut(api, dom, uid, ""); err != nil {
		return err
	}
	switch n, err := checkpointCount(api, dom); {
	case err != nil:
		return err
	case n > 0:
		return driver.Terminalf("guest %s cannot be snapshotted while it has checkpoints virtfleet did not make (%d): QEMU 7.2 refuses to revert an internal snapshot of a disk with dirty bitmaps (\"Device has active dirty bitmaps\"); delete them to snapshot it", uid, n)
	}
	return nil
}

// snapshotPlan is how a guest is snapshotted as it is now.
type snapshotPlan struct {
	// def is the snapshot's XML but its description.
	def libvirtxml.DomainSnapshot
	// vols are the pool volumes it keeps.
	vols []poolVolume
	// online: the guest runs. freeze: its filesystems are to be frozen.
	// live: QEMU takes its disks alone while it runs (snapshotlive.go).
	online, freeze, live bool
	// aliases name, for a live snapshot, each disk target's device in
	// the running definition.
	aliases map[string]string
}

// planSnapshot plans snapshot r of dom, the guest uid's, as the guest is
// now. It refuses a guest with a disk that cannot keep a snapshot.
func (d *Driver) planSnapshot(api API, dom golibvirt.Domain, uid string, r driver.SnapshotRequest) (snapshotPlan, error) {
	// The definition the guest runs with, or the one it starts with.
	info, x, err := d.describeXML(api, dom, uid, 0)
	if err != nil {
		return snapshotPlan{}, err
	}
	state, _, err := api.DomainGetState(dom, 0)
	if err != nil {
		return snapshotPlan{}, errors.Wrap(err, "cannot read domain state")
	}
	p := snapshotPlan{online: active(golibvirt.DomainState(state))}
	var def libvirtxml.Domain
	if err := def.Unmarshal(x); err != nil {
		return snapshotPlan{}, errors.Wrap(err, "cannot parse domain XML")
	}
	disks, vols, err := snapshotDisks(&def, uid, formatUUID(dom.UUID))
	if err != nil {
		return snapshotPlan{}, err
	}
	p.vols = vols
	p.live = p.online && !r.Memory && !d.testDriver
	memory := "no"
	switch {
	case p.live:
		p.aliases = diskAliases(&def)
	case p.online:
		memory = "internal"
		if err := roomForMemory(api, uid, r.ID, vols, info.memory); err != nil {
			return snapshotPlan{}, err
		}
	}
	p.def = libvirtxml.DomainSnapshot{
		Name:   r.ID,
		Memory: &libvirtxml.DomainSnapshotMemory{Snapshot: memory},
		Disks:  &libvirtxml.DomainSnapshotDisks{Disks: disks},
	}
	// The memory, when it is kept, is the guest whole at one moment: its
	// writes in flight are in it. A freeze would be kept with it, and a
	// guest resumed from it would stay frozen. A paused guest's agent
	// cannot answer.
	p.freeze = p.online && !r.Memory && golibvirt.DomainState(state) == golibvirt.DomainRunning
	return p, nil
}

// createSnapshot takes the snapshot p plans of dom, the guest uid's, with
// record in its description.
func createSnapshot(api API, dom golibvirt.Domain, uid string, p snapshotPlan, record snapshotRecord) (golibvirt.DomainSnapshot, error) {
	def := p.def
	desc, err := record.description()
	if err != nil {
		return golibvirt.DomainSnapshot{}, err
	}
	def.Description = desc
	x, err := def.Marshal()
	if err != nil {
		return golibvirt.DomainSnapshot{}, errors.Wrap(err, "cannot marshal snapshot XML")
	}
	h, err := api.DomainSnapshotCreateXML(dom, x, snapshotCreateFlags)
	switch {
	case isCode(err, golibvirt.ErrNoDomain):
		return h, driver.NotFoundf("no domain with uuid %s", uid)
	case isCode(err, snapshotRefusals...):
		// Planned for a running guest that stopped since, or the other
		// way round: the next try plans for it as it is.
		if state, _, serr := api.DomainGetState(dom, 0); serr == nil && active(golibvirt.DomainState(state)) != p.online {
			return h, errors.Wrapf(err, "guest %s started or stopped while snapshot %s was taken", uid, p.def.Name)
		}
		return h, driver.Terminal(errors.Wrapf(err, "libvirt refused snapshot %s of guest %s", p.def.Name, uid))
	}
	return h, errors.Wrapf(err, "cannot take snapshot %s", p.def.Name)
}

// active is whether a domain in state s has a QEMU process: one whose
// snapshot is online.
func active(s golibvirt.DomainState) bool {
	return s != golibvirt.DomainShutoff && s != golibvirt.DomainCrashed && s != golibvirt.DomainNostate
}

// snapshotDisks says, for each disk of the domain definition def, whether a
// snapshot keeps it, and which pool volumes it keeps. It refuses a guest
// with a writable disk that cannot keep an internal snapshot, before
// anything is done: only qcow2 can.
func snapshotDisks(def *libvirtxml.Domain, uid, key string) ([]libvirtxml.DomainSnapshotDisk, []poolVolume, error) {
	if def.Devices == nil {
		return nil, nil, nil
	}
	var disks []libvirtxml.DomainSnapshotDisk
	var vols []poolVolume
	for _, disk := range def.Devices.Disks {
		if disk.Target == nil {
			continue
		}
		dev := disk.Target.Dev
		var vol *libvirtxml.DomainDiskSourceVolume
		if disk.Source != nil {
			vol = disk.Source.Volume
		}
		format := "raw" // what libvirt takes a disk without a format for
		if disk.Driver != nil && disk.Driver.Type != "" {
			format = disk.Driver.Type
		}
		switch {
		case vol != nil && vol.Volume == seedVolume(key),
			disk.ReadOnly != nil, disk.Source == nil, disk.Device == "cdrom", disk.Device == "floppy":
			// Nothing the guest writes: the cloud-init seed (raw, and
			// made afresh at every definition) or read-only media.
			disks = append(disks, libvirtxml.DomainSnapshotDisk{Name: dev, Snapshot: "no"})
			continue
		case format != "qcow2":
			what := "disk"
			if vol != nil && vol.Volume == swapVolume(key) {
				what = "swap disk"
			}
			return nil, nil, driver.Terminalf("guest %s cannot be snapshotted: its %s %s (%s) is %s, and libvirt keeps snapshots of qcow2 disks only (internal snapshots, the only ones libvirt 9.0 reverts); no snapshot was taken", uid, what, diskName(disk), dev, format)
		}
		disks = append(disks, libvirtxml.DomainSnapshotDisk{Name: dev, Snapshot: "internal"})
		if vol != nil {
			vols = append(vols, poolVolume{pool: vol.Pool, name: vol.Volume})
		}
	}
	return disks, vols, nil
}

// roomForMemory refuses snapshot id of the guest uid, which keeps the
// guest's memory of up to memory bytes, when the pool of its first disk
// that keeps snapshots (vols), where QEMU's savevm writes the memory, has
// not that much free: the snapshot would fail midway, after writing what
// fits.
func roomForMemory(api API, uid, id string, vols []poolVolume, memory int64) error {
	if len(vols) == 0 || memory <= 0 {
		return nil
	}
	pool := vols[0].pool
	p, err := api.StoragePoolLookupByName(pool)
	if err != nil {
		return errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	return roomIn(api, p, uint64(memory), fmt.Sprintf("snapshot %s of guest %s, which keeps its memory,", id, uid))
}

// diskAliases maps each disk target of the domain definition def to
// libvirt's alias of its device.
func diskAliases(def *libvirtxml.Domain) map[string]string {
	aliases := map[string]string{}
	if def.Devices == nil {
		return aliases
	}
	for _, disk := range def.Devices.Disks {
		if disk.Target != nil && disk.Alias != nil {
			aliases[disk.Target.Dev] = disk.Alias.Name
		}
	}
	return aliases
}

// diskName is what a user knows a disk by: its volume, or its file.
func diskName(disk libvirtxml.DomainDisk) string {
	switch s := disk.Source; {
	case s != nil && s.Volume != nil:
		return "volume " + s.Volume.Volume
	case s != nil && s.File != nil:
		return "file " + s.File.File
	}
	return disk.Target.Dev
}

// allocations looks the volumes vols up and reads how much of its pool
// each takes. looked are the volumes as looked up, to read again.
func allocations(api API, vols []poolVolume) (looked []golibvirt.StorageVol, sizes []uint64, err error) {
	looked = make([]golibvirt.StorageVol, 0, len(vols))
	for _, v := range vols {
		h, err := findVolume(api, v.pool, v.name)
		if err != nil {
			return nil, nil, errors.Wrap(err, "cannot find a disk to snapshot")
		}
		looked = append(looked, h)
	}
	sizes, err = allocated(api, looked)
	return looked, sizes, err
}

// allocated reads how much of its pool each of vols takes.
func allocated(api API, vols []golibvirt.StorageVol) ([]uint64, error) {
	sizes := make([]uint64, 0, len(vols))
	for _, v := range vols {
		_, _, allocation, err := api.StorageVolGetInfo(v)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read volume %s", v.Name)
		}
		sizes = append(sizes, allocation)
	}
	return sizes, nil
}

// growth is the snapshot's size as the disks tell it: how much their
// allocation grew while it was taken. That is the memory image, which QEMU
// writes into the first qcow2 disk, and the snapshot tables qcow2 copies;
// not the blocks the guest rewrites afterwards, which the snapshot keeps
// from then on. libvirt's test driver allocates nothing: 0 there.
func growth(before, after []uint64) int64 {
	var n int64
	for i := range min(len(before), len(after)) {
		if after[i] > before[i] {
			n += int64(after[i] - before[i])
		}
	}
	return n
}

// whileFrozen calls take with the guest's filesystems frozen through its
// guest agent, when freeze is set and the agent answers, and thaws them
// after whatever happened. A guest without an agent that answers is
// snapshotted as it is (crash-consistent): take learns it from frozen.
func whileFrozen(api API, dom golibvirt.Domain, freeze bool, take func(frozen bool) error) (err error) {
	if !freeze {
		return take(false)
	}
	n, ferr := api.DomainFsfreeze(dom, nil, 0)
	frozen := ferr == nil && n > 0
	defer func() {
		// Also after a freeze that failed: one that timed out waiting for
		// the agent may have frozen filesystems all the same. A thaw of
		// what is not frozen does nothing.
		if _, terr := api.DomainFsthaw(dom, nil, 0); terr != nil && frozen {
			err = errors.Join(err, errors.Wrap(terr, "cannot thaw the guest's filesystems"))
		}
	}()
	if ferr != nil && libvirtCode(ferr) == -1 {
		// Not the agent's answer: libvirtd is out of reach.
		return errors.Wrap(ferr, "cannot freeze the guest's filesystems")
	}
	return take(frozen)
}

// completeSnapshot writes record, complete, in snapshot h's description
// (a redefinition of it: libvirt changes nothing else of a snapshot it
// has), and returns the snapshot as it is now.
func completeSnapshot(api API, h golibvirt.DomainSnapshot, record snapshotRecord) (guestSnapshot, error) {
	// The secure XML: the redefinition replaces the definitions the
	// snapshot keeps, and must not drop their secrets.
	x, err := api.DomainSnapshotGetXMLDesc(h, uint32(golibvirt.DomainSnapshotXMLSecure))
	if err != nil {
		return guestSnapshot{}, errors.Wrapf(err, "cannot read snapshot %s", h.Name)
	}
	var def libvirtxml.DomainSnapshot
	if err := def.Unmarshal(x); err != nil {
		return guestSnapshot{}, errors.Wrapf(err, "cannot parse snapshot %s", h.Name)
	}
	if def.Description, err = record.description(); err != nil {
		return guestSnapshot{}, err
	}
	if x, err = def.Marshal(); err != nil {
		return guestSnapshot{}, errors.Wrap(err, "cannot marshal snapshot XML")
	}
	// It was made current when it was taken, and stays so.
	flags := uint32(golibvirt.DomainSnapshotCreateRedefine | golibvirt.DomainSnapshotCreateCurrent)
	if _, err := api.DomainSnapshotCreateXML(h.Dom, x, flags); err != nil {
		return guestSnapshot{}, errors.Wrapf(err, "cannot record snapshot %s", h.Name)
	}
	return guestSnapshot{handle: h, def: def, record: record, ours: true}, nil
}

// deleteSnapshot deletes snapshot h; one already gone is deleted.
func deleteSnapshot(api API, h golibvirt.DomainSnapshot) error {
	err := api.DomainSnapshotDelete(h, 0)
	if isCode(err, golibvirt.ErrNoDomainSnapshot, golibvirt.ErrNoDomain) {
		return nil
	}
	return errors.Wrapf(err, "cannot delete snapshot %s", h.Name)
}

// Snapshots implements driver.Snapshotter.
func (d *Driver) Snapshots(_ context.Context, uid string) ([]driver.Snapshot, error) {
	api, _, err := d.api()
	if err != nil {
		return nil, err
	}
	dom, err := d.domainOf(api, uid)
	if driver.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	all, _, err := api.DomainListAllSnapshots(dom, 1, 0)
	if isCode(err, golibvirt.ErrNoDomain) {
		return nil, nil
	}
	if err != nil {
		return nil, errors.Wrap(err, "cannot list snapshots")
	}
	var out []driver.Snapshot
	for _, h := range all {
		s, err := readSnapshot(api, h, uid)
		if isCode(err, golibvirt.ErrNoDomainSnapshot, golibvirt.ErrNoDomain) {
			continue // deleted since the list
		}
		if err != nil {
			return nil, err
		}
		if s.taken() {
			out = append(out, s.report())
		}
	}
	slices.SortFunc(out, func(a, b driver.Snapshot) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// DeleteSnapshot implements driver.Snapshotter. A snapshot of that name
// virtfleet did not take of the guest is none of the guest's: it is left
// alone.
func (d *Driver) DeleteSnapshot(_ context.Context, uid, id string) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	dom, err := d.domainOf(api, uid)
	if driver.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	s, found, err := snapshot(api, dom, uid, id)
	switch {
	case driver.IsNotFound(err):
		return nil
	case err != nil:
		return err
	case !found || !s.ours:
		return nil
	}
	return deleteSnapshot(api, s.handle)
}

// RevertSnapshot implements driver.Snapshotter.
//
// A revert replaces the domain's definitions (the next one, and the
// running one when it runs) with those the snapshot keeps, virtfleet's
// metadata in them included: what the driver recorded since (the restart
// and reset nonces handled, the restarts counted, who owns the guest) is
// read before and written back after, so that no nonce is acted on again
// and no restart counted again. The spec hash alone comes with the
// snapshot: it says what shape the definition it is in has, and the shape
// is the snapshot's now, which the next Ensure changes as the Machine
// says.
func (d *Driver) RevertSnapshot(_ context.Context, uid string, r driver.RevertRequest) error {
	id, running := r.Snapshot, r.Running
	api, _, err := d.api()
	if err != nil {
		return err
	}
	dom, err := d.domainOf(api, uid)
	if err != nil {
		return err
	}
	s, found, err := snapshot(api, dom, uid, id)
	if err != nil {
		return err
	}
	if !found || !s.taken() {
		return driver.Terminalf("guest %s has no snapshot %s", uid, id)
	}
	kept, err := d.guestRecord(api, dom, uid)
	if err != nil {
		return err
	}
	if r.Restore != "" && kept.owner.LastRestore == r.Restore {
		return nil
	}
	resume := running && s.record.Memory && s.holdsMemory()
	var flags golibvirt.DomainSnapshotRevertFlags
	switch {
	case resume:
		flags = golibvirt.DomainSnapshotRevertRunning
	case s.holdsMemory():
		// Memory the snapshot holds and is not to run (a disk-only
		// snapshot of a running guest, see above, or a stop asked
		// for): its guest is brought back paused, never running a
		// single instruction, and powered off below, which leaves the
		// disks as the snapshot has them for a cold boot.
		flags = golibvirt.DomainSnapshotRevertPaused
	}
	err = api.DomainRevertToSnapshot(s.handle, uint32(flags))
	if err == nil {
		// The revert brought back the snapshot's record, which the
		// record kept replaces at once: a crash in between is the one
		// moment a named revert could be made twice.
		kept.owner.LastRestore = cmp.Or(r.Restore, kept.owner.LastRestore)
	}
	switch {
	case isCode(err, golibvirt.ErrNoDomain):
		return driver.NotFoundf("no domain with uuid %s", uid)
	case isCode(err, golibvirt.ErrNoDomainSnapshot):
		return driver.Terminalf("guest %s has no snapshot %s", uid, id)
	case err != nil:
		// The definitions may have come back already: they get their
		// record either way.
		err = errors.Wrapf(err, "cannot revert guest %s to snapshot %s", uid, id)
	case !resume:
		err = d.forceOff(api, dom)
	}
	d.reverted(uid)
	return errors.Join(err, d.restoreRecord(api, dom, kept))
}

// guestRecord is what the driver recorded of a guest in its domain's
// metadata.
type guestRecord struct {
	owner ownership
	// reset is the last reset nonce handled.
	reset string
}

// guestRecord reads what the driver recorded of the guest uid in dom: the
// ownership of its next definition, and the reset record of the one it
// runs (or starts) with.
func (d *Driver) guestRecord(api API, dom golibvirt.Domain, uid string) (guestRecord, error) {
	next, err := d.describe(api, dom, uid, golibvirt.DomainXMLInactive)
	if err != nil {
		return guestRecord{}, err
	}
	_, x, err := d.describeXML(api, dom, uid, 0)
	if err != nil {
		return guestRecord{}, err
	}
	reset, err := resetOf(x)
	return guestRecord{owner: *next.owner, reset: reset}, err
}

// restoreRecord writes kept back into dom's definitions, as a revert left
// them: the next one, and the running one if it runs.
func (d *Driver) restoreRecord(api API, dom golibvirt.Domain, kept guestRecord) error {
	state, _, err := api.DomainGetState(dom, 0)
	if err != nil {
		return errors.Wrap(err, "cannot read domain state")
	}
	x, err := d.restoreOwnership(api, dom, kept.owner, golibvirt.DomainXMLInactive, golibvirt.DomainAffectConfig)
	if err != nil {
		return err
	}
	if active(golibvirt.DomainState(state)) {
		if x, err = d.restoreOwnership(api, dom, kept.owner, 0, golibvirt.DomainAffectLive); err != nil {
			return err
		}
	}
	// x is the definition recordReset writes to: the running one, or
	// the next when the guest is off.
	reset, err := resetOf(x)
	if err != nil || reset == kept.reset {
		return err
	}
	return recordReset(api, dom, kept.reset)
}

// restoreOwnership writes kept, with the spec hash the definition has,
// into dom's definition which (impact), and returns that definition as it
// was read.
func (d *Driver) restoreOwnership(api API, dom golibvirt.Domain, kept ownership, which golibvirt.DomainXMLFlags, impact golibvirt.DomainModificationImpact) (string, error) {
	x, err := api.DomainGetXMLDesc(dom, which)
	if err != nil {
		return "", errors.Wrap(err, "cannot read domain XML")
	}
	info, err := parseDomain(x)
	if err != nil {
		return "", err
	}
	want := kept
	// A definition without virtfleet's metadata has an unknown shape: an
	// empty hash has the next Ensure define it anew.
	want.SpecHash = ""
	if info.owner != nil {
		want.SpecHash = info.owner.SpecHash
		if *info.owner == want {
			return x, nil
		}
	}
	return x, d.setOwnership(api, dom, want, impact)
}

// reverted forgets what the driver kept in memory of the guest uid's run
// before a revert. It was not rebooted: the reboots and crashes seen
// before it still count. A shutdown asked of it before was asked of
// another run, and is asked again if it is still wanted. Its addresses
// are the snapshot's run's. When this run began is unknown (the snapshot's
// run began before it was taken), so no lease is too old for it.
func (d *Driver) reverted(uid string) {
	d.clearShutdown(uid)
	d.addresses.forget(uid)
	d.stateMu.Lock()
	delete(d.startedAt, uid)
	d.stateMu.Unlock()
}
