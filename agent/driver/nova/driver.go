// Package nova is the driver.Driver that fronts one region of an OpenStack
// cloud: a guest is a Nova server booted from a Cinder volume, found by its
// metadata (MetaUID, MetaNode), so everything else in the project is left
// alone and a restarted agent rebuilds its view from one list call.
//
// What a VirtualMachine says becomes what Nova needs: vcpu, memory and swap
// pick a flavor with exactly that shape, or a private flavor named
// vf-c<vcpu>-m<MiB>-s<MiB> is created; the public key becomes a keypair named
// from its SHA-256; the first disk is the boot volume and the others are
// attached once the server has booted; networks are Neutron networks by
// name, created with a subnet from their CIDR when missing. Delete removes
// the server, then the keypair no other virtfleet server uses and the
// private flavor no server uses at all; volumes and networks stay.
//
// The driver watches with one changes-since list call per poll interval for
// all of its servers and serves Observe and List from what it saw; it GETs a
// single server only after acting on it.
//
// Shape changes: the Machine's flavor shape is hashed into the server's
// metadata (MetaShape); the shape the server last started with is MetaLive.
// While they differ a running server reports RestartRequired; at its next
// start the driver resizes it (resize, then confirmResize, while it is
// SHUTOFF), then starts it. A restart requested while a shape change waits
// is done as stop, apply, start. Extra disks need no restart: a disk added
// to or removed from the Machine is attached to or detached from the
// running server (volume hot-plug), or to the stopped one before it
// starts. A pause is Nova's pause action (the server shows PAUSED), a
// reset its hard reboot, after which a server that should stay paused is
// paused again. Network, key and user-data changes are not applied to an existing
// server (Nova would need a rebuild).
//
// Live migration between the cloud's compute hosts (MigrateHost) is Nova's
// own: the guest stays on the node, and Observe reports its new host once
// Nova moved it.
//
// Errors and retries (see retryRequest and classify): a 409 from a busy
// server is retried with backoff; a 413 or 429 with Retry-After is retried
// after it; 5xx and transport errors are retried with backoff on idempotent
// calls, while a failed POST is left to the next Ensure, which looks the
// server up by metadata before it creates one, so a create is never
// doubled. Whatever is left is returned: 400 as a Terminal error (the input
// can never succeed), 403 and an over-quota 413 as Failing, everything else
// as transient. A server in ERROR is reported Failed with Nova's fault
// message. An expired token is renewed by gophercloud (AllowReauth). No
// error or log line quotes the password or a token.
package nova

