package libvirt

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// validate rejects Machines no host could run.
func validate(m driver.Machine) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if len(m.Disks) > 24 {
		return driver.Terminalf("at most 24 disks can be attached, got %d", len(m.Disks))
	}
	_, err := parseUUID(m.UID)
	return err
}

// Ensure implements driver.Driver.
func (d *Driver) Ensure(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	if err := validate(m); err != nil {
		return driver.Observation{}, err
	}
	switch phase, node := d.outgoing(m.UID); phase {
	case driver.MigrationRunning:
		// The migration owns the guest until it is over.
		return d.Observe(ctx, m.UID)
	case driver.MigrationSucceeded:
		return driver.Observation{}, driver.NotFoundf("guest %s moved to node %s by live migration", m.UID, node)
	}
	api, conn, err := d.api()
	if err != nil {
		return driver.Observation{}, err
	}
	api = rememberPools(api)
	// The networks a (re)definition makes ready are observed as it left
	// them, without reading them again.
	nets := newNetworkView(api)
	dom, info, err := d.lookup(api, m.UID, golibvirt.DomainXMLInactive)
	if err != nil && !driver.IsNotFound(err) {
		return driver.Observation{}, err
	}
	// The Machine as the domain knows it: an adopted domain keeps the
	// uid it was made for in its UUID, name, MACs and volumes.
	key := m
	if err == nil {
		key.UID = formatUUID(dom.UUID)
	}
	owner := ownership{UID: m.UID, Namespace: m.Namespace, Name: m.Name, Generation: m.Generation, SpecHash: specHash(key), LastNonce: m.RestartNonce}
	// libvirt's test driver attaches and detaches no device: a new
	// definition gives its guests their disks, at their next start.
	plugs := !d.testDriver
	if driver.IsNotFound(err) || (!info.owner.Imported && (!upToDate(info.owner.SpecHash, key, info, d.pool) || !plugs && !sameDisks(info, key, d.pool))) {
		if info.owner != nil {
			// A redefinition keeps what the old definition counted.
			owner.LastNonce, owner.Restarts, owner.LastRestore = info.owner.LastNonce, info.owner.Restarts, info.owner.LastRestore
		}
		// Its disks are looked up, and made when absent, from here on.
		if err := d.refreshDiskPools(api, m); err != nil {
			return driver.Observation{}, err
		}
		d.imagesInUse.RLock()
		importing, err := d.prepareImages(api, m)
		if err == nil && importing == "" {
			old := info
			// info becomes the new definition: what resize and observe
			// compare the guest with.
			dom, info, err = d.define(api, conn, key, owner, info.owner == nil, nets)
			if err == nil && old.owner != nil {
				d.leftNetworks(api, old.nics, nicsOf(key))
			}
		}
		d.imagesInUse.RUnlock()
		switch {
		case err != nil:
			return driver.Observation{}, err
		case importing != "" && info.owner == nil:
			return driver.Observation{UID: m.UID, Phase: driver.PhaseProvisioning, Node: d.node, Message: importing}, nil
		case importing != "":
			// An existing guest goes on as it is until its new disks' images are here.
			o, err := d.Observe(ctx, m.UID)
			o.Message = importing
			return o, err
		}
	} else {
		owner = *info.owner
	}
	// Its domain holds its interfaces from now on.
	d.arrived(m.UID)
	if err := d.converge(api, dom, m, owner); err != nil {
		return driver.Observation{}, err
	}
	live, err := d.describe(api, dom, m.UID, 0)
	if err != nil {
		return driver.Observation{}, err
	}
	var unPlugged string
	if plugs && !owner.Imported {
		var plugged bool
		if unPlugged, plugged = d.plugDisks(api, dom, key, info, live); plugged {
			if info, err = d.describe(api, dom, m.UID, golibvirt.DomainXMLInactive); err != nil {
				return driver.Observation{}, err
			}
			if live, err = d.describe(api, dom, m.UID, 0); err != nil {
				return driver.Observation{}, err
			}
		}
	}
	// After converge and plugDisks: a guest it started is grown live,
	// with the disks it has now.
	unGrown := d.growDisks(api, dom, m)
	var unResized string
	if !owner.Imported {
		var tried bool
		if unResized, tried = d.resize(api, dom, m, &info, live); tried {
			if live, err = d.describe(api, dom, m.UID, 0); err != nil {
				return driver.Observation{}, err
			}
		}
	}
	// The next definition is the one just written or read, and its hash
	// the one converge kept.
	info.owner = &owner
	o, err := d.observeWith(look{api: api, nets: nets, defined: &info}, dom, m.UID, live)
	for _, why := range []string{unPlugged, unGrown, unResized} {
		if why != "" {
			o.Message = strings.TrimPrefix(o.Message+"; "+why, "; ")
		}
	}
	return o, err
}

