package openstacktest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Nova's live migration: the os-migrateLive server action, the server's
// in-progress migrations (GET /servers/{id}/migrations), the cloud's
// migration records (GET /os-migrations) and the instance actions that say
// why one failed (GET /servers/{id}/os-instance-actions), as the compute
// API reference shows them.
//
// A live migration runs on the server's clock of transitions: accepted by
// the conductor, then preparing, running (memory copied in proportion to
// the time passed), post-migrating, and completed once TransitionDelay has
// passed, when the server is ACTIVE on its new host. Nova's conductor fails
// it early when no host fits (the scheduler's choice when the server's
// host is the only one, or the server's own host asked for); a test makes
// the compute hosts fail the next one with FailNextLiveMigration. A failed
// migration leaves the server ACTIVE where it was, the record in status
// error and the instance action's event Error with Nova's message in its
// details (microversion 2.84).

// Live migration statuses, as Nova's migration records have them.
const (
	MigrationAccepted      = "accepted"
	MigrationPreparing     = "preparing"
	MigrationRunning       = "running"
	MigrationPostMigrating = "post-migrating"
	MigrationCompleted     = "completed"
	MigrationError         = "error"
)

// inProgress are the statuses GET /servers/{id}/migrations lists (Nova's
// migration_get_in_progress_by_instance); accepted is not among them.
var inProgress = []string{"queued", MigrationPreparing, MigrationRunning, MigrationPostMigrating}

// novaTime is how Nova renders the timestamps of migrations and instance
// actions: microseconds, no zone.
const novaTime = "2006-01-02T15:04:05.000000"

// liveMigration is a row of Nova's migrations table of type
// live-migration.
type liveMigration struct {
	ID           int
	UUID         string
	Server       string
	Source, Dest string
	Status       string
	FlavorID     int
	// resume is the status the server returns to, ACTIVE or PAUSED.
	resume           string
	MemoryTotal      int64
	MemoryProcessed  int64
	Created, Updated time.Time
	// failAt and failure, when set, end the migration in error at failAt
	// with failure as the message of the event named failEvent.
	failAt    time.Time
	failure   string
	failEvent string
	// action is the instance action the migration's events go to.
	action *instanceAction
}

// instanceAction is an entry of a server's os-instance-actions.
type instanceAction struct {
	Action, RequestID string
	Start, Updated    time.Time
	// Message is "Error" once an event failed, as Nova sets it.
	Message string
	Events  []actionEvent
}

// actionEvent is an event of an instance action.
type actionEvent struct {
	Event, Result, Host, Details string
	Start, Finish                time.Time
}

// MigrationState is a live migration as the cloud holds it.
type MigrationState struct {
	ID                   int
	Server, Source, Dest string
	Status               string
}

func (s *Server) routeMigrations(mux *http.ServeMux) {
	for pattern, h := range map[string]computeHandler{
		"GET /servers/{id}/migrations":                    s.admin(s.listServerMigrations),
		"GET /os-migrations":                              s.admin(s.listMigrations),
		"GET /servers/{id}/os-instance-actions":           s.listActions,
		"GET /servers/{id}/os-instance-actions/{request}": s.getAction,
	} {
		method, p, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" "+ComputePath+p, s.compute(h))
	}
}

// LiveMigrations lists every live migration, oldest first.
func (s *Server) LiveMigrations() []MigrationState {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	out := make([]MigrationState, 0, len(s.migrations))
	for _, m := range s.migrations {
		out = append(out, MigrationState{ID: m.ID, Server: m.Server, Source: m.Source, Dest: m.Dest, Status: m.Status})
	}
	return out
}

// FailNextLiveMigration makes the compute hosts fail the next live
// migration accepted, at its end, with message as Nova's reason.
func (s *Server) FailNextLiveMigration(message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failMigration = message
}

