package openstacktest

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Neutron, networking API v2.0: networks and IPv4 subnets, whose addresses
// servers get when they finish building.

type network struct {
	ID, Name, Description string
	Subnets               []string
	Created               time.Time
}

type subnet struct {
	ID, Name, NetworkID string
	Prefix              netip.Prefix
	Gateway             netip.Addr
	Created             time.Time
	used                map[string]bool
}

// allocate hands out the subnet's lowest free address after the gateway.
func (sn *subnet) allocate() string {
	base := binary.BigEndian.Uint32(sn.Prefix.Masked().Addr().AsSlice())
	size := uint32(1) << (32 - sn.Prefix.Bits())
	for off := uint32(2); off < size-1; off++ {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], base+off)
		ip := netip.AddrFrom4(b)
		if ip != sn.Gateway && !sn.used[ip.String()] {
			sn.used[ip.String()] = true
			return ip.String()
		}
	}
	return ""
}

func (sn *subnet) release(ip string) { delete(sn.used, ip) }

// free says why ip cannot be a port's fixed IP on the subnet, as Neutron
// refuses it, or "" when it can.
func (sn *subnet) free(ip string) string {
	a, err := netip.ParseAddr(ip)
	switch {
	case err != nil || !sn.Prefix.Contains(a):
		return fmt.Sprintf("IP address %s is not a valid IP for the specified subnet.", ip)
	case a == sn.Gateway || sn.used[ip]:
		return fmt.Sprintf("Fixed IP address %s is already in use.", ip)
	}
	return ""
}

type networkJSON struct {
	ID           string   `json:"id"`
	Name         string   `json:"name"`
	Description  string   `json:"description"`
	AdminStateUp bool     `json:"admin_state_up"`
	Status       string   `json:"status"`
	Subnets      []string `json:"subnets"`
	TenantID     string   `json:"tenant_id"`
	ProjectID    string   `json:"project_id"`
	Shared       bool     `json:"shared"`
	Tags         []string `json:"tags"`
	CreatedAt    string   `json:"created_at"`
	UpdatedAt    string   `json:"updated_at"`
}

type subnetJSON struct {
	ID              string           `json:"id"`
	Name            string           `json:"name"`
	NetworkID       string           `json:"network_id"`
	IPVersion       int              `json:"ip_version"`
	CIDR            string           `json:"cidr"`
	GatewayIP       string           `json:"gateway_ip"`
	EnableDHCP      bool             `json:"enable_dhcp"`
	AllocationPools []allocationPool `json:"allocation_pools"`
	DNSNameservers  []string         `json:"dns_nameservers"`
	HostRoutes      []string         `json:"host_routes"`
	TenantID        string           `json:"tenant_id"`
	ProjectID       string           `json:"project_id"`
	Tags            []string         `json:"tags"`
	CreatedAt       string           `json:"created_at"`
	UpdatedAt       string           `json:"updated_at"`
}

type allocationPool struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

func (s *Server) renderNetwork(n *network) networkJSON {
	return networkJSON{ID: n.ID, Name: n.Name, Description: n.Description, AdminStateUp: true, Status: "ACTIVE",
		Subnets: slices.Clone(n.Subnets), TenantID: s.projectID, ProjectID: s.projectID, Tags: []string{},
		CreatedAt: stamp(n.Created), UpdatedAt: stamp(n.Created)}
}

func (s *Server) renderSubnet(sn *subnet) subnetJSON {
	base := binary.BigEndian.Uint32(sn.Prefix.Masked().Addr().AsSlice())
	size := uint32(1) << (32 - sn.Prefix.Bits())
	addr := func(off uint32) string {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], base+off)
		return netip.AddrFrom4(b).String()
	}
	return subnetJSON{ID: sn.ID, Name: sn.Name, NetworkID: sn.NetworkID, IPVersion: 4, CIDR: sn.Prefix.String(),
		GatewayIP: sn.Gateway.String(), EnableDHCP: true, AllocationPools: []allocationPool{{Start: addr(2), End: addr(size - 2)}},
		DNSNameservers: []string{}, HostRoutes: []string{}, TenantID: s.projectID, ProjectID: s.projectID, Tags: []string{},
		CreatedAt: stamp(sn.Created), UpdatedAt: stamp(sn.Created)}
}

// networkHandler is a Neutron handler, called with s.mu held.
type networkHandler func(w http.ResponseWriter, r *http.Request)

func (s *Server) routeNetwork(mux *http.ServeMux) {
	// Version discovery on the unversioned endpoint the catalog lists.
	mux.HandleFunc("GET "+NetworkPath+"/{$}", func(w http.ResponseWriter, _ *http.Request) {
		type version struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Links  []link `json:"links"`
		}
		writeJSON(w, http.StatusOK, map[string][]version{"versions": {{ID: "v2.0", Status: "CURRENT", Links: []link{{Href: s.http.URL + NetworkPath + "/v2.0/", Rel: "self"}}}}})
	})
	for pattern, h := range map[string]networkHandler{
		"GET /v2.0/networks":         s.listNetworks,
		"POST /v2.0/networks":        s.createNetwork,
		"GET /v2.0/networks/{id}":    s.getNetwork,
		"DELETE /v2.0/networks/{id}": s.deleteNetwork,
		"GET /v2.0/subnets":          s.listSubnets,
		"POST /v2.0/subnets":         s.createSubnet,
	} {
		method, p, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" "+NetworkPath+p, func(w http.ResponseWriter, r *http.Request) {
			s.mu.Lock()
			defer s.mu.Unlock()
			h(w, r)
		})
	}
}

