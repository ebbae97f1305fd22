package nova

import (
	"context"
	"net/http"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Server metadata keys of orphans and imported servers.
const (
	// MetaOrphaned marks a server released from its VM: the driver no
	// longer manages it; MetaNamespace/MetaName say which VM it was.
	MetaOrphaned = "virtfleet-orphaned"
	// MetaSeal is the hub's seal of the release, reported with the orphan.
	MetaSeal = "virtfleet-seal"
	// MetaImported marks a server a VM took over that was not made for a
	// VM of its name: its flavor and volumes are never changed.
	MetaImported = "virtfleet-imported"
)

var _ driver.Adopter = (*Driver)(nil)

// Release implements driver.Adopter: the server's metadata says it is
// orphaned; nothing else of it changes.
func (d *Driver) Release(ctx context.Context, uid, seal string) error {
	defer d.lock(uid)()
	found, err := d.find(ctx, uid)
	if err != nil {
		return err
	}
	for _, s := range found {
		if err := d.setMetadata(ctx, s, map[string]string{MetaOrphaned: "true", MetaSeal: seal}); err != nil {
			return err
		}
	}
	d.forget(uid)
	d.forgetMigration(uid)
	return nil
}

// orphan is whether s is an orphan of this node.
func (d *Driver) orphan(s servers.Server) bool {
	return s.Metadata[MetaUID] != "" && s.Metadata[MetaNode] == d.node && s.Metadata[MetaOrphaned] != ""
}

// Orphans implements driver.Adopter.
func (d *Driver) Orphans(ctx context.Context) ([]driver.Observation, error) {
	all, err := d.listServers(ctx, servers.ListOpts{})
	if err != nil {
		return nil, err
	}
	var out []driver.Observation
	for _, s := range all {
		if !d.orphan(s) || s.Status == "DELETED" {
			continue
		}
		o := d.observation(s.Metadata[MetaUID], s)
		o.OrphanOf = &driver.VMRef{Namespace: s.Metadata[MetaNamespace], Name: s.Metadata[MetaName], Seal: s.Metadata[MetaSeal]}
		out = append(out, o)
	}
	return out, nil
}

// target finds the server ref names. An orphan is found by its name and
// metadata; uid is the claiming VM's, which an orphan half claimed by an
// agent that stopped midway already names.
func (d *Driver) target(ctx context.Context, ref driver.Ref, uid string) (servers.Server, error) {
	if ref.Orphan == "" {
		s, err := servers.Get(ctx, d.c.compute, ref.ExternalName).Extract()
		if statusOf(err) == http.StatusNotFound || (err == nil && s.Status == "DELETED") {
			return servers.Server{}, driver.NotFoundf("no server %s in the cloud of node %s", ref.ExternalName, d.node)
		}
		if err != nil {
			return servers.Server{}, classify(err, "cannot read server "+ref.ExternalName)
		}
		return *s, nil
	}
	all, err := d.listServers(ctx, servers.ListOpts{Name: "^" + serverName(ref.Orphan) + "$"})
	if err != nil {
		return servers.Server{}, err
	}
	for _, s := range all {
		if d.orphan(s) && (s.Metadata[MetaUID] == ref.Orphan || s.Metadata[MetaUID] == uid) {
			return s, nil
		}
	}
	return servers.Server{}, driver.NotFoundf("no orphan %s on node %s", ref.Orphan, d.node)
}

// Claim implements driver.Adopter. The server takes the claiming VM's name
// and metadata (Nova renames a running server in place); an orphan adopted
// by the VM of its name is driven like one the VM made, any other server
// is imported: its power state and restarts are managed, its flavor and
// volumes never changed.
func (d *Driver) Claim(ctx context.Context, m driver.Machine, ref driver.Ref) error {
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	defer d.lock(m.UID)()
	if found, err := d.find(ctx, m.UID); err != nil || len(found) > 0 {
		return err // nil: claimed before
	}
	s, err := d.target(ctx, ref, m.UID)
	if err != nil {
		return err
	}
	md := s.Metadata
	if md[MetaUID] != "" && md[MetaOrphaned] == "" {
		return driver.Terminalf("server %s is already managed by VirtualMachine %s/%s (uid %s); a guest has one VirtualMachine", s.ID, md[MetaNamespace], md[MetaName], md[MetaUID])
	}
	adopt := md[MetaUID] != "" && md[MetaNamespace] == m.Namespace && md[MetaName] == m.Name
	next := map[string]string{MetaUID: m.UID, MetaNode: d.node, MetaNamespace: m.Namespace, MetaName: m.Name, MetaNonce: m.RestartNonce}
	if m.ResetNonce != "" {
		// Taking a server over never resets it, as it never restarts it.
		next[MetaReset] = m.ResetNonce
	}
	if !adopt {
		live := shapeHash(m)
		next[MetaImported], next[MetaShape], next[MetaLive] = "true", live, live
	}
	if err := d.setMetadata(ctx, s, next); err != nil {
		return err
	}
	if _, err := servers.Update(ctx, d.c.compute, s.ID, servers.UpdateOpts{Name: serverName(m.UID)}).Extract(); err != nil {
		return classify(err, "cannot rename server "+s.ID)
	}
	if err := servers.DeleteMetadatum(ctx, d.c.compute, s.ID, MetaOrphaned).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
		return classify(err, "cannot clear the orphan mark of server "+s.ID)
	}
	got, err := servers.Get(ctx, d.c.compute, s.ID).Extract()
	if err != nil {
		return classify(err, "cannot read server "+s.ID)
	}
	d.remember(m.UID, *got, d.now())
	return nil
}

// ObserveRef implements driver.Adopter.
func (d *Driver) ObserveRef(ctx context.Context, ref driver.Ref) (driver.Observation, error) {
	s, err := d.target(ctx, ref, "")
	if err != nil {
		return driver.Observation{}, err
	}
	o := d.observation(s.Metadata[MetaUID], s)
	o.RestartRequired = false
	return o, nil
}

// imported is whether s was imported: its shape is its own.
func imported(md map[string]string) bool { return md[MetaImported] != "" }
