package nova

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/volumeattach"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// serverName is the server's name: deterministic, so a create can be looked
// for by name before it is made.
func serverName(uid string) string { return Prefix + uid }

// validate rejects Machines no cloud could run.
func validate(m driver.Machine) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if m.PublicKey != "" {
		if _, err := keypairName(m.PublicKey); err != nil {
			return err
		}
	}
	return nil
}

// shapeHash identifies what only a start applies: the flavor's shape.
// Extra disks are attached and detached while the server runs, so they
// are not part of it. The hash is prefixed with shapeVersion: a MetaLive
// without it was written when the hash covered the extra disks too.
func shapeHash(m driver.Machine) string { return hashShape(shapeOf(m)) }

// shapeVersion marks a shape hash that covers the flavor alone.
const shapeVersion = "f1-"

func hashShape(sh shape) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d/%d/%d", sh.VCPU, sh.RAMMiB, sh.SwapMiB))
	return shapeVersion + hex.EncodeToString(sum[:8])
}

// flavorShape is the shape a server runs with, from the flavor it embeds.
func flavorShape(s servers.Server) shape {
	n := func(k string) int {
		switch v := s.Flavor[k].(type) {
		case float64:
			return int(v)
		case json.Number:
			i, _ := v.Int64()
			return int(i)
		}
		return 0
	}
	return shape{VCPU: n("vcpus"), RAMMiB: n("ram"), SwapMiB: n("swap")}
}

// find looks the uid's servers up by name and metadata, oldest first.
func (d *Driver) find(ctx context.Context, uid string) ([]servers.Server, error) {
	all, err := d.listServers(ctx, servers.ListOpts{Name: "^" + serverName(uid) + "$"})
	if err != nil {
		return nil, err
	}
	all = slices.DeleteFunc(all, func(s servers.Server) bool {
		u, ok := d.ours(s)
		return !ok || u != uid
	})
	slices.SortFunc(all, func(a, b servers.Server) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return all, nil
}

// Ensure implements driver.Driver.
func (d *Driver) Ensure(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	if err := validate(m); err != nil {
		return driver.Observation{}, err
	}
	defer d.lock(m.UID)()
	s, ok := d.cached(m.UID)
	if ok && transitional(s) {
		// Mid-transition the view, a poll interval old, is too stale to act
		// on; steady servers cost no call.
		at := d.now()
		got, err := servers.Get(ctx, d.c.compute, s.ID).Extract()
		switch {
		case statusOf(err) == http.StatusNotFound:
			d.forget(m.UID)
			ok = false
		case err != nil:
			return driver.Observation{}, classify(err, "cannot read server "+s.ID)
		default:
			s = *got
			d.remember(m.UID, s, at)
		}
	}
	if !ok {
		// The view may lag behind a create that answered late or an agent
		// that stopped mid-create: look before creating.
		found, err := d.find(ctx, m.UID)
		if err != nil {
			return driver.Observation{}, err
		}
		if len(found) == 0 {
			o, err := d.create(ctx, m)
			if s, ok = d.cached(m.UID); err != nil || !ok || transitional(s) {
				return o, err
			}
			// Nova booted it before it was read back: it is converged now,
			// as the next call would, so that its extra disks are attached
			// without waiting for a call a Running guest may not get soon.
		} else {
			for _, dup := range found[1:] {
				if err := servers.Delete(ctx, d.c.compute, dup.ID).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
					return driver.Observation{}, classify(err, "cannot delete duplicate server "+dup.ID)
				}
			}
			s = found[0]
			d.remember(m.UID, s, time.Time{})
		}
	}
	if boot := s.Metadata[MetaBoot]; boot != "" && boot != m.Disks[0].Name {
		return driver.Observation{}, driver.Terminalf("the boot disk of server %s is %s and cannot be changed to %s on nova; delete and recreate the VirtualMachine", s.ID, boot, m.Disks[0].Name)
	}
	o, err := d.converge(ctx, m, s)
	if err != nil || imported(s.Metadata) {
		// An imported server keeps its own volumes.
		return o, err
	}
	if msg := d.growDisks(ctx, m); msg != "" {
		o.Message = strings.TrimPrefix(o.Message+"; "+msg, "; ")
	}
	return o, nil
}

