package openstacktest

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

type flavor struct {
	ID, Name                          string
	VCPUs, RAM, Disk, Swap, Ephemeral int
	Public                            bool
	Description                       string
	// access lists the projects a private flavor may be used by.
	access []string
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
