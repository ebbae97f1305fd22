package nova

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/instanceactions"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/migrations"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// MetaMigration records, before the driver asks Nova for a live migration,
// which migration it is: "<id> <after> <host>", the migration's id, the
// newest live migration record of the server before it (0 for none, -1
// where Nova hides the records from the user) and the host the server
// left. An agent that restarts mid-way finds its migration from it, and
// never asks Nova again for one Nova took.
const MetaMigration = "virtfleet-migration"

// detailsMicroversion is the first compute microversion whose instance
// action events tell why they failed (details).
const detailsMicroversion = "2.84"

// Nova's live migration record statuses that end a migration.
var (
	migrationDone   = map[string]bool{"completed": true}
	migrationFailed = map[string]bool{"error": true, "failed": true, "cancelled": true}
)

var _ driver.HostMigrator = (*Driver)(nil)

// hostMigration is what the driver keeps of the last live migration of a
// guest.
type hostMigration struct {
	id string
	// asked is set once Nova accepted the request in this process.
	asked   bool
	started time.Time
	// total and processed are the bytes Nova last reported.
	total, processed int64
	// final is the status once Succeeded or Failed.
	final *driver.MigrationStatus
}

// migrationRecord is MetaMigration's value.
type migrationRecord struct {
	id     string
	after  int64
	source string
}

func (r migrationRecord) String() string {
	return fmt.Sprintf("%s %d %s", r.id, r.after, r.source)
}

func parseMigrationRecord(v string) (migrationRecord, bool) {
	parts := strings.SplitN(v, " ", 3)
	if len(parts) != 3 {
		return migrationRecord{}, false
	}
	after, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || parts[0] == "" {
		return migrationRecord{}, false
	}
	return migrationRecord{id: parts[0], after: after, source: parts[2]}, true
}

// liveMigrateOpts is the os-migrateLive action as microversion 2.25 and
// later take it. block_migration "auto" lets Nova copy a server's local
// disks only where they are not on shared storage (a server booted from a
// volume has none); gophercloud's LiveMigrateOpts can only say true or
// false. No force: a host asked for still passes the scheduler's checks.
type liveMigrateOpts struct{ host string }

func (o liveMigrateOpts) ToLiveMigrateMap() (map[string]any, error) {
	var host any // null: the scheduler chooses
	if o.host != "" {
		host = o.host
	}
	return map[string]any{"os-migrateLive": map[string]any{"host": host, "block_migration": "auto"}}, nil
}

// MigrateHost implements driver.HostMigrator with Nova's live migration
// (os-migrateLive, compute microversion Microversion, whose pre-checks
// run after Nova answered: a host that does not fit fails the migration,
// not the call).
//
// The first call of an id records the migration in the server's metadata
// (MetaMigration) and asks Nova, which moves the server to host, or to the
// host its scheduler chooses when host is empty; it returns Running at
// once. Later calls read the server, its migration record (os-migrations)
// and, while it runs, its progress (the server's in-progress migrations:
// memory and disk bytes): Succeeded once Nova completed it and the server
// is ACTIVE again (on its new host, which Observe then reports: the server
// read here goes into the view, and no listing older than that read
// replaces it), Failed when Nova ended it in error or the server went
// ERROR, with Nova's reason (the instance action's event details, which
// Nova gives from microversion 2.84). Where Nova hides the migration
// records from the user, a server ACTIVE on another host than it left has
// Succeeded and one back where it was has Failed. Nova does not tell the
// switch-over's downtime: it stays 0.
//
// A final status is kept in memory, one per guest (its last migration),
// until the guest is deleted or released; an agent that restarted finds
// its migration again from MetaMigration and Nova's records, and asks Nova
// again only for a migration Nova has no record of.
//
// A guest with no server returns a NotFound error; a server that is not
// ACTIVE, one already on host, a host Nova refuses (400) or a user Nova's
// policy does not let migrate (403) a Terminal one with Nova's message. A
// server busy with another task returns a transient error.
func (d *Driver) MigrateHost(ctx context.Context, m driver.Machine, id, host string) (driver.MigrationStatus, error) {
	switch {
	case m.UID == "":
		return driver.MigrationStatus{}, driver.Terminalf("uid is required")
	case id == "" || strings.ContainsAny(id, " \t\n"):
		return driver.MigrationStatus{}, driver.Terminalf("a migration id must be non-empty and without spaces, got %q", id)
	case len(migrationRecord{id: id, after: -1, source: strings.Repeat("h", 64)}.String()) > 255:
		return driver.MigrationStatus{}, driver.Terminalf("migration id %q is too long to record in Nova's metadata", id)
	}
	defer d.lock(m.UID)()
	mig := d.migration(m.UID, id)
	if mig != nil && mig.final != nil {
		return *mig.final, nil
	}
	s, err := d.readServer(ctx, m.UID)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	rec, ok := parseMigrationRecord(s.Metadata[MetaMigration])
	if !ok || rec.id != id {
		return d.startMigration(ctx, m.UID, s, id, host)
	}
	if mig == nil {
		// Asked for by an earlier process of this agent.
		mig = &hostMigration{id: id}
		d.keepMigration(m.UID, mig)
	}
	st, asked, err := d.migrationStatus(ctx, s, rec, mig)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	if !asked {
		// Recorded, but Nova never took it: the call failed, or the agent
		// stopped between the record and the call.
		return d.startMigration(ctx, m.UID, s, id, host)
	}
	if st.Phase != driver.MigrationRunning {
		st.FinishedAt = d.now()
		mig.final = &st
	}
	return st, nil
}

