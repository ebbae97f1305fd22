// Package app wires one node's agent together: the NATS connection with the
// node's identity, the backend's Driver, the bus, the reconciler and the
// heartbeat. Behaviour lives in those packages; this one only decides what
// runs, with which settings, and how it stops.
//
// The agent holds no credentials for the hub's Kubernetes cluster: everything
// it needs arrives in intents, resolved by the hub. (The kubevirt backend
// holds credentials for the KubeVirt cluster it fronts, a different one.)
package app

import (
	"cmp"
	"context"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/nats-io/nats.go"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/kubevirt"
	"github.com/virtfleet/virtfleet/agent/driver/libvirt"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	"github.com/virtfleet/virtfleet/agent/internal/lease"
	"github.com/virtfleet/virtfleet/agent/internal/reconciler"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/version"
)

// reconnectWait is the pause between attempts to reach a NATS server. The
// agent retries forever: a node must keep its guests and come back on its own
// however long the wire is down.
const reconnectWait = time.Second

// Run runs the agent until ctx is done, then stops it and returns nil. It
// returns an error when it cannot start (bad configuration, backend
// unreachable) or when the intent watch fails for good; a lost NATS server or
// a restarted backend daemon are not errors, they are waited out.
//
// Stopping leaves the guests running and the heartbeat in place; the nodes
// bucket's TTL is what tells the hub that an agent is gone for good.
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	log := cfg.Log.WithValues("node", cfg.Node)

	stopMetrics, err := serveMetrics(cfg.MetricsAddress, cfg.Metrics, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	stopPprof, err := servePprof(cfg.PprofAddress, log)
	if err != nil {
		return err
	}
	defer stopPprof()

	nc, err := connect(cfg, log)
	if err != nil {
		return err
	}
	defer nc.Close()

	drv, err := newDriver(ctx, cfg)
	if err != nil && ctx.Err() != nil {
		// Stopped while the backend was being reached: the stop ended the
		// start, not the backend, and a stop is a clean exit.
		return nil
	}
	if err != nil {
		return errors.Wrap(err, "cannot start driver")
	}
	defer func() {
		if err := drv.Close(); err != nil {
			log.Debug("Cannot close driver", "error", err)
		}
	}()

	b, err := bus.New(nc, bus.Config{
		Node:       cfg.Node,
		Timeout:    cfg.RequestTimeout,
		Log:        log,
		Rejections: &natswire.Rejections{Counter: cfg.Metrics.IntentsIgnored},
	})
	if err != nil {
		return errors.Wrap(err, "cannot start bus")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	limits := natswire.ConsoleLimits{Sessions: cfg.ConsoleSessions, BytesPerSecond: cfg.ConsoleBytesPerSecond}
	wg.Go(func() {
		// Consoles are a convenience: without them the node still runs
		// its guests, so a failure here stops nothing else.
		if err := natswire.ServeConsoles(ctx, nc, cfg.Node, limits, log, openConsole(consolesOf(drv), cfg.Backend)); err != nil {
			log.Info("Cannot serve consoles", "error", err)
		}
	})

	log.Info("Agent started", "backend", cfg.Backend, "version", version.Get(), "nats", nc.ConnectedUrlRedacted(), "fenceAfter", cfg.FenceAfter)
	err = runNode(ctx, cfg, b, drv, log)
	cancel()
	wg.Wait()
	log.Info("Agent stopped")
	return err
}

// runNode runs the node's own work over b and drv until ctx is done: the
// intent watch, the reconciler and the heartbeat, which renews the node's
// lease. It returns an error only when the intent watch fails for good.
func runNode(ctx context.Context, cfg Config, b bus.Bus, drv driver.Driver, log logging.Logger) error {
	l := lease.New(cfg.FenceAfter, nil)
	rec := reconciler.New(cfg.Node, drv, b, log, reconciler.Options{Workers: cfg.Workers, ResyncEvery: cfg.ResyncInterval, Metrics: cfg.Metrics, Lease: l, Backend: cfg.Backend})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		watchErr error
	)
	wg.Go(func() {
		// WatchIntents returns nil when ctx is done; anything else means the
		// agent can no longer learn what to do, so it stops everything.
		if err := b.WatchIntents(ctx, rec.Handlers()); err != nil {
			watchErr = errors.Wrap(err, "cannot watch intents")
			cancel()
		}
	})
	hb := &heartbeat{cfg: cfg, driver: drv, log: log}
	stored := func(issued time.Time) {
		// A lost lease is held again only after the intents are read
		// afresh: have the watch resume, so it says when it has.
		if l.Stored(issued) {
			b.ResumeIntents()
		}
	}
	wg.Go(func() {
		bus.RunHeartbeat(ctx, b, cfg.HeartbeatInterval, log, func() wire.NodeHeartbeat { return hb.next(ctx) }, stored)
	})
	rec.Run(ctx)
	wg.Wait()
	return watchErr
}

