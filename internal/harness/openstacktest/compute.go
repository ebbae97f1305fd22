package openstacktest

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Nova, compute API v2.1 with microversions up to MaxMicroversion.

// MaxMicroversion is the newest compute microversion served. From 2.47 a
// server embeds its flavor; from 2.88 os-hypervisors/statistics is gone.
const MaxMicroversion = "2.96"

const maxMinor = 96

// Nova server statuses.
const (
	StatusActive           = "ACTIVE"
	StatusBuild            = "BUILD"
	StatusDeleted          = "DELETED"
	StatusError            = "ERROR"
	StatusHardReboot       = "HARD_REBOOT"
	StatusMigrating        = "MIGRATING"
	StatusPassword         = "PASSWORD"
	StatusPaused           = "PAUSED"
	StatusReboot           = "REBOOT"
	StatusRebuild          = "REBUILD"
	StatusRescue           = "RESCUE"
	StatusResize           = "RESIZE"
	StatusRevertResize     = "REVERT_RESIZE"
	StatusShelved          = "SHELVED"
	StatusShelvedOffloaded = "SHELVED_OFFLOADED"
	StatusShutoff          = "SHUTOFF"
	StatusSoftDeleted      = "SOFT_DELETED"
	StatusSuspended        = "SUSPENDED"
	StatusUnknown          = "UNKNOWN"
	StatusVerifyResize     = "VERIFY_RESIZE"
)

// Statuses are every status of the compute API reference's server
// resource.
var Statuses = []string{
	StatusActive, StatusBuild, StatusDeleted, StatusError, StatusHardReboot, StatusMigrating, StatusPassword,
	StatusPaused, StatusReboot, StatusRebuild, StatusRescue, StatusResize, StatusRevertResize, StatusShelved,
	StatusShelvedOffloaded, StatusShutoff, StatusSoftDeleted, StatusSuspended, StatusUnknown, StatusVerifyResize,
}

// transition is a status change due at a time.
type transition struct {
	at     time.Time
	status string
	then   func(*server)
}

// advance applies the transitions that are due. Callers hold s.mu.
func (s *Server) advance() {
	now := time.Now()
	for _, sv := range s.servers {
		if p := sv.pending; p != nil && !now.Before(p.at) {
			sv.pending = nil
			sv.Status, sv.TaskState = p.status, ""
			if p.then != nil {
				p.then(sv)
			}
			sv.Updated = now
		}
	}
	s.advanceMigrations(now)
	for _, v := range s.volumes {
		if v.Status == "creating" && !now.Before(v.readyAt) {
			v.Status = "available"
			v.Updated = now
		}
		if p := v.pending; p != nil && !now.Before(p.at) {
			v.pending = nil
			p.then(v)
			v.Updated = now
		}
	}
}

// after moves sv to status once the transition delay has passed.
func (s *Server) after(sv *server, task, status string, then func(*server)) {
	sv.TaskState = task
	sv.Updated = time.Now()
	sv.pending = &transition{at: time.Now().Add(s.opts.TransitionDelay), status: status, then: then}
}

// computeHandler is a Nova handler, called with s.mu held and the request's
// microversion minor number.
type computeHandler func(w http.ResponseWriter, r *http.Request, mv int)

// compute negotiates the microversion as Nova does: none means 2.1, latest
// means MaxMicroversion, anything else outside 2.1–MaxMicroversion is 406.
func (s *Server) compute(h computeHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("X-OpenStack-Nova-API-Version")
		if h := r.Header.Get("OpenStack-API-Version"); h != "" {
			v = strings.TrimSpace(strings.TrimPrefix(h, "compute"))
		}
		mv := 1
		switch v {
		case "":
		case "latest":
			mv = maxMinor
		default:
			minor, err := strconv.Atoi(strings.TrimPrefix(v, "2."))
			if !strings.HasPrefix(v, "2.") || err != nil || minor < 1 || minor > maxMinor {
				writeError(w, http.StatusNotAcceptable, "computeFault", fmt.Sprintf("Version %s is not supported by the API. Minimum is 2.1 and maximum is %s.", v, MaxMicroversion))
				return
			}
			mv = minor
		}
		version := "2." + strconv.Itoa(mv)
		// Nova's request id, which names the instance action a server
		// action records.
		id := "req-" + uuid.NewString()
		w.Header().Set(requestIDHeader, id)
		w.Header().Set("X-Compute-Request-Id", id)
		w.Header().Set("X-OpenStack-Nova-API-Version", version)
		w.Header().Set("OpenStack-API-Version", "compute "+version)
		w.Header().Set("Vary", "OpenStack-API-Version, X-OpenStack-Nova-API-Version")
		s.mu.Lock()
		defer s.mu.Unlock()
		h(w, r, mv)
	}
}