// create makes what the server needs, then the server. Volumes still being
// created make it return Provisioning: it never waits.
func (d *Driver) create(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	provisioning := func(msg string) (driver.Observation, error) {
		return driver.Observation{UID: m.UID, Phase: driver.PhaseProvisioning, Node: d.node, Message: msg}, nil
	}
	var nets []servers.Network
	for _, n := range m.Networks {
		id, err := d.ensureNetwork(ctx, n)
		if err != nil {
			return driver.Observation{}, err
		}
		net := servers.Network{UUID: id}
		if n.Address.IsValid() {
			// The hub's address for the interface: Neutron puts it on the
			// server's port, and its DHCP or config drive gives it.
			net.FixedIP = n.Address.Addr().String()
		}
		nets = append(nets, net)
	}
	var boot *volumes.Volume
	for i, disk := range m.Disks {
		v, err := d.ensureVolume(ctx, disk)
		if progress := importing(err); progress != "" {
			return provisioning(progress)
		}
		if err != nil {
			return driver.Observation{}, err
		}
		d.cacheVolume(disk.Name, v.ID)
		switch {
		case v.Status == "creating" || v.Status == "downloading":
			return provisioning(fmt.Sprintf("waiting for volume %s to be created", disk.Name))
		case strings.HasPrefix(v.Status, "error"):
			return driver.Observation{}, driver.Failingf("volume %s is in status %s in Cinder", disk.Name, v.Status)
		case i == 0 && v.Status != "available":
			return driver.Observation{}, driver.Failingf("boot volume %s is %s, not available: is another server using it?", disk.Name, v.Status)
		case i == 0:
			boot = v
		}
	}
	if boot.Bootable != "true" {
		// Nova boots only from a volume Cinder marks bootable (400 "Block
		// Device … is not bootable"); an empty volume is not, until told.
		if err := volumes.SetBootable(ctx, d.c.volume, boot.ID, volumes.BootableOpts{Bootable: true}).ExtractErr(); err != nil {
			return driver.Observation{}, classify(err, "cannot mark boot volume "+boot.Name+" bootable")
		}
	}
	if m.Firmware == driver.FirmwareUEFI && boot.VolumeImageMetadata["hw_firmware_type"] != "uefi" {
		err := volumes.SetImageMetadata(ctx, d.c.volume, boot.ID, volumes.ImageMetadataOpts{Metadata: map[string]string{"hw_firmware_type": "uefi", "hw_machine_type": "q35"}}).ExtractErr()
		if err != nil {
			return driver.Observation{}, classify(err, "cannot mark boot volume "+boot.Name+" as needing UEFI")
		}
	}

	d.shared.RLock()
	defer d.shared.RUnlock()
	keyName := ""
	if m.PublicKey != "" {
		var err error
		if keyName, err = d.ensureKeypair(ctx, m.PublicKey); err != nil {
			return driver.Observation{}, err
		}
	}
	fl, err := d.ensureFlavor(ctx, shapeOf(m))
	if err != nil {
		return driver.Observation{}, err
	}
	opts := servers.CreateOpts{
		Name:      serverName(m.UID),
		FlavorRef: fl.ID,
		Networks:  "none",
		Metadata: map[string]string{
			MetaUID: m.UID, MetaNode: d.node, MetaNamespace: m.Namespace, MetaName: m.Name, MetaBoot: m.Disks[0].Name,
			MetaShape: shapeHash(m), MetaLive: shapeHash(m), MetaNonce: m.RestartNonce, MetaRestarts: restartsAfterRevert(boot, m.UID),
		},
		BlockDevice: []servers.BlockDevice{{
			SourceType: servers.SourceVolume, DestinationType: servers.DestinationVolume, UUID: boot.ID, BootIndex: 0,
		}},
	}
	if m.ResetNonce != "" {
		// The nonce a new guest comes with counts as handled.
		opts.Metadata[MetaReset] = m.ResetNonce
	}
	if len(nets) > 0 {
		opts.Networks = nets
	}
	if m.UserData != "" {
		// Encoded here: gophercloud passes data that already is base64 as is.
		opts.UserData = []byte(base64.StdEncoding.EncodeToString([]byte(m.UserData)))
	}
	created, err := servers.Create(ctx, d.c.compute, keypairs.CreateOptsExt{CreateOptsBuilder: opts, KeyName: keyName}, nil).Extract()
	if statusOf(err) == http.StatusBadRequest && (strings.Contains(describe(err), "key_name") || strings.Contains(describe(err), "Flavor")) {
		// Another agent of this cloud cleaned up the keypair or flavor
		// between their lookup and this create: look again.
		return driver.Observation{}, errors.Errorf("cannot create server: %s", describe(err))
	}
	if err != nil {
		return driver.Observation{}, classify(err, "cannot create server")
	}
	return d.reread(ctx, m.UID, created.ID)
}