// recordAction adds an instance action to sv, under the request's id.
func (s *Server) recordAction(sv *server, w http.ResponseWriter, action string) *instanceAction {
	now := time.Now()
	a := &instanceAction{Action: action, RequestID: w.Header().Get(requestIDHeader), Start: now, Updated: now}
	sv.instanceActions = append(sv.instanceActions, a)
	return a
}

// novaActions are Nova's names, in os-instance-actions, of the server
// actions the API serves.
var novaActions = map[string]string{
	"os-start": "start", "os-stop": "stop", "reboot": "reboot", "resize": "resize",
	"confirmResize": "confirmResize", "revertResize": "revertResize", "os-migrateLive": "live-migration",
	"pause": "pause", "unpause": "unpause",
}

// liveMigrate serves os-migrateLive, answering as Nova's API does before
// its conductor takes over (from 2.34 the conductor's checks are
// asynchronous: a host that does not fit fails the migration, not the
// request). It reports whether the action was accepted.
func (s *Server) liveMigrate(w http.ResponseWriter, sv *server, body json.RawMessage, mv int) bool {
	if s.opts.Member {
		writeError(w, http.StatusForbidden, "forbidden", "Policy doesn't allow os_compute_api:os-migrate-server:migrate_live to be performed.")
		return false
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		badRequest(w, "Invalid input for field/attribute os-migrateLive. Value: %s. %s is not of type 'object'", body, body)
		return false
	}
	allowed := []string{"host", "block_migration"}
	switch {
	case mv < 25:
		allowed = append(allowed, "disk_over_commit")
	case mv >= 30 && mv < 68:
		allowed = append(allowed, "force")
	}
	for k := range req {
		if !slices.Contains(allowed, k) {
			badRequest(w, "Invalid input for field/attribute os-migrateLive. Additional properties are not allowed ('%s' was unexpected)", k)
			return false
		}
	}
	rawHost, ok := req["host"]
	if !ok {
		badRequest(w, "Invalid input for field/attribute os-migrateLive. 'host' is a required property")
		return false
	}
	var host *string
	if json.Unmarshal(rawHost, &host) != nil {
		badRequest(w, "Invalid input for field/attribute host. Value: %s. %s is not of type 'string', 'null'", rawHost, rawHost)
		return false
	}
	var block any
	if raw, ok := req["block_migration"]; !ok || json.Unmarshal(raw, &block) != nil {
		badRequest(w, "Invalid input for field/attribute os-migrateLive. 'block_migration' is a required property")
		return false
	}
	if _, isBool := block.(bool); !isBool && (mv < 25 || block != "auto") {
		badRequest(w, "Invalid input for field/attribute block_migration. Value: %v. %v is not valid under any of the given schemas", block, block)
		return false
	}
	if _, ok := req["disk_over_commit"]; mv < 25 && !ok {
		badRequest(w, "Invalid input for field/attribute os-migrateLive. 'disk_over_commit' is a required property")
		return false
	}
	switch {
	case sv.TaskState != "" || sv.pending != nil || (sv.Status != StatusActive && sv.Status != StatusPaused):
		conflict(w, sv, "os-migrateLive")
		return false
	case host != nil && !slices.Contains(s.opts.Hosts, *host):
		badRequest(w, "Compute host %s could not be found.", *host)
		return false
	}

	now := time.Now()
	s.migrationSeq++
	fid, _ := strconv.Atoi(sv.Flavor.ID)
	m := &liveMigration{
		ID: s.migrationSeq, UUID: uuid.NewString(), Server: sv.ID, Source: sv.Host, Status: MigrationAccepted,
		FlavorID: fid, resume: sv.Status, MemoryTotal: int64(sv.Flavor.RAM) << 20, Created: now, Updated: now,
		action: s.recordAction(sv, w, "live-migration"),
	}
	// The conductor's checks: the host asked for, else the scheduler's
	// first other host.
	switch {
	case host != nil && *host == sv.Host:
		m.failEvent, m.failure = "conductor_live_migrate_instance", fmt.Sprintf("Unable to migrate instance (%s) to current host (%s).", sv.ID, sv.Host)
	case host != nil:
		m.Dest = *host
	default:
		for i := range s.opts.Hosts {
			if h := s.opts.Hosts[(slices.Index(s.opts.Hosts, sv.Host)+1+i)%len(s.opts.Hosts)]; h != sv.Host {
				m.Dest = h
				break
			}
		}
		if m.Dest == "" {
			m.failEvent, m.failure = "conductor_live_migrate_instance", "No valid host was found. There are not enough hosts available."
		}
	}
	switch {
	case m.failure != "":
		m.failAt = now.Add(s.opts.TransitionDelay / 4)
	case s.failMigration != "":
		m.failEvent, m.failure, m.failAt = "compute_live_migration", s.failMigration, now.Add(s.opts.TransitionDelay)
		s.failMigration = ""
	}
	s.migrations = append(s.migrations, m)
	sv.Status, sv.TaskState, sv.Updated = StatusMigrating, "migrating", now
	return true
}

