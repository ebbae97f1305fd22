package libvirt

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// defaultDetachWait bounds how long Ensure waits for a running guest to
// release a disk it was asked to detach. QEMU only asks the guest (the
// unplug is the guest's to acknowledge), and libvirt's own wait for the
// answer ends without an error when it does not come.
const defaultDetachWait = 5 * time.Second

// dataDisks are the disks of a domain (info) of the guest uid besides its
// boot disk (the first) and the driver's own swap and seed, in target
// order: the ones that come and go with the Machine's data disks.
func dataDisks(info domainInfo, uid string) []domainDisk {
	var data []domainDisk
	for i, disk := range info.disks {
		if i == 0 || disk.name == seedVolume(uid) || disk.name == swapVolume(uid) {
			continue
		}
		data = append(data, disk)
	}
	return data
}

// attachedVolumes names the volumes of the Machine's disks in info, a
// domain of the guest uid: all but the driver's own swap and seed.
func attachedVolumes(info domainInfo, uid string) []string {
	var out []string
	for _, disk := range info.disks {
		if disk.name != seedVolume(uid) && disk.name != swapVolume(uid) {
			out = append(out, disk.name)
		}
	}
	return out
}

// wantedDisks are m's data disks as volumes, in the order m names them;
// pool is the driver's default pool.
func wantedDisks(m driver.Machine, pool string) []poolVolume {
	var want []poolVolume
	for _, disk := range m.Disks[min(1, len(m.Disks)):] {
		want = append(want, poolVolume{pool: cmp.Or(disk.Pool, pool), name: disk.Name})
	}
	return want
}

// volumesOf are the volumes of disks.
func volumesOf(disks []domainDisk) []poolVolume {
	vs := make([]poolVolume, len(disks))
	for i, disk := range disks {
		vs[i] = disk.poolVolume
	}
	return vs
}

// planDisks is how data disks have become want: the volumes to attach and
// to detach, and whether that is all (live is false when the disks kept
// changed their order, or a new one comes before a kept one: a guest
// enumerates its disks in the order they were plugged, so only a start
// gives it another).
func planDisks(have, want []poolVolume) (attach, detach []poolVolume, live bool) {
	var kept []poolVolume
	for _, v := range have {
		if slices.Contains(want, v) {
			kept = append(kept, v)
		} else {
			detach = append(detach, v)
		}
	}
	for _, v := range want {
		if !slices.Contains(have, v) {
			attach = append(attach, v)
		}
	}
	live = slices.Equal(want[:len(kept)], kept)
	return attach, detach, live
}

// disksFollow is whether m's data disks differ from those of the
// definition defined only by disks added at the end or removed.
func disksFollow(defined domainInfo, m driver.Machine, pool string) bool {
	_, _, live := planDisks(volumesOf(dataDisks(defined, m.UID)), wantedDisks(m, pool))
	return live
}

// sameDisks is whether m's data disks are those of the definition
// defined, in the same order.
func sameDisks(defined domainInfo, m driver.Machine, pool string) bool {
	return slices.Equal(volumesOf(dataDisks(defined, m.UID)), wantedDisks(m, pool))
}

// diskNote says how the disks of the running guest, live, differ from its
// next definition, defined, and whether that waits for its next start:
// a boot disk changed, disks reordered, a disk the guest still holds
// though it was detached (it has not released it), a disk not attached to
// it yet. plugs is whether the node's libvirt attaches and detaches disks
// live.
func diskNote(live, defined domainInfo, uid string, plugs bool) (note string, restart bool) {
	var notes []string
	if len(live.disks) > 0 && len(defined.disks) > 0 && live.disks[0].poolVolume != defined.disks[0].poolVolume {
		notes = append(notes, fmt.Sprintf("the boot disk changes from volume %s to %s at the next start", live.disks[0].name, defined.disks[0].name))
	}
	attach, detach, inOrder := planDisks(volumesOf(dataDisks(live, uid)), volumesOf(dataDisks(defined, uid)))
	for _, v := range detach {
		if plugs {
			notes = append(notes, fmt.Sprintf("disk %s is still attached to the running guest, which has not released it since it was detached; it is gone at the next start", v.name))
		} else {
			notes = append(notes, fmt.Sprintf("disk %s stays attached to the running guest until its next start: this node's libvirt detaches no disk live", v.name))
		}
	}
	for _, v := range attach {
		if plugs {
			notes = append(notes, fmt.Sprintf("disk %s is not attached to the running guest; it is at the next start", v.name))
		} else {
			notes = append(notes, fmt.Sprintf("disk %s is attached at the guest's next start: this node's libvirt attaches no disk live", v.name))
		}
	}
	if !inOrder {
		notes = append(notes, "the order of the data disks changed; the guest sees it from its next start")
	}
	return strings.Join(notes, "; "), len(notes) > 0
}

