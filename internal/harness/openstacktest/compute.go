package openstacktest

import (
	"crypto/md5" //nolint:gosec // Nova's keypair fingerprint is MD5
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"
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

type flavor struct {
	ID, Name                          string
	VCPUs, RAM, Disk, Swap, Ephemeral int
	Public                            bool
	Description                       string
	// access lists the projects a private flavor may be used by.
	access []string
}

type keypair struct {
	Name, PublicKey, Fingerprint, Type string
	Created                            time.Time
}

type server struct {
	ID, Name  string
	Status    string
	TaskState string
	Host      string
	Flavor    flavor
	// oldFlavor and resumeStatus are what a resize returns to.
	oldFlavor    flavor
	resumeStatus string
	KeyName      string
	Metadata     map[string]string
	UserData     string
	Networks     []string
	// FixedIPs are the addresses asked for on Networks, by index; "" lets
	// the subnet choose.
	FixedIPs  []string
	Addresses []Address
	Volumes   []string
	Created   time.Time
	Updated   time.Time
	Fault     string
	pending   *transition
	// confirming is a confirmed resize Nova has not finished.
	confirming bool
	// actions are the accepted actions, in order, as Nova's
	// os-instance-actions lists them.
	actions []string
	// instanceActions are what os-instance-actions shows, oldest first.
	instanceActions []*instanceAction
}

// Address is one fixed IP of a server on a network.
type Address struct {
	Network string
	MAC     string
	IP      string
}

// transition is a status change due at a time.
type transition struct {
	at     time.Time
	status string
	then   func(*server)
}

func (s *Server) seedFlavors() {
	for i, f := range []flavor{
		{Name: "m1.tiny", VCPUs: 1, RAM: 512, Disk: 1},
		{Name: "m1.small", VCPUs: 1, RAM: 2048, Disk: 20},
		{Name: "m1.medium", VCPUs: 2, RAM: 4096, Disk: 40},
		{Name: "m1.large", VCPUs: 4, RAM: 8192, Disk: 80},
	} {
		f.ID = strconv.Itoa(i + 1)
		f.Public = true
		s.flavors[f.ID] = &f
	}
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

// serverJSON is a server as GET /servers/{id} shows it.
type serverJSON struct {
	ID              string                   `json:"id"`
	Name            string                   `json:"name"`
	Status          string                   `json:"status"`
	TenantID        string                   `json:"tenant_id"`
	UserID          string                   `json:"user_id"`
	Created         string                   `json:"created"`
	Updated         string                   `json:"updated"`
	HostID          string                   `json:"hostId"`
	Flavor          any                      `json:"flavor"`
	Image           string                   `json:"image"`
	Addresses       map[string][]addressJSON `json:"addresses"`
	Metadata        map[string]string        `json:"metadata"`
	KeyName         *string                  `json:"key_name"`
	Links           []link                   `json:"links"`
	Host            string                   `json:"OS-EXT-SRV-ATTR:host"`
	HypervisorName  string                   `json:"OS-EXT-SRV-ATTR:hypervisor_hostname"`
	TaskState       *string                  `json:"OS-EXT-STS:task_state"`
	VMState         string                   `json:"OS-EXT-STS:vm_state"`
	PowerState      int                      `json:"OS-EXT-STS:power_state"`
	VolumesAttached []attachedJSON           `json:"os-extended-volumes:volumes_attached"`
	Fault           *faultJSON               `json:"fault,omitempty"`
}

type addressJSON struct {
	Version int    `json:"version"`
	Addr    string `json:"addr"`
	Type    string `json:"OS-EXT-IPS:type"`
	MAC     string `json:"OS-EXT-IPS-MAC:mac_addr"`
}

type attachedJSON struct {
	ID                  string `json:"id"`
	DeleteOnTermination bool   `json:"delete_on_termination"`
}

type faultJSON struct {
	Code    int    `json:"code"`
	Created string `json:"created"`
	Message string `json:"message"`
}

// embeddedFlavor is a server's flavor from microversion 2.47 on.
type embeddedFlavor struct {
	VCPUs        int               `json:"vcpus"`
	RAM          int               `json:"ram"`
	Disk         int               `json:"disk"`
	Ephemeral    int               `json:"ephemeral"`
	Swap         int               `json:"swap"`
	OriginalName string            `json:"original_name"`
	ExtraSpecs   map[string]string `json:"extra_specs"`
}

type idLinks struct {
	ID    string `json:"id"`
	Links []link `json:"links"`
}

var vmStates = map[string]string{
	StatusActive: "active", StatusMigrating: "active", StatusBuild: "building", StatusShutoff: "stopped", StatusError: "error",
	StatusPaused: "paused", StatusSuspended: "suspended", StatusRescue: "rescued", StatusVerifyResize: "resized",
	StatusShelved: "shelved", StatusShelvedOffloaded: "shelved_offloaded", StatusSoftDeleted: "soft-delete",
	StatusDeleted: "deleted",
}

func (s *Server) render(sv *server, mv int) serverJSON {
	out := serverJSON{
		ID: sv.ID, Name: sv.Name, Status: sv.Status, TenantID: s.projectID, UserID: s.userID,
		Created: stamp(sv.Created), Updated: stamp(sv.Updated),
		Addresses: map[string][]addressJSON{}, Metadata: sv.Metadata,
		Links: []link{{Href: s.http.URL + ComputePath + "/servers/" + sv.ID, Rel: "self"}},
		Host:  sv.Host, HypervisorName: sv.Host, VMState: vmStates[sv.Status],
		VolumesAttached: []attachedJSON{},
	}
	if s.opts.Member {
		out.Host, out.HypervisorName = "", ""
	}
	out.HostID = s.hostID(sv.Host)
	if sv.KeyName != "" {
		out.KeyName = &sv.KeyName
	}
	if sv.TaskState != "" {
		out.TaskState = &sv.TaskState
	}
	switch sv.Status {
	case StatusActive, StatusPassword, StatusMigrating, StatusRescue:
		out.PowerState = 1
	case StatusShutoff:
		out.PowerState = 4
	}
	if mv >= 47 {
		out.Flavor = embeddedFlavor{VCPUs: sv.Flavor.VCPUs, RAM: sv.Flavor.RAM, Disk: sv.Flavor.Disk, Ephemeral: sv.Flavor.Ephemeral, Swap: sv.Flavor.Swap, OriginalName: sv.Flavor.Name, ExtraSpecs: map[string]string{}}
	} else {
		out.Flavor = idLinks{ID: sv.Flavor.ID, Links: []link{{Href: s.http.URL + ComputePath + "/flavors/" + sv.Flavor.ID, Rel: "bookmark"}}}
	}
	for _, a := range sv.Addresses {
		out.Addresses[a.Network] = append(out.Addresses[a.Network], addressJSON{Version: 4, Addr: a.IP, Type: "fixed", MAC: a.MAC})
	}
	for _, v := range sv.Volumes {
		out.VolumesAttached = append(out.VolumesAttached, attachedJSON{ID: v})
	}
	if sv.Status == StatusError && sv.Fault != "" {
		out.Fault = &faultJSON{Code: 500, Created: stamp(sv.Updated), Message: sv.Fault}
	}
	return out
}

// hostID is the opaque id of host the project sees, as Nova's hostId; ""
// for none.
func (s *Server) hostID(host string) string {
	if host == "" {
		return ""
	}
	return fmt.Sprintf("%x", md5.Sum([]byte(s.projectID+host))) //nolint:gosec // an opaque id, as Nova's
}

// listServers answers GET /servers and /servers/detail, newest first, with
// Nova's filters name (a regular expression), status, flavor and
// changes-since. Only a changes-since query shows deleted servers, with
// status DELETED.
func (s *Server) listServers(detail bool) computeHandler {
	return func(w http.ResponseWriter, r *http.Request, mv int) {
		q := r.URL.Query()
		var since time.Time
		if v := q.Get("changes-since"); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				writeError(w, http.StatusBadRequest, "badRequest", fmt.Sprintf("Invalid input for query parameters changes-since. Value: %s.", v))
				return
			}
			since = t
		}
		var name *regexp.Regexp
		if v := q.Get("name"); v != "" {
			re, err := regexp.Compile(v)
			if err != nil {
				writeError(w, http.StatusBadRequest, "badRequest", "Invalid name filter")
				return
			}
			name = re
		}
		var list []*server
		for _, sv := range s.servers {
			switch {
			case sv.Status == StatusDeleted && since.IsZero():
			case !since.IsZero() && sv.Updated.Before(since):
			case name != nil && !name.MatchString(sv.Name):
			case q.Get("status") != "" && q.Get("status") != sv.Status:
			case q.Get("flavor") != "" && q.Get("flavor") != sv.Flavor.ID:
			default:
				list = append(list, sv)
			}
		}
		slices.SortFunc(list, func(a, b *server) int {
			if c := b.Created.Compare(a.Created); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
		out := []any{}
		for _, sv := range list {
			if detail {
				out = append(out, s.render(sv, mv))
			} else {
				out = append(out, map[string]any{"id": sv.ID, "name": sv.Name, "links": s.render(sv, mv).Links})
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"servers": out})
	}
}

// lookupServer finds a server that is not deleted, answering 404 otherwise.
func (s *Server) lookupServer(w http.ResponseWriter, id string) *server {
	sv, ok := s.servers[id]
	if !ok || sv.Status == StatusDeleted {
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Instance %s could not be found.", id))
		return nil
	}
	return sv
}

func (s *Server) getServer(w http.ResponseWriter, r *http.Request, mv int) {
	if sv := s.lookupServer(w, r.PathValue("id")); sv != nil {
		writeJSON(w, http.StatusOK, map[string]any{"server": s.render(sv, mv)})
	}
}

type createServerRequest struct {
	Server struct {
		Name      string            `json:"name"`
		ImageRef  string            `json:"imageRef"`
		FlavorRef string            `json:"flavorRef"`
		KeyName   string            `json:"key_name"`
		UserData  string            `json:"user_data"`
		Metadata  map[string]string `json:"metadata"`
		Networks  json.RawMessage   `json:"networks"`
		BDM       []struct {
			BootIndex           *int   `json:"boot_index"`
			UUID                string `json:"uuid"`
			SourceType          string `json:"source_type"`
			DestinationType     string `json:"destination_type"`
			DeleteOnTermination bool   `json:"delete_on_termination"`
		} `json:"block_device_mapping_v2"`
	} `json:"server"`
}

type networkRef struct {
	UUID    string `json:"uuid"`
	FixedIP string `json:"fixed_ip"`
}

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeError(w, http.StatusBadRequest, "badRequest", fmt.Sprintf(format, args...))
}

// createServer boots a server from a volume: Nova's create with a
// block_device_mapping_v2 whose boot_index 0 is an available volume. Booting
// from an image is not served.
func (s *Server) createServer(w http.ResponseWriter, r *http.Request, _ int) {
	var req createServerRequest
	if !readJSON(w, r, &req) {
		return
	}
	in := req.Server
	fl, ok := s.flavors[in.FlavorRef]
	switch {
	case in.Name == "":
		badRequest(w, "Invalid input for field/attribute server. Value: name is a required property")
		return
	case !ok || !s.usable(fl):
		badRequest(w, "Flavor %s could not be found.", in.FlavorRef)
		return
	case in.KeyName != "" && s.keypairs[in.KeyName] == nil:
		badRequest(w, "Invalid key_name provided.")
		return
	case in.ImageRef != "":
		badRequest(w, "Image %s could not be found.", in.ImageRef)
		return
	}
	for k, v := range in.Metadata {
		if k == "" || len(k) > 255 || len(v) > 255 {
			badRequest(w, "Invalid input for field/attribute metadata: keys and values must be 1-255 characters")
			return
		}
	}
	if in.UserData != "" {
		if _, err := base64.StdEncoding.DecodeString(in.UserData); err != nil {
			badRequest(w, "User data needs to be valid base 64.")
			return
		}
	}
	sv := &server{ID: uuid.NewString(), Name: in.Name, Status: StatusBuild, Flavor: *fl, KeyName: in.KeyName, Metadata: map[string]string{}, UserData: in.UserData, Created: time.Now()}
	for k, v := range in.Metadata {
		sv.Metadata[k] = v
	}
	for _, b := range in.BDM {
		if b.SourceType != "volume" || b.DestinationType != "volume" {
			badRequest(w, "Block Device Mapping is Invalid: only volume to volume mappings are served.")
			return
		}
		v, ok := s.volumes[b.UUID]
		if !ok {
			badRequest(w, "Block Device Mapping is Invalid: failed to get volume %s.", b.UUID)
			return
		}
		if v.Status != "available" {
			badRequest(w, "Invalid volume: volume %s status must be available, but current status is: %s.", b.UUID, v.Status)
			return
		}
		if b.BootIndex != nil && *b.BootIndex == 0 && !v.Bootable {
			badRequest(w, "Block Device %s is not bootable.", b.UUID)
			return
		}
		if b.BootIndex != nil && *b.BootIndex == 0 {
			sv.Volumes = append([]string{b.UUID}, sv.Volumes...)
		} else {
			sv.Volumes = append(sv.Volumes, b.UUID)
		}
	}
	if len(sv.Volumes) == 0 {
		badRequest(w, "Block Device Mapping is Invalid: Boot sequence for the instance and image/block device mapping combination is not valid.")
		return
	}
	if len(in.Networks) > 0 && string(in.Networks) != `"none"` && string(in.Networks) != `"auto"` {
		var refs []networkRef
		if err := json.Unmarshal(in.Networks, &refs); err != nil {
			badRequest(w, "Invalid input for field/attribute networks.")
			return
		}
		for _, n := range refs {
			net := s.networks[n.UUID]
			if net == nil {
				badRequest(w, "Network %s could not be found.", n.UUID)
				return
			}
			if n.FixedIP != "" && len(net.Subnets) > 0 {
				if why := s.subnets[net.Subnets[0]].free(n.FixedIP); why != "" {
					badRequest(w, "%s", why)
					return
				}
			}
			sv.Networks = append(sv.Networks, n.UUID)
			sv.FixedIPs = append(sv.FixedIPs, n.FixedIP)
		}
	}
	for _, v := range sv.Volumes {
		s.volumes[v].attach(sv.ID)
	}
	sv.Host = s.opts.Hosts[s.nextHost%len(s.opts.Hosts)]
	s.nextHost++
	s.servers[sv.ID] = sv
	s.recordAction(sv, w, "create")
	s.after(sv, "spawning", StatusActive, s.plug)
	writeJSON(w, http.StatusAccepted, map[string]any{"server": map[string]any{
		"id": sv.ID, "links": []link{{Href: s.http.URL + ComputePath + "/servers/" + sv.ID, Rel: "self"}},
		"OS-DCF:diskConfig": "MANUAL", "security_groups": []map[string]string{{"name": "default"}},
		"adminPass": hexID(),
	}})
}

// plug gives a server that finished building a port with an address on the
// first subnet of each of its networks.
func (s *Server) plug(sv *server) {
	for i, id := range sv.Networks {
		n := s.networks[id]
		a := Address{Network: n.Name, MAC: mac()}
		switch sn := s.subnet(n); {
		case sn == nil:
		case sv.FixedIPs[i] != "" && sn.free(sv.FixedIPs[i]) == "":
			sn.used[sv.FixedIPs[i]] = true
			a.IP = sv.FixedIPs[i]
		case sv.FixedIPs[i] == "":
			a.IP = sn.allocate()
		}
		if a.IP != "" {
			sv.Addresses = append(sv.Addresses, a)
		}
	}
}

// subnet is the first subnet of n, or nil.
func (s *Server) subnet(n *network) *subnet {
	if len(n.Subnets) == 0 {
		return nil
	}
	return s.subnets[n.Subnets[0]]
}

func mac() string {
	b := hexID()
	return "fa:16:3e:" + b[0:2] + ":" + b[2:4] + ":" + b[4:6]
}

// deleteServer deletes at once: the server leaves every list but a
// changes-since one, where it shows as DELETED, and its volumes become
// available again.
func (s *Server) deleteServer(w http.ResponseWriter, r *http.Request, _ int) {
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	for _, v := range sv.Volumes {
		if vol, ok := s.volumes[v]; ok {
			vol.detach()
		}
	}
	for _, a := range sv.Addresses {
		for _, n := range s.networks {
			if n.Name == a.Network && len(n.Subnets) > 0 {
				s.subnets[n.Subnets[0]].release(a.IP)
			}
		}
	}
	sv.Status, sv.TaskState, sv.pending, sv.Volumes, sv.Addresses = StatusDeleted, "", nil, nil, nil
	sv.Updated = time.Now()
	w.WriteHeader(http.StatusNoContent)
}

// actionRequest is the body of a POST /servers/{id}/action: one key, the
// action, whose value may be null (os-start, os-stop).
type actionRequest map[string]json.RawMessage

type rebootAction struct {
	Type string `json:"type"`
}

type resizeAction struct {
	FlavorRef string `json:"flavorRef"`
}

func conflict(w http.ResponseWriter, sv *server, action string) {
	if sv.TaskState != "" {
		writeError(w, http.StatusConflict, "conflictingRequest", fmt.Sprintf("Cannot '%s' instance %s while it is in task_state %s", action, sv.ID, sv.TaskState))
		return
	}
	writeError(w, http.StatusConflict, "conflictingRequest", fmt.Sprintf("Cannot '%s' instance %s while it is in vm_state %s", action, sv.ID, vmStates[sv.Status]))
}

// serverAction serves os-start, os-stop, reboot, resize, confirmResize,
// revertResize and os-migrateLive (see liveMigrate), each allowed in the
// states the compute API allows it in and answered 409 otherwise.
func (s *Server) serverAction(w http.ResponseWriter, r *http.Request, mv int) {
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	var a actionRequest
	if !readJSON(w, r, &a) {
		return
	}
	if len(a) != 1 {
		badRequest(w, "There is no such action")
		return
	}
	idle := sv.TaskState == "" && sv.pending == nil
	if sv.confirming && a["confirmResize"] == nil {
		conflict(w, sv, "act on")
		return
	}
	for action, body := range a {
		switch action {
		case "os-start":
			if !idle || sv.Status != StatusShutoff {
				conflict(w, sv, "start")
				return
			}
			s.after(sv, "powering-on", StatusActive, nil)
		case "os-stop":
			if !idle || (sv.Status != StatusActive && sv.Status != StatusError) {
				conflict(w, sv, "stop")
				return
			}
			s.after(sv, "powering-off", StatusShutoff, nil)
		case "pause":
			if !idle || sv.Status != StatusActive {
				conflict(w, sv, "pause")
				return
			}
			s.after(sv, "pausing", StatusPaused, nil)
		case "unpause":
			if !idle || sv.Status != StatusPaused {
				conflict(w, sv, "unpause")
				return
			}
			s.after(sv, "unpausing", StatusActive, nil)
		case "reboot":
			var rb rebootAction
			_ = json.Unmarshal(body, &rb)
			hard := rb.Type == "HARD"
			if rb.Type != "SOFT" && !hard {
				badRequest(w, "Invalid input for field/attribute type. Value: %s.", rb.Type)
				return
			}
			if !idle || (sv.Status != StatusActive && !(hard && slices.Contains([]string{StatusShutoff, StatusError, StatusPaused, StatusSuspended}, sv.Status))) {
				conflict(w, sv, "reboot")
				return
			}
			sv.Status = StatusReboot
			if hard {
				sv.Status = StatusHardReboot
			}
			s.after(sv, "rebooting", StatusActive, nil)
		case "resize":
			var rs resizeAction
			_ = json.Unmarshal(body, &rs)
			fl, ok := s.flavors[rs.FlavorRef]
			switch {
			case !ok || !s.usable(fl):
				badRequest(w, "Flavor %s could not be found.", rs.FlavorRef)
				return
			case !idle || (sv.Status != StatusActive && sv.Status != StatusShutoff):
				conflict(w, sv, "resize")
				return
			case fl.ID == sv.Flavor.ID:
				badRequest(w, "When resizing, instances must change flavor!")
				return
			}
			sv.oldFlavor, sv.resumeStatus = sv.Flavor, sv.Status
			sv.Status = StatusResize
			next := *fl
			s.after(sv, "resize_prep", StatusVerifyResize, func(sv *server) { sv.Flavor = next })
		case "confirmResize":
			switch {
			case sv.Status != StatusVerifyResize:
				conflict(w, sv, "confirmResize")
				return
			case sv.confirming:
				// Nova looks for the migration in status finished, which a
				// confirm under way has moved on.
				badRequest(w, "Instance has not been resized.")
				return
			}
			// Nova confirms on the compute host, asynchronously: the server
			// stays VERIFY_RESIZE with no task state until it has.
			sv.confirming = true
			sv.pending = &transition{at: time.Now().Add(s.opts.TransitionDelay), status: sv.resumeStatus, then: func(sv *server) { sv.confirming = false }}
		case "revertResize":
			if sv.Status != StatusVerifyResize {
				conflict(w, sv, "revertResize")
				return
			}
			sv.Status = StatusRevertResize
			s.after(sv, "resize_reverting", sv.resumeStatus, func(sv *server) { sv.Flavor = sv.oldFlavor })
		case "os-migrateLive":
			if !s.liveMigrate(w, sv, body, mv) {
				return
			}
		default:
			badRequest(w, "There is no such action: %s", action)
			return
		}
		sv.actions = append(sv.actions, action)
		if action != "os-migrateLive" { // liveMigrate recorded it
			s.recordAction(sv, w, novaActions[action])
		}
	}
	w.WriteHeader(http.StatusAccepted)
}

// serverMetadata serves GET (show), POST (merge) and PUT (replace) of a
// server's metadata.
func (s *Server) serverMetadata(w http.ResponseWriter, r *http.Request, _ int) {
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	if r.Method != http.MethodGet {
		var req struct {
			Metadata map[string]string `json:"metadata"`
		}
		if !readJSON(w, r, &req) {
			return
		}
		if r.Method == http.MethodPut {
			sv.Metadata = map[string]string{}
		}
		for k, v := range req.Metadata {
			if k == "" || len(k) > 255 || len(v) > 255 {
				badRequest(w, "Invalid input for field/attribute metadata: keys and values must be 1-255 characters")
				return
			}
			sv.Metadata[k] = v
		}
		sv.Updated = time.Now()
	}
	writeJSON(w, http.StatusOK, map[string]any{"metadata": sv.Metadata})
}

type attachmentJSON struct {
	ID       string `json:"id"`
	ServerID string `json:"serverId"`
	VolumeID string `json:"volumeId"`
	Device   string `json:"device"`
}

func attachments(sv *server) []attachmentJSON {
	out := []attachmentJSON{}
	for i, v := range sv.Volumes {
		out = append(out, attachmentJSON{ID: v, ServerID: sv.ID, VolumeID: v, Device: "/dev/vd" + string(rune('a'+i))})
	}
	return out
}

func (s *Server) listAttachments(w http.ResponseWriter, r *http.Request, _ int) {
	if sv := s.lookupServer(w, r.PathValue("id")); sv != nil {
		writeJSON(w, http.StatusOK, map[string]any{"volumeAttachments": attachments(sv)})
	}
}

// attachVolume attaches an available volume to an active or stopped server.
func (s *Server) attachVolume(w http.ResponseWriter, r *http.Request, _ int) {
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	var req struct {
		VolumeAttachment struct {
			VolumeID string `json:"volumeId"`
		} `json:"volumeAttachment"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	v, ok := s.volumes[req.VolumeAttachment.VolumeID]
	switch {
	case !ok:
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Volume %s could not be found.", req.VolumeAttachment.VolumeID))
		return
	case v.Status != "available":
		badRequest(w, "Invalid volume: volume %s status must be available, but current status is: %s.", v.ID, v.Status)
		return
	case sv.TaskState != "" || (sv.Status != StatusActive && sv.Status != StatusShutoff):
		conflict(w, sv, "attach_volume")
		return
	}
	v.attach(sv.ID)
	sv.Volumes = append(sv.Volumes, v.ID)
	sv.Updated = time.Now()
	all := attachments(sv)
	writeJSON(w, http.StatusOK, map[string]any{"volumeAttachment": all[len(all)-1]})
}

// detachVolume detaches a volume that is not the root device.
func (s *Server) detachVolume(w http.ResponseWriter, r *http.Request, _ int) {
	sv := s.lookupServer(w, r.PathValue("id"))
	if sv == nil {
		return
	}
	id := r.PathValue("v")
	i := slices.Index(sv.Volumes, id)
	switch {
	case i < 0:
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("volume_id not found: %s", id))
		return
	case i == 0:
		badRequest(w, "Cannot detach a root device volume")
		return
	}
	sv.Volumes = slices.Delete(sv.Volumes, i, i+1)
	sv.Updated = time.Now()
	s.volumes[id].detach()
	w.WriteHeader(http.StatusAccepted)
}

// flavorJSON is a flavor as the compute API shows it. Swap is "" for none
// before 2.75, as Nova has it.
type flavorJSON struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	VCPUs       int               `json:"vcpus"`
	RAM         int               `json:"ram"`
	Disk        int               `json:"disk"`
	Swap        any               `json:"swap"`
	Ephemeral   int               `json:"OS-FLV-EXT-DATA:ephemeral"`
	Public      bool              `json:"os-flavor-access:is_public"`
	RxTxFactor  float64           `json:"rxtx_factor"`
	Description *string           `json:"description,omitempty"`
	ExtraSpecs  map[string]string `json:"extra_specs,omitempty"`
	Links       []link            `json:"links"`
}

func (s *Server) renderFlavor(f *flavor, mv int) flavorJSON {
	out := flavorJSON{ID: f.ID, Name: f.Name, VCPUs: f.VCPUs, RAM: f.RAM, Disk: f.Disk, Swap: f.Swap, Ephemeral: f.Ephemeral, Public: f.Public, RxTxFactor: 1,
		Links: []link{{Href: s.http.URL + ComputePath + "/flavors/" + f.ID, Rel: "self"}}}
	if f.Swap == 0 && mv < 75 {
		out.Swap = ""
	}
	if mv >= 55 {
		out.Description = &f.Description
	}
	if mv >= 61 {
		out.ExtraSpecs = map[string]string{}
	}
	return out
}

// usable reports whether the project may boot with f: public, or private
// with access granted to the project.
func (s *Server) usable(f *flavor) bool {
	return f.Public || slices.Contains(f.access, s.projectID)
}

// listFlavors answers GET /flavors/detail with is_public true (the default:
// public flavors and private ones the project may use), false (private
// ones) or None (all; the user is an admin).
func (s *Server) listFlavors(w http.ResponseWriter, r *http.Request, mv int) {
	access := strings.ToLower(r.URL.Query().Get("is_public"))
	if s.opts.Member {
		access = "true" // Nova ignores is_public for non-admins
	}
	var list []*flavor
	for _, f := range s.flavors {
		switch access {
		case "none":
		case "false", "0", "no":
			if f.Public {
				continue
			}
		default:
			if !s.usable(f) {
				continue
			}
		}
		list = append(list, f)
	}
	slices.SortFunc(list, func(a, b *flavor) int { return strings.Compare(a.ID, b.ID) })
	out := []flavorJSON{}
	for _, f := range list {
		out = append(out, s.renderFlavor(f, mv))
	}
	writeJSON(w, http.StatusOK, map[string]any{"flavors": out})
}

func (s *Server) lookupFlavor(w http.ResponseWriter, id string) *flavor {
	f, ok := s.flavors[id]
	if !ok {
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Flavor %s could not be found.", id))
	}
	return f
}

func (s *Server) getFlavor(w http.ResponseWriter, r *http.Request, mv int) {
	if f := s.lookupFlavor(w, r.PathValue("id")); f != nil {
		writeJSON(w, http.StatusOK, map[string]any{"flavor": s.renderFlavor(f, mv)})
	}
}

func (s *Server) createFlavor(w http.ResponseWriter, r *http.Request, mv int) {
	var req struct {
		Flavor struct {
			ID          string  `json:"id"`
			Name        string  `json:"name"`
			VCPUs       int     `json:"vcpus"`
			RAM         int     `json:"ram"`
			Disk        *int    `json:"disk"`
			Swap        int     `json:"swap"`
			Ephemeral   int     `json:"OS-FLV-EXT-DATA:ephemeral"`
			Public      *bool   `json:"os-flavor-access:is_public"`
			Description string  `json:"description"`
			RxTxFactor  float64 `json:"rxtx_factor"`
		} `json:"flavor"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	in := req.Flavor
	if in.Name == "" || in.VCPUs < 1 || in.RAM < 1 || in.Disk == nil || *in.Disk < 0 || in.Swap < 0 {
		badRequest(w, "Invalid input for field/attribute flavor: name, vcpus >= 1, ram >= 1 and disk >= 0 are required")
		return
	}
	if in.ID == "" {
		in.ID = uuid.NewString()
	}
	for _, f := range s.flavors {
		if f.Name == in.Name || f.ID == in.ID {
			writeError(w, http.StatusConflict, "conflictingRequest", fmt.Sprintf("Flavor with name %s already exists.", in.Name))
			return
		}
	}
	f := &flavor{ID: in.ID, Name: in.Name, VCPUs: in.VCPUs, RAM: in.RAM, Disk: *in.Disk, Swap: in.Swap, Ephemeral: in.Ephemeral, Public: in.Public == nil || *in.Public, Description: in.Description}
	s.flavors[f.ID] = f
	writeJSON(w, http.StatusOK, map[string]any{"flavor": s.renderFlavor(f, mv)})
}

func (s *Server) deleteFlavor(w http.ResponseWriter, r *http.Request, _ int) {
	if f := s.lookupFlavor(w, r.PathValue("id")); f != nil {
		delete(s.flavors, f.ID)
		w.WriteHeader(http.StatusAccepted)
	}
}

// flavorAction serves addTenantAccess, which lets a project use a private
// flavor.
func (s *Server) flavorAction(w http.ResponseWriter, r *http.Request, _ int) {
	f := s.lookupFlavor(w, r.PathValue("id"))
	if f == nil {
		return
	}
	var req struct {
		Add *struct {
			Tenant string `json:"tenant"`
		} `json:"addTenantAccess"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	switch {
	case req.Add == nil:
		badRequest(w, "There is no such action")
		return
	case f.Public:
		writeError(w, http.StatusConflict, "conflictingRequest", "Can not add access to a public flavor.")
		return
	}
	if !slices.Contains(f.access, req.Add.Tenant) {
		f.access = append(f.access, req.Add.Tenant)
	}
	type access struct {
		FlavorID string `json:"flavor_id"`
		TenantID string `json:"tenant_id"`
	}
	out := []access{}
	for _, t := range f.access {
		out = append(out, access{FlavorID: f.ID, TenantID: t})
	}
	writeJSON(w, http.StatusOK, map[string]any{"flavor_access": out})
}

type keypairJSON struct {
	Name        string `json:"name"`
	PublicKey   string `json:"public_key"`
	Fingerprint string `json:"fingerprint"`
	Type        string `json:"type"`
	UserID      string `json:"user_id,omitempty"`
	CreatedAt   string `json:"created_at,omitempty"`
}

func (s *Server) renderKeypair(k *keypair, full bool) keypairJSON {
	out := keypairJSON{Name: k.Name, PublicKey: k.PublicKey, Fingerprint: k.Fingerprint, Type: k.Type}
	if full {
		out.UserID, out.CreatedAt = s.userID, stamp(k.Created)
	}
	return out
}

func (s *Server) listKeypairs(w http.ResponseWriter, _ *http.Request, _ int) {
	names := make([]string, 0, len(s.keypairs))
	for n := range s.keypairs {
		names = append(names, n)
	}
	slices.Sort(names)
	out := []map[string]keypairJSON{}
	for _, n := range names {
		out = append(out, map[string]keypairJSON{"keypair": s.renderKeypair(s.keypairs[n], false)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"keypairs": out})
}

func (s *Server) lookupKeypair(w http.ResponseWriter, name string) *keypair {
	k, ok := s.keypairs[name]
	if !ok {
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Keypair %s not found for user %s", name, s.userID))
	}
	return k
}

func (s *Server) getKeypair(w http.ResponseWriter, r *http.Request, _ int) {
	if k := s.lookupKeypair(w, r.PathValue("name")); k != nil {
		writeJSON(w, http.StatusOK, map[string]any{"keypair": s.renderKeypair(k, true)})
	}
}

var keypairName = regexp.MustCompile(`^[a-zA-Z0-9 _.@-]{1,255}$`)

// importKeypair imports a public key; generating one is not served.
func (s *Server) importKeypair(w http.ResponseWriter, r *http.Request, mv int) {
	var req struct {
		Keypair struct {
			Name      string `json:"name"`
			PublicKey string `json:"public_key"`
			Type      string `json:"type"`
		} `json:"keypair"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	in := req.Keypair
	if !keypairName.MatchString(in.Name) {
		badRequest(w, "Invalid input for field/attribute name. Value: %s.", in.Name)
		return
	}
	// Nova parses the key to fingerprint it: base64 alone is not a key.
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(in.PublicKey))
	if err != nil {
		badRequest(w, "Keypair data is invalid: failed to generate fingerprint")
		return
	}
	blob := key.Marshal()
	if _, dup := s.keypairs[in.Name]; dup {
		writeError(w, http.StatusConflict, "conflictingRequest", fmt.Sprintf("Key pair '%s' already exists.", in.Name))
		return
	}
	sum := md5.Sum(blob) //nolint:gosec // Nova's fingerprint
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02x", b)
	}
	k := &keypair{Name: in.Name, PublicKey: in.PublicKey, Fingerprint: strings.Join(parts, ":"), Type: "ssh", Created: time.Now()}
	s.keypairs[k.Name] = k
	status := http.StatusOK
	if mv >= 2 {
		status = http.StatusCreated
	}
	writeJSON(w, status, map[string]any{"keypair": s.renderKeypair(k, true)})
}

func (s *Server) deleteKeypair(w http.ResponseWriter, r *http.Request, mv int) {
	k := s.lookupKeypair(w, r.PathValue("name"))
	if k == nil {
		return
	}
	delete(s.keypairs, k.Name)
	if mv >= 2 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusAccepted)
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