// readServer GETs the server of uid into the view, or returns a NotFound
// error.
func (d *Driver) readServer(ctx context.Context, uid string) (servers.Server, error) {
	s, ok := d.cached(uid)
	if !ok {
		found, err := d.find(ctx, uid)
		if err != nil {
			return servers.Server{}, err
		}
		if len(found) == 0 {
			return servers.Server{}, driver.NotFoundf("no server with %s %s", MetaUID, uid)
		}
		s = found[0]
	}
	at := d.now()
	got, err := servers.Get(ctx, d.c.compute, s.ID).Extract()
	switch {
	case statusOf(err) == http.StatusNotFound || (err == nil && got.Status == "DELETED"):
		d.forget(uid)
		return servers.Server{}, driver.NotFoundf("no server with %s %s", MetaUID, uid)
	case err != nil:
		return servers.Server{}, classify(err, "cannot read server "+s.ID)
	}
	d.remember(uid, *got, at)
	return *got, nil
}

// startMigration records the migration on the server and asks Nova for it.
func (d *Driver) startMigration(ctx context.Context, uid string, s servers.Server, id, host string) (driver.MigrationStatus, error) {
	switch {
	case s.Status != "ACTIVE":
		return driver.MigrationStatus{}, driver.Terminalf("server %s is %s in Nova, not ACTIVE: only a running server migrates live", s.ID, s.Status)
	case s.TaskState != "":
		return driver.MigrationStatus{}, errors.Errorf("server %s is busy (%s); its migration waits", s.ID, s.TaskState)
	case host != "" && host == s.Host:
		return driver.MigrationStatus{}, driver.Terminalf("server %s already runs on host %s", s.ID, host)
	}
	after, visible, err := d.newestMigration(ctx, s.ID)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	if !visible {
		after = -1
	}
	rec := migrationRecord{id: id, after: after, source: s.Host}
	if err := d.setMetadata(ctx, s, map[string]string{MetaMigration: rec.String()}); err != nil {
		return driver.MigrationStatus{}, err
	}
	err = servers.LiveMigrate(ctx, d.c.compute, s.ID, liveMigrateOpts{host: host}).ExtractErr()
	switch {
	case statusOf(err) == http.StatusNotFound && strings.Contains(describe(err), s.ID):
		d.forget(uid)
		return driver.MigrationStatus{}, driver.NotFoundf("no server with %s %s", MetaUID, uid)
	case statusOf(err) == http.StatusBadRequest || statusOf(err) == http.StatusNotFound || statusOf(err) == http.StatusForbidden:
		// A host Nova does not know, or a policy that keeps live migration
		// from this user (Nova's default: admins only): retrying cannot
		// help, and the migration must show why.
		return driver.MigrationStatus{}, driver.Terminalf("Nova refuses to migrate server %s to %s: %s", s.ID, hostOrScheduler(host), describe(err))
	case err != nil:
		return driver.MigrationStatus{}, classify(err, "cannot ask Nova to migrate server "+s.ID)
	}
	mig := &hostMigration{id: id, asked: true, started: d.now()}
	d.keepMigration(uid, mig)
	// Nova marked the server migrating before it answered: the view shows
	// it so at once.
	if _, err := d.readServer(ctx, uid); err != nil && !driver.IsNotFound(err) {
		return driver.MigrationStatus{}, err
	}
	return driver.MigrationStatus{ID: id, Phase: driver.MigrationRunning, StartedAt: mig.started,
		Message: fmt.Sprintf("Nova is migrating the server from %s to %s", fromHost(s.Host), hostOrScheduler(host))}, nil
}

func hostOrScheduler(host string) string {
	if host == "" {
		return "the host its scheduler chooses"
	}
	return "host " + host
}

