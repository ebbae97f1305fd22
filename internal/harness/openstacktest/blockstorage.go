package openstacktest

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Cinder, block-storage API v3: volumes created empty, listed by name,
// attached by Nova.

type volume struct {
	ID, Name, Description string
	Size                  int
	Status                string
	Metadata              map[string]string
	ImageMetadata         map[string]string
	Server                string
	Bootable              bool
	Created, Updated      time.Time
	readyAt               time.Time
	// pending is the next step of a hot-plug attach or detach, which
	// Nova's compute host finishes after the API answered.
	pending *volumeStep
}

// volumeStep is a change to a volume due at a time, applied by advance.
type volumeStep struct {
	at   time.Time
	then func(*volume)
}

func (v *volume) attach(server string) {
	v.Status, v.Server, v.Updated, v.pending = "in-use", server, time.Now(), nil
}

func (v *volume) detach() {
	v.Status, v.Server, v.Updated, v.pending = "available", "", time.Now(), nil
}

// cinderTime is how Cinder renders timestamps: microseconds, no zone.
const cinderTime = "2006-01-02T15:04:05.000000"

type volumeJSON struct {
	ID               string             `json:"id"`
	Name             string             `json:"name"`
	Description      string             `json:"description"`
	Size             int                `json:"size"`
	Status           string             `json:"status"`
	Attachments      []volumeAttachment `json:"attachments"`
	Metadata         map[string]string  `json:"metadata"`
	ImageMetadata    map[string]string  `json:"volume_image_metadata,omitempty"`
	CreatedAt        string             `json:"created_at"`
	UpdatedAt        string             `json:"updated_at"`
	Bootable         string             `json:"bootable"`
	AvailabilityZone string             `json:"availability_zone"`
	VolumeType       string             `json:"volume_type"`
	Multiattach      bool               `json:"multiattach"`
	Encrypted        bool               `json:"encrypted"`
	UserID           string             `json:"user_id"`
	TenantID         string             `json:"os-vol-tenant-attr:tenant_id"`
	Host             string             `json:"os-vol-host-attr:host"`
	Links            []link             `json:"links"`
}

type volumeAttachment struct {
	ID           string `json:"id"`
	AttachmentID string `json:"attachment_id"`
	VolumeID     string `json:"volume_id"`
	ServerID     string `json:"server_id"`
	Device       string `json:"device"`
	HostName     string `json:"host_name"`
	AttachedAt   string `json:"attached_at"`
}

func (s *Server) renderVolume(v *volume) volumeJSON {
	out := volumeJSON{
		ID: v.ID, Name: v.Name, Description: v.Description, Size: v.Size, Status: v.Status,
		Attachments: []volumeAttachment{}, Metadata: v.Metadata, ImageMetadata: v.ImageMetadata,
		CreatedAt: v.Created.UTC().Format(cinderTime), UpdatedAt: v.Updated.UTC().Format(cinderTime),
		Bootable: strconv.FormatBool(v.Bootable), AvailabilityZone: "nova", VolumeType: "__DEFAULT__", UserID: s.userID, TenantID: s.projectID,
		Links: []link{{Href: s.http.URL + VolumePath + "/" + s.projectID + "/volumes/" + v.ID, Rel: "self"}},
		Host:  "cinder@lvm#lvm",
	}
	if sv, ok := s.servers[v.Server]; ok && v.Server != "" {
		out.Attachments = append(out.Attachments, volumeAttachment{ID: v.ID, AttachmentID: v.ID + "-" + sv.ID[:8], VolumeID: v.ID, ServerID: sv.ID, Device: "/dev/vd" + string(rune('a'+slices.Index(sv.Volumes, v.ID))), HostName: sv.Host, AttachedAt: v.Updated.UTC().Format(cinderTime)})
	}
	return out
}

// volumeHandler is a Cinder handler, called with s.mu held once the project
// in the path is known.
type volumeHandler func(w http.ResponseWriter, r *http.Request)

func (s *Server) volume(h volumeHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("project") != s.projectID {
			writeError(w, http.StatusNotFound, "itemNotFound", "The resource could not be found.")
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		h(w, r)
	}
}

func (s *Server) routeVolumes(mux *http.ServeMux) {
	for pattern, h := range map[string]volumeHandler{
		"GET /volumes":              s.listVolumes(false),
		"GET /volumes/detail":       s.listVolumes(true),
		"POST /volumes":             s.createVolume,
		"GET /volumes/{id}":         s.getVolume,
		"DELETE /volumes/{id}":      s.deleteVolume,
		"POST /volumes/{id}/action": s.volumeAction,
		// The stand-in takes no snapshots (the real services' tests do):
		// a volume it serves has none.
		"GET /snapshots/detail": func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"snapshots": []any{}})
		},
	} {
		method, p, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" "+VolumePath+"/{project}"+p, s.volume(h))
	}
}