// openConsole opens the consoles the hub asks for through drv, refusing
// with the reason the driver's error gives: a guest not on the node is
// NotFound, a Terminal error (guest not running, no such console, console
// held) is Unavailable; any other error ServeConsoles refuses as Failed. A
// nil c (a driver that is no Consoler) refuses every console as
// Unavailable, so the user hears why at once instead of waiting for a node
// that never answers.
func openConsole(c driver.Consoler, backend string) func(context.Context, wire.ConsoleOpen) (io.ReadWriteCloser, error) {
	return func(ctx context.Context, o wire.ConsoleOpen) (io.ReadWriteCloser, error) {
		if c == nil {
			return nil, &natswire.ConsoleRefusedError{Reason: wire.ConsoleUnavailable, Message: "the " + cmp.Or(backend, driver.BackendLibvirt) + " backend of this node serves no consoles"}
		}
		s, err := c.OpenConsole(ctx, o.UID, driver.ConsoleKind(o.Kind))
		switch {
		case err == nil:
			return s, nil
		case driver.IsNotFound(err):
			return nil, &natswire.ConsoleRefusedError{Reason: wire.ConsoleNotFound, Message: err.Error()}
		case driver.IsTerminal(err):
			return nil, &natswire.ConsoleRefusedError{Reason: wire.ConsoleUnavailable, Message: err.Error()}
		}
		return nil, err
	}
}

// consolesOf is drv's consoles, or nil when it has none.
func consolesOf(drv driver.Driver) driver.Consoler {
	c, _ := drv.(driver.Consoler)
	return c
}

// connect opens the node's NATS connection. It does not wait for a server:
// with RetryOnFailedConnect the agent starts, works its backend, and catches
// up once NATS is reachable, so start order in a cluster does not matter.
func connect(cfg Config, log logging.Logger) (*nats.Conn, error) {
	id := natswire.Identity{
		User:        natswire.User{Name: cfg.Node},
		InboxPrefix: natswire.InboxPrefix(cfg.Node),
		Seed:        cfg.Seed,
	}
	opts, err := id.ConnectOptions()
	if err != nil {
		// The cause may quote the seed; say only which setting is wrong.
		return nil, errors.New("--nats-credentials: the file does not hold a valid nkey seed")
	}
	opts = append(opts,
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(reconnectWait),
		nats.Timeout(cfg.RequestTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Info("Disconnected from NATS; reconnecting", "error", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("Reconnected to NATS", "server", c.ConnectedUrlRedacted())
		}),
		// Refused requests arrive only here (permissions violations), so
		// this is where a misconfigured agent becomes visible.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Info("NATS error", "error", err)
		}),
	)
	nc, err := nats.Connect(strings.Join(cfg.NATSURLs, ","), opts...)
	return nc, errors.Wrap(err, "cannot connect to NATS")
}

// heartbeat builds the node's heartbeats from the driver's capacity.
type heartbeat struct {
	cfg    Config
	driver driver.Driver
	log    logging.Logger

	// last is the allocation last read, kept while the backend is down.
	last driver.Capacity
	// down is set while Capacity fails, so the failure is logged once.
	down bool
	// asking is a capacity read that outlasted its heartbeat, awaited by
	// the next one instead of asking again.
	asking chan capacityRead
}

// capacityRead is what one Capacity call returned.
type capacityRead struct {
	capacity driver.Capacity
	err      error
}