// reread GETs a server the driver acted on into the view.
func (d *Driver) reread(ctx context.Context, uid, id string) (driver.Observation, error) {
	at := d.now()
	s, err := servers.Get(ctx, d.c.compute, id).Extract()
	if err != nil {
		return driver.Observation{}, classify(err, "cannot read server "+id)
	}
	d.remember(uid, *s, at)
	return d.observation(uid, *s), nil
}

// converge drives a server towards m: power state, pause, restart and
// reset nonces, and the new shape at a start. It acts once per call; the
// caller comes back while the phase is transitional.
func (d *Driver) converge(ctx context.Context, m driver.Machine, s servers.Server) (driver.Observation, error) {
	md := s.Metadata
	want := shapeHash(m)
	if imported(md) {
		// An imported server keeps its own flavor and volumes.
		want = md[MetaLive]
	}
	before := map[string]string{}
	if md[MetaShape] != want {
		before[MetaShape] = want
	}
	if live := md[MetaLive]; !imported(md) && live != "" && !strings.HasPrefix(live, shapeVersion) {
		// Hashed with the disks by an older agent: the shape the server
		// runs with is its flavor's, which it embeds.
		md = maps.Clone(md)
		md[MetaLive] = hashShape(flavorShape(s))
		before[MetaLive] = md[MetaLive]
	}
	newNonce := m.RestartNonce != md[MetaNonce]
	restart := newNonce && m.RestartNonce != ""
	reset := m.ResetNonce != "" && m.ResetNonce != md[MetaReset]
	restarts, _ := strconv.Atoi(md[MetaRestarts])
	var act func() error
	var after map[string]string
	changed := false
	c := d.c.compute
	pause := func() error { return classify(servers.Pause(ctx, c, s.ID).ExtractErr(), "cannot pause server") }
	unpause := func() error { return classify(servers.Unpause(ctx, c, s.ID).ExtractErr(), "cannot unpause server") }
	hardReboot := func() error {
		return classify(servers.Reboot(ctx, c, s.ID, servers.RebootOpts{Type: servers.HardReboot}).ExtractErr(), "cannot reset server")
	}
	// A start, or a restart done at the same time, satisfies a pending
	// reset request.
	handled := func(into map[string]string) {
		if reset {
			into[MetaReset] = m.ResetNonce
		}
	}
	if m.ResetNonce == "" && md[MetaReset] != "" {
		// No reset is asked for any more: the same nonce asks again.
		before[MetaReset] = ""
	}
	if s.Status != "VERIFY_RESIZE" {
		// Confirmed, or never resized: the next resize needs a confirm of
		// its own.
		d.confirmDone(s.ID)
	}
	switch {
	case s.TaskState != "":
		// Nova is working on it; come back.
	case s.Status == "VERIFY_RESIZE" && d.confirming(s.ID):
		// Nova confirms asynchronously and shows VERIFY_RESIZE, with no
		// task, until it has: a second confirm is refused.
	case s.Status == "VERIFY_RESIZE":
		act = func() error { return d.confirmResize(ctx, s.ID) }
	case s.Status == "PAUSED" && (!m.Running || restart && want != md[MetaLive]):
		// Nova stops no paused server: unpaused, it is stopped (or
		// restarted cold with its new shape) by the next call.
		act = unpause
	case s.Status == "PAUSED" && (restart || reset):
		// Nova reboots a paused server only hard, and it runs afterwards:
		// the next call pauses it again if it should stay paused.
		// Recorded before it is made: a reset is never made twice.
		before[MetaRestarts] = strconv.Itoa(restarts + 1)
		if restart {
			before[MetaNonce] = m.RestartNonce
		}
		handled(before)
		act = hardReboot
	case s.Status == "PAUSED" && !m.Paused:
		act = unpause
	case s.Status == "ACTIVE" && !m.Running:
		if newNonce {
			before[MetaNonce] = m.RestartNonce
		}
		act = func() error { return classify(servers.Stop(ctx, c, s.ID).ExtractErr(), "cannot stop server") }
	case s.Status == "ACTIVE" && restart && want != md[MetaLive]:
		// A cold restart, which applies the new shape on the way.
		before[MetaNonce], before[MetaRestarts] = m.RestartNonce, strconv.Itoa(restarts+1)
		act = func() error {
			return classify(servers.Stop(ctx, c, s.ID).ExtractErr(), "cannot stop server to restart it")
		}
	case s.Status == "ACTIVE" && restart:
		after = map[string]string{MetaNonce: m.RestartNonce, MetaRestarts: strconv.Itoa(restarts + 1)}
		handled(after)
		act = func() error {
			return classify(servers.Reboot(ctx, c, s.ID, servers.RebootOpts{Type: servers.SoftReboot}).ExtractErr(), "cannot restart server")
		}
	case s.Status == "ACTIVE" && reset:
		// Recorded before it is made: a reset is never made twice.
		before[MetaReset], before[MetaRestarts] = m.ResetNonce, strconv.Itoa(restarts+1)
		act = hardReboot
	case s.Status == "ACTIVE" && m.Paused:
		// Extra disks still to attach are attached once it is unpaused.
		act = pause
	case s.Status == "ACTIVE" && !imported(md):
		// Extra disks are attached once the server has booted, and
		// attached and detached live from then on, also while a new
		// flavor waits for a restart.
		var err error
		if changed, err = d.attach(ctx, m, s); err != nil {
			return driver.Observation{}, err
		}
	case s.Status == "SHUTOFF" && !m.Running:
		if newNonce {
			before[MetaNonce] = m.RestartNonce
		}
	case s.Status == "SHUTOFF" && flavorShape(s) != shapeOf(m) && !imported(md):
		fl, err := d.ensureFlavor(ctx, shapeOf(m))
		if err != nil {
			return driver.Observation{}, err
		}
		// Recorded before the resize: a resize that fails leaves the server
		// on its old flavor, and Delete must still find this one to clean up.
		before[MetaResizeFlavor] = fl.Name
		act = func() error {
			return classify(servers.Resize(ctx, c, s.ID, servers.ResizeOpts{FlavorRef: fl.ID}).ExtractErr(), "cannot resize server")
		}
	case s.Status == "SHUTOFF":
		// A start applies the new shape and satisfies any restart request.
		// One that should be paused is paused once a later call sees it
		// ACTIVE.
		handled(before)
		if imported(md) {
			before[MetaNonce] = m.RestartNonce
			act = func() error { return classify(servers.Start(ctx, c, s.ID).ExtractErr(), "cannot start server") }
			break
		}
		if _, err := d.attach(ctx, m, s); err != nil {
			return driver.Observation{}, err
		}
		before[MetaLive], before[MetaNonce] = want, m.RestartNonce
		act = func() error { return classify(servers.Start(ctx, c, s.ID).ExtractErr(), "cannot start server") }
	}
	if err := d.setMetadata(ctx, s, before); err != nil {
		return driver.Observation{}, err
	}
	if act != nil {
		if err := act(); err != nil {
			return driver.Observation{}, err
		}
	}
	if err := d.setMetadata(ctx, s, after); err != nil {
		return driver.Observation{}, err
	}
	if act == nil && len(before) == 0 && !changed {
		return d.observation(m.UID, s), nil
	}
	return d.reread(ctx, m.UID, s.ID)
}