// advanceMigrations moves the live migrations under way on by the time
// passed. Callers hold s.mu.
func (s *Server) advanceMigrations(now time.Time) {
	d := s.opts.TransitionDelay
	for _, m := range s.migrations {
		if m.Status == MigrationCompleted || m.Status == MigrationError {
			continue
		}
		sv := s.servers[m.Server]
		elapsed := now.Sub(m.Created)
		status := MigrationAccepted
		switch {
		case sv.Status != StatusMigrating:
			// Deleted, or forced into another status: the compute host
			// rolls the migration back.
			m.failEvent, m.failure, m.failAt = "compute_live_migration", "Instance "+sv.ID+" is in status "+sv.Status, now
		case elapsed >= d:
			status = MigrationCompleted
		case elapsed >= 3*d/4:
			status, m.MemoryProcessed = MigrationPostMigrating, m.MemoryTotal
		case elapsed >= d/2:
			status = MigrationRunning
			m.MemoryProcessed = m.MemoryTotal * int64(elapsed-d/2) / int64(d/4)
		case elapsed >= d/4:
			status = MigrationPreparing
		}
		if m.failure != "" && !now.Before(m.failAt) {
			m.Status, m.Updated = MigrationError, now
			m.action.Events = append(m.action.Events, actionEvent{Event: m.failEvent, Result: "Error", Host: m.Source, Details: m.failure, Start: m.Created, Finish: now})
			m.action.Message, m.action.Updated = "Error", now
			if sv.Status == StatusMigrating {
				sv.Status, sv.TaskState, sv.Updated = m.resume, "", now
			}
			continue
		}
		if status != m.Status {
			m.Status, m.Updated = status, now
		}
		if status == MigrationCompleted {
			m.MemoryProcessed = m.MemoryTotal
			m.action.Events = append(m.action.Events,
				actionEvent{Event: "conductor_live_migrate_instance", Result: "Success", Host: m.Source, Start: m.Created, Finish: now},
				actionEvent{Event: "compute_live_migration", Result: "Success", Host: m.Source, Start: m.Created, Finish: now})
			m.action.Updated = now
			sv.Status, sv.TaskState, sv.Host, sv.Updated = m.resume, "", m.Dest, now
		}
	}
}

// migrationRecordJSON is what GET /servers/{id}/migrations and GET
// /os-migrations both show of a migration.
type migrationRecordJSON struct {
	ID            int     `json:"id"`
	UUID          string  `json:"uuid,omitempty"`
	SourceCompute string  `json:"source_compute"`
	SourceNode    string  `json:"source_node"`
	DestCompute   *string `json:"dest_compute"`
	DestNode      *string `json:"dest_node"`
	DestHost      *string `json:"dest_host"`
	Status        string  `json:"status"`
	CreatedAt     string  `json:"created_at"`
	UpdatedAt     string  `json:"updated_at"`
	UserID        string  `json:"user_id,omitempty"`
	ProjectID     string  `json:"project_id,omitempty"`
}