// migrationStatus is the status of the migration rec records on server s,
// or asked false when Nova has no trace of it.
func (d *Driver) migrationStatus(ctx context.Context, s servers.Server, rec migrationRecord, mig *hostMigration) (driver.MigrationStatus, bool, error) {
	st := driver.MigrationStatus{ID: rec.id, Phase: driver.MigrationRunning, StartedAt: mig.started}
	from := fromHost(rec.source)
	if s.Status == "ERROR" {
		_, msg := phaseOf(s)
		st.Phase, st.Message = driver.MigrationFailed, msg
		return st, true, nil
	}
	if s.Status == "MIGRATING" || s.TaskState == "migrating" {
		p, err := d.migrationProgress(ctx, s.ID, rec.after)
		if err != nil {
			return st, true, err
		}
		if p != nil {
			mig.total, mig.processed = p.total(), p.processed()
			st.Message = fmt.Sprintf("Nova's live migration from %s to %s is %s", from, toHost(p.DestCompute), p.Status)
		} else {
			st.Message = "Nova accepted the live migration from " + from
		}
		st.TotalBytes, st.ProcessedBytes = mig.total, mig.processed
		if st.StartedAt.IsZero() && p != nil {
			st.StartedAt = p.created()
		}
		return st, true, nil
	}
	r, visible, err := d.lastMigration(ctx, s.ID, rec.after)
	if err != nil {
		return st, true, err
	}
	if st.StartedAt.IsZero() && r != nil {
		st.StartedAt = r.CreatedAt
	}
	st.TotalBytes, st.ProcessedBytes = mig.total, mig.processed
	switch {
	case r != nil && migrationDone[r.Status]:
		// A completed migration moved everything.
		st.Phase, st.ProcessedBytes = driver.MigrationSucceeded, st.TotalBytes
		st.Message = fmt.Sprintf("moved from %s to %s", from, toHost(s.Host))
	case r != nil && migrationFailed[r.Status]:
		st.Phase = driver.MigrationFailed
		st.Message = fmt.Sprintf("Nova's live migration from %s to %s ended in status %s%s", from, toHost(r.DestCompute), r.Status, d.failureReason(ctx, s.ID))
	case r != nil:
		// Nova clears the task before it records the end.
		st.Message = fmt.Sprintf("Nova's live migration from %s is %s", from, r.Status)
	case visible:
		return st, false, nil
	case s.Host != "" && rec.source != "" && s.Host != rec.source:
		st.Phase, st.ProcessedBytes = driver.MigrationSucceeded, st.TotalBytes
		st.Message = fmt.Sprintf("moved from %s to %s", from, toHost(s.Host))
	case mig.asked:
		st.Phase = driver.MigrationFailed
		st.Message = fmt.Sprintf("Nova left the server on %s%s", from, d.failureReason(ctx, s.ID))
	default:
		return st, false, nil
	}
	return st, true, nil
}

// fromHost and toHost name a host in a message; Nova hides hosts from
// users its policy does not show them to, and names no target before its
// scheduler chose one.
func fromHost(host string) string {
	if host == "" {
		return "its host"
	}
	return "host " + host
}

func toHost(host string) string {
	if host == "" {
		return "another host"
	}
	return "host " + host
}

// newestMigration is the id of the server's newest live migration record
// (Nova numbers them from 1); 0 when it has none, or visible false when
// Nova hides the records from the user (os-migrations is for admins by
// default).
func (d *Driver) newestMigration(ctx context.Context, serverID string) (int64, bool, error) {
	all, visible, err := d.liveMigrations(ctx, serverID)
	newest := int64(0)
	for _, r := range all {
		newest = max(newest, r.ID)
	}
	return newest, visible, err
}

// lastMigration is the server's newest live migration record after the
// one numbered after, or nil; visible is false when Nova hides them.
func (d *Driver) lastMigration(ctx context.Context, serverID string, after int64) (*migrations.Migration, bool, error) {
	if after < 0 {
		// Hidden when the migration was recorded; no record can be told
		// from the ones before it.
		return nil, false, nil
	}
	all, visible, err := d.liveMigrations(ctx, serverID)
	var last *migrations.Migration
	for i, r := range all {
		if r.ID > after && (last == nil || r.ID > last.ID) {
			last = &all[i]
		}
	}
	return last, visible, err
}

// liveMigrations are the server's live migration records.
func (d *Driver) liveMigrations(ctx context.Context, serverID string) ([]migrations.Migration, bool, error) {
	liveMigration := "live-migration"
	page, err := migrations.List(d.c.compute, migrations.ListOpts{InstanceID: &serverID, MigrationType: &liveMigration}).AllPages(ctx)
	switch {
	case statusOf(err) == http.StatusForbidden:
		return nil, false, nil
	case err != nil:
		return nil, true, classify(err, "cannot list the migrations of server "+serverID)
	}
	all, err := migrations.ExtractMigrations(page)
	return all, true, errors.Wrap(err, "cannot read the migrations of server "+serverID)
}

