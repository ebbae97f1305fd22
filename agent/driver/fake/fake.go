// Package fake is an in-memory driver.Driver that records its calls and can be
// told to fail the next call of an operation, or every call of an operation
// for one guest, for the reconciler's tests.
package fake

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"sync"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Call is one recorded call.
type Call struct {
	// Op is the method name: Ensure, Delete, Observe, List, Capacity,
	// DeleteVolume, ObserveVolume, TakeSnapshot, Snapshots, DeleteSnapshot,
	// RevertSnapshot, ...
	Op string
	// UID is the guest the call was about; empty for List and Capacity.
	UID string
	// Machine is Ensure's argument.
	Machine driver.Machine
	// Disk is DeleteVolume's and ObserveVolume's argument.
	Disk driver.Disk
	// Snapshot is TakeSnapshot's argument; DeleteSnapshot and
	// RevertSnapshot set its ID.
	Snapshot driver.SnapshotRequest
	// Running is RevertSnapshot's running.
	Running bool
}

// Driver is a recording in-memory driver. Guests become Running, Paused or
// Stopped at once. Set a Next<Op>Err field to make the next call of that operation
// return the error (it is then cleared); Fail makes every call of an
// operation about one guest fail until it is cleared. A failed call is still
// recorded, so Attempts counts it.
type Driver struct {
	// Node is reported in every Observation.
	Node string
	// Host is what Capacity reports as the host's; allocations are
	// computed from the guests.
	Host driver.Capacity

	// Tunnel is what TunnelAddress reports; invalid by default.
	Tunnel netip.Addr

	// Unrecorded keeps no calls: a simulated node (agent/simnodes) runs
	// for hours, and a record of every call would grow without end.
	// Calls and Attempts then see nothing.
	Unrecorded bool

	mu sync.Mutex
	// peers are what SetPeers was last given.
	peers []netip.Addr

	NextEnsureErr   error
	NextDeleteErr   error
	NextObserveErr  error
	NextListErr     error
	NextCapacityErr error
	// NextDeleteVolumeErr fails the next DeleteVolume.
	NextDeleteVolumeErr error
	// NextImagesErr fails the next Images.
	NextImagesErr error
	// NextTakeSnapshotErr, NextSnapshotsErr, NextDeleteSnapshotErr and
	// NextRevertSnapshotErr fail the next call of the Snapshotter's
	// methods.
	NextTakeSnapshotErr, NextSnapshotsErr, NextDeleteSnapshotErr, NextRevertSnapshotErr error
	// NextBackUpErr and NextCommitBackupErr fail the next call of the
	// Backuper's methods.
	NextBackUpErr, NextCommitBackupErr error

	calls []Call
	// failures are Fail's errors, by operation and uid.
	failures map[failure]error
	guests   map[string]*guest
	// consoles are the guests' consoles a session holds (console.go).
	consoles map[console]bool
	// orphans are released guests, by the uid they were released under;
	// foreign are guests virtfleet never made, by their ID.
	orphans map[string]*guest
	foreign map[string]*guest
	// volumes are the volumes AddVolume put on the node, by name.
	volumes map[string]driver.VolumeObservation
	// capacities are the sizes the guests' disks were grown to, by name.
	capacities map[string]int64
	// images are what Images reports, as SetImage left them; imagesCalls
	// counts Images calls, which are not in calls: the reconciler polls
	// them on a timer, and tests counting calls must not see that.
	images      map[string]driver.ImageStatus
	imagesCalls int
	events      chan driver.Event
	closeOne    sync.Once

	// reach are the drivers guests migrate to, by URI (Reach); incoming
	// the machines PrepareIncoming was given, by uid; migrations the last
	// migration of each guest, by uid.
	reach      map[string]*Driver
	incoming   map[string]driver.Machine
	migrations map[string]driver.MigrationStatus
	// snapshots are the guests' snapshots, oldest first, by guest uid
	// (snapshot.go); they go with the guest's Delete.
	snapshots map[string][]snapshot
}

