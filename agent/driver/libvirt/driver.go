// Package libvirt is the driver.Driver for hosts running libvirtd, reached
// with go-libvirt over its unix socket. A guest is a domain whose UUID is the
// VM's uid and whose <metadata> carries virtfleet's element (see Namespace);
// a network the driver made carries one too (see NetworkNamespace), and only
// such a network is ever removed; everything else on the host is left alone.
package libvirt

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// Defaults for an empty Config.
const (
	DefaultSocket        = "/run/libvirt/libvirt-sock"
	DefaultURI           = "qemu:///system"
	DefaultPool          = "default"
	DefaultShutdownGrace = 2 * time.Minute
)

// Driver is the libvirt driver.Driver.
type Driver struct {
	node   string
	socket string
	uri    string
	pool   string
	grace  time.Duration
	// domainType is the configured domain type; empty means the best the
	// host offers.
	domainType string
	// testDriver is set for libvirt's test driver, which simulates guests
	// and lacks a few calls (StorageVolUpload).
	testDriver bool
	now        func() time.Time
	// intercept, when set, wraps every connection's API: the seam tests
	// inject libvirt failures through.
	intercept func(API) API

	ctx    context.Context
	cancel context.CancelFunc
	events chan driver.Event
	done   chan struct{}

	mu   sync.Mutex
	conn *connection
	// generation counts connections, so the event loop knows it reconnected.
	generation int

	addresses *addressBook
	aliases   *aliases

	// images are the image imports; imagesInUse is read-held from an image
	// being found present until the disks made from it exist, and
	// write-held while pruning, so an image is never pruned between the
	// two; pruneClock says when an unused image goes.
	images      *imageimport.Imports
	imagesInUse sync.RWMutex
	pruneClock  imageimport.PruneClock

	// definitions are the domains' definitions Capacity reads.
	definitions *definitions
	// echoes are the events of the driver's own defines and starts.
	echoes *echoes
	// consoles are the guests' console sockets and open sessions.
	consoles *consoles
	// claimMu serialises claims, so two VMs never take one domain.
	claimMu sync.Mutex
	// networkMu serialises making, changing and removing networks and
	// their overlays: guests sharing a network may be ensured at once, and
	// libvirt refuses a second define or start of it. It guards defining
	// and peers.
	networkMu sync.Mutex
	// defining counts the interfaces of domains being defined, whose
	// networks and reservations are made and must stay (ensureNetworks).
	defining map[nic]int
	// tunnel is the node's underlay address, invalid for none; netns the
	// namespace of libvirtd's bridges, empty for the agent's own.
	tunnel netip.Addr
	netns  string
	// peers are the other nodes' tunnel addresses (SetPeers).
	peers []netip.Addr
	// loops counts the goroutines besides watch that Close waits for.
	loops sync.WaitGroup

	// migrateStart serialises starting live migrations and finishing what
	// they leave behind (migrate.go).
	migrateStart sync.Mutex
	// migrateMu guards migrations and incoming. It is taken after
	// networkMu, never before.
	migrateMu sync.Mutex
	// migrations are the last live migration started per uid.
	migrations map[string]*migration
	// incoming are the guests PrepareIncoming readied for a migration to
	// this node, per uid, until they arrive or are deleted.
	incoming map[string]*incoming

	stateMu sync.Mutex
	// shutdownAt is when a graceful shutdown was requested, per uid.
	shutdownAt map[string]time.Time
	// crashes counts crash events seen per uid since the agent started.
	crashes map[string]int32
	// reboots counts guest reboots seen (libvirt's reboot event: the guest
	// was reset and boots again) and not yet written to the domain's
	// metadata, per uid.
	reboots map[string]int32
	// startedAt is when the guest last started or rebooted, per uid: a DHCP
	// lease granted before it belongs to an earlier boot.
	startedAt map[string]time.Time
}