import (
	"cmp"
	"context"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// DefaultPollInterval between changes-since list calls.
const DefaultPollInterval = 5 * time.Second

// pollMargin is subtracted from the last poll's start for the next
// changes-since: Nova's timestamps have whole seconds, and the agent's clock
// may run ahead of the cloud's. Seeing a change twice costs nothing.
const pollMargin = 2 * time.Second

// Server metadata keys.
const (
	MetaUID       = "virtfleet-uid"
	MetaNode      = "virtfleet-node"
	MetaNamespace = "virtfleet-namespace"
	MetaName      = "virtfleet-name"
	// MetaBoot is the name of the boot volume, which cannot change.
	MetaBoot = "virtfleet-boot"
	// MetaShape is the hash of the shape the last Ensure asked for.
	MetaShape = "virtfleet-shape"
	// MetaLive is the hash of the shape the server last started with.
	MetaLive = "virtfleet-live"
	// MetaNonce is the last restart nonce handled.
	MetaNonce = "virtfleet-restart-nonce"
	// MetaReset is the last reset nonce handled.
	MetaReset = "virtfleet-reset-nonce"
	// MetaRestarts counts the restarts (and resets) the driver performed.
	MetaRestarts = "virtfleet-restarts"
	// MetaResizeFlavor is the flavor the last resize asked for.
	MetaResizeFlavor = "virtfleet-resize-flavor"
)

// Driver is the nova driver.Driver.
type Driver struct {
	node string
	poll time.Duration
	c    *clients
	now  func() time.Time

	ctx    context.Context
	cancel context.CancelFunc
	events chan driver.Event
	done   chan struct{}

	// view is every server of this agent by uid, as last listed or read.
	viewMu sync.Mutex
	// claimMu serialises claims, so two VMs never take one server.
	claimMu sync.Mutex
	view    map[string]servers.Server
	// readAt is when the driver last read a server itself, after acting on
	// it, or saw it gone (a uid in readAt but not in view): a listing that
	// started before then is older and is ignored, so a server deleted or
	// released while a poll was in flight does not come back from it.
	readAt map[string]time.Time
	// listings are the start times of the listings in flight; a uid seen
	// gone is remembered until none of them started before it.
	listings []time.Time

	// locks serialise the calls for one uid; see lock.
	locksMu sync.Mutex
	locks   map[string]*uidLock

	flavorMu  sync.Mutex
	networkMu sync.Mutex
	// shared is held for reading from a keypair's or flavor's lookup until
	// the server using it is created, and for writing while unused ones are
	// deleted, so a cleanup never removes what a create is about to use.
	shared sync.RWMutex

	cacheMu sync.Mutex
	// volumeIDs and networkIDs remember names resolved once.
	volumeIDs  map[string]string
	networkIDs map[string]string
	// grown are the disk sizes growDisks last found in place.
	grown driver.GrownDisks

	// confirmed are the servers whose resize the driver confirmed, and
	// when, until it sees them leave VERIFY_RESIZE.
	confirmed map[string]time.Time

	// migrations are the last live migration of each guest MigrateHost
	// was asked for, until the guest is deleted or released.
	migrationsMu sync.Mutex
	migrations   map[string]*hostMigration

	// imports are the node's image imports into Glance (images.go), and
	// pruneClock times the images no volume was made from.
	imports    *imageimport.Imports
	pruneClock imageimport.PruneClock
	// imageUse is held for reading from an image being found active until
	// the volume made from it exists, and for writing while images are
	// pruned, so a prune never deletes an image a volume is about to name.
	imageUse sync.RWMutex
	// loops counts the driver's background loops, for Close.
	loops sync.WaitGroup
}

var _ driver.Driver = (*Driver)(nil)

// New authenticates to the cloud cfg names and lists the agent's
// servers. It fails when the cloud cannot be reached or refuses the
// credentials, so misconfiguration shows at start-up; later outages are
// retried on every call.
func New(ctx context.Context, cfg Config) (driver.Driver, error) {
	return Open(ctx, cfg)
}

// Open is New returning the concrete type.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	c, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d := &Driver{
		node:       cfg.Node,
		poll:       cfg.PollInterval,
		c:          c,
		now:        time.Now,
		events:     make(chan driver.Event, 256),
		done:       make(chan struct{}),
		view:       map[string]servers.Server{},
		readAt:     map[string]time.Time{},
		locks:      map[string]*uidLock{},
		volumeIDs:  map[string]string{},
		networkIDs: map[string]string{},
		confirmed:  map[string]time.Time{},
		migrations: map[string]*hostMigration{},
		imports:    imageimport.New(cfg.Images),
	}
	if d.poll <= 0 {
		d.poll = DefaultPollInterval
	}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	start := d.now()
	if _, err := d.refresh(ctx); err != nil {
		d.cancel()
		return nil, err
	}
	go d.watch(start)
	d.loops.Add(1)
	go d.pruneEvery(cmp.Or(cfg.ImagePruneInterval, time.Minute))
	return d, nil
}

// uidLock is the lock of one uid and how many calls hold or wait for it.
type uidLock struct {
	sync.Mutex
	users int
}

// lock serialises calls for uid and returns the unlock. A uid's lock lives
// only while a call holds or waits for it: kept for every uid the agent
// ever served, the map would grow with each VM created on the node.
func (d *Driver) lock(uid string) func() {
	d.locksMu.Lock()
	l, ok := d.locks[uid]
	if !ok {
		l = &uidLock{}
		d.locks[uid] = l
	}
	l.users++
	d.locksMu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		d.locksMu.Lock()
		defer d.locksMu.Unlock()
		if l.users--; l.users == 0 {
			delete(d.locks, uid)
		}
	}
}

// ours reports whether a listed server is this agent's, and its uid.
func (d *Driver) ours(s servers.Server) (string, bool) {
	uid := s.Metadata[MetaUID]
	return uid, uid != "" && s.Metadata[MetaNode] == d.node && s.Metadata[MetaOrphaned] == ""
}

// listServers lists the project's servers in detail, changed since since
// when it is not zero (deleted ones included, as DELETED).
func (d *Driver) listServers(ctx context.Context, opts servers.ListOpts) ([]servers.Server, error) {
	page, err := servers.List(d.c.compute, opts).AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list servers")
	}
	all, err := servers.ExtractServers(page)
	return all, errors.Wrap(err, "cannot read servers")
}

// refresh lists every server and replaces the view with this agent's,
// keeping servers read since the list started.
func (d *Driver) refresh(ctx context.Context) ([]servers.Server, error) {
	start := d.beginListing()
	all, err := d.listServers(ctx, servers.ListOpts{})
	if err != nil {
		d.endListing(start)
		return nil, err
	}
	d.replaceView(all, start)
	return all, nil
}

