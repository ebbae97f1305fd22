package openstacktest

import (
	"crypto/md5" //nolint:gosec // Nova's keypair fingerprint is MD5
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

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