func (d *Driver) setMetadata(ctx context.Context, s servers.Server, md map[string]string) error {
	if len(md) == 0 {
		return nil
	}
	_, err := servers.UpdateMetadata(ctx, d.c.compute, s.ID, servers.MetadataOpts(md)).Extract()
	return classify(err, "cannot write server metadata")
}

func (d *Driver) cacheVolume(name, id string) {
	d.cacheMu.Lock()
	d.volumeIDs[name] = id
	d.cacheMu.Unlock()
}

// volumeID resolves a disk to its volume's id, creating the volume when it
// is missing; ready is false while Cinder is still creating it.
func (d *Driver) volumeID(ctx context.Context, disk driver.Disk) (id string, ready bool, err error) {
	d.cacheMu.Lock()
	id, ok := d.volumeIDs[disk.Name]
	d.cacheMu.Unlock()
	if ok {
		return id, true, nil
	}
	v, err := d.ensureVolume(ctx, disk)
	if importing(err) != "" {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	if v.Status == "creating" || v.Status == "downloading" {
		return v.ID, false, nil
	}
	d.cacheVolume(disk.Name, v.ID)
	return v.ID, true, nil
}

// attach attaches the Machine's extra disks the server lacks and detaches
// the volumes it no longer names, through Nova's os-volume_attachments:
// the hypervisor plugs them into a running guest as into a stopped one. It
// needs no call when nothing differs, and reports whether it changed
// anything or found the driver's view of s behind Cinder's.
//
// Nova gives a guest no serial of the driver's choosing: the disk's serial
// is its Cinder volume id, which stays with the volume (and so with the
// Volume) across restarts and migrations.
//
// A detach is asynchronous: until the guest released the disk the volume
// stays attached, in Cinder's "detaching", and is not asked again (Nova
// refuses a second detach). A guest that never releases it makes Nova give
// up and the volume "in-use" again, and the next call asks again. Cinder
// detaches only an "in-use" volume: one still attaching is detached by a
// later call (a transient error says which), and one Cinder already calls
// "available" is one whose detach Nova is finishing, never asked again.
func (d *Driver) attach(ctx context.Context, m driver.Machine, s servers.Server) (bool, error) {
	changed := false
	attached := map[string]bool{}
	for _, v := range s.AttachedVolumes {
		attached[v.ID] = true
	}
	wanted := map[string]bool{}
	for i, disk := range m.Disks {
		id, ready, err := d.volumeID(ctx, disk)
		if err != nil {
			return changed, err
		}
		wanted[id] = true
		switch {
		case i == 0 || attached[id]:
		case !ready:
			return changed, errors.Errorf("waiting for volume %s to be created before attaching it", disk.Name)
		default:
			_, err := volumeattach.Create(ctx, d.c.compute, s.ID, volumeattach.CreateOpts{VolumeID: id}).Extract()
			if err != nil {
				return changed, classify(err, "cannot attach volume "+disk.Name)
			}
			changed = true
		}
	}
	var unsettled []string
	for _, id := range slices.Sorted(maps.Keys(attached)) {
		if wanted[id] {
			continue
		}
		v, err := volumes.Get(ctx, d.c.volume, id).Extract()
		switch {
		case statusOf(err) == http.StatusNotFound:
			continue
		case err != nil:
			return changed, classify(err, "cannot read volume "+id+" to detach it")
		case v.Status == "detaching":
			continue
		case v.Status == "available":
			// Detached in Cinder, and gone from the server once Nova
			// finished: the view of the server is read again.
			changed = true
			continue
		case v.Status != "in-use":
			unsettled = append(unsettled, id+" is "+v.Status)
			continue
		}
		err = volumeattach.Delete(ctx, d.c.compute, s.ID, id).ExtractErr()
		switch {
		case statusOf(err) == http.StatusBadRequest:
			// The volume left "in-use" since it was read: the driver
			// asked nothing a retry cannot mend.
			unsettled = append(unsettled, id+" is no longer in-use: "+describe(err))
		case err != nil && statusOf(err) != http.StatusNotFound:
			return changed, classify(err, "cannot detach volume "+id)
		default:
			changed = true
		}
	}
	if len(unsettled) > 0 {
		return changed, errors.Errorf("waiting to detach volumes until Cinder has them in-use: %s", strings.Join(unsettled, "; "))
	}
	return changed, nil
}

// Delete implements driver.Driver. It returns a transient error while Nova
// is still deleting the server, and once the server is gone it cleans up
// the keypairs and flavors nothing uses any more (cleanup).
func (d *Driver) Delete(ctx context.Context, uid string) error {
	defer d.lock(uid)()
	found, err := d.find(ctx, uid)
	if err != nil {
		return err
	}
	for _, s := range found {
		if err := servers.Delete(ctx, d.c.compute, s.ID).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
			return classify(err, "cannot delete server "+s.ID)
		}
		got, err := servers.Get(ctx, d.c.compute, s.ID).Extract()
		switch {
		case statusOf(err) == http.StatusNotFound:
		case err != nil:
			return classify(err, "cannot read server "+s.ID)
		case got.Status != "DELETED":
			return errors.Errorf("server %s is being deleted", s.ID)
		}
	}
	d.forget(uid)
	d.forgetMigration(uid)
	return d.cleanup(ctx, uid)
}