// define creates what the guest needs and (re)defines its domain, and
// returns it with the definition as written. A running domain keeps
// running on its old definition until its next start.
//
// For a new guest, a definition libvirt refuses for good (a machine or
// domain type the host lacks, an unsupported configuration) leaves nothing
// behind: the volumes made for it here are removed again.
func (d *Driver) define(api API, conn *connection, m driver.Machine, owner ownership, fresh bool, nets *networkView) (dom golibvirt.Domain, info domainInfo, err error) {
	if int64(m.VCPU) > conn.hostCPUs {
		return golibvirt.Domain{}, domainInfo{}, driver.Terminalf("vcpu %d is more than the %d CPUs of node %s", m.VCPU, conn.hostCPUs, d.node)
	}
	maxVCPU, maxMemory, err := maxima(m, conn.hostCPUs, conn.hostMemory, d.node)
	if err != nil {
		return golibvirt.Domain{}, domainInfo{}, err
	}
	for _, n := range m.Networks {
		if err := d.checkNetwork(n); err != nil {
			return golibvirt.Domain{}, domainInfo{}, err
		}
	}
	release, err := d.ensureNetworks(api, m, nets)
	if err != nil {
		return golibvirt.Domain{}, domainInfo{}, err
	}
	defer release()
	var made []poolVolume
	defer func() {
		if err != nil && fresh && driver.IsTerminal(err) {
			for _, v := range made {
				_ = deleteVolume(api, v.pool, v.name)
			}
		}
	}()
	m.Disks = slices.Clone(m.Disks) // imported disks get their format below
	// A new guest whose disks are all made here has them at their size
	// (or an image's larger one): growDisks need not read them.
	grown := fresh
	for i, disk := range m.Disks {
		pool := cmp.Or(disk.Pool, d.pool)
		if disk.Imported {
			if m.Disks[i].Format, err = d.importedFormat(api, pool, disk.Name); err != nil {
				return golibvirt.Domain{}, domainInfo{}, err
			}
			continue
		}
		var created bool
		if disk.Image != nil {
			created, err = d.ensureImageDisk(api, disk)
		} else {
			created, err = ensureVolume(api, pool, disk.Name, disk.SizeBytes, cmp.Or(disk.Format, defaultFormat))
		}
		if err != nil {
			return golibvirt.Domain{}, domainInfo{}, err
		}
		if created {
			made = append(made, poolVolume{pool: pool, name: disk.Name})
		}
		grown = grown && created
	}
	made = append(made, poolVolume{pool: d.pool, name: seedVolume(m.UID)})
	var swapFmt string
	if m.SwapBytes > 0 {
		made = append(made, poolVolume{pool: d.pool, name: swapVolume(m.UID)})
		created, err := ensureVolume(api, d.pool, swapVolume(m.UID), m.SwapBytes, swapFormat)
		if err != nil {
			return golibvirt.Domain{}, domainInfo{}, err
		}
		// Only a swap volume made before may be in another format.
		if !created {
			if swapFmt, err = volumeFormat(api, d.pool, swapVolume(m.UID)); err != nil {
				return golibvirt.Domain{}, domainInfo{}, err
			}
		}
	}
	iso, err := seedISO(m)
	if err != nil {
		return golibvirt.Domain{}, domainInfo{}, err
	}
	if err := writeSeed(api, d.pool, seedVolume(m.UID), iso, d.testDriver); err != nil {
		return golibvirt.Domain{}, domainInfo{}, err
	}
	spec := domainSpec{machine: m, owner: owner, domainType: conn.domainType, pool: d.pool, consoleDir: d.consoles.dir, swapFormat: swapFmt, maxVCPU: maxVCPU, maxMemory: maxMemory}
	if slices.ContainsFunc(m.Networks, func(n driver.Network) bool { return n.VNI != 0 }) {
		if spec.overlayMTU, err = d.overlayMTU(); err != nil {
			return golibvirt.Domain{}, domainInfo{}, err
		}
	}
	x, err := domainXML(spec)
	if err != nil {
		return golibvirt.Domain{}, domainInfo{}, err
	}
	if info, err = parseDomain(x); err != nil {
		return golibvirt.Domain{}, domainInfo{}, err
	}
	key, err := parseUUID(m.UID)
	if err != nil {
		return golibvirt.Domain{}, domainInfo{}, driver.Terminal(errors.Wrap(err, "the guest's uid is no UUID"))
	}
	d.echoes.expect(formatUUID(key), golibvirt.DomainEventDefined, d.now())
	dom, err = api.DomainDefineXMLFlags(x, 0)
	if err != nil {
		d.echoes.withdraw(formatUUID(key), golibvirt.DomainEventDefined)
	}
	if isCode(err, permanentCodes...) {
		return dom, info, driver.Terminal(errors.Wrap(err, "libvirt rejected the guest's definition"))
	}
	if err == nil && grown {
		d.grown.Found(m)
	}
	return dom, info, errors.Wrap(err, "cannot define domain")
}

