package libvirt

import (
	"context"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Observe implements driver.Driver.
func (d *Driver) Observe(_ context.Context, uid string) (driver.Observation, error) {
	api, _, err := d.api()
	if err != nil {
		return driver.Observation{}, err
	}
	dom, info, err := d.lookup(api, uid, 0)
	if err != nil {
		return driver.Observation{}, err
	}
	return d.observe(api, dom, uid, info)
}

// observe reports the guest uid of domain dom, whose running definition is
// info.
func (d *Driver) observe(api API, dom golibvirt.Domain, uid string, info domainInfo) (driver.Observation, error) {
	return d.observeWith(look{api: api, nets: newNetworkView(api)}, dom, uid, info)
}

// look is what one observation reads through, and what its caller read
// for it already.
type look struct {
	api API
	// definitions, when set, reads the next definition through
	// d.definitions on connection generation; else it is read afresh.
	definitions bool
	generation  int
	// nets reads the networks, shared by the observations of one List.
	nets *networkView
	// state is the domain's state when the caller read it; nil to read it.
	state *powerState
	// defined is the next definition when the caller knows it (Ensure,
	// which just wrote or read it); nil to read it.
	defined *domainInfo
}

// look is a look at one of the node's guests in a full observe: the next
// definitions through d.definitions, the networks through nets.
func (d *Driver) look(api API, generation int, nets *networkView) look {
	return look{api: api, definitions: true, generation: generation, nets: nets}
}

// observeWith is observe, reading what l does not know through l.
func (d *Driver) observeWith(l look, dom golibvirt.Domain, uid string, info domainInfo) (driver.Observation, error) {
	api := l.api
	if l.state == nil {
		state, reason, err := api.DomainGetState(dom, 0)
		if err != nil {
			return driver.Observation{}, errors.Wrap(err, "cannot read domain state")
		}
		l.state = &powerState{state: golibvirt.DomainState(state), reason: reason}
	}
	state, reason := l.state.state, l.state.reason
	o := driver.Observation{UID: uid, ID: formatUUID(dom.UUID), Node: d.node, VCPU: int32(info.vcpu), MemoryBytes: info.memory, MaxVCPU: int32(info.maxVCPU), MaxMemoryBytes: info.maxMemory}
	o.Phase, o.Message = phaseOf(state, reason)
	o.Disks = attachedVolumes(info, formatUUID(dom.UUID))
	switch s := state; {
	case movedAway(s, reason):
		// A guest is on one node at a time: this one runs elsewhere now.
		return driver.Observation{}, driver.NotFoundf("guest %s moved to another node by live migration", uid)
	case migrating(s, reason):
		o.Phase, o.Message = d.migratingPhase(uid)
	}
	var restarts int32
	if info.owner != nil {
		restarts = info.owner.Restarts
	}
	if o.Phase == driver.PhaseRunning && d.shuttingDown(uid) {
		o.Phase, o.Message = driver.PhaseStopping, "waiting for the guest to shut down"
	}
	d.stateMu.Lock()
	o.RestartCount = restarts + d.crashes[uid] + d.reboots[uid]
	started, startKnown := d.startedAt[uid]
	d.stateMu.Unlock()

	if o.Phase != driver.PhaseStopped && o.Phase != driver.PhaseFailed && info.owner != nil {
		// A running domain whose definition changed since it started runs
		// the old shape until its next start; so does one asked for more
		// vCPUs or memory than it can grow to.
		defined := l.defined
		if defined == nil {
			next, err := d.nextDefinitionOf(l, dom, uid)
			if err != nil && !driver.IsNotFound(err) {
				return driver.Observation{}, err
			}
			if err == nil {
				defined = &next
			}
		}
		if defined != nil {
			note, beyond := shapeNote(info, *defined)
			disks, moved := diskNote(info, *defined, formatUUID(dom.UUID), !d.testDriver)
			o.RestartRequired = beyond || moved || defined.owner.SpecHash != info.owner.SpecHash
			for _, n := range []string{note, disks} {
				if n != "" && !info.owner.Imported {
					o.Message = strings.TrimPrefix(o.Message+"; "+n, "; ")
				}
			}
		}
	}
	if o.Phase != driver.PhaseRunning && o.Phase != driver.PhaseStopping && o.Phase != driver.PhasePaused {
		// A paused guest keeps its addresses: its memory, and so its
		// network configuration, is as it was.
		d.addresses.forget(uid)
		o.Interfaces = d.addresses.merge(uid, info.nics, nil, d.now())
		return o, nil
	}
	var since *time.Time
	if startKnown {
		since = &started
	}
	o.Interfaces = d.addresses.merge(uid, info.nics, d.sightings(l.nets, dom, info.nics, since), d.now())
	return o, nil
}

// nextDefinitionOf is the next definition of dom, the guest uid's, as
// describe checks it: through d.definitions when l says so.
func (d *Driver) nextDefinitionOf(l look, dom golibvirt.Domain, uid string) (domainInfo, error) {
	if !l.definitions {
		return d.describe(l.api, dom, uid, golibvirt.DomainXMLInactive)
	}
	info, err := d.definitions.readAs(l.api, l.generation, dom, golibvirt.DomainXMLInactive)
	if isCode(err, golibvirt.ErrNoDomain) {
		return domainInfo{}, driver.NotFoundf("no domain with uuid %s", uid)
	}
	if err != nil {
		return domainInfo{}, err
	}
	return info, ownedBy(dom, uid, info)
}

// haltedByHypervisor reports whether the domain is paused for a fault a
// resume cannot mend: QEMU stops the CPUs on an internal error, such as
// "KVM internal error. Suberror: 1 emulation failure" of a nested KVM, and
// libvirt reports it paused for an unknown reason; a guest that panicked
// with a pvpanic device is paused as crashed. Resuming either runs into the
// same fault again; a start afresh (a restart, or running false then true)
// is the way out, as for a crashed guest.
func haltedByHypervisor(s golibvirt.DomainState, reason int32) bool {
	if s != golibvirt.DomainPaused {
		return false
	}
	switch golibvirt.DomainPausedReason(reason) {
	case golibvirt.DomainPausedUnknown, golibvirt.DomainPausedCrashed:
		return true
	}
	return false
}

// phaseOf maps a libvirt domain state to a phase.
func phaseOf(s golibvirt.DomainState, reason int32) (driver.Phase, string) {
	switch {
	case haltedByHypervisor(s, reason) && golibvirt.DomainPausedReason(reason) == golibvirt.DomainPausedCrashed:
		return driver.PhaseFailed, "guest panicked and is paused: restart the VM, or set running false then true"
	case haltedByHypervisor(s, reason):
		return driver.PhaseFailed, "the hypervisor stopped the guest (paused, reason unknown, as after a KVM internal error: the guest's QEMU log says why): restart the VM, or set running false then true"
	case s == golibvirt.DomainPaused && golibvirt.DomainPausedReason(reason) == golibvirt.DomainPausedUser:
		// Paused as driver.Machine.Paused asks (or by hand, which Ensure
		// undoes unless it asks for it too): vCPUs stopped, memory kept.
		return driver.PhasePaused, ""
	}
	switch s {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked:
		return driver.PhaseRunning, ""
	case golibvirt.DomainPaused:
		return driver.PhaseStopped, "guest is paused"
	case golibvirt.DomainPmsuspended:
		return driver.PhaseStopped, "guest is suspended by power management"
	case golibvirt.DomainShutdown:
		return driver.PhaseStopping, "guest is shutting down"
	case golibvirt.DomainShutoff:
		if golibvirt.DomainShutoffReason(reason) == golibvirt.DomainShutoffCrashed {
			return driver.PhaseFailed, "guest crashed"
		}
		return driver.PhaseStopped, ""
	case golibvirt.DomainCrashed:
		return driver.PhaseFailed, "guest crashed"
	default:
		return driver.PhaseStarting, ""
	}
}