func (s *Server) routeCompute(mux *http.ServeMux) {
	for pattern, h := range map[string]computeHandler{
		"GET /servers":                                   s.listServers(false),
		"GET /servers/detail":                            s.listServers(true),
		"POST /servers":                                  s.createServer,
		"GET /servers/{id}":                              s.getServer,
		"DELETE /servers/{id}":                           s.deleteServer,
		"POST /servers/{id}/action":                      s.serverAction,
		"GET /servers/{id}/metadata":                     s.serverMetadata,
		"POST /servers/{id}/metadata":                    s.serverMetadata,
		"PUT /servers/{id}/metadata":                     s.serverMetadata,
		"GET /servers/{id}/os-volume_attachments":        s.listAttachments,
		"POST /servers/{id}/os-volume_attachments":       s.attachVolume,
		"DELETE /servers/{id}/os-volume_attachments/{v}": s.detachVolume,
		"GET /flavors/detail":                            s.listFlavors,
		"GET /flavors/{id}":                              s.getFlavor,
		"POST /flavors":                                  s.admin(s.createFlavor),
		"DELETE /flavors/{id}":                           s.admin(s.deleteFlavor),
		"POST /flavors/{id}/action":                      s.admin(s.flavorAction),
		"GET /os-keypairs":                               s.listKeypairs,
		"GET /os-keypairs/{name}":                        s.getKeypair,
		"POST /os-keypairs":                              s.importKeypair,
		"DELETE /os-keypairs/{name}":                     s.deleteKeypair,
		"GET /os-hypervisors/statistics":                 s.admin(s.hypervisorStatistics),
		"GET /limits":                                    s.limits,
	} {
		method, p, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" "+ComputePath+p, s.compute(h))
	}
	s.routeMigrations(mux)
	s.routeConsoles(mux)
}

// admin answers 403 to a member, as Nova's default policy does.
func (s *Server) admin(h computeHandler) computeHandler {
	return func(w http.ResponseWriter, r *http.Request, mv int) {
		if s.opts.Member {
			writeError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("Policy doesn't allow %s %s to be performed.", r.Method, r.URL.Path))
			return
		}
		h(w, r, mv)
	}
}

// limits shows the project's absolute compute limits and usage.
func (s *Server) limits(w http.ResponseWriter, _ *http.Request, _ int) {
	type absolute struct {
		MaxTotalCores      int `json:"maxTotalCores"`
		MaxTotalRAMSize    int `json:"maxTotalRAMSize"`
		MaxTotalInstances  int `json:"maxTotalInstances"`
		TotalCoresUsed     int `json:"totalCoresUsed"`
		TotalRAMUsed       int `json:"totalRAMUsed"`
		TotalInstancesUsed int `json:"totalInstancesUsed"`
	}
	a := absolute{MaxTotalCores: s.opts.QuotaCores, MaxTotalRAMSize: s.opts.QuotaRAMMB, MaxTotalInstances: 10}
	for _, sv := range s.servers {
		if sv.Status != StatusDeleted {
			a.TotalCoresUsed += sv.Flavor.VCPUs
			a.TotalRAMUsed += sv.Flavor.RAM
			a.TotalInstancesUsed++
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"limits": map[string]any{"absolute": a, "rate": []any{}}})
}

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeError(w, http.StatusBadRequest, "badRequest", fmt.Sprintf(format, args...))
}

func conflict(w http.ResponseWriter, sv *server, action string) {
	if sv.TaskState != "" {
		writeError(w, http.StatusConflict, "conflictingRequest", fmt.Sprintf("Cannot '%s' instance %s while it is in task_state %s", action, sv.ID, sv.TaskState))
		return
	}
	writeError(w, http.StatusConflict, "conflictingRequest", fmt.Sprintf("Cannot '%s' instance %s while it is in vm_state %s", action, sv.ID, vmStates[sv.Status]))
}

// hypervisorStatistics sums the hosts' resources and what the servers on
// them use. Nova removed it in 2.88.
func (s *Server) hypervisorStatistics(w http.ResponseWriter, _ *http.Request, mv int) {
	if mv >= 88 {
		writeError(w, http.StatusNotFound, "itemNotFound", "The resource could not be found.")
		return
	}
	type stats struct {
		Count              int `json:"count"`
		VCPUs              int `json:"vcpus"`
		VCPUsUsed          int `json:"vcpus_used"`
		MemoryMB           int `json:"memory_mb"`
		MemoryMBUsed       int `json:"memory_mb_used"`
		FreeRAMMB          int `json:"free_ram_mb"`
		LocalGB            int `json:"local_gb"`
		LocalGBUsed        int `json:"local_gb_used"`
		FreeDiskGB         int `json:"free_disk_gb"`
		DiskAvailableLeast int `json:"disk_available_least"`
		CurrentWorkload    int `json:"current_workload"`
		RunningVMs         int `json:"running_vms"`
	}
	n := len(s.opts.Hosts)
	st := stats{Count: n, VCPUs: n * s.opts.HostVCPUs, MemoryMB: n * s.opts.HostMemoryMB, LocalGB: n * 1024}
	for _, sv := range s.servers {
		if sv.Status == StatusDeleted {
			continue
		}
		st.VCPUsUsed += sv.Flavor.VCPUs
		st.MemoryMBUsed += sv.Flavor.RAM
		st.RunningVMs++
	}
	st.FreeRAMMB = st.MemoryMB - st.MemoryMBUsed
	st.FreeDiskGB, st.DiskAvailableLeast = st.LocalGB, st.LocalGB
	writeJSON(w, http.StatusOK, map[string]any{"hypervisor_statistics": st})
}
