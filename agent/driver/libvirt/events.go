package libvirt

import (
	"math"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// watch forwards lifecycle events and, after a lost connection, reconnects
// and asks for a resync: events sent while disconnected are gone.
func (d *Driver) watch() {
	defer close(d.done)
	defer close(d.events)
	seen := 0
	// Redial quickly at first (a restarting libvirtd is back within a
	// second), then every 5 s.
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 5 * time.Second}
	}
	backoff := newBackoff()
	for {
		c, err := d.connection()
		if err != nil {
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(backoff.Step()):
			}
			continue
		}
		backoff = newBackoff()
		if seen != 0 && c.generation != seen {
			d.emit(driver.Event{Kind: driver.EventResync})
		}
		seen = c.generation
		d.drain(c)
		if d.ctx.Err() != nil {
			return
		}
	}
}

// definitionChanges are the events of a definition changed without a
// lifecycle event: metadata written, a device added or removed.
var definitionChanges = []golibvirt.DomainEventID{golibvirt.DomainEventIDMetadataChange, golibvirt.DomainEventIDDeviceAdded, golibvirt.DomainEventIDDeviceRemoved}

// changedDomain is the UUID of the domain a definitionChanges event is
// about.
func changedDomain(e any) (string, bool) {
	switch m := e.(type) {
	case *golibvirt.DomainEventCallbackMetadataChangeMsg:
		return formatUUID(m.Dom.UUID), true
	case *golibvirt.DomainEventCallbackDeviceAddedMsg:
		return formatUUID(m.Dom.UUID), true
	case *golibvirt.DomainEventCallbackDeviceRemovedMsg:
		return formatUUID(m.Msg.Dom.UUID), true
	}
	return "", false
}

// drain handles a connection's events until all of its streams end. The
// definition changes only make d.definitions forget, whatever else happens
// meanwhile, so each stream of them is drained on its own.
func (d *Driver) drain(c *connection) {
	var wg sync.WaitGroup
	for _, ch := range c.changes {
		wg.Go(func() {
			for e := range ch {
				uuid, ok := changedDomain(e)
				if !ok {
					continue
				}
				d.definitions.forget(uuid)
				if _, removed := e.(*golibvirt.DomainEventCallbackDeviceRemovedMsg); removed {
					// A guest that releases a detached disk after
					// Ensure stopped waiting for it: its report no
					// longer names the disk as held.
					d.emit(driver.Event{UID: d.aliases.ownerOf(uuid), Kind: driver.EventChanged})
				}
			}
		})
	}
	defer wg.Wait()
	events, reboots := c.events, c.reboots
	for events != nil || reboots != nil {
		select {
		case e, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			d.handle(e)
		case e, ok := <-reboots:
			if !ok {
				reboots = nil
				continue
			}
			if r, ok := e.(*golibvirt.DomainEventCallbackRebootMsg); ok {
				d.rebooted(formatUUID(r.Msg.Dom.UUID))
			}
		}
	}
}

// rebootSettle is how long the resets of one reboot may take. One reboot
// can reset the machine more than once, so a single restart of a guest can
// bring several reboot events (the kernel may try several reset methods,
// and the firmware hard-resets when it finds itself re-run), and no guest
// boots and reboots again within it.
const rebootSettle = 10 * time.Second

// rebooted counts a guest reboot: libvirt saw the guest reset, whoever asked
// for it (a restart request, or the guest itself). Resets within
// rebootSettle of the last start or reboot are the same reboot.
func (d *Driver) rebooted(uid string) {
	d.stateMu.Lock()
	now := d.now()
	if last, ok := d.startedAt[uid]; !ok || now.Sub(last) >= rebootSettle {
		d.reboots[uid]++
	}
	d.startedAt[uid] = now
	d.stateMu.Unlock()
	d.emit(driver.Event{UID: uid, Kind: driver.EventChanged})
}

// started records when the guest (re)started, for the leases' sake.
func (d *Driver) started(uid string, at time.Time) {
	d.stateMu.Lock()
	d.startedAt[uid] = at
	d.stateMu.Unlock()
}

func (d *Driver) handle(e golibvirt.DomainEventLifecycleMsg) {
	d.definitions.forget(formatUUID(e.Dom.UUID))
	uid := d.aliases.ownerOf(formatUUID(e.Dom.UUID))
	kind, ok := map[golibvirt.DomainEventType]driver.EventKind{
		golibvirt.DomainEventDefined:     driver.EventDefined,
		golibvirt.DomainEventUndefined:   driver.EventUndefined,
		golibvirt.DomainEventStarted:     driver.EventStarted,
		golibvirt.DomainEventSuspended:   driver.EventSuspended,
		golibvirt.DomainEventResumed:     driver.EventResumed,
		golibvirt.DomainEventStopped:     driver.EventStopped,
		golibvirt.DomainEventShutdown:    driver.EventChanged,
		golibvirt.DomainEventPmsuspended: driver.EventSuspended,
		golibvirt.DomainEventCrashed:     driver.EventCrashed,
	}[golibvirt.DomainEventType(e.Event)]
	if !ok {
		kind = driver.EventChanged
	}
	switch kind {
	case driver.EventCrashed:
		d.stateMu.Lock()
		d.crashes[uid]++
		d.stateMu.Unlock()
	case driver.EventStarted:
		// A guest that arrived by live migration did not boot: its DHCP
		// lease and its reboots are the same boot's as before it came.
		// Nor did one resumed from a snapshot (see reverted).
		switch golibvirt.DomainEventStartedDetailType(e.Detail) {
		case golibvirt.DomainEventStartedMigrated, golibvirt.DomainEventStartedFromSnapshot:
		default:
			d.started(uid, d.now())
		}
	}
	if d.echoes.heard(formatUUID(e.Dom.UUID), golibvirt.DomainEventType(e.Event), d.now()) {
		return
	}
	d.emit(driver.Event{UID: uid, Kind: kind})
}

// emit never blocks the event loop: a lagging receiver loses hints, which the
// contract allows, and resyncs.
func (d *Driver) emit(e driver.Event) {
	select {
	case d.events <- e:
	default:
	}
}

// Events implements driver.Driver.
func (d *Driver) Events() <-chan driver.Event { return d.events }

func (d *Driver) pendingReboots(uid string) int32 {
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	return d.reboots[uid]
}

func (d *Driver) recordedReboots(uid string, n int32) {
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	if d.reboots[uid] -= n; d.reboots[uid] <= 0 {
		delete(d.reboots, uid)
	}
}
