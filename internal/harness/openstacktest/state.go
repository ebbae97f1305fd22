package openstacktest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// What a test reads and changes behind the API's back.

// ServerState is a server as the cloud holds it.
type ServerState struct {
	ID, Name, Status, TaskState, Host string
	FlavorID, FlavorName              string
	VCPUs, RAMMB, SwapMB              int
	KeyName                           string
	Metadata                          map[string]string
	// UserData is as the create request carried it, base64.
	UserData string
	// Volumes are the attached volumes' ids, the boot volume first.
	Volumes   []string
	Networks  []string
	Addresses []Address
	Fault     string
	// Actions are the server actions accepted, in order (os-start,
	// resize, confirmResize, ...).
	Actions []string
}

// FlavorState is a flavor.
type FlavorState struct {
	ID, Name             string
	VCPUs, RAMMB, SwapMB int
	Public               bool
}

// VolumeState is a Cinder volume.
type VolumeState struct {
	ID, Name, Status, Server string
	SizeGiB                  int
	ImageMetadata            map[string]string
}

// NetworkState is a Neutron network and its subnets' CIDRs.
type NetworkState struct {
	ID, Name, Description string
	CIDRs                 []string
}

// Servers lists the servers that are not deleted, oldest first.
func (s *Server) Servers() []ServerState {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	var out []ServerState
	for _, sv := range s.servers {
		if sv.Status == StatusDeleted {
			continue
		}
		out = append(out, ServerState{
			ID: sv.ID, Name: sv.Name, Status: sv.Status, TaskState: sv.TaskState, Host: sv.Host,
			FlavorID: sv.Flavor.ID, FlavorName: sv.Flavor.Name, VCPUs: sv.Flavor.VCPUs, RAMMB: sv.Flavor.RAM, SwapMB: sv.Flavor.Swap,
			KeyName: sv.KeyName, Metadata: maps.Clone(sv.Metadata), UserData: sv.UserData,
			Volumes: slices.Clone(sv.Volumes), Networks: slices.Clone(sv.Networks), Addresses: slices.Clone(sv.Addresses), Fault: sv.Fault,
			Actions: slices.Clone(sv.actions),
		})
	}
	slices.SortFunc(out, func(a, b ServerState) int {
		return s.servers[a.ID].Created.Compare(s.servers[b.ID].Created)
	})
	return out
}

// SetServerStatus forces a server into status, as an operator or a failing
// compute host would; fault is the message of an ERROR server's fault. A
// transition under way is dropped.
func (s *Server) SetServerStatus(id, status, fault string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sv, ok := s.servers[id]
	if !ok || sv.Status == StatusDeleted {
		return fmt.Errorf("no server %s", id)
	}
	if !slices.Contains(Statuses, status) {
		return fmt.Errorf("%s is not a Nova server status", status)
	}
	sv.Status, sv.TaskState, sv.pending, sv.Fault, sv.Updated = status, "", nil, fault, time.Now()
	return nil
}

// Flavors lists every flavor, public and private, by name.
func (s *Server) Flavors() []FlavorState {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []FlavorState
	for _, f := range s.flavors {
		out = append(out, FlavorState{ID: f.ID, Name: f.Name, VCPUs: f.VCPUs, RAMMB: f.RAM, SwapMB: f.Swap, Public: f.Public})
	}
	slices.SortFunc(out, func(a, b FlavorState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Keypairs lists the keypairs' names, sorted.
func (s *Server) Keypairs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.keypairs))
}

// Volumes lists the volumes by name.
func (s *Server) Volumes() []VolumeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	var out []VolumeState
	for _, v := range s.volumes {
		out = append(out, VolumeState{ID: v.ID, Name: v.Name, Status: v.Status, Server: v.Server, SizeGiB: v.Size, ImageMetadata: maps.Clone(v.ImageMetadata)})
	}
	slices.SortFunc(out, func(a, b VolumeState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Networks lists the networks by name.
func (s *Server) Networks() []NetworkState {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []NetworkState
	for _, n := range s.networks {
		ns := NetworkState{ID: n.ID, Name: n.Name, Description: n.Description}
		for _, id := range n.Subnets {
			ns.CIDRs = append(ns.CIDRs, s.subnets[id].Prefix.String())
		}
		out = append(out, ns)
	}
	slices.SortFunc(out, func(a, b NetworkState) int { return strings.Compare(a.Name, b.Name) })
	return out
}