// replaceView makes the view this agent's servers of all, a listing that
// started at start, except for what the driver read or saw gone since.
func (d *Driver) replaceView(all []servers.Server, start time.Time) {
	view := map[string]servers.Server{}
	for _, s := range all {
		if uid, ok := d.ours(s); ok {
			if old, dup := view[uid]; !dup || s.Created.Before(old.Created) {
				view[uid] = s
			}
		}
	}
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	for uid, at := range d.readAt {
		if at.After(start) {
			if s, ok := d.view[uid]; ok {
				view[uid] = s
			} else {
				delete(view, uid)
			}
		}
	}
	d.view = view
	d.endListingLocked(start)
}

// beginListing records a listing about to start and returns its start.
func (d *Driver) beginListing() time.Time {
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	start := d.now()
	d.listings = append(d.listings, start)
	return start
}

// endListing records that the listing that began at start is over.
func (d *Driver) endListing(start time.Time) {
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	d.endListingLocked(start)
}

// endListingLocked is endListing with viewMu held. It forgets the uids
// seen gone before every listing still in flight began: no listing left
// can bring them back.
func (d *Driver) endListingLocked(start time.Time) {
	if i := slices.Index(d.listings, start); i >= 0 {
		d.listings = slices.Delete(d.listings, i, i+1)
	}
	oldest := d.now()
	for _, t := range d.listings {
		if t.Before(oldest) {
			oldest = t
		}
	}
	for uid, at := range d.readAt {
		if _, live := d.view[uid]; !live && at.Before(oldest) {
			delete(d.readAt, uid)
		}
	}
}

// watch polls for changes until Close, hinting at every server that
// changed. After failed polls it asks for a resync: the reconciler should
// not rely on hints it may have missed.
func (d *Driver) watch(since time.Time) {
	defer close(d.done)
	defer close(d.events)
	t := time.NewTicker(d.poll)
	defer t.Stop()
	failed := false
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		start := d.beginListing()
		changed, err := d.listServers(d.ctx, servers.ListOpts{ChangesSince: since.Add(-pollMargin).UTC().Format(time.RFC3339)})
		if err != nil {
			d.endListing(start)
			failed = true
			continue
		}
		if failed {
			d.emit(driver.Event{Kind: driver.EventResync})
			failed = false
		}
		since = start
		for _, s := range changed {
			d.see(s, start)
		}
		d.endListing(start)
	}
}

// see puts a server listed at listedAt into the view and hints at it if it
// changed.
func (d *Driver) see(s servers.Server, listedAt time.Time) {
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	if s.Status == "DELETED" {
		for uid, old := range d.view {
			if old.ID == s.ID {
				delete(d.view, uid)
				d.readAt[uid] = listedAt
				d.emit(driver.Event{UID: uid, Kind: driver.EventUndefined})
			}
		}
		return
	}
	uid, ok := d.ours(s)
	if !ok {
		return
	}
	old, known := d.view[uid]
	switch {
	case d.readAt[uid].After(listedAt):
		return // read since, after the driver acted on it
	case known && old.ID != s.ID && old.Created.Before(s.Created):
		return // a duplicate; the oldest server is the guest
	case known && same(old, s):
		return
	}
	d.view[uid] = s
	kind := driver.EventChanged
	if !known {
		kind = driver.EventDefined
	}
	d.emit(driver.Event{UID: uid, Kind: kind})
}

// same reports whether two listings of a server say the same.
func same(a, b servers.Server) bool {
	return a.ID == b.ID && a.Status == b.Status && a.TaskState == b.TaskState && a.Updated.Equal(b.Updated) &&
		a.Host == b.Host && maps.Equal(a.Metadata, b.Metadata) && len(a.Addresses) == len(b.Addresses)
}

// remember puts a server the driver read at readAt into the view.
func (d *Driver) remember(uid string, s servers.Server, readAt time.Time) {
	d.viewMu.Lock()
	d.view[uid] = s
	d.readAt[uid] = readAt
	d.viewMu.Unlock()
}

// forget drops uid from the view, seen gone now: listings in flight,
// which may have read it before it went, do not bring it back.
func (d *Driver) forget(uid string) {
	d.grown.Forget(uid)
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	delete(d.view, uid)
	d.readAt[uid] = d.now()
}

func (d *Driver) cached(uid string) (servers.Server, bool) {
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	s, ok := d.view[uid]
	return s, ok
}

// emit never blocks: a lagging receiver loses hints, which the contract
// allows.
func (d *Driver) emit(e driver.Event) {
	select {
	case d.events <- e:
	default:
	}
}

// Events implements driver.Driver.
func (d *Driver) Events() <-chan driver.Event { return d.events }

// Close implements driver.Driver.
func (d *Driver) Close() error {
	d.cancel()
	<-d.done
	d.loops.Wait()
	d.imports.Wait()
	return nil
}

// Observe implements driver.Driver. It reads the view and calls nothing.
func (d *Driver) Observe(_ context.Context, uid string) (driver.Observation, error) {
	s, ok := d.cached(uid)
	if !ok {
		return driver.Observation{}, driver.NotFoundf("no server with %s %s", MetaUID, uid)
	}
	return d.observation(uid, s), nil
}

