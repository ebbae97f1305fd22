package fake

import (
	"context"
	"slices"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.Snapshotter = (*Driver)(nil)

// snapshotDuration is how long the fake takes to take a snapshot, as
// Snapshot.Duration says: a fixed figure, so a test can pin what the
// agent reports of it.
const snapshotDuration = 3 * time.Millisecond

// snapshot is one snapshot of a guest with what the fake needs to revert to
// it: the guest as it was then, and the shape it was running with.
type snapshot struct {
	driver.Snapshot
	obs     driver.Observation
	applied driver.Machine
}

// TakeSnapshot implements driver.Snapshotter. Every guest of the fake has a
// guest agent that answers, so a running guest's snapshot without memory
// is Frozen. A snapshot ID another guest of the node has is refused as
// Terminal: IDs are unique on the node.
func (d *Driver) TakeSnapshot(_ context.Context, uid string, r driver.SnapshotRequest) (driver.Snapshot, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "TakeSnapshot", UID: uid, Snapshot: r}, &d.NextTakeSnapshotErr); err != nil {
		return driver.Snapshot{}, err
	}
	g, ok := d.guests[uid]
	if !ok {
		return driver.Snapshot{}, driver.NotFoundf("guest %s not found", uid)
	}
	for owner, snaps := range d.snapshots {
		i := slices.IndexFunc(snaps, func(s snapshot) bool { return s.ID == r.ID })
		switch {
		case i < 0:
		case owner == uid:
			return snaps[i].Snapshot, nil
		default:
			return driver.Snapshot{}, driver.Terminalf("snapshot %s is guest %s's, not guest %s's", r.ID, owner, uid)
		}
	}
	online := g.obs.Phase == driver.PhaseRunning || g.obs.Phase == driver.PhasePaused
	s := snapshot{
		Snapshot: driver.Snapshot{
			ID: r.ID, CreatedAt: time.Now(), Duration: snapshotDuration,
			Online: online, Memory: online && r.Memory, Frozen: online && !r.Memory,
		},
		obs: g.obs, applied: g.applied,
	}
	for _, disk := range g.machine.Disks {
		s.SizeBytes += disk.SizeBytes
	}
	if s.Memory {
		s.SizeBytes += g.applied.MemoryBytes
	}
	if d.snapshots == nil {
		d.snapshots = map[string][]snapshot{}
	}
	d.snapshots[uid] = append(d.snapshots[uid], s)
	return s.Snapshot, nil
}

// Snapshots implements driver.Snapshotter.
func (d *Driver) Snapshots(_ context.Context, uid string) ([]driver.Snapshot, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "Snapshots", UID: uid}, &d.NextSnapshotsErr); err != nil {
		return nil, err
	}
	if _, ok := d.guests[uid]; !ok {
		return nil, nil
	}
	out := make([]driver.Snapshot, 0, len(d.snapshots[uid]))
	for _, s := range d.snapshots[uid] {
		out = append(out, s.Snapshot)
	}
	return out, nil
}

// DeleteSnapshot implements driver.Snapshotter.
func (d *Driver) DeleteSnapshot(_ context.Context, uid, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "DeleteSnapshot", UID: uid, Snapshot: driver.SnapshotRequest{ID: id}}, &d.NextDeleteSnapshotErr); err != nil {
		return err
	}
	switch left := slices.DeleteFunc(d.snapshots[uid], func(s snapshot) bool { return s.ID == id }); {
	case len(left) == 0:
		delete(d.snapshots, uid)
	default:
		d.snapshots[uid] = left
	}
	return nil
}

// RevertSnapshot implements driver.Snapshotter. A guest reverted to a
// snapshot with memory, with running set, runs on from the snapshot's
// moment in the same boot: its RestartCount is not counted up, and its
// shape is the one it ran with then. Any other revert leaves it Stopped.
// The nonces it handled are kept, so the next Ensure replays none, and a
// named revert it made last is not made again.
func (d *Driver) RevertSnapshot(_ context.Context, uid string, r driver.RevertRequest) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	id, running := r.Snapshot, r.Running
	if err := d.take(Call{Op: "RevertSnapshot", UID: uid, Snapshot: driver.SnapshotRequest{ID: id}, Running: running}, &d.NextRevertSnapshotErr); err != nil {
		return err
	}
	g, ok := d.guests[uid]
	if !ok {
		return driver.NotFoundf("guest %s not found", uid)
	}
	if r.Restore != "" && r.Restore == g.lastRestore {
		return nil
	}
	i := slices.IndexFunc(d.snapshots[uid], func(s snapshot) bool { return s.ID == id })
	if i < 0 {
		return driver.Terminalf("guest %s has no snapshot %s", uid, id)
	}
	s := d.snapshots[uid][i]
	g.lastRestore = r.Restore
	if s.Memory && running {
		g.obs.Phase, g.obs.Interfaces = driver.PhaseRunning, slices.Clone(s.obs.Interfaces)
		g.obs.VCPU, g.obs.MemoryBytes = s.obs.VCPU, s.obs.MemoryBytes
		g.applied = s.applied
		g.obs.RestartRequired = !sameShape(g.applied, g.machine)
		return nil
	}
	g.obs.Phase, g.obs.Interfaces, g.obs.RestartRequired = driver.PhaseStopped, nil, false
	return nil
}