func neutronError(w http.ResponseWriter, status int, typ, message string) {
	writeJSON(w, status, map[string]map[string]string{"NeutronError": {"type": typ, "message": message, "detail": ""}})
}

// listNetworks filters by exact name and id, oldest first.
func (s *Server) listNetworks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var list []*network
	for _, n := range s.networks {
		if (q.Get("name") == "" || q.Get("name") == n.Name) && (q.Get("id") == "" || q.Get("id") == n.ID) {
			list = append(list, n)
		}
	}
	slices.SortFunc(list, func(a, b *network) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := []networkJSON{}
	for _, n := range list {
		out = append(out, s.renderNetwork(n))
	}
	writeJSON(w, http.StatusOK, map[string]any{"networks": out})
}

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	n, ok := s.networks[r.PathValue("id")]
	if !ok {
		neutronError(w, http.StatusNotFound, "NetworkNotFound", fmt.Sprintf("Network %s could not be found.", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"network": s.renderNetwork(n)})
}

func (s *Server) createNetwork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Network struct {
			Name        string `json:"name"`
			Description string `json:"description"`
		} `json:"network"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	n := &network{ID: uuid.NewString(), Name: req.Network.Name, Description: req.Network.Description, Created: time.Now()}
	s.networks[n.ID] = n
	writeJSON(w, http.StatusCreated, map[string]any{"network": s.renderNetwork(n)})
}

// deleteNetwork refuses a network a server has a port on.
func (s *Server) deleteNetwork(w http.ResponseWriter, r *http.Request) {
	n, ok := s.networks[r.PathValue("id")]
	if !ok {
		neutronError(w, http.StatusNotFound, "NetworkNotFound", fmt.Sprintf("Network %s could not be found.", r.PathValue("id")))
		return
	}
	for _, sv := range s.servers {
		if sv.Status != StatusDeleted && slices.Contains(sv.Networks, n.ID) {
			neutronError(w, http.StatusConflict, "NetworkInUse", fmt.Sprintf("Unable to complete operation on network %s. There are one or more ports still in use on the network.", n.ID))
			return
		}
	}
	for _, id := range n.Subnets {
		delete(s.subnets, id)
	}
	delete(s.networks, n.ID)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listSubnets(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var list []*subnet
	for _, sn := range s.subnets {
		if (q.Get("network_id") == "" || q.Get("network_id") == sn.NetworkID) && (q.Get("name") == "" || q.Get("name") == sn.Name) {
			list = append(list, sn)
		}
	}
	slices.SortFunc(list, func(a, b *subnet) int { return a.Created.Compare(b.Created) })
	out := []subnetJSON{}
	for _, sn := range list {
		out = append(out, s.renderSubnet(sn))
	}
	writeJSON(w, http.StatusOK, map[string]any{"subnets": out})
}

// createSubnet creates an IPv4 subnet whose gateway is its first address
// unless given.
func (s *Server) createSubnet(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Subnet struct {
			Name      string  `json:"name"`
			NetworkID string  `json:"network_id"`
			CIDR      string  `json:"cidr"`
			IPVersion int     `json:"ip_version"`
			GatewayIP *string `json:"gateway_ip"`
		} `json:"subnet"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	in := req.Subnet
	n, ok := s.networks[in.NetworkID]
	if !ok {
		neutronError(w, http.StatusNotFound, "NetworkNotFound", fmt.Sprintf("Network %s could not be found.", in.NetworkID))
		return
	}
	prefix, err := netip.ParsePrefix(in.CIDR)
	if err != nil || !prefix.Addr().Is4() || prefix.Bits() > 30 || (in.IPVersion != 0 && in.IPVersion != 4) {
		neutronError(w, http.StatusBadRequest, "HTTPBadRequest", fmt.Sprintf("Invalid input for cidr. Reason: '%s' is not a valid IPv4 subnet of at least 4 addresses.", in.CIDR))
		return
	}
	prefix = prefix.Masked()
	for _, id := range n.Subnets {
		if s.subnets[id].Prefix.Overlaps(prefix) {
			neutronError(w, http.StatusBadRequest, "HTTPBadRequest", fmt.Sprintf("Invalid input for operation: Requested subnet with cidr: %s for network: %s overlaps with another subnet.", prefix, n.ID))
			return
		}
	}
	gw := prefix.Addr().Next()
	if in.GatewayIP != nil {
		if gw, err = netip.ParseAddr(*in.GatewayIP); err != nil || !prefix.Contains(gw) {
			neutronError(w, http.StatusBadRequest, "HTTPBadRequest", fmt.Sprintf("Invalid input for gateway_ip: %q is not in %s.", *in.GatewayIP, prefix))
			return
		}
	}
	sn := &subnet{ID: uuid.NewString(), Name: in.Name, NetworkID: n.ID, Prefix: prefix, Gateway: gw, Created: time.Now(), used: map[string]bool{}}
	s.subnets[sn.ID] = sn
	n.Subnets = append(n.Subnets, sn.ID)
	writeJSON(w, http.StatusCreated, map[string]any{"subnet": s.renderSubnet(sn)})
}