// List implements driver.Driver with one list call, which also refreshes
// the view.
func (d *Driver) List(ctx context.Context) ([]driver.Observation, error) {
	if _, err := d.refresh(ctx); err != nil {
		return nil, err
	}
	d.viewMu.Lock()
	view := maps.Clone(d.view)
	d.viewMu.Unlock()
	out := make([]driver.Observation, 0, len(view))
	for _, uid := range slices.Sorted(maps.Keys(view)) {
		out = append(out, d.observation(uid, view[uid]))
	}
	return out, nil
}

// observation is what a server says, in the driver's terms.
func (d *Driver) observation(uid string, s servers.Server) driver.Observation {
	o := driver.Observation{UID: uid, ID: s.ID, Node: s.Host}
	if o.Node == "" {
		// Not scheduled yet, or the policy hides the host from this user.
		o.Node = d.node
	}
	o.Phase, o.Message = phaseOf(s)
	restarts, _ := strconv.ParseInt(s.Metadata[MetaRestarts], 10, 32)
	o.RestartCount = int32(restarts)
	o.RestartRequired = (o.Phase == driver.PhaseRunning || o.Phase == driver.PhaseStarting || o.Phase == driver.PhasePaused) && s.Metadata[MetaShape] != s.Metadata[MetaLive]
	o.Interfaces = interfaces(s, d.now())
	fs := flavorShape(s)
	o.VCPU, o.MemoryBytes = int32(fs.VCPU), int64(fs.RAMMiB)*mib
	o.Disks = d.disks(s)
	return o
}

// disks are the volumes attached to s (one still detaching among them), as
// the Machine's disks name them, the boot disk first; nil while one of
// them is a volume whose name the driver has not resolved (after a start,
// before the guest's first Ensure): a partial list would show a disk gone.
func (d *Driver) disks(s servers.Server) []string {
	d.cacheMu.Lock()
	names := make(map[string]string, len(d.volumeIDs))
	for name, id := range d.volumeIDs {
		names[id] = name
	}
	d.cacheMu.Unlock()
	out := make([]string, 0, len(s.AttachedVolumes))
	for _, v := range s.AttachedVolumes {
		name, ok := names[v.ID]
		if !ok {
			return nil
		}
		out = append(out, name)
	}
	if i := slices.Index(out, s.Metadata[MetaBoot]); i > 0 {
		out = slices.Insert(slices.Delete(out, i, i+1), 0, s.Metadata[MetaBoot])
	}
	return out
}

// Capacity implements driver.Driver: the cloud's hypervisors, less what
// servers other than this agent's use, and this agent's servers' flavors.
// A user Nova's policy does not show the hypervisors to (403, the default
// for non-admins) gets the project's compute quota instead.
func (d *Driver) Capacity(ctx context.Context) (driver.Capacity, error) {
	var total, used struct{ vcpu, memoryMiB int64 }
	st, err := hypervisors.GetStatistics(ctx, d.c.computeBase).Extract()
	switch {
	case err == nil:
		total.vcpu, total.memoryMiB, used.vcpu, used.memoryMiB = int64(st.VCPUs), int64(st.MemoryMB), int64(st.VCPUsUsed), int64(st.MemoryMBUsed)
	case statusOf(err) == http.StatusForbidden:
		l, err := limits.Get(ctx, d.c.computeBase, nil).Extract()
		if err != nil {
			return driver.Capacity{}, classify(err, "cannot read the project's compute limits")
		}
		a := l.Absolute
		if a.MaxTotalCores < 0 || a.MaxTotalRAMSize < 0 {
			return driver.Capacity{}, errors.New("the hypervisors are hidden from this user and the project's quota is unlimited: no capacity to report")
		}
		total.vcpu, total.memoryMiB, used.vcpu, used.memoryMiB = int64(a.MaxTotalCores), int64(a.MaxTotalRAMSize), int64(a.TotalCoresUsed), int64(a.TotalRAMUsed)
	default:
		return driver.Capacity{}, classify(err, "cannot read hypervisor statistics")
	}
	var c driver.Capacity
	d.viewMu.Lock()
	for _, s := range d.view {
		sh := flavorShape(s)
		c.AllocatedVCPU += int64(sh.VCPU)
		c.AllocatedMemoryBytes += int64(sh.RAMMiB) * mib
	}
	d.viewMu.Unlock()
	othersVCPU := max(used.vcpu-c.AllocatedVCPU, 0)
	othersMemory := max(used.memoryMiB*mib-c.AllocatedMemoryBytes, 0)
	c.VCPU = max(total.vcpu-othersVCPU, 0)
	c.MemoryBytes = max(total.memoryMiB*mib-othersMemory, 0)
	return c, nil
}