// plugDisks attaches m's data disks the domain lacks and detaches those m
// no longer names (driver.Driver's Ensure): to and from the next
// definition, defined, always, and the running guest, live, where it can
// take them (as `virsh attach-disk --live --config` does). A new disk gets
// the target after every one the domain has, so no disk's target changes.
// A detached disk the guest holds on to is waited for, within
// d.detachWait, and never reported gone while it is attached. It returns
// why something could not be done, for the Observation's message, and
// whether it changed the domain.
func (d *Driver) plugDisks(api API, dom golibvirt.Domain, m driver.Machine, defined, live domainInfo) (string, bool) {
	state, _, err := api.DomainGetState(dom, 0)
	if err != nil {
		return fmt.Sprintf("cannot read the domain's state to attach or detach disks: %v", err), false
	}
	on := active(golibvirt.DomainState(state))
	want := wantedDisks(m, d.pool)
	attach, detach, _ := planDisks(volumesOf(dataDisks(defined, m.UID)), want)
	var liveAttach, liveDetach []poolVolume
	if on {
		var inOrder bool
		liveAttach, liveDetach, inOrder = planDisks(volumesOf(dataDisks(live, m.UID)), want)
		if !inOrder {
			// The next start gives the guest its disks in their new
			// order; until then it keeps the ones it has.
			liveAttach = nil
		}
	}
	if len(attach)+len(detach)+len(liveAttach)+len(liveDetach) == 0 {
		return "", false
	}
	p := plugger{api: api, dom: dom}
	for _, v := range detach {
		p.detach(v, defined, live, slices.Contains(liveDetach, v))
	}
	for _, v := range liveDetach {
		if !slices.Contains(detach, v) {
			// Asked before and still held: asked again, live only.
			p.detach(v, domainInfo{}, live, true)
		}
	}
	if len(attach)+len(liveAttach) > 0 {
		p.attachAll(d, m, defined, live, attach, liveAttach)
	}
	if len(detach) > 0 && on {
		// Asked again, the guest was waited for by libvirt already.
		d.awaitRelease(api, dom, m.UID, &p)
	}
	// libvirt announces a device only once it is in the running guest.
	d.definitions.forget(formatUUID(dom.UUID))
	return strings.Join(p.why, "; "), true
}

// attachAll attaches m's data disks on the volumes attach to the
// definition, defined, and those on liveAttach to the running guest, live,
// once their volumes are made: a disk from an image waits for the image.
func (p *plugger) attachAll(d *Driver, m driver.Machine, defined, live domainInfo, attach, liveAttach []poolVolume) {
	var disks []driver.Disk
	for _, disk := range m.Disks[1:] {
		v := poolVolume{pool: cmp.Or(disk.Pool, d.pool), name: disk.Name}
		if slices.Contains(attach, v) || slices.Contains(liveAttach, v) {
			disks = append(disks, disk)
		}
	}
	plugged := driver.Machine{UID: m.UID, Disks: disks}
	if err := d.refreshDiskPools(p.api, plugged); err != nil {
		p.why = append(p.why, fmt.Sprintf("cannot attach disks: %v", err))
		return
	}
	d.imagesInUse.RLock()
	defer d.imagesInUse.RUnlock()
	importing, err := d.prepareImages(p.api, plugged)
	switch {
	case err != nil:
		p.why = append(p.why, fmt.Sprintf("cannot attach disks: %v", err))
		return
	case importing != "":
		p.why = append(p.why, "disks wait for their images to be attached: "+importing)
		return
	}
	next := max(lastIndex(defined), lastIndex(live)) + 1
	for _, disk := range disks {
		v := poolVolume{pool: cmp.Or(disk.Pool, d.pool), name: disk.Name}
		config, running := slices.Contains(attach, v), slices.Contains(liveAttach, v)
		dev := virtioDev(next)
		if !config {
			// The definition has it already: under its target there.
			dev = targetOf(defined, v)
		}
		if p.attach(d, disk, v, dev, config, running) && dev == virtioDev(next) {
			next++
		}
	}
}

