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
	// detachWait bounds the wait for a guest to release a detached disk;
	// zero means defaultDetachWait.
	detachWait time.Duration

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
	// grown are the disk sizes growDisks last found in place.
	grown driver.GrownDisks
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