type connection struct {
	l       *golibvirt.Libvirt
	events  <-chan golibvirt.DomainEventLifecycleMsg
	reboots <-chan any
	// changes are the streams of definitionChanges: changes of a
	// definition without a lifecycle event, which d.definitions must not
	// outlive.
	changes []<-chan any
	// domainType is the domain type the host offers: kvm where it can,
	// else qemu (TCG); test on libvirt's test driver.
	domainType string
	generation int
	hostCPUs   int64
	hostMemory int64
}

var _ driver.Driver = (*Driver)(nil)

// New connects to libvirtd as cfg says. It fails when the daemon
// cannot be reached, so misconfiguration shows at start-up; later outages are
// retried on every call.
func New(ctx context.Context, cfg Config) (driver.Driver, error) {
	return Open(ctx, cfg)
}

// Open is New returning the concrete type.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	d := &Driver{
		node:        cfg.Node,
		socket:      cmp.Or(cfg.Socket, DefaultSocket),
		uri:         cmp.Or(cfg.URI, DefaultURI),
		pool:        cmp.Or(cfg.Pool, DefaultPool),
		grace:       cfg.ShutdownGrace,
		domainType:  cfg.DomainType,
		now:         time.Now,
		events:      make(chan driver.Event, 256),
		done:        make(chan struct{}),
		addresses:   newAddressBook(),
		aliases:     newAliases(),
		definitions: newDefinitions(),
		echoes:      newEchoes(),
		consoles:    newConsoles(cfg),
		defining:    map[nic]int{},
		tunnel:      cfg.TunnelAddress.Unmap(),
		netns:       cfg.Netns,
		shutdownAt:  map[string]time.Time{},
		crashes:     map[string]int32{},
		reboots:     map[string]int32{},
		startedAt:   map[string]time.Time{},
		migrations:  map[string]*migration{},
		incoming:    map[string]*incoming{},
	}
	if d.grace == 0 {
		d.grace = DefaultShutdownGrace
	}
	d.testDriver = strings.HasPrefix(d.uri, "test:")
	d.images = d.newImports(cfg.Images)
	if err := writable(d.images.Dir()); err != nil {
		return nil, err
	}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if _, err := d.connection(); err != nil {
		d.cancel()
		return nil, err
	}
	go d.watch()
	d.loops.Add(2)
	// Images are pruned, and networks swept, until the driver is closed; a
	// failed round is simply tried again at the next.
	go d.every(cmp.Or(cfg.ImagePruneInterval, defaultPruneEvery), func() { _, _ = d.PruneImages(d.ctx) })
	go d.every(networkSweepInterval, d.sweepNetworksNow)
	return d, nil
}

// connection returns the live connection, dialling a new one when the last
// one was lost (libvirtd restarted).
func (d *Driver) connection() (*connection, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil && d.conn.l.IsConnected() {
		return d.conn, nil
	}
	if d.ctx.Err() != nil {
		return nil, errors.New("driver is closed")
	}
	l, err := d.dial()
	if err != nil {
		return nil, err
	}
	domType, err := d.hostDomainType(l)
	if err != nil {
		_ = l.Disconnect()
		return nil, err
	}
	// The subscriptions last as long as the connection: they end when it
	// closes, and libvirtd drops their callbacks with it. Ending them
	// first, with a context, sends one deregistration each that races the
	// closing connection's own cleanup in libvirtd (libvirt 9.0 then logs
	// callbacks it cannot find, and was seen to read freed memory and die).
	subscribed := context.WithoutCancel(d.ctx)
	evs, err := l.LifecycleEvents(subscribed)
	if err != nil {
		_ = l.Disconnect()
		return nil, errors.Wrap(err, "cannot subscribe to domain events")
	}
	reboots, err := l.SubscribeEvents(subscribed, golibvirt.DomainEventIDReboot, golibvirt.OptDomain{})
	if err != nil {
		_ = l.Disconnect()
		return nil, errors.Wrap(err, "cannot subscribe to reboot events")
	}
	changes := make([]<-chan any, 0, len(definitionChanges))
	for _, id := range definitionChanges {
		ch, err := l.SubscribeEvents(subscribed, id, golibvirt.OptDomain{})
		if err != nil {
			_ = l.Disconnect()
			return nil, errors.Wrapf(err, "cannot subscribe to domain events %d", id)
		}
		changes = append(changes, ch)
	}
	_, mem, cpus, _, _, _, _, _, err := l.NodeGetInfo()
	if err != nil {
		_ = l.Disconnect()
		return nil, errors.Wrap(err, "cannot read host info")
	}
	d.generation++
	d.echoes.reset()
	d.conn = &connection{l: l, events: evs, reboots: reboots, changes: changes, domainType: domType, generation: d.generation, hostCPUs: int64(cpus), hostMemory: int64(mem) << 10}
	return d.conn, nil
}