// listVolumes filters by exact name and status, oldest first.
func (s *Server) listVolumes(detail bool) volumeHandler {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var list []*volume
		for _, v := range s.volumes {
			if (q.Get("name") == "" || q.Get("name") == v.Name) && (q.Get("status") == "" || q.Get("status") == v.Status) {
				list = append(list, v)
			}
		}
		slices.SortFunc(list, func(a, b *volume) int {
			if c := a.Created.Compare(b.Created); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
		out := []any{}
		for _, v := range list {
			if detail {
				out = append(out, s.renderVolume(v))
			} else {
				out = append(out, map[string]any{"id": v.ID, "name": v.Name, "links": s.renderVolume(v).Links})
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"volumes": out})
	}
}

func (s *Server) lookupVolume(w http.ResponseWriter, id string) *volume {
	v, ok := s.volumes[id]
	if !ok {
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Volume %s could not be found.", id))
	}
	return v
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	if v := s.lookupVolume(w, r.PathValue("id")); v != nil {
		writeJSON(w, http.StatusOK, map[string]any{"volume": s.renderVolume(v)})
	}
}

// createVolume creates an empty volume, creating until the transition
// delay has passed, then available. Sizes are in GiB.
func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Volume struct {
			Name        string            `json:"name"`
			Description string            `json:"description"`
			Size        int               `json:"size"`
			Metadata    map[string]string `json:"metadata"`
			ImageRef    string            `json:"imageRef"`
		} `json:"volume"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	in := req.Volume
	switch {
	case in.Size < 1:
		badRequest(w, "Invalid input received: volume size must be an integer and greater than 0")
		return
	case in.ImageRef != "":
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Image %s could not be found.", in.ImageRef))
		return
	}
	now := time.Now()
	v := &volume{ID: uuid.NewString(), Name: in.Name, Description: in.Description, Size: in.Size, Status: "creating", Metadata: map[string]string{}, Created: now, Updated: now, readyAt: now.Add(s.opts.TransitionDelay)}
	for k, val := range in.Metadata {
		v.Metadata[k] = val
	}
	s.volumes[v.ID] = v
	writeJSON(w, http.StatusAccepted, map[string]any{"volume": s.renderVolume(v)})
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	v := s.lookupVolume(w, r.PathValue("id"))
	if v == nil {
		return
	}
	if v.Status != "available" && v.Status != "error" {
		badRequest(w, "Invalid volume: Volume status must be available or error or error_restoring or error_extending or error_managing and must not be migrating, attached, belong to a group, have snapshots or be disassociated from snapshots after volume transfer.")
		return
	}
	if v.pending != nil {
		// Released by Cinder, still listed by Nova: Nova's last step of
		// the detach would never run for a volume no longer kept.
		v.pending.then(v)
	}
	delete(s.volumes, v.ID)
	w.WriteHeader(http.StatusAccepted)
}

// volumeAction serves os-set_image_metadata, how a boot volume says which
// firmware it needs (hw_firmware_type), os-set_bootable: Nova boots only
// from a volume marked bootable, which a new empty volume is not, and
// os-extend.
func (s *Server) volumeAction(w http.ResponseWriter, r *http.Request) {
	v := s.lookupVolume(w, r.PathValue("id"))
	if v == nil {
		return
	}
	var req struct {
		SetImageMetadata *struct {
			Metadata map[string]string `json:"metadata"`
		} `json:"os-set_image_metadata"`
		SetBootable *struct {
			Bootable bool `json:"bootable"`
		} `json:"os-set_bootable"`
		Extend *struct {
			NewSize int `json:"new_size"`
		} `json:"os-extend"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.Extend != nil {
		s.extendVolume(w, r, v, req.Extend.NewSize)
		return
	}
	if req.SetBootable != nil {
		v.Bootable, v.Updated = req.SetBootable.Bootable, time.Now()
		w.WriteHeader(http.StatusOK)
		return
	}
	if req.SetImageMetadata == nil {
		badRequest(w, "Invalid request body: no supported action")
		return
	}
	if v.ImageMetadata == nil {
		v.ImageMetadata = map[string]string{}
	}
	for k, val := range req.SetImageMetadata.Metadata {
		v.ImageMetadata[k] = val
	}
	v.Updated = time.Now()
	writeJSON(w, http.StatusOK, map[string]any{"metadata": v.ImageMetadata})
}

// extendMicroversion is the first block storage microversion that extends
// an attached (in-use) volume.
const extendMicroversion = 42

// extendVolume grows v to newSize GiB as Cinder's os-extend does: only
// larger, and an attached volume only from microversion 3.42 on (Cinder then
// tells Nova, which has the hypervisor grow the guest's disk). The stand-in
// grows it at once.
func (s *Server) extendVolume(w http.ResponseWriter, r *http.Request, v *volume, newSize int) {
	switch {
	case newSize <= v.Size:
		badRequest(w, "Invalid input received: New size for extend must be greater than current size. (current: %d, extended: %d).", v.Size, newSize)
	case v.Status == "in-use" && volumeMinor(r) < extendMicroversion, v.Status != "in-use" && v.Status != "available":
		badRequest(w, "Invalid volume: Volume %s status must be available or in-use (microversion 3.42), but current status is: %s.", v.ID, v.Status)
	default:
		v.Size, v.Updated = newSize, time.Now()
		w.WriteHeader(http.StatusAccepted)
	}
}

// volumeMinor is the block storage microversion's minor number the request
// asks for: Cinder's base, 3.0, when it names none.
func volumeMinor(r *http.Request) int {
	f := strings.Fields(r.Header.Get("OpenStack-API-Version"))
	if len(f) != 2 || f[0] != "volume" {
		return 0
	}
	_, minor, _ := strings.Cut(f[1], ".")
	n, _ := strconv.Atoi(minor)
	return n
}
