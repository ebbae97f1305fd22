package openstacktest

import (
	"fmt"
	"net/http"
	"slices"
	"time"
)

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

// attachVolume attaches an available volume to an active or stopped server
// as Nova does with Cinder's attachments: the server lists it at once, and
// Cinder has it "attaching" until the compute host finished, a transition
// delay later, and "in-use" from then on.
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
	case slices.Contains(sv.Volumes, v.ID):
		badRequest(w, "Invalid volume: volume %s already attached", v.ID)
		return
	case v.Status != "available":
		badRequest(w, "Invalid volume: volume %s status must be available, but current status is: %s.", v.ID, v.Status)
		return
	case sv.TaskState != "" || (sv.Status != StatusActive && sv.Status != StatusShutoff):
		conflict(w, sv, "attach_volume")
		return
	}
	v.Status, v.Server, v.Updated = "attaching", sv.ID, time.Now()
	v.pending = &volumeStep{at: time.Now().Add(s.opts.TransitionDelay), then: func(v *volume) { v.attach(sv.ID) }}
	sv.Volumes = append(sv.Volumes, v.ID)
	sv.Updated = time.Now()
	all := attachments(sv)
	writeJSON(w, http.StatusOK, map[string]any{"volumeAttachment": all[len(all)-1]})
}

// detachVolume detaches a volume that is not the root device, in Nova's
// steps: Cinder must have it "in-use" (attached), as begin_detaching asks,
// and has it "detaching" until the compute host released it, a transition
// delay later; Cinder then has it "available" while the server still lists
// it, for another transition delay, before Nova drops it.
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
	v, ok := s.volumes[id]
	switch {
	case !ok:
		// Deleted while Nova still listed it, after Cinder released it.
		writeError(w, http.StatusNotFound, "itemNotFound", fmt.Sprintf("Volume %s could not be found.", id))
		return
	case v.Status != "in-use":
		badRequest(w, "Invalid volume: Unable to detach volume. Volume status must be 'in-use' and attach_status must be 'attached' to detach.")
		return
	}
	v.Status, v.Updated = "detaching", time.Now()
	delay := s.opts.TransitionDelay
	v.pending = &volumeStep{at: time.Now().Add(delay), then: func(v *volume) {
		v.detach()
		v.pending = &volumeStep{at: time.Now().Add(delay), then: func(*volume) {
			if i := slices.Index(sv.Volumes, id); i > 0 {
				sv.Volumes = slices.Delete(sv.Volumes, i, i+1)
				sv.Updated = time.Now()
			}
		}}
	}}
	w.WriteHeader(http.StatusAccepted)
}