// dial opens a new connection to libvirtd.
func (d *Driver) dial() (*golibvirt.Libvirt, error) {
	l := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(d.socket), dialers.WithLocalTimeout(5*time.Second)))
	if err := l.ConnectToURI(golibvirt.ConnectURI(d.uri)); err != nil {
		return nil, errors.Wrapf(err, "cannot reach libvirtd: cannot open %s on %s", d.uri, d.socket)
	}
	return l, nil
}

// hostDomainType picks the domain type from the host's capabilities and
// the configured one: kvm only where the host offers it (a define of type
// kvm fails on a host without /dev/kvm), else qemu, QEMU's own emulation.
func (d *Driver) hostDomainType(api API) (string, error) {
	if d.testDriver {
		return "test", nil
	}
	x, err := api.ConnectGetCapabilities()
	if err != nil {
		return "", errors.Wrap(err, "cannot read host capabilities")
	}
	var caps libvirtxml.Caps
	if err := caps.Unmarshal(x); err != nil {
		return "", errors.Wrap(err, "cannot parse host capabilities")
	}
	return domainTypeOf(caps, d.domainType)
}

// domainTypeOf is the domain type for hvm guests of the host's own
// architecture: want if the host offers it, or the best it offers when
// want is empty.
func domainTypeOf(caps libvirtxml.Caps, want string) (string, error) {
	offered := map[string]bool{}
	for _, g := range caps.Guests {
		if g.OSType != "hvm" || g.Arch.Name != caps.Host.CPU.Arch {
			continue
		}
		for _, dom := range g.Arch.Domains {
			offered[dom.Type] = true
		}
	}
	switch {
	case want != "" && offered[want]:
		return want, nil
	case want != "":
		return "", errors.Errorf("domain type %q was asked for, and the host offers no %s guests of its architecture %s", want, want, caps.Host.CPU.Arch)
	}
	for _, t := range []string{"kvm", "qemu"} {
		if offered[t] {
			return t, nil
		}
	}
	return "", errors.Errorf("the host offers no kvm or qemu guests of its architecture %s (is qemu-system installed?)", caps.Host.CPU.Arch)
}

// DomainType is the domain type guests on this host get: kvm, qemu (TCG)
// or test.
func (d *Driver) DomainType() (string, error) {
	c, err := d.connection()
	if err != nil {
		return "", err
	}
	return c.domainType, nil
}

func (d *Driver) api() (API, *connection, error) {
	c, err := d.connection()
	if err != nil {
		return nil, nil, err
	}
	return d.through(c.l), c, nil
}

// through is l as the driver calls it: through the test's intercept, if
// any, and forgetting what d.definitions keeps of what it changes.
func (d *Driver) through(l API) API {
	if d.intercept != nil {
		l = d.intercept(l)
	}
	return forgetting{API: l, defs: d.definitions}
}

