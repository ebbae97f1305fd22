package libvirt

import (
	"fmt"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// resize gives the guest m's vCPUs and memory (driver.Driver's Ensure):
// its next definition, defined, always (Ensure redefined it if it could
// not hold them), and the running guest, live, within the maximum it was
// started with. defined is updated to what it now holds. It returns why
// something could not be applied, for the Observation's message, and
// whether it changed the domain (and live, read before, is out of date:
// a domain that is off shows its next definition).
//
// Memory is set live and in the definition by two calls: libvirt's test
// driver refuses both at once, and QEMU's takes either.
func (d *Driver) resize(api API, dom golibvirt.Domain, m driver.Machine, defined *domainInfo, live domainInfo) (string, bool) {
	r := resizer{api: api, dom: dom}
	vcpu := int64(m.VCPU)
	var flags golibvirt.DomainVCPUFlags
	if defined.vcpu != vcpu {
		flags |= golibvirt.DomainVCPUConfig
	}
	if live.vcpu != vcpu && vcpu <= live.maxVCPU && r.active() {
		flags |= golibvirt.DomainVCPULive
	}
	if flags != 0 {
		err := api.DomainSetVcpusFlags(dom, uint32(vcpu), uint32(flags))
		r.did(err, "cannot set vcpu to %d: %v", vcpu, err)
		if err == nil && flags&golibvirt.DomainVCPUConfig != 0 {
			defined.vcpu = vcpu
		}
	}
	memory := kib(m.MemoryBytes)
	if kib(defined.memory) != memory {
		err := api.DomainSetMemoryFlags(dom, memory, uint32(golibvirt.DomainMemConfig))
		r.did(err, "cannot set the memory of the next start to %d KiB: %v", memory, err)
		if err == nil {
			defined.memory = int64(memory) << 10
		}
	}
	if kib(live.memory) != memory && m.MemoryBytes <= live.maxMemory && r.active() {
		err := api.DomainSetMemoryFlags(dom, memory, uint32(golibvirt.DomainMemLive))
		r.did(err, "cannot set the running guest's memory to %d KiB: %v", memory, err)
	}
	if r.tried {
		// libvirt announces neither change with an event.
		d.definitions.forget(formatUUID(dom.UUID))
	}
	return strings.Join(r.why, "; "), r.tried
}

// resizer is one resize of one domain; it reads the domain's state once,
// and only when the running guest may change.
type resizer struct {
	api   API
	dom   golibvirt.Domain
	on    *bool
	tried bool
	why   []string
}

// active is whether the domain runs (or is paused): whether it has a live
// shape to change. A state it cannot read counts as not running, so only
// the definition changes; the next Ensure looks again.
func (r *resizer) active() bool {
	if r.on == nil {
		state, _, err := r.api.DomainGetState(r.dom, 0)
		on := err == nil && active(golibvirt.DomainState(state))
		r.on = &on
	}
	return *r.on
}

// did records a call and its error, explained by format and args.
func (r *resizer) did(err error, format string, args ...any) {
	r.tried = true
	if err != nil {
		r.why = append(r.why, fmt.Sprintf(format, args...))
	}
}

// shapeNote says how the running guest, live, differs in vCPUs and memory
// from its next definition, defined, which holds what the last Ensure
// asked for: what waits for a restart (beyond the maximum the guest runs
// with, so restart is true), and what the guest has not taken yet (a
// balloon it has not filled or emptied as asked, a vCPU it keeps).
func shapeNote(live, defined domainInfo) (note string, restart bool) {
	var notes []string
	switch {
	case defined.vcpu > live.maxVCPU:
		restart = true
		notes = append(notes, fmt.Sprintf("vcpu %d is more than the %d the running guest can have (its maximum); it applies at the next start", defined.vcpu, live.maxVCPU))
	case defined.vcpu != live.vcpu:
		notes = append(notes, fmt.Sprintf("the guest runs %d vCPUs of the %d asked", live.vcpu, defined.vcpu))
	}
	switch {
	case defined.memory > live.maxMemory:
		restart = true
		notes = append(notes, fmt.Sprintf("memory of %d bytes is more than the %d bytes the running guest can have (its maximum); it applies at the next start", defined.memory, live.maxMemory))
	case kib(defined.memory) != kib(live.memory):
		notes = append(notes, fmt.Sprintf("the guest holds %d bytes of memory of the %d asked; its balloon moves as the guest allows", live.memory, defined.memory))
	}
	return strings.Join(notes, "; "), restart
}