// cleanup deletes every keypair of the driver's that no virtfleet server
// uses any more and every private flavor of the driver's (a server's, or
// the target of a resize, which a failed resize never made the server's
// own) that no server uses at all. It looks at them all, not only the
// deleted server's: a cleanup an agent restart cut short, between a
// server's deletion and its own, is made good by the next. The server of
// uid, and any server Nova is deleting, use nothing. Public flavors and
// anything not named with Prefix are never touched.
func (d *Driver) cleanup(ctx context.Context, uid string) error {
	d.shared.Lock()
	defer d.shared.Unlock()
	all, err := d.listServers(ctx, servers.ListOpts{})
	if err != nil {
		return err
	}
	keyUsed, flavorUsed := map[string]bool{}, map[string]bool{}
	for _, s := range all {
		if u, ok := d.ours(s); ok && u == uid || s.TaskState == "deleting" || s.Status == "DELETED" {
			continue
		}
		keyUsed[s.KeyName] = keyUsed[s.KeyName] || s.Metadata[MetaUID] != ""
		flavorUsed[fmt.Sprint(s.Flavor["original_name"])] = true
		// A resize under way uses its target flavor before the server
		// shows it.
		flavorUsed[s.Metadata[MetaResizeFlavor]] = true
	}
	kps, err := d.listKeypairs(ctx)
	if err != nil {
		return err
	}
	for _, k := range kps {
		if !strings.HasPrefix(k, Prefix) || keyUsed[k] {
			continue
		}
		if err := keypairs.Delete(ctx, d.c.compute, k, nil).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
			return classify(err, "cannot delete keypair "+k)
		}
	}
	private, err := d.listFlavors(ctx, flavors.PrivateAccess)
	if err != nil {
		return err
	}
	for _, f := range private {
		if !strings.HasPrefix(f.Name, Prefix) || f.IsPublic || flavorUsed[f.Name] {
			continue
		}
		if err := flavors.Delete(ctx, d.c.compute, f.ID).ExtractErr(); err != nil && statusOf(err) != http.StatusNotFound {
			return classify(err, "cannot delete flavor "+f.Name)
		}
	}
	return nil
}