type guest struct {
	// machine is the last Machine ensured; applied the one the guest was
	// last started with.
	machine   driver.Machine
	applied   driver.Machine
	obs       driver.Observation
	lastNonce string
	// lastReset is the last reset nonce handled.
	lastReset string
	// lastRestore is the last named revert made.
	lastRestore string
	// root is the guest's root disk, made on first use, and checkpoints
	// the backups' checkpoints of it, oldest first (backup.go).
	root        *disk
	checkpoints []*checkpoint
}

type failure struct{ op, uid string }

var (
	_ driver.Driver         = (*Driver)(nil)
	_ driver.Adopter        = (*Driver)(nil)
	_ driver.VolumeImporter = (*Driver)(nil)
)

// New returns an empty fake driver for node.
func New(node string) *Driver {
	return &Driver{
		Node:       node,
		Host:       driver.Capacity{VCPU: 16, MemoryBytes: 64 << 30},
		failures:   map[failure]error{},
		guests:     map[string]*guest{},
		orphans:    map[string]*guest{},
		foreign:    map[string]*guest{},
		volumes:    map[string]driver.VolumeObservation{},
		capacities: map[string]int64{},
		images:     map[string]driver.ImageStatus{},
		events:     make(chan driver.Event, 64),
	}
}

// Calls returns the calls recorded so far, oldest first.
func (d *Driver) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Call(nil), d.calls...)
}

// Emit sends a hint on the Events channel, as a backend would.
func (d *Driver) Emit(e driver.Event) {
	d.events <- e
}

// SetPhase overrides a guest's phase, e.g. to simulate a crash.
func (d *Driver) SetPhase(uid string, p driver.Phase) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g, ok := d.guests[uid]; ok {
		g.obs.Phase = p
	}
}

// SetInterfaces overrides a guest's interfaces without a hint, as an
// address a guest takes over DHCP comes on a real backend.
func (d *Driver) SetInterfaces(uid string, ifs []driver.Interface) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g, ok := d.guests[uid]; ok {
		g.obs.Interfaces = ifs
	}
}

// Fail makes every call of op (Ensure, Delete, Observe, TakeSnapshot, ...:
// the operations about one guest) for guest uid return err, until Fail is called again with
// a nil err. A Next<Op>Err hook, when set, takes precedence once.
func (d *Driver) Fail(op, uid string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.failures, failure{op, uid})
		return
	}
	d.failures[failure{op, uid}] = err
}

// Attempts counts the calls of op for guest uid so far, failed ones included.
func (d *Driver) Attempts(op, uid string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.calls {
		if c.Op == op && c.UID == uid {
			n++
		}
	}
	return n
}

// record keeps c, unless the driver is Unrecorded.
func (d *Driver) record(c Call) {
	if !d.Unrecorded {
		d.calls = append(d.calls, c)
	}
}

// take records a call and returns the error it must fail with: the one-shot
// hook for its op, which it clears, else the guest's persistent one.
func (d *Driver) take(c Call, next *error) error {
	d.record(c)
	if err := *next; err != nil {
		*next = nil
		return err
	}
	if c.UID == "" {
		return nil
	}
	return d.failures[failure{c.Op, c.UID}]
}

