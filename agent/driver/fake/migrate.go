package fake

import (
	"context"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.Migrator = (*Driver)(nil)

// Reach lets d migrate guests to the driver to, at uri (a
// MigrationTarget.URI), as the hypervisors of one fleet reach each other.
func (d *Driver) Reach(uri string, to *Driver) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reach == nil {
		d.reach = map[string]*Driver{}
	}
	d.reach[uri] = to
}

// Prepared says whether PrepareIncoming made the node ready for uid and
// nothing deleted it since.
func (d *Driver) Prepared(uid string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.incoming[uid]
	return ok
}

// PrepareIncoming implements driver.Migrator: it records the machine, which
// Delete forgets.
func (d *Driver) PrepareIncoming(_ context.Context, m driver.Machine) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(Call{Op: "PrepareIncoming", UID: m.UID, Machine: m}, new(error)); err != nil {
		return err
	}
	if d.incoming == nil {
		d.incoming = map[string]driver.Machine{}
	}
	d.incoming[m.UID] = m
	return nil
}

// Migrate implements driver.Migrator in two steps: the first call of an ID
// starts the migration (Running), the next one moves the guest to the
// driver Reach gave for t.URI, which must be prepared for it. Fail("Migrate",
// uid, err) makes the migration fail with err's message instead, leaving the
// guest here.
func (d *Driver) Migrate(_ context.Context, m driver.Machine, t driver.MigrationTarget) (driver.MigrationStatus, error) {
	d.mu.Lock()
	st, g, over, err := d.begin("Migrate", m, t.ID, t.Cancel)
	to := d.reach[t.URI]
	d.mu.Unlock()
	if over {
		return st, err
	}

	arrived := to != nil && to.receive(m.UID, g)
	d.mu.Lock()
	defer d.mu.Unlock()
	st.FinishedAt = time.Now()
	if !arrived {
		st.Phase, st.Message = driver.MigrationFailed, "cannot reach "+t.URI+" or it is not ready for the guest"
	} else {
		delete(d.guests, m.UID)
		st.Phase, st.ProcessedBytes, st.Downtime = driver.MigrationSucceeded, st.TotalBytes, time.Millisecond
	}
	d.migrations[m.UID] = st
	return st, nil
}

// begin is what Migrate and MigrateHost (op) do before the move itself,
// with d.mu held: the call is recorded (Fail of op fails the migration), a
// final status kept for id is returned as it is, a cancel ends the
// migration, the guest is checked, and the first call of id starts the
// migration. over says the caller returns st and err as they are;
// otherwise g is the guest to move and st its running migration.
func (d *Driver) begin(op string, m driver.Machine, id string, cancel bool) (st driver.MigrationStatus, g *guest, over bool, err error) {
	if err := d.take(Call{Op: op, UID: m.UID, Machine: m}, new(error)); err != nil {
		return driver.MigrationStatus{ID: id, Phase: driver.MigrationFailed, Message: err.Error()}, nil, true, nil
	}
	if d.migrations == nil {
		d.migrations = map[string]driver.MigrationStatus{}
	}
	st, started := d.migrations[m.UID]
	if started && st.ID == id && st.Phase != driver.MigrationRunning {
		return st, nil, true, nil
	}
	if cancel {
		st = driver.MigrationStatus{ID: id, Phase: driver.MigrationFailed, FinishedAt: time.Now(), Message: "cancelled"}
		d.migrations[m.UID] = st
		return st, nil, true, nil
	}
	g, here := d.guests[m.UID]
	switch {
	case !here:
		return driver.MigrationStatus{}, nil, true, driver.NotFoundf("guest %s not found", m.UID)
	case g.obs.Phase != driver.PhaseRunning:
		return driver.MigrationStatus{}, nil, true, driver.Terminalf("guest %s is %s, not Running", m.UID, g.obs.Phase)
	case !started || st.ID != id:
		st = driver.MigrationStatus{ID: id, Phase: driver.MigrationRunning, StartedAt: time.Now(), TotalBytes: m.MemoryBytes}
		d.migrations[m.UID] = st
		return st, nil, true, nil
	}
	return st, g, false, nil
}

// receive takes guest g of uid in, if the node was prepared for it, and
// says so on Events.
func (d *Driver) receive(uid string, g *guest) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.incoming[uid]; !ok {
		return false
	}
	moved := *g
	moved.obs.Node = d.Node
	d.guests[uid] = &moved
	delete(d.incoming, uid)
	select {
	case d.events <- driver.Event{UID: uid}:
	default:
	}
	return true
}

var _ driver.HostMigrator = (*Driver)(nil)

// MigrateHost implements driver.HostMigrator in two steps, as Migrate does:
// the first call of an id starts the move, the next one puts the guest on
// host (or on "<node>-other" when host is empty). Fail("MigrateHost", uid,
// err) makes it fail with err's message instead.
func (d *Driver) MigrateHost(_ context.Context, m driver.Machine, id, host string) (driver.MigrationStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, g, over, err := d.begin("MigrateHost", m, id, false)
	if over {
		return st, err
	}
	if host == "" {
		host = d.Node + "-other"
	}
	g.obs.Node = host
	st.Phase, st.FinishedAt, st.ProcessedBytes, st.Downtime = driver.MigrationSucceeded, time.Now(), st.TotalBytes, time.Millisecond
	d.migrations[m.UID] = st
	return st, nil
}