// transitional reports whether Nova is moving the server somewhere.
func transitional(s servers.Server) bool {
	p, _ := phaseOf(s)
	return s.TaskState != "" || p == driver.PhaseProvisioning || p == driver.PhaseStarting || p == driver.PhaseStopping
}

// phaseOf maps a Nova status, and the task under way, to a phase.
func phaseOf(s servers.Server) (driver.Phase, string) {
	switch s.Status {
	case "BUILD":
		return driver.PhaseProvisioning, "Nova is building the server"
	case "REBUILD":
		return driver.PhaseProvisioning, "Nova is rebuilding the server"
	case "ACTIVE":
		switch {
		case s.TaskState == "powering-off":
			return driver.PhaseStopping, "shutting down"
		case strings.HasPrefix(s.TaskState, "reboot"):
			return driver.PhaseStarting, "rebooting"
		case s.TaskState == "deleting":
			return driver.PhaseStopping, "being deleted"
		}
		return driver.PhaseRunning, ""
	case "SHUTOFF", "STOPPED":
		if s.TaskState == "powering-on" {
			return driver.PhaseStarting, "starting"
		}
		return driver.PhaseStopped, ""
	case "REBOOT", "HARD_REBOOT":
		return driver.PhaseStarting, "rebooting"
	case "RESIZE":
		return driver.PhaseProvisioning, "resizing to the new flavor"
	case "VERIFY_RESIZE":
		return driver.PhaseProvisioning, "resized; confirming"
	case "REVERT_RESIZE":
		return driver.PhaseProvisioning, "reverting a resize"
	case "MIGRATING":
		return driver.PhaseRunning, "migrating to another host"
	case "PASSWORD":
		return driver.PhaseRunning, "setting the admin password"
	case "PAUSED":
		// Paused as driver.Machine.Paused asks, or in OpenStack, which
		// Ensure undoes unless it asks for it too.
		return driver.PhasePaused, ""
	case "SUSPENDED":
		return driver.PhaseStopped, "suspended in OpenStack; resume it there"
	case "SHELVED", "SHELVED_OFFLOADED":
		return driver.PhaseStopped, "shelved in OpenStack; unshelve it there"
	case "RESCUE":
		return driver.PhaseStopped, "in rescue mode in OpenStack: it runs a rescue image; unrescue it there"
	case "SOFT_DELETED":
		return driver.PhaseFailed, "soft-deleted in OpenStack; restore it there or delete the VirtualMachine"
	case "ERROR":
		if s.Fault.Message != "" {
			return driver.PhaseFailed, "Nova reports ERROR: " + s.Fault.Message
		}
		return driver.PhaseFailed, "Nova reports ERROR"
	case "UNKNOWN":
		return driver.PhaseFailed, "Nova cannot tell the server's state: its compute host does not answer"
	}
	return driver.PhaseFailed, "unexpected Nova status " + s.Status
}

