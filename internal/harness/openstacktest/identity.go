package openstacktest

import (
	"crypto/subtle"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Keystone v3: password authentication for the one user, scoped to the one
// project, answering a token in X-Subject-Token and the service catalog.

type authRequest struct {
	Auth struct {
		Identity struct {
			Methods  []string `json:"methods"`
			Password struct {
				User struct {
					ID       string    `json:"id"`
					Name     string    `json:"name"`
					Password string    `json:"password"`
					Domain   reference `json:"domain"`
				} `json:"user"`
			} `json:"password"`
		} `json:"identity"`
		Scope *struct {
			Project *struct {
				ID     string    `json:"id"`
				Name   string    `json:"name"`
				Domain reference `json:"domain"`
			} `json:"project"`
		} `json:"scope"`
	} `json:"auth"`
}

// reference names a domain by id or name.
type reference struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

type tokenBody struct {
	Token token `json:"token"`
}

type token struct {
	Methods   []string       `json:"methods"`
	ExpiresAt string         `json:"expires_at"`
	IssuedAt  string         `json:"issued_at"`
	User      named          `json:"user"`
	Project   named          `json:"project"`
	Roles     []named        `json:"roles"`
	Catalog   []catalogEntry `json:"catalog"`
}

type named struct {
	ID     string     `json:"id"`
	Name   string     `json:"name"`
	Domain *reference `json:"domain,omitempty"`
}

type catalogEntry struct {
	ID        string     `json:"id"`
	Type      string     `json:"type"`
	Name      string     `json:"name"`
	Endpoints []endpoint `json:"endpoints"`
}

type endpoint struct {
	ID        string `json:"id"`
	Interface string `json:"interface"`
	Region    string `json:"region"`
	RegionID  string `json:"region_id"`
	URL       string `json:"url"`
}

func (s *Server) routeIdentity(mux *http.ServeMux) {
	mux.HandleFunc("POST "+IdentityPath+"/v3/auth/tokens", s.issueToken)
}

func isIdentity(p string) bool { return strings.HasPrefix(p, IdentityPath+"/") }

func (s *Server) issueToken(w http.ResponseWriter, r *http.Request) {
	var req authRequest
	if !readJSON(w, r, &req) {
		return
	}
	a := req.Auth
	user := a.Identity.Password.User
	switch {
	case len(a.Identity.Methods) != 1 || a.Identity.Methods[0] != "password":
		writeError(w, http.StatusUnauthorized, "error", "only password authentication is supported")
		return
	case !s.knownUser(user.ID, user.Name, user.Domain) || subtle.ConstantTimeCompare([]byte(user.Password), []byte(s.opts.Password)) != 1:
		writeError(w, http.StatusUnauthorized, "error", "The request you have made requires authentication.")
		return
	case a.Scope == nil || a.Scope.Project == nil:
		writeError(w, http.StatusBadRequest, "error", "only project-scoped tokens are supported")
		return
	}
	p := a.Scope.Project
	if p.ID != s.projectID && (p.Name != s.opts.Project || !s.knownDomain(p.Domain)) {
		writeError(w, http.StatusUnauthorized, "error", "the project in the scope does not exist")
		return
	}
	now := time.Now()
	id := "gAAAA" + hexID() + hexID()
	s.mu.Lock()
	s.tokens[id] = now.Add(s.opts.TokenLifetime)
	s.issued++
	s.mu.Unlock()
	w.Header().Set("X-Subject-Token", id)
	domain := &reference{ID: "default", Name: s.opts.Domain}
	writeJSON(w, http.StatusCreated, tokenBody{Token: token{
		Methods:   []string{"password"},
		ExpiresAt: now.Add(s.opts.TokenLifetime).UTC().Format(time.RFC3339Nano),
		IssuedAt:  now.UTC().Format(time.RFC3339Nano),
		User:      named{ID: s.userID, Name: s.opts.Username, Domain: domain},
		Project:   named{ID: s.projectID, Name: s.opts.Project, Domain: domain},
		Roles:     []named{{ID: "admin", Name: "admin"}},
		Catalog:   s.catalog(),
	}})
}

func (s *Server) knownUser(id, name string, domain reference) bool {
	if id != "" {
		return id == s.userID
	}
	return name == s.opts.Username && s.knownDomain(domain)
}

func (s *Server) knownDomain(d reference) bool {
	return d.ID == "default" || d.Name == s.opts.Domain
}

func (s *Server) catalog() []catalogEntry {
	entry := func(typ, name, url string) catalogEntry {
		e := catalogEntry{ID: hexID(), Type: typ, Name: name}
		for _, iface := range []string{"public", "internal"} {
			e.Endpoints = append(e.Endpoints, endpoint{ID: hexID(), Interface: iface, Region: s.opts.Region, RegionID: s.opts.Region, URL: url})
		}
		return e
	}
	base := s.http.URL
	return []catalogEntry{
		entry("identity", "keystone", base+IdentityPath+"/v3"),
		entry("compute", "nova", base+ComputePath),
		entry("volumev3", "cinderv3", base+VolumePath+"/"+s.projectID),
		entry("network", "neutron", base+NetworkPath),
	}
}

// authorized reports whether r carries a token that is valid now. Callers
// hold s.mu.
func (s *Server) authorized(r *http.Request) bool {
	exp, ok := s.tokens[r.Header.Get("X-Auth-Token")]
	return ok && time.Now().Before(exp)
}

// ExpireTokens makes every token issued so far invalid, as if its lifetime
// had passed: the next request with one is answered 401.
func (s *Server) ExpireTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.tokens {
		s.tokens[id] = time.Time{}
	}
}

// TokensIssued counts the tokens Keystone issued.
func (s *Server) TokensIssued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.issued
}

// Tokens lists the tokens issued so far, for tests that check none leaks.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.tokens))
}