// converge drives the domain's power state towards m.Running and m.Paused
// and handles a new restart or reset nonce. A running domain keeps the
// definition it was started with until it is started again, so a restart
// requested while the definition changed is a cold one (destroy, then
// start) that applies the new shape, as KubeVirt does; otherwise it is a
// guest reboot. A reset resets the domain in place, on the shape it runs.
func (d *Driver) converge(api API, dom golibvirt.Domain, m driver.Machine, owner ownership) error {
	state, reason, err := api.DomainGetState(dom, 0)
	if err != nil {
		return errors.Wrap(err, "cannot read domain state")
	}
	s := golibvirt.DomainState(state)
	switch {
	case movedAway(s, reason):
		// What is left here is the definition of a guest that runs on
		// another node: starting it would run the guest twice.
		return driver.NotFoundf("guest %s moved to another node by live migration", m.UID)
	case migrating(s, reason):
		// Paused for the switch-over of a live migration, to or from
		// here: libvirt resumes it where it is to run.
		return nil
	}
	halted := haltedByHypervisor(s, reason)
	// paused is a pause a resume ends: the user's, or one behind the
	// driver's back; never the hypervisor's halt.
	paused := s == golibvirt.DomainPaused && !halted
	active := s != golibvirt.DomainShutoff && s != golibvirt.DomainCrashed && s != golibvirt.DomainNostate
	liveHash, lastReset := owner.SpecHash, ""
	// stale is whether the running guest is of an older shape than m, one
	// only a start gives it.
	stale := false
	if active {
		live, x, err := d.describeXML(api, dom, m.UID, 0)
		if err != nil {
			return err
		}
		liveHash = live.owner.SpecHash
		// Data disks are not in the hash: a guest that holds others
		// than m's (not attached or detached live) gets them at a start.
		key := m
		key.UID = formatUUID(dom.UUID)
		stale = liveHash != owner.SpecHash || beyond(m, live) || !owner.Imported && !sameDisks(live, key, d.pool)
		if lastReset, err = resetOf(x); err != nil {
			return err
		}
	}
	newNonce := m.RestartNonce != owner.LastNonce
	next := owner
	next.LastNonce = m.RestartNonce

	if !m.Running {
		// Before the shutdown: a guest that is off has no live metadata.
		if err := d.saveOwnership(api, dom, owner, next, liveHash, active); err != nil {
			return err
		}
		switch {
		case !active:
			d.clearShutdown(m.UID)
			return nil
		case halted:
			// Its CPUs are stopped: no ACPI request can reach it.
			return d.forceOff(api, dom)
		case paused:
			// Nor can a paused guest act on one; resumed, it shuts down
			// cleanly instead of being forced off after the grace period.
			if err := d.resume(api, dom); err != nil {
				return err
			}
		}
		return d.shutdown(api, dom, m.UID)
	}
	d.clearShutdown(m.UID)
	restart := newNonce && m.RestartNonce != ""
	// A restart asked for at the same time satisfies a reset request.
	reset := !restart && m.ResetNonce != "" && m.ResetNonce != lastReset
	switch {
	case !active:
		// A start satisfies any pending restart or reset request.
		if err := d.saveOwnership(api, dom, owner, next, liveHash, false); err != nil {
			return err
		}
		return d.startAs(api, dom, m)
	case restart && (halted || paused || m.Paused || s == golibvirt.DomainRunning && stale), reset && halted:
		// A guest the hypervisor halted is only ever started afresh: a
		// resume runs the failing instruction again, a reboot is not
		// delivered, and a reset in place finds the same fault. Nor is a
		// reboot delivered to a guest that is paused or about to be.
		next.Restarts++
		if err := d.saveOwnership(api, dom, owner, next, liveHash, active); err != nil {
			return err
		}
		if err := api.DomainDestroy(dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
			return errors.Wrap(err, "cannot stop domain to restart it")
		}
		return d.startAs(api, dom, m)
	case restart && s == golibvirt.DomainRunning:
		if err := api.DomainReboot(dom, 0); err != nil {
			return errors.Wrap(err, "cannot restart domain")
		}
		// A real guest is counted when it was reset (the reboot event),
		// not when the request returned: a guest that ignores the request
		// has not restarted. The test driver simulates the reboot and
		// sends no event.
		if d.testDriver {
			next.Restarts++
		}
	case reset && (s == golibvirt.DomainRunning || s == golibvirt.DomainBlocked || paused):
		// Recorded before it is made: a reset the agent lost track of is
		// never made twice.
		next.Restarts++
		if err := d.saveOwnership(api, dom, owner, next, liveHash, active); err != nil {
			return err
		}
		owner = next
		if err := recordReset(api, dom, m.ResetNonce); err != nil {
			return err
		}
		lastReset = m.ResetNonce
		if err := d.reset(api, dom, m.UID); err != nil {
			return err
		}
		if err := d.pauseAs(api, dom, m, s); err != nil {
			return err
		}
	case halted:
		// Failed until a restart or a stop: neither resumed nor paused.
	default:
		if err := d.pauseAs(api, dom, m, s); err != nil {
			return err
		}
	}
	if !reset && m.ResetNonce != lastReset {
		// Handled: by the reset or the restart just made, or, for an empty
		// nonce, none asked for any more, so the same nonce asks again.
		if err := recordReset(api, dom, m.ResetNonce); err != nil {
			return err
		}
	}
	// Reboots seen since the last look become part of the domain's record,
	// so a restarted agent keeps counting from there.
	pending := d.pendingReboots(m.UID)
	next.Restarts += pending
	if err := d.saveOwnership(api, dom, owner, next, liveHash, active); err != nil {
		return err
	}
	d.recordedReboots(m.UID, pending)
	return nil
}

// startAs starts the domain as m asks: with its reset nonce recorded as
// handled, and paused as soon as it runs when m.Paused.
func (d *Driver) startAs(api API, dom golibvirt.Domain, m driver.Machine) error {
	if m.ResetNonce != "" {
		// An empty one asks for nothing: a guest that ran with a nonce is
		// told so by the next Ensure, not by a call at every start.
		if err := recordReset(api, dom, m.ResetNonce); err != nil {
			return err
		}
	}
	if err := d.start(api, dom, m.UID); err != nil {
		return err
	}
	return d.pauseAs(api, dom, m, golibvirt.DomainRunning)
}

// pauseAs pauses the domain, in state s, when m.Paused and it runs, and
// resumes it when it is paused and m.Paused is not set. A domain the
// hypervisor halted is neither: the caller never asks.
func (d *Driver) pauseAs(api API, dom golibvirt.Domain, m driver.Machine, s golibvirt.DomainState) error {
	switch {
	case m.Paused && (s == golibvirt.DomainRunning || s == golibvirt.DomainBlocked):
		return d.suspend(api, dom)
	case !m.Paused && s == golibvirt.DomainPaused:
		return d.resume(api, dom)
	}
	return nil
}