// interfaces reads a server's addresses, one interface per network (by
// name, sorted), learned from Nova.
func interfaces(s servers.Server, now time.Time) []driver.Interface {
	var out []driver.Interface
	for _, network := range slices.Sorted(maps.Keys(s.Addresses)) {
		raw, err := json.Marshal(s.Addresses[network])
		if err != nil {
			continue
		}
		var addrs []struct {
			Addr string `json:"addr"`
			MAC  string `json:"OS-EXT-IPS-MAC:mac_addr"`
		}
		if json.Unmarshal(raw, &addrs) != nil {
			continue
		}
		i := driver.Interface{Network: network, Source: driver.AddressSourceBackend, LastSeen: now}
		for _, a := range addrs {
			if i.MAC == "" {
				i.MAC = a.MAC
			}
			i.IPs = append(i.IPs, a.Addr)
		}
		out = append(out, i)
	}
	return out
}

// confirmResize confirms a server's resize once. Nova refuses a confirm it
// is already carrying out (400 "Instance has not been resized" once the
// migration is confirming, 409 while the instance is busy); after an agent
// restart the driver cannot know it confirmed, so those answers mean done,
// not a user error. A confirm that is still not done after confirmPatience
// is sent again, in case the 409 was about something else.
func (d *Driver) confirmResize(ctx context.Context, id string) error {
	err := servers.ConfirmResize(ctx, d.c.compute, id).ExtractErr()
	switch {
	case err == nil, statusOf(err) == http.StatusConflict,
		statusOf(err) == http.StatusBadRequest && strings.Contains(describe(err), "has not been resized"):
		d.cacheMu.Lock()
		d.confirmed[id] = d.now()
		d.cacheMu.Unlock()
		return nil
	}
	return classify(err, "cannot confirm the resize")
}

// confirmPatience is how long a confirmed resize may stay in VERIFY_RESIZE
// before the driver confirms again.
const confirmPatience = 2 * time.Minute

// confirming reports whether the driver confirmed the resize of server id
// recently.
func (d *Driver) confirming(id string) bool {
	d.cacheMu.Lock()
	defer d.cacheMu.Unlock()
	at, ok := d.confirmed[id]
	return ok && d.now().Sub(at) < confirmPatience
}

// confirmDone forgets a confirm once the server left VERIFY_RESIZE.
func (d *Driver) confirmDone(id string) {
	d.cacheMu.Lock()
	delete(d.confirmed, id)
	d.cacheMu.Unlock()
}