// Ensure implements driver.Driver. Like a real backend it applies a new
// shape to a running guest only at its next start or restart (a reset
// restarts the guest in place, on its old shape), and reports
// RestartRequired until then. A restart and a reset asked for at once are
// one restart.
func (d *Driver) Ensure(_ context.Context, m driver.Machine) (driver.Observation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "Ensure", UID: m.UID, Machine: m}, &d.NextEnsureErr); err != nil {
		return driver.Observation{}, err
	}
	if err := m.Validate(); err != nil {
		return driver.Observation{}, err
	}
	g, ok := d.guests[m.UID]
	if !ok {
		g = &guest{lastNonce: m.RestartNonce, lastReset: m.ResetNonce, obs: driver.Observation{UID: m.UID, ID: m.UID, Node: d.Node}}
		d.guests[m.UID] = g
	}
	g.obs.VCPU, g.obs.MemoryBytes = m.VCPU, m.MemoryBytes
	if g.applied.VCPU != 0 {
		g.obs.VCPU, g.obs.MemoryBytes = g.applied.VCPU, g.applied.MemoryBytes
	}
	running := g.obs.Phase == driver.PhaseRunning || g.obs.Phase == driver.PhasePaused
	switch {
	case !m.Running:
		g.obs.Phase, g.obs.Interfaces = driver.PhaseStopped, nil
	case !running:
		g.obs.Phase, g.applied = driver.PhaseRunning, m
		g.obs.VCPU, g.obs.MemoryBytes = m.VCPU, m.MemoryBytes
		g.obs.Interfaces = interfacesOf(m)
	case m.RestartNonce != "" && m.RestartNonce != g.lastNonce:
		g.obs.RestartCount++
		g.applied = m
	case m.ResetNonce != "" && m.ResetNonce != g.lastReset:
		g.obs.RestartCount++
	}
	g.lastNonce, g.lastReset = m.RestartNonce, m.ResetNonce
	if m.Running {
		g.obs.Phase = driver.PhaseRunning
		if m.Paused {
			g.obs.Phase = driver.PhasePaused
		}
	}
	g.machine = m
	d.grow(m)
	g.obs.RestartRequired = g.obs.Phase != driver.PhaseStopped && !sameShape(g.applied, m)
	// Like libvirt's test driver, the fake plugs no disk in or out of a
	// running guest: it has the disks it started with, and a disk removed
	// since stays until its next start.
	has := m
	if g.obs.Phase != driver.PhaseStopped {
		has = g.applied
	}
	g.obs.Disks = nil
	for _, disk := range has.Disks {
		g.obs.Disks = append(g.obs.Disks, disk.Name)
	}
	return g.obs, nil
}

// interfacesOf are the interfaces a guest started as m has on the networks
// where the hub allocated it an address, each holding that address, as a
// real backend's DHCP reservation hands it out. The fake reports no
// interface on a network without one (an imported network): it has no
// DHCP server that could give one, and an addressless interface would only
// have the reconciler look for an address that never comes.
func interfacesOf(m driver.Machine) []driver.Interface {
	var out []driver.Interface
	for i, n := range m.Networks {
		if n.Address.IsValid() {
			out = append(out, driver.Interface{Network: n.Name, MAC: macOf(m.UID, i), IPs: []string{n.Address.Addr().String()}, Source: driver.AddressSourceBackend})
		}
	}
	return out
}

// macOf is the MAC of interface i of guest uid: locally administered, and
// the same every time the guest starts.
func macOf(uid string, i int) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(uid))
	v := h.Sum32()
	return fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", byte(v>>24), byte(v>>16), byte(v>>8), byte(v)+byte(i))
}

// sameShape compares what a guest is made of, not how it is asked to run
// nor which VM owns it.
func sameShape(a, b driver.Machine) bool {
	return reflect.DeepEqual(shapeOf(a), shapeOf(b))
}

// shapeOf is m without how it is asked to run nor which VM owns it, and
// without its disks' sizes, which Ensure grows live.
func shapeOf(m driver.Machine) driver.Machine {
	m.Running, m.Paused, m.RestartNonce, m.ResetNonce, m.Generation, m.UID = false, false, "", "", 0, ""
	m.Disks = slices.Clone(m.Disks)
	for i := range m.Disks {
		m.Disks[i].SizeBytes = 0
	}
	return m
}

// grow grows the fake's volumes of m's disks to their sizes, live, as the
// contract asks; it never shrinks one nor resizes an imported one.
func (d *Driver) grow(m driver.Machine) {
	for _, disk := range m.Disks {
		if !disk.Imported {
			d.capacities[disk.Name] = max(d.capacities[disk.Name], disk.SizeBytes)
		}
	}
}

