package openstacktest

import (
	"encoding/json"
	"net/http"
	"slices"
	"time"
)

// actionRequest is the body of a POST /servers/{id}/action: one key, the
// action, whose value may be null (os-start, os-stop).
type actionRequest map[string]json.RawMessage

type rebootAction struct {
	Type string `json:"type"`
}

type resizeAction struct {
	FlavorRef string `json:"flavorRef"`
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
