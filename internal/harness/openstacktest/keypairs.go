package openstacktest

import (
	"crypto/md5" //nolint:gosec // Nova's keypair fingerprint is MD5
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

type keypair struct {
	Name, PublicKey, Fingerprint, Type string
	Created                            time.Time
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