// DiskCapacity is the size of the volume name as the fake's guests' Ensures
// left it: the largest size asked of it.
func (d *Driver) DiskCapacity(name string) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.capacities[name]
}

// AddForeign puts a guest virtfleet never made on the node, running with
// the given shape, under the backend id id: what Claim and ObserveRef find
// by external name.
func (d *Driver) AddForeign(id string, vcpu int32, memoryBytes int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := driver.Machine{VCPU: vcpu, MemoryBytes: memoryBytes}
	d.foreign[id] = &guest{machine: m, applied: m, obs: driver.Observation{ID: id, Phase: driver.PhaseRunning, Node: d.Node, VCPU: vcpu, MemoryBytes: memoryBytes}}
}

// TunnelAddress implements driver.Overlay.
func (d *Driver) TunnelAddress() netip.Addr { return d.Tunnel }

// SetPeers implements driver.Overlay.
func (d *Driver) SetPeers(_ context.Context, peers []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.peers = slices.Clone(peers)
	return nil
}

// Peers is what SetPeers was last given.
func (d *Driver) Peers() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.peers)
}

// Release implements driver.Adopter.
func (d *Driver) Release(_ context.Context, uid, seal string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record(Call{Op: "Release", UID: uid})
	g, ok := d.guests[uid]
	if !ok {
		return nil
	}
	delete(d.guests, uid)
	g.obs.OrphanOf = &driver.VMRef{Namespace: g.machine.Namespace, Name: g.machine.Name, Seal: seal}
	d.orphans[uid] = g
	return nil
}

// Orphans implements driver.Adopter.
func (d *Driver) Orphans(_ context.Context) ([]driver.Observation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]driver.Observation, 0, len(d.orphans))
	for _, g := range d.orphans {
		out = append(out, g.obs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out, nil
}

// find is the guest ref names: the map holding it and its key there.
func (d *Driver) find(ref driver.Ref) (map[string]*guest, string, bool) {
	if ref.Orphan != "" {
		_, ok := d.orphans[ref.Orphan]
		return d.orphans, ref.Orphan, ok
	}
	for _, m := range []map[string]*guest{d.guests, d.orphans, d.foreign} {
		for k, g := range m {
			if g.obs.ID == ref.ExternalName {
				return m, k, true
			}
		}
	}
	return nil, "", false
}

// Claim implements driver.Adopter.
func (d *Driver) Claim(_ context.Context, m driver.Machine, ref driver.Ref) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record(Call{Op: "Claim", UID: m.UID, Machine: m})
	if _, ok := d.guests[m.UID]; ok {
		return nil
	}
	from, k, ok := d.find(ref)
	switch {
	case !ok:
		return driver.NotFoundf("no guest %s on node %s", ref, d.Node)
	case reflect.ValueOf(from).Pointer() == reflect.ValueOf(d.guests).Pointer():
		owner := d.guests[k].machine
		return driver.Terminalf("guest %s is managed by VirtualMachine %s/%s", ref, owner.Namespace, owner.Name)
	}
	g := from[k]
	delete(from, k)
	g.obs.UID, g.obs.OrphanOf = m.UID, nil
	g.machine.UID, g.machine.Namespace, g.machine.Name = m.UID, m.Namespace, m.Name
	g.lastNonce, g.lastReset = m.RestartNonce, m.ResetNonce
	d.guests[m.UID] = g
	return nil
}

// ObserveRef implements driver.Adopter.
func (d *Driver) ObserveRef(_ context.Context, ref driver.Ref) (driver.Observation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record(Call{Op: "ObserveRef"})
	from, k, ok := d.find(ref)
	if !ok {
		return driver.Observation{}, driver.NotFoundf("no guest %s on node %s", ref, d.Node)
	}
	return from[k].obs, nil
}