// awaitRelease waits, within d.detachWait, for the running guest to
// release the disks p detached from it.
func (d *Driver) awaitRelease(api API, dom golibvirt.Domain, uid string, p *plugger) {
	deadline := time.Now().Add(cmp.Or(d.detachWait, defaultDetachWait))
	for {
		x, err := api.DomainGetXMLDesc(dom, 0)
		if err != nil {
			return
		}
		live, err := parseDomain(x)
		if err != nil {
			return
		}
		held := volumesOf(dataDisks(live, uid))
		if !slices.ContainsFunc(p.detachedLive, func(v poolVolume) bool { return slices.Contains(held, v) }) || time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// plugger is one round of attaches and detaches of one domain.
type plugger struct {
	api          API
	dom          golibvirt.Domain
	detachedLive []poolVolume
	why          []string
}

// detach detaches the volume v from the definition defined where it has
// it, and from the running guest, live, when running is set.
func (p *plugger) detach(v poolVolume, defined, live domainInfo, running bool) {
	configDev, liveDev := targetOf(defined, v), targetOf(live, v)
	var calls []deviceChange
	switch {
	case configDev != "" && running && configDev == liveDev:
		calls = append(calls, deviceChange{configDev, golibvirt.DomainDeviceModifyLive | golibvirt.DomainDeviceModifyConfig})
	default:
		if configDev != "" {
			calls = append(calls, deviceChange{configDev, golibvirt.DomainDeviceModifyConfig})
		}
		if running && liveDev != "" {
			calls = append(calls, deviceChange{liveDev, golibvirt.DomainDeviceModifyLive})
		}
	}
	for _, c := range calls {
		disk := volumeDisk(v.pool, v.name, "", c.dev)
		x, err := disk.Marshal()
		if err == nil {
			err = p.api.DomainDetachDeviceFlags(p.dom, x, uint32(c.flags))
		}
		if err != nil {
			p.why = append(p.why, fmt.Sprintf("cannot detach disk %s: %v", v.name, err))
			continue
		}
		if c.flags&golibvirt.DomainDeviceModifyLive != 0 {
			p.detachedLive = append(p.detachedLive, v)
		}
	}
}

// deviceChange is a disk's target and what of the domain a change to it
// affects.
type deviceChange struct {
	dev   string
	flags golibvirt.DomainDeviceModifyFlags
}

// attach attaches disk, on volume v, under target dev: to the next
// definition when config is set, to the running guest when running is. It
// makes the volume first, as a definition does, and says whether the
// target is taken now.
func (p *plugger) attach(d *Driver, disk driver.Disk, v poolVolume, dev string, config, running bool) bool {
	format, err := d.readyDisk(p.api, disk)
	if err != nil {
		p.why = append(p.why, fmt.Sprintf("cannot attach disk %s: %v", disk.Name, err))
		return false
	}
	dd := volumeDisk(v.pool, v.name, format, dev)
	x, err := dd.Marshal()
	if err != nil {
		p.why = append(p.why, fmt.Sprintf("cannot attach disk %s: %v", disk.Name, err))
		return false
	}
	var flags golibvirt.DomainDeviceModifyFlags
	if config {
		flags |= golibvirt.DomainDeviceModifyConfig
	}
	if running {
		flags |= golibvirt.DomainDeviceModifyLive
	}
	if err := p.api.DomainAttachDeviceFlags(p.dom, x, uint32(flags)); err != nil {
		p.why = append(p.why, fmt.Sprintf("cannot attach disk %s: %v", disk.Name, err))
		return false
	}
	return true
}

// readyDisk makes the volume of disk, as a definition does, and returns
// its format.
func (d *Driver) readyDisk(api API, disk driver.Disk) (string, error) {
	pool := cmp.Or(disk.Pool, d.pool)
	if disk.Imported {
		return d.importedFormat(api, pool, disk.Name)
	}
	var err error
	if disk.Image != nil {
		_, err = d.ensureImageDisk(api, disk)
	} else {
		_, err = ensureVolume(api, pool, disk.Name, disk.SizeBytes, cmp.Or(disk.Format, defaultFormat))
	}
	if err != nil {
		return "", errors.Wrapf(err, "cannot make volume %s", disk.Name)
	}
	return cmp.Or(disk.Format, defaultFormat), nil
}

// targetOf is the target of volume v's disk in info; empty when it has
// none.
func targetOf(info domainInfo, v poolVolume) string {
	for _, disk := range info.disks {
		if disk.poolVolume == v {
			return disk.dev
		}
	}
	return ""
}

// lastIndex is the index of the last virtio target info's disks take; -1
// when they take none.
func lastIndex(info domainInfo) int {
	last := -1
	for _, disk := range info.disks {
		last = max(last, diskIndex(disk.dev))
	}
	return last
}