// capacity reads the backend's capacity, waiting at most one heartbeat
// interval: a backend that hangs (libvirtd stuck on a storage pool) must
// not hold back the heartbeat, whose absence would have the node fence
// itself, destroying the guests the hub then restarts elsewhere, though
// they ran. A read that takes longer is waited for by the next heartbeat,
// never asked twice. (The libvirt driver answers from its caches while no
// domain changed; a hang reaches the heartbeat once one has.)
func (h *heartbeat) capacity(ctx context.Context) (driver.Capacity, error) {
	if h.asking == nil {
		read := make(chan capacityRead, 1)
		go func() {
			c, err := reconciler.DriverCall(h.cfg.Metrics, reconciler.OpCapacity, func() (driver.Capacity, error) { return h.driver.Capacity(ctx) })
			read <- capacityRead{capacity: c, err: err}
		}()
		h.asking = read
	}
	t := time.NewTimer(h.cfg.HeartbeatInterval)
	defer t.Stop()
	select {
	case r := <-h.asking:
		h.asking = nil
		return r.capacity, r.err
	case <-t.C:
		return driver.Capacity{}, errors.Errorf("the backend has not answered within %s", h.cfg.HeartbeatInterval)
	case <-ctx.Done():
		return driver.Capacity{}, ctx.Err()
	}
}

// next is called by bus.RunHeartbeat from one goroutine.
//
// When the backend cannot be asked (libvirtd restarting, or hanging) the
// heartbeat still goes out, so the hub does not declare the node and its
// guests lost, but it offers no capacity, so nothing new is placed on a
// node that cannot create guests right now. The allocation is the last one
// read.
func (h *heartbeat) next(ctx context.Context) wire.NodeHeartbeat {
	hb := wire.NodeHeartbeat{
		Node:         h.cfg.Node,
		Backend:      h.cfg.Backend,
		Labels:       h.cfg.Labels,
		AgentVersion: version.Get(),
		SentAt:       time.Now().UTC(),
		// The lease the node keeps (lease.Lease): what lets the hub
		// restart its guests elsewhere, and when.
		FenceAfterMillis: h.cfg.FenceAfter.Milliseconds(),
		SharedPools:      h.cfg.SharedPools,
	}
	if o, ok := h.driver.(driver.Overlay); ok && o.TunnelAddress().IsValid() {
		hb.TunnelAddress = o.TunnelAddress().String()
	}
	if _, ok := h.driver.(driver.Migrator); ok {
		hb.MigrationURI = h.cfg.MigrationURI
	}
	_, hb.HostMigration = h.driver.(driver.HostMigrator)
	// This agent understands snapshot intents and restores; the backend
	// says whether it can keep snapshots.
	_, hb.Snapshots = h.driver.(driver.Snapshotter)
	_, hb.Backups = h.driver.(driver.Backuper)
	c, err := h.capacity(ctx)
	switch {
	case err != nil:
		if !h.down && ctx.Err() == nil {
			h.log.Info("Cannot read the backend's capacity; offering none until it answers", "error", err)
		}
		h.down = true
		hb.Allocated = wire.Resources{VCPU: h.last.AllocatedVCPU, MemoryBytes: h.last.AllocatedMemoryBytes}
		return hb
	case h.down:
		h.log.Info("Backend answers again")
		h.down = false
	}
	h.last = c
	hb.Capacity = wire.Resources{
		VCPU:        scale(c.VCPU, h.cfg.CPUAllocationRatio),
		MemoryBytes: scale(c.MemoryBytes, h.cfg.MemoryAllocationRatio),
	}
	hb.Allocated = wire.Resources{VCPU: c.AllocatedVCPU, MemoryBytes: c.AllocatedMemoryBytes}
	hb.Hypervisor = c.Hypervisor
	return hb
}

// scale rounds down: offering a fraction of a CPU or byte more than the ratio
// allows would let placement overshoot it.
func scale(v int64, ratio float64) int64 {
	return int64(math.Floor(float64(v) * ratio))
}

// newDriver is the one factory that turns the configured backend into a
// Driver; the reconciler above it knows only driver.Driver.
func newDriver(ctx context.Context, cfg Config) (driver.Driver, error) {
	if cfg.Driver != nil {
		return cfg.Driver, nil
	}
	switch cfg.Backend {
	case driver.BackendLibvirt:
		lc := cfg.Libvirt
		lc.Node = cfg.Node
		return libvirt.New(ctx, lc)
	case driver.BackendNova:
		nc := cfg.Nova
		nc.Node = cfg.Node
		return nova.New(ctx, nc)
	case driver.BackendKubeVirt:
		return kubevirt.New(ctx, cfg.KubeVirt)
	}
	return nil, errors.Errorf("unknown backend %q; want one of %s, %s, %s", cfg.Backend, driver.BackendLibvirt, driver.BackendNova, driver.BackendKubeVirt)
}