// Close implements driver.Driver.
func (d *Driver) Close() error {
	d.cancel()
	d.mu.Lock()
	var err error
	if d.conn != nil && d.conn.l.IsConnected() {
		// The event subscriptions end with the connection (see
		// connection), so their callbacks go in libvirtd's one cleanup.
		err = d.conn.l.Disconnect()
	}
	d.mu.Unlock()
	<-d.done
	d.loops.Wait()
	d.images.Wait()
	return errors.Wrap(err, "cannot disconnect from libvirtd")
}

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
	if driver.IsNotFound(err) || (!info.owner.Imported && info.owner.SpecHash != owner.SpecHash) {
		if info.owner != nil {
			// A redefinition keeps what the old definition counted.
			owner.LastNonce, owner.Restarts = info.owner.LastNonce, info.owner.Restarts
		}
		// Its disks are looked up, and made when absent, from here on.
		if err := d.refreshDiskPools(api, m); err != nil {
			return driver.Observation{}, err
		}
		d.imagesInUse.RLock()
		importing, err := d.prepareImages(api, m)
		if err == nil && importing == "" {
			dom, err = d.define(api, conn, key, owner, info.owner == nil, nets)
			if err == nil && info.owner != nil {
				d.leftNetworks(api, info.nics, nicsOf(key))
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
	// The next definition's hash is the one just written or read.
	return d.observeWith(look{api: api, nets: nets, definedHash: owner.SpecHash}, dom, m.UID, live)
}

// define creates what the guest needs and (re)defines its domain. A running
// domain keeps running on its old definition until its next start.
//
// For a new guest, a definition libvirt refuses for good (a machine or
// domain type the host lacks, an unsupported configuration) leaves nothing
// behind: the volumes made for it here are removed again.
func (d *Driver) define(api API, conn *connection, m driver.Machine, owner ownership, fresh bool, nets *networkView) (dom golibvirt.Domain, err error) {
	if int64(m.VCPU) > conn.hostCPUs {
		return golibvirt.Domain{}, driver.Terminalf("vcpu %d is more than the %d CPUs of node %s", m.VCPU, conn.hostCPUs, d.node)
	}
	for _, n := range m.Networks {
		if err := d.checkNetwork(n); err != nil {
			return golibvirt.Domain{}, err
		}
	}
	release, err := d.ensureNetworks(api, m, nets)
	if err != nil {
		return golibvirt.Domain{}, err
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
	for i, disk := range m.Disks {
		pool := cmp.Or(disk.Pool, d.pool)
		if disk.Imported {
			if m.Disks[i].Format, err = d.importedFormat(api, pool, disk.Name); err != nil {
				return golibvirt.Domain{}, err
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
			return golibvirt.Domain{}, err
		}
		if created {
			made = append(made, poolVolume{pool: pool, name: disk.Name})
		}
	}
	made = append(made, poolVolume{pool: d.pool, name: seedVolume(m.UID)})
	var swapFmt string
	if m.SwapBytes > 0 {
		made = append(made, poolVolume{pool: d.pool, name: swapVolume(m.UID)})
		created, err := ensureVolume(api, d.pool, swapVolume(m.UID), m.SwapBytes, swapFormat)
		if err != nil {
			return golibvirt.Domain{}, err
		}
		// Only a swap volume made before may be in another format.
		if !created {
			if swapFmt, err = volumeFormat(api, d.pool, swapVolume(m.UID)); err != nil {
				return golibvirt.Domain{}, err
			}
		}
	}
	iso, err := seedISO(m)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	if err := writeSeed(api, d.pool, seedVolume(m.UID), iso, d.testDriver); err != nil {
		return golibvirt.Domain{}, err
	}
	spec := domainSpec{machine: m, owner: owner, domainType: conn.domainType, pool: d.pool, consoleDir: d.consoles.dir, swapFormat: swapFmt}
	if slices.ContainsFunc(m.Networks, func(n driver.Network) bool { return n.VNI != 0 }) {
		if spec.overlayMTU, err = d.overlayMTU(); err != nil {
			return golibvirt.Domain{}, err
		}
	}
	x, err := domainXML(spec)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	key, err := parseUUID(m.UID)
	if err != nil {
		return golibvirt.Domain{}, driver.Terminal(errors.Wrap(err, "the guest's uid is no UUID"))
	}
	d.echoes.expect(formatUUID(key), golibvirt.DomainEventDefined, d.now())
	dom, err = api.DomainDefineXMLFlags(x, 0)
	if err != nil {
		d.echoes.withdraw(formatUUID(key), golibvirt.DomainEventDefined)
	}
	if isCode(err, permanentCodes...) {
		return dom, driver.Terminal(errors.Wrap(err, "libvirt rejected the guest's definition"))
	}
	return dom, errors.Wrap(err, "cannot define domain")
}

// permanentCodes are libvirt errors no retry mends: the request itself is
// wrong for this host (say "invalid argument: could not get preferred
// machine for ... type=kvm", or "unsupported configuration: Emulator ...
// does not support machine type ...").
var permanentCodes = []golibvirt.ErrorNumber{
	golibvirt.ErrXMLError, golibvirt.ErrXMLDetail, golibvirt.ErrConfigUnsupported,
	golibvirt.ErrInvalidArg, golibvirt.ErrNoSupport,
}

// start starts the domain. libvirt refusing the start of a definition it
// accepted (firmware the host lacks: "operation failed: Unable to find any
// firmware to satisfy 'efi'") is shown to the user and retried with
// backoff, since installing the missing piece on the host mends it.
func (d *Driver) start(api API, dom golibvirt.Domain, uid string) error {
	at := d.now()
	d.echoes.expect(formatUUID(dom.UUID), golibvirt.DomainEventStarted, at)
	err := api.DomainCreate(dom)
	if err != nil {
		d.echoes.withdraw(formatUUID(dom.UUID), golibvirt.DomainEventStarted)
	}
	if isCode(err, append(permanentCodes, golibvirt.ErrOperationFailed)...) {
		return driver.Failing(errors.Wrap(err, "libvirt cannot start the guest"))
	}
	if err != nil {
		return errors.Wrap(err, "cannot start domain")
	}
	d.started(uid, at)
	return nil
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
	if active {
		live, x, err := d.describeXML(api, dom, m.UID, 0)
		if err != nil {
			return err
		}
		liveHash = live.owner.SpecHash
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
	case restart && (halted || paused || m.Paused || s == golibvirt.DomainRunning && liveHash != owner.SpecHash), reset && halted:
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

// shutdown asks the guest to power off and forces it off once the grace
// period has passed. It never waits: the caller comes back.
func (d *Driver) shutdown(api API, dom golibvirt.Domain, uid string) error {
	d.stateMu.Lock()
	at, asked := d.shutdownAt[uid]
	if !asked {
		d.shutdownAt[uid] = d.now()
	}
	d.stateMu.Unlock()
	if !asked {
		return errors.Wrap(api.DomainShutdown(dom), "cannot shut domain down")
	}
	if d.now().Sub(at) < d.grace {
		return nil
	}
	return d.forceOff(api, dom)
}

// forceOff powers the domain off at once (virsh destroy).
func (d *Driver) forceOff(api API, dom golibvirt.Domain) error {
	err := api.DomainDestroy(dom)
	if isCode(err, golibvirt.ErrOperationInvalid) {
		return nil // already off
	}
	return errors.Wrap(err, "cannot force domain off")
}

func (d *Driver) clearShutdown(uid string) {
	d.stateMu.Lock()
	delete(d.shutdownAt, uid)
	d.stateMu.Unlock()
}

func (d *Driver) shuttingDown(uid string) bool {
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	_, ok := d.shutdownAt[uid]
	return ok
}

// saveOwnership writes changed metadata to the definition and, for a running
// domain, to its live state, which is what Observe reads. The live copy keeps
// liveHash, the shape the domain was started with, so Observe can tell that
// a newer definition waits for the next start.
func (d *Driver) saveOwnership(api API, dom golibvirt.Domain, old, next ownership, liveHash string, active bool) error {
	if old == next {
		return nil
	}
	live := next
	live.SpecHash = liveHash
	if !active || live == next {
		flags := golibvirt.DomainAffectConfig
		if active {
			flags |= golibvirt.DomainAffectLive
		}
		return d.setOwnership(api, dom, next, flags)
	}
	if err := d.setOwnership(api, dom, next, golibvirt.DomainAffectConfig); err != nil {
		return err
	}
	return d.setOwnership(api, dom, live, golibvirt.DomainAffectLive)
}

func (d *Driver) setOwnership(api API, dom golibvirt.Domain, o ownership, flags golibvirt.DomainModificationImpact) error {
	x, err := o.marshal()
	if err != nil {
		return err
	}
	err = api.DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{x}, golibvirt.OptString{metadataKey}, golibvirt.OptString{Namespace}, flags)
	return errors.Wrap(err, "cannot write domain metadata")
}

// Delete implements driver.Driver.
func (d *Driver) Delete(ctx context.Context, uid string) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	dom, info, err := d.lookup(api, uid, golibvirt.DomainXMLInactive)
	var notOurs *NotOursError
	key := uid
	var released []nic
	found := false
	switch {
	case errors.As(err, &notOurs):
		return nil // another VM's now, or released: not to be touched
	case driver.IsNotFound(err):
	case err != nil:
		return err
	default:
		found = true
		key = formatUUID(dom.UUID)
		// The running definition may have interfaces the next one dropped;
		// unread, they are only left to the sweeps of the networks the
		// driver made.
		released = info.nics
		if x, err := api.DomainGetXMLDesc(dom, 0); err == nil {
			if live, err := parseDomain(x); err == nil {
				released = append(released, live.nics...)
			}
		}
		if err := api.DomainDestroy(dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid, golibvirt.ErrNoDomain) {
			return errors.Wrap(err, "cannot stop domain")
		}
		flags := golibvirt.DomainUndefineManagedSave | golibvirt.DomainUndefineSnapshotsMetadata
		if info.firmware == driver.FirmwareUEFI {
			flags |= golibvirt.DomainUndefineNvram
		}
		if err := api.DomainUndefineFlags(dom, flags); err != nil && !isCode(err, golibvirt.ErrNoDomain) {
			return errors.Wrap(err, "cannot undefine domain")
		}
	}
	// Also after a crash between undefine and here: the volumes are the
	// guest's alone, named by its uid.
	for _, v := range []string{seedVolume(key), swapVolume(key)} {
		if err := deleteVolume(api, d.pool, v); err != nil {
			return err
		}
	}
	// A guest readied for a migration that did not come: what the
	// migration made of it goes too, and its interfaces are no longer held.
	if err := d.dropIncoming(ctx, uid, !found); err != nil {
		return err
	}
	d.aliases.set(key, key)
	d.addresses.forget(uid)
	d.clearShutdown(uid)
	d.stateMu.Lock()
	delete(d.startedAt, uid)
	delete(d.reboots, uid)
	delete(d.crashes, uid)
	d.stateMu.Unlock()
	// Also when the domain was gone already: a sweep cut short before
	// is finished.
	return d.sweepNetworks(api, append(released, d.releaseIncoming(uid)...))
}

// generationNow is the connection generation of the live connection, for
// callers of the definitions that hold only an API. A read through an
// earlier connection fails: that connection is closed.
func (d *Driver) generationNow() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.generation
}

// every calls fn every interval until the driver is closed, as one of the
// driver's loops.
func (d *Driver) every(interval time.Duration, fn func()) {
	defer d.loops.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