// serverMigration is an in-progress live migration as GET
// /servers/{id}/migrations shows it (microversion 2.23 and later; no
// gophercloud call reads it). Nova leaves the byte counts null where its
// hypervisor does not tell them.
type serverMigration struct {
	ID                   int64  `json:"id"`
	Status               string `json:"status"`
	DestCompute          string `json:"dest_compute"`
	CreatedAt            string `json:"created_at"`
	MemoryTotalBytes     *int64 `json:"memory_total_bytes"`
	MemoryProcessedBytes *int64 `json:"memory_processed_bytes"`
	DiskTotalBytes       *int64 `json:"disk_total_bytes"`
	DiskProcessedBytes   *int64 `json:"disk_processed_bytes"`
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func (m serverMigration) total() int64 { return deref(m.MemoryTotalBytes) + deref(m.DiskTotalBytes) }

func (m serverMigration) processed() int64 {
	return deref(m.MemoryProcessedBytes) + deref(m.DiskProcessedBytes)
}

// created is when Nova created the record; zero if it cannot be read.
func (m serverMigration) created() time.Time {
	t, err := time.Parse("2006-01-02T15:04:05.999999", m.CreatedAt)
	if err != nil {
		return time.Time{}
	}
	return t
}

// migrationProgress is the server's in-progress live migration after the
// record numbered after, or nil when there is none or Nova hides them.
func (d *Driver) migrationProgress(ctx context.Context, serverID string, after int64) (*serverMigration, error) {
	var body struct {
		Migrations []serverMigration `json:"migrations"`
	}
	_, err := d.c.compute.Get(ctx, d.c.compute.ServiceURL("servers", serverID, "migrations"), &body, nil)
	switch {
	case statusOf(err) == http.StatusForbidden || statusOf(err) == http.StatusNotFound:
		return nil, nil
	case err != nil:
		return nil, classify(err, "cannot read the migrations of server "+serverID)
	}
	var last *serverMigration
	for i, m := range body.Migrations {
		if m.ID > after && (last == nil || m.ID > last.ID) {
			last = &body.Migrations[i]
		}
	}
	return last, nil
}

// failureReason is ": " and Nova's reason for the failure of the server's
// last live migration, from its instance action's failed events, or ""
// when Nova does not tell this user.
func (d *Driver) failureReason(ctx context.Context, serverID string) string {
	page, err := instanceactions.List(d.c.compute, serverID, nil).AllPages(ctx)
	if err != nil {
		return ""
	}
	actions, err := instanceactions.ExtractInstanceActions(page)
	if err != nil {
		return ""
	}
	var last *instanceactions.InstanceAction
	for i, a := range actions {
		if a.Action == "live-migration" && (last == nil || a.StartTime.After(last.StartTime)) {
			last = &actions[i]
		}
	}
	if last == nil {
		return ""
	}
	c := *d.c.compute
	c.Microversion = detailsMicroversion
	// gophercloud's Event has no details.
	var action struct {
		Events []struct {
			Event   string `json:"event"`
			Result  string `json:"result"`
			Details string `json:"details"`
		} `json:"events"`
	}
	if err := instanceactions.Get(ctx, &c, serverID, last.RequestID).ExtractInto(&action); err != nil {
		return ""
	}

	var reasons []string
	for _, e := range action.Events {
		if e.Result == "Error" && e.Details != "" {
			reasons = append(reasons, e.Details)
		}
	}
	if len(reasons) == 0 {
		return ""
	}
	return ": " + strings.Join(reasons, "; ")
}

// migration is the kept migration of uid if it has the given id.
func (d *Driver) migration(uid, id string) *hostMigration {
	d.migrationsMu.Lock()
	defer d.migrationsMu.Unlock()
	if mig := d.migrations[uid]; mig != nil && mig.id == id {
		return mig
	}
	return nil
}

// keepMigration makes mig uid's kept migration, in place of any other.
func (d *Driver) keepMigration(uid string, mig *hostMigration) {
	d.migrationsMu.Lock()
	defer d.migrationsMu.Unlock()
	if d.migrations == nil {
		d.migrations = map[string]*hostMigration{}
	}
	d.migrations[uid] = mig
}

// forgetMigration drops what the driver keeps of uid's migrations.
func (d *Driver) forgetMigration(uid string) {
	d.migrationsMu.Lock()
	defer d.migrationsMu.Unlock()
	delete(d.migrations, uid)
}