// Delete implements driver.Driver.
func (d *Driver) Delete(_ context.Context, uid string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "Delete", UID: uid}, &d.NextDeleteErr); err != nil {
		return err
	}
	delete(d.guests, uid)
	delete(d.incoming, uid)
	delete(d.snapshots, uid)
	return nil
}

// Observe implements driver.Driver.
func (d *Driver) Observe(_ context.Context, uid string) (driver.Observation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "Observe", UID: uid}, &d.NextObserveErr); err != nil {
		return driver.Observation{}, err
	}
	g, ok := d.guests[uid]
	if !ok {
		return driver.Observation{}, driver.NotFoundf("guest %s not found", uid)
	}
	return g.obs, nil
}

// List implements driver.Driver.
func (d *Driver) List(_ context.Context) ([]driver.Observation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "List"}, &d.NextListErr); err != nil {
		return nil, err
	}
	out := make([]driver.Observation, 0, len(d.guests))
	for _, g := range d.guests {
		out = append(out, g.obs)
	}
	return out, nil
}

// DeleteVolume implements driver.Driver. Volumes exist in the fake as the
// disks of its guests and as AddVolume's: it refuses a volume a guest has,
// and otherwise succeeds.
func (d *Driver) DeleteVolume(_ context.Context, disk driver.Disk) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "DeleteVolume", Disk: disk}, &d.NextDeleteVolumeErr); err != nil {
		return err
	}
	for uid, g := range d.guests {
		for _, gd := range g.machine.Disks {
			if gd.Name == disk.Name && gd.Pool == disk.Pool {
				return driver.InUsef("volume %s is attached to guest %s", disk.Name, uid)
			}
		}
	}
	delete(d.volumes, disk.Name)
	return nil
}

// AddVolume puts a volume on the node, as made outside virtfleet: what
// ObserveVolume finds.
func (d *Driver) AddVolume(name string, o driver.VolumeObservation) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.volumes[name] = o
}

// ObserveVolume implements driver.VolumeImporter: it finds AddVolume's
// volumes.
func (d *Driver) ObserveVolume(_ context.Context, disk driver.Disk) (driver.VolumeObservation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record(Call{Op: "ObserveVolume", Disk: disk})
	o, ok := d.volumes[disk.Name]
	if !ok {
		return o, driver.NotFoundf("no volume %s on node %s", disk.Name, d.Node)
	}
	return o, nil
}

// Events implements driver.Driver.
func (d *Driver) Events() <-chan driver.Event { return d.events }

// Capacity implements driver.Driver.
func (d *Driver) Capacity(_ context.Context) (driver.Capacity, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "Capacity"}, &d.NextCapacityErr); err != nil {
		return driver.Capacity{}, err
	}
	c := d.Host
	for _, g := range d.guests {
		c.AllocatedVCPU += int64(g.machine.VCPU)
		c.AllocatedMemoryBytes += g.machine.MemoryBytes
	}
	return c, nil
}

// SetImage makes Images report st, as a backend importing or holding the
// image would.
func (d *Driver) SetImage(st driver.ImageStatus) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.images[st.UID] = st
}

// RemoveImage makes Images stop reporting image uid, as after a prune.
func (d *Driver) RemoveImage(uid string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.images, uid)
}

// ImagesCalls counts the calls of Images so far.
func (d *Driver) ImagesCalls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.imagesCalls
}

// Images implements driver.Driver: the images SetImage set, by uid.
func (d *Driver) Images(_ context.Context) ([]driver.ImageStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.imagesCalls++
	if err := d.NextImagesErr; err != nil {
		d.NextImagesErr = nil
		return nil, err
	}
	out := make([]driver.ImageStatus, 0, len(d.images))
	for _, st := range d.images {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out, nil
}

// Close implements driver.Driver.
func (d *Driver) Close() error {
	d.closeOne.Do(func() { close(d.events) })
	return nil
}