// migrationRecord is m's record as microversion mv shows it.
func (s *Server) migrationRecord(m *liveMigration, mv int) migrationRecordJSON {
	out := migrationRecordJSON{
		ID: m.ID, SourceCompute: m.Source, SourceNode: m.Source,
		DestCompute: optional(m.Dest), DestNode: optional(m.Dest), Status: m.Status,
		CreatedAt: m.Created.UTC().Format(novaTime), UpdatedAt: m.Updated.UTC().Format(novaTime),
	}
	if mv >= 59 {
		out.UUID = m.UUID
	}
	if mv >= 80 {
		out.UserID, out.ProjectID = s.userID, s.projectID
	}
	return out
}

// migrationJSON is a migration as GET /servers/{id}/migrations shows it.
type migrationJSON struct {
	migrationRecordJSON
	ServerUUID           string `json:"server_uuid"`
	MemoryTotalBytes     *int64 `json:"memory_total_bytes"`
	MemoryProcessedBytes *int64 `json:"memory_processed_bytes"`
	MemoryRemainingBytes *int64 `json:"memory_remaining_bytes"`
	DiskTotalBytes       *int64 `json:"disk_total_bytes"`
	DiskProcessedBytes   *int64 `json:"disk_processed_bytes"`
	DiskRemainingBytes   *int64 `json:"disk_remaining_bytes"`
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (s *Server) renderServerMigration(m *liveMigration, mv int) migrationJSON {
	zero := int64(0)
	remaining := m.MemoryTotal - m.MemoryProcessed
	return migrationJSON{
		migrationRecordJSON: s.migrationRecord(m, mv), ServerUUID: m.Server,
		MemoryTotalBytes: &m.MemoryTotal, MemoryProcessedBytes: &m.MemoryProcessed, MemoryRemainingBytes: &remaining,
		// Booted from volumes: there are no local disks to copy.
		DiskTotalBytes: &zero, DiskProcessedBytes: &zero, DiskRemainingBytes: &zero,
	}
}

// listServerMigrations answers GET /servers/{id}/migrations (from 2.23,
// admins only): the server's live migrations in progress.
func (s *Server) listServerMigrations(w http.ResponseWriter, r *http.Request, mv int) {
	if mv < 23 {
		writeError(w, http.StatusNotFound, "itemNotFound", "The resource could not be found.")
		return
	}
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	out := []migrationJSON{}
	for _, m := range s.migrations {
		if m.Server == sv.ID && slices.Contains(inProgress, m.Status) {
			out = append(out, s.renderServerMigration(m, mv))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"migrations": out})
}

// osMigrationJSON is a migration record as GET /os-migrations shows it.
type osMigrationJSON struct {
	migrationRecordJSON
	InstanceUUID      string `json:"instance_uuid"`
	OldInstanceTypeID int    `json:"old_instance_type_id"`
	NewInstanceTypeID int    `json:"new_instance_type_id"`
	MigrationType     string `json:"migration_type,omitempty"`
	Links             []link `json:"links,omitempty"`
}

// listMigrations answers GET /os-migrations (admins only) with Nova's
// filters instance_uuid, migration_type, status, source_compute and host;
// from 2.59 newest first.
func (s *Server) listMigrations(w http.ResponseWriter, r *http.Request, mv int) {
	q := r.URL.Query()
	var list []*liveMigration
	for _, m := range s.migrations {
		switch {
		case q.Get("instance_uuid") != "" && q.Get("instance_uuid") != m.Server:
		case q.Get("migration_type") != "" && q.Get("migration_type") != "live-migration":
		case q.Get("status") != "" && q.Get("status") != m.Status:
		case q.Get("source_compute") != "" && q.Get("source_compute") != m.Source:
		case q.Get("host") != "" && q.Get("host") != m.Source && q.Get("host") != m.Dest:
		default:
			list = append(list, m)
		}
	}
	if mv >= 59 {
		slices.Reverse(list)
	}
	out := []osMigrationJSON{}
	for _, m := range list {
		o := osMigrationJSON{
			migrationRecordJSON: s.migrationRecord(m, mv), InstanceUUID: m.Server,
			OldInstanceTypeID: m.FlavorID, NewInstanceTypeID: m.FlavorID,
		}
		if mv >= 23 {
			o.MigrationType = "live-migration"
			if slices.Contains(inProgress, m.Status) {
				href := fmt.Sprintf("%s%s/servers/%s/migrations/%d", s.http.URL, ComputePath, m.Server, m.ID)
				o.Links = []link{{Href: href, Rel: "self"}, {Href: strings.Replace(href, "/v2.1", "", 1), Rel: "bookmark"}}
			}
		}
		out = append(out, o)
	}
	writeJSON(w, http.StatusOK, map[string]any{"migrations": out})
}

// actionJSON is an instance action as os-instance-actions shows it.
type actionJSON struct {
	Action       string      `json:"action"`
	InstanceUUID string      `json:"instance_uuid"`
	Message      *string     `json:"message"`
	ProjectID    string      `json:"project_id"`
	RequestID    string      `json:"request_id"`
	StartTime    string      `json:"start_time"`
	UserID       string      `json:"user_id"`
	UpdatedAt    string      `json:"updated_at,omitempty"`
	Events       []eventJSON `json:"events,omitempty"`
}

type eventJSON struct {
	Event      string  `json:"event"`
	StartTime  string  `json:"start_time"`
	FinishTime string  `json:"finish_time"`
	Result     string  `json:"result"`
	Traceback  *string `json:"traceback,omitempty"`
	Host       *string `json:"host,omitempty"`
	HostID     *string `json:"hostId,omitempty"`
	Details    *string `json:"details,omitempty"`
}

func (s *Server) renderAction(sv *server, a *instanceAction, mv int) actionJSON {
	out := actionJSON{
		Action: a.Action, InstanceUUID: sv.ID, Message: optional(a.Message), ProjectID: s.projectID,
		RequestID: a.RequestID, StartTime: a.Start.UTC().Format(novaTime), UserID: s.userID,
	}
	if mv >= 58 {
		out.UpdatedAt = a.Updated.UTC().Format(novaTime)
	}
	return out
}

// listActions answers GET /servers/{id}/os-instance-actions, newest first.
func (s *Server) listActions(w http.ResponseWriter, r *http.Request, mv int) {
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	out := []actionJSON{}
	for i := len(sv.instanceActions) - 1; i >= 0; i-- {
		out = append(out, s.renderAction(sv, sv.instanceActions[i], mv))
	}
	writeJSON(w, http.StatusOK, map[string]any{"instanceActions": out})
}

// getAction answers GET /servers/{id}/os-instance-actions/{request_id}:
// its events for admins, with their host from 2.62 and their details from
// 2.84, as Nova's default policy shows them.
func (s *Server) getAction(w http.ResponseWriter, r *http.Request, mv int) {
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	i := slices.IndexFunc(sv.instanceActions, func(a *instanceAction) bool { return a.RequestID == r.PathValue("request") })
	if i < 0 {
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Action %s not found", r.PathValue("request")))
		return
	}
	a := sv.instanceActions[i]
	out := s.renderAction(sv, a, mv)
	if !s.opts.Member {
		out.Events = []eventJSON{}
		for _, e := range a.Events {
			ej := eventJSON{Event: e.Event, StartTime: e.Start.UTC().Format(novaTime), FinishTime: e.Finish.UTC().Format(novaTime), Result: e.Result}
			if e.Result == "Error" {
				tb := "Traceback (most recent call last):\n  ...\n" + e.Details
				ej.Traceback = &tb
			}
			if mv >= 62 {
				ej.Host, ej.HostID = optional(e.Host), optional(s.hostID(e.Host))
			}
			if mv >= 84 {
				ej.Details = optional(e.Details)
			}
			out.Events = append(out.Events, ej)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"instanceAction": out})
}
