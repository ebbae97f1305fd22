// Package reconciler is the agent's desired-vs-observed loop. Intents say what
// the hub wants on this node; the Driver says what is there. For each guest
// (and Volume, and the node's Fabric) the reconciler compares the two, acts
// through the Driver, and writes a report when what it would say has changed.
// It is level-triggered: intents, driver events and a periodic resync only
// put an item on a work queue, and the worker always starts from the current
// intent and observation.
package reconciler

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	"github.com/virtfleet/virtfleet/agent/internal/lease"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Options tune a Reconciler. Zero values take the defaults.
type Options struct {
	// Workers reconcile different guests in parallel; one guest is never
	// reconciled by two workers at once. Default 8.
	Workers int
	// ResyncEvery re-examines every guest even without a trigger. Default 60 s.
	ResyncEvery time.Duration
	// PollTransitional re-examines a guest in a transitional phase
	// (Provisioning, Starting, Stopping), which not every backend announces
	// with an event. Default 1 s.
	PollTransitional time.Duration
	// BackupProgress is how often a backup's report shows its progress
	// while it runs. Default 2 s.
	BackupProgress time.Duration
	// RetryBase and RetryMax bound the per-guest exponential backoff after a
	// retryable error. Defaults 250 ms and 1 min.
	RetryBase, RetryMax time.Duration
	// ImagePollEvery re-reads the node's images to report them when no
	// import runs; it bounds how long a pruned image stays reported.
	// Default 10 s.
	ImagePollEvery time.Duration
	// ObserveEvery re-examines a guest a VM only observes, and a volume a
	// Volume imports. Default 5 s.
	ObserveEvery time.Duration
	// Now replaces time.Now, for tests.
	Now func() time.Time
	// Lease is the node's lease; nil means the node never fences itself.
	// While it is not held (lease.Lease.Fenced) every guest whose intent
	// sets Fence is destroyed, and none is created or started: see fence.
	Lease *lease.Lease
	// Metrics are observed as the reconciler works; nil means the
	// process's (metrics.DefaultAgent).
	Metrics *metrics.AgentMetrics
	// Backend names the node's backend (driver.BackendLibvirt, ...) in
	// what the reconciler tells the user; empty leaves it unnamed.
	Backend string
}

func (o *Options) defaults() {
	if o.Workers <= 0 {
		o.Workers = 8
	}
	if o.ResyncEvery <= 0 {
		o.ResyncEvery = 60 * time.Second
	}
	if o.PollTransitional <= 0 {
		o.PollTransitional = time.Second
	}
	if o.BackupProgress <= 0 {
		o.BackupProgress = 2 * time.Second
	}
	if o.RetryBase <= 0 {
		o.RetryBase = 250 * time.Millisecond
	}
	if o.RetryMax <= 0 {
		o.RetryMax = time.Minute
	}
	if o.ImagePollEvery <= 0 {
		o.ImagePollEvery = 10 * time.Second
	}
	if o.ObserveEvery <= 0 {
		o.ObserveEvery = defaultObserveEvery
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Metrics == nil {
		o.Metrics = metrics.DefaultAgent()
	}
}

// The kinds of queue items: each has its own reconcile function.
const (
	kindGuest    = "guest"
	kindVolume   = "volume"
	kindFabric   = "fabric"
	kindSnapshot = "snapshot"
	kindBackup   = "backup"
)

// item is what the queue holds: one thing to converge, of a kind.
type item struct {
	kind string
	uid  string
}

func guest(uid string) item { return item{kind: kindGuest, uid: uid} }

// Reconciler makes one node's guests match its intents.
type Reconciler struct {
	node      string
	driver    driver.Driver
	log       logging.Logger
	opts      Options
	metrics   *metrics.AgentMetrics
	queue     workqueue.TypedRateLimitingInterface[item]
	reconcile map[string]func(ctx context.Context, uid string) (time.Duration, error)
	// reports, volumeReports, imageReports and snapshotReports write each
	// kind of report when it changes; the guest gauge counts reports
	// (countGuests).
	reports         *writer[wire.Report]
	volumeReports   *writer[wire.VolumeReport]
	imageReports    *writer[wire.ImageReport]
	snapshotReports *writer[wire.SnapshotReport]
	backupReports   *writer[wire.BackupReport]
	// stored lists the node's reports on the bus; listing is set once the
	// reports an earlier agent left are being looked at
	// (lookAtReportedBefore).
	stored  bus.Reports
	listing atomic.Bool
	// guestErrors and imageErrors are the errors last logged per guest
	// and per image, so each cause is logged once.
	guestErrors, imageErrors errorLog
	// guestLocks keep the driver's work on one guest to one worker at a
	// time, across the guest's item and its snapshots' (snapshot.go).
	guestLocks guestLocks

	mu      sync.Mutex
	intents map[string]wire.Intent
	// volumes are the Volume intents, by Volume uid.
	volumes map[string]wire.VolumeIntent
	// snapshots are the SnapshotIntents, by snapshot uid;
	// snapshotsFailed those that failed for good, as they were then.
	snapshots, snapshotsFailed map[string]wire.SnapshotIntent
	// backups are the BackupIntents, by backup uid (backup.go).
	backups map[string]wire.BackupIntent
	// restores are the guests' restores this process began or found
	// reported, by guest uid and restore ID (restore.go).
	restores map[string]map[string]wire.RestoreReport
	// synced is set once the bus delivered every intent; before that an
	// absent intent may just not have arrived yet, so nothing is deleted.
	synced bool
	// orphans are the node's released guests, by the uid they were
	// released under, as of the last resync or release.
	orphans map[string]driver.Observation
	// cleared are adopted orphans whose report this run deleted.
	cleared map[string]bool
	// imagesCleaned is set once the reports of images the intents name but
	// the node does not have were deleted (see staleImageReports).
	imagesCleaned bool

	// imports are when the last import counted per image uid finished;
	// only the image loop uses it.
	imports map[string]time.Time
	// imagesNudge wakes the image loop.
	imagesNudge chan struct{}
	// peers are the other nodes' tunnel addresses, as the Fabric last
	// said.
	peers []netip.Addr
	// addressless are the running guests seen with an interface that has
	// no address yet, by uid, with when that was first seen.
	addressless map[string]time.Time
	// settled are the guests last ensured settled, and listed the
	// observations a periodic resync listed of them, by uid (settled.go).
	settled map[string]settled
	listed  map[string]listed
}

// New returns a Reconciler for node that writes its reports to reports.
// Watch the bus's intents with its Handlers and call Run to start working.
func New(node string, d driver.Driver, reports bus.Reports, log logging.Logger, o Options) *Reconciler {
	o.defaults()
	r := &Reconciler{
		node:    node,
		driver:  d,
		log:     log.WithValues("node", node),
		opts:    o,
		metrics: o.Metrics,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[item](o.RetryBase, o.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[item]{Name: "guests-" + node},
		),
		intents:         map[string]wire.Intent{},
		volumes:         map[string]wire.VolumeIntent{},
		snapshots:       map[string]wire.SnapshotIntent{},
		snapshotsFailed: map[string]wire.SnapshotIntent{},
		backups:         map[string]wire.BackupIntent{},
		restores:        map[string]map[string]wire.RestoreReport{},
		addressless:     map[string]time.Time{},
		settled:         map[string]settled{},
		listed:          map[string]listed{},
		imports:         map[string]time.Time{},
		orphans:         map[string]driver.Observation{},
		cleared:         map[string]bool{},
		imagesNudge:     make(chan struct{}, 1),
	}
	r.reconcile = map[string]func(context.Context, string) (time.Duration, error){
		kindGuest:    r.reconcileGuest,
		kindVolume:   r.reconcileVolume,
		kindFabric:   r.reconcileFabric,
		kindSnapshot: r.reconcileSnapshot,
		kindBackup:   r.reconcileBackup,
	}
	// The guest gauge has every phase at 0 from the start.
	r.stored = reports
	r.reports = newWriter(wire.GuestReports, reports, r.countGuests)
	r.volumeReports = newWriter(wire.VolumeReports, reports, nil)
	r.imageReports = newWriter(wire.ImageReports, reports, nil)
	r.snapshotReports = newWriter(wire.SnapshotReports, reports, nil)
	r.backupReports = newWriter(wire.BackupReports, reports, nil)
	return r
}

// Handlers are the reconciler's handlers of the bus's intent watch: each kind
// of intent is recorded and its item queued. Synced queues a full resync,
// which is what deletes guests whose intents vanished while the agent was
// away.
func (r *Reconciler) Handlers() bus.Handlers {
	return bus.Handlers{
		Kinds: []bus.Handler{
			bus.On(wire.GuestIntents, r.guestIntent),
			bus.On(wire.VolumeIntents, r.volumeIntent),
			bus.On(wire.Fabrics, r.fabric),
			bus.On(wire.SnapshotIntents, r.snapshotIntent),
			bus.On(wire.BackupIntents, r.backupIntent),
		},
		Synced: r.intentsSynced,
	}
}

func (r *Reconciler) guestIntent(ev bus.Event[wire.Intent]) {
	r.log.Debug("Guest intent", "uid", ev.UID, "revision", ev.Revision, "deleted", ev.Deleted, "generation", ev.Value.Generation, "running", ev.Value.Running)
	record(r, r.intents, kindGuest, ev)
}

func (r *Reconciler) volumeIntent(ev bus.Event[wire.VolumeIntent]) {
	record(r, r.volumes, kindVolume, ev)
}

// record keeps the intent of ev in intents, or drops it once deleted, and
// queues its item.
func record[V any](r *Reconciler, intents map[string]V, kind string, ev bus.Event[V]) {
	r.mu.Lock()
	if ev.Deleted {
		delete(intents, ev.UID)
	} else {
		intents[ev.UID] = ev.Value
	}
	r.mu.Unlock()
	r.queue.Add(item{kind: kind, uid: ev.UID})
}

// intentsSynced also tells the lease, first, so that the resync it queues
// starts the guests that fence once the lease is held again.
func (r *Reconciler) intentsSynced() {
	if r.opts.Lease != nil {
		r.opts.Lease.Synced()
	}
	r.mu.Lock()
	r.synced = true
	r.mu.Unlock()
	r.resync(context.Background())
}

// Run works the queue until ctx is done: workers, driver events as triggers,
// a full resync every Options.ResyncEvery, the node's image reports, and
// the watchdog of the node's lease (watchLease).
func (r *Reconciler) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { r.runImages(ctx) })
	for range r.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r.processNext(ctx) {
			}
		}()
	}

	tick := time.NewTicker(r.opts.ResyncEvery)
	defer tick.Stop()
	var watchdog <-chan time.Time
	if r.opts.Lease != nil && r.opts.Lease.After() > 0 {
		t := time.NewTicker(r.opts.Lease.CheckEvery())
		defer t.Stop()
		watchdog = t.C
	}
	leaseState := lease.Held
	events := r.driver.Events()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			r.sweep(ctx, true)
		case <-watchdog:
			leaseState = r.watchLease(leaseState)
		case ev, ok := <-events:
			if !ok {
				events = nil // driver closed; the resync still runs
				continue
			}
			if ev.Kind == driver.EventResync || ev.UID == "" {
				r.resync(ctx)
				continue
			}
			// Whatever the event says, the guest takes the full way.
			r.forgetSettled(ev.UID)
			r.queue.Add(guest(ev.UID))
		}
	}
	r.queue.ShutDown()
	wg.Wait()
}

// resync queues every guest the node should have or has, every Volume and
// every snapshot, each guest to be ensured. Until the intents are synced
// only the intents are queued: a guest without an intent might be one whose
// intent has not arrived yet.
func (r *Reconciler) resync(ctx context.Context) { r.sweep(ctx, false) }

// sweep is resync; a periodic one takes what it lists of the guests that
// were settled as their observation instead of ensuring them (settled.go).
func (r *Reconciler) sweep(ctx context.Context, periodic bool) {
	r.mu.Lock()
	items := make([]item, 0, len(r.intents)+len(r.volumes)+len(r.snapshots))
	for uid := range r.intents {
		items = append(items, guest(uid))
	}
	for uid := range r.volumes {
		items = append(items, item{kind: kindVolume, uid: uid})
	}
	for uid := range r.snapshots {
		items = append(items, item{kind: kindSnapshot, uid: uid})
	}
	for uid := range r.backups {
		items = append(items, item{kind: kindBackup, uid: uid})
	}
	synced := r.synced
	r.mu.Unlock()
	// Queued once the listing is kept, so no guest is taken up before,
	// and each once: a guest is there by its intent, its report and the
	// listing at once, and a worker that took it up between two adds would
	// reconcile it again, through Ensure, the listing's observation taken.
	defer func() {
		queued := make(map[item]bool, len(items))
		for _, it := range items {
			if !queued[it] {
				queued[it] = true
				r.queue.Add(it)
			}
		}
	}()
	if !synced {
		return
	}
	// A report whose guest went out of band (an orphan deleted by hand) is
	// looked at, and deleted, too; so is one an earlier agent of this node
	// wrote.
	for _, uid := range r.reports.uids() {
		items = append(items, guest(uid))
	}
	for _, uid := range r.snapshotReports.uids() {
		items = append(items, item{kind: kindSnapshot, uid: uid})
	}
	for _, uid := range r.backupReports.uids() {
		items = append(items, item{kind: kindBackup, uid: uid})
	}
	r.lookAtReportedBefore(ctx)
	start := time.Now()
	defer func() { r.metrics.ResyncDuration.WithLabelValues().Observe(time.Since(start).Seconds()) }()
	if err := r.refreshOrphans(ctx); err != nil {
		r.log.Info("Cannot list orphaned guests; the next resync tries again", "error", err)
		return
	}
	guests, err := DriverCall(r.metrics, OpList, func() ([]driver.Observation, error) { return r.driver.List(ctx) })
	if err != nil {
		r.log.Info("Cannot list guests; the next resync tries again", "error", err)
		return
	}
	if periodic {
		r.keepListed(guests, start)
	}
	for _, g := range guests {
		items = append(items, guest(g.UID))
	}
	r.mu.Lock()
	for uid := range r.orphans {
		items = append(items, guest(uid))
	}
	r.mu.Unlock()
}

// lookAtReportedBefore queues, once per agent, the guests and snapshots this
// node reported before the agent started. An agent that starts afresh
// remembers no report, and a guest that went while no agent ran (its VM
// deleted while the node was lost, and the hypervisor lost its guests too)
// has neither intent nor guest to bring it up: without this its report
// would stay, and hold its VM's deletion, for good. So would a snapshot's
// whose intent the hub deleted while no agent ran. The listing runs apart
// from the resync, which the bus may call with its own locks held.
func (r *Reconciler) lookAtReportedBefore(ctx context.Context) {
	if !r.listing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		keys, err := r.stored.Keys(ctx)
		if err != nil {
			r.log.Info("Cannot list the reports this node wrote before; the next resync tries again", "error", err)
			r.listing.Store(false)
			return
		}
		for _, key := range keys {
			if _, rest, err := wire.ParseKey(key); err == nil {
				if uid, ok := wire.GuestReports.UID(rest); ok && !intended(r, r.intents, uid) {
					r.queue.Add(guest(uid))
				}
				if uid, ok := wire.SnapshotReports.UID(rest); ok && !intended(r, r.snapshots, uid) {
					r.queue.Add(item{kind: kindSnapshot, uid: uid})
				}
				if uid, ok := wire.BackupReports.UID(rest); ok && !intended(r, r.backups, uid) {
					r.queue.Add(item{kind: kindBackup, uid: uid})
				}
			}
		}
	}()
}

// intended says whether intents holds uid. The listing of earlier reports
// passes over what has an intent: the intent's own events queue it, and the
// listing, which may end after this agent reported on it, would make it
// taken up once more for nothing (a Terminal failure tried again).
func intended[V any](r *Reconciler, intents map[string]V, uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := intents[uid]
	return ok
}

func (r *Reconciler) processNext(ctx context.Context) bool {
	it, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(it)

	requeueAfter, err := r.reconcile[it.kind](ctx, it.uid)
	switch {
	case err != nil:
		r.log.Debug("Cannot reconcile; backing off", "kind", it.kind, "uid", it.uid, "error", err)
		r.queue.AddRateLimited(it)
	default:
		r.queue.Forget(it)
		if requeueAfter > 0 {
			r.queue.AddAfter(it, requeueAfter)
		}
	}
	return true
}

// reconcileGuest converges one guest. It returns an error to be retried with
// backoff, or how soon to look again when the guest is mid-transition.
func (r *Reconciler) reconcileGuest(ctx context.Context, uid string) (time.Duration, error) {
	// Not while a snapshot of the guest is taken (snapshot.go).
	defer r.guestLocks.lock(uid)()
	r.mu.Lock()
	in, wanted := r.intents[uid]
	synced := r.synced
	if !wanted || in.Release {
		delete(r.addressless, uid)
		delete(r.settled, uid)
		delete(r.listed, uid)
	}
	if !wanted {
		delete(r.restores, uid)
	}
	r.mu.Unlock()

	if !wanted {
		if !synced {
			return 0, nil
		}
		if orphan, err := r.orphaned(ctx, uid); orphan || err != nil {
			return 0, err
		}
		return 0, r.remove(ctx, uid)
	}
	if in.Release {
		return 0, r.release(ctx, in)
	}
	if in.Fence && r.opts.Lease.Fenced() {
		return 0, r.fence(ctx, in)
	}

	var (
		m   driver.Machine
		obs driver.Observation
		err error
	)
	if !in.ObserveOnly {
		// An intent that only observes carries no machine.
		if m, err = machine(in); err != nil {
			return 0, r.report(ctx, failed(in, r.node, err))
		}
	}
	switch {
	case in.Incoming != nil:
		return r.incoming(ctx, in, m)
	case in.Migration != nil:
		return r.migrate(ctx, in, m)
	}
	// Past the migrations: a guest is never restored as it moves.
	if err := r.restore(ctx, in); err != nil {
		r.guestError(ctx, in.UID, in.Namespace, in.Name, err)
		return 0, err
	}
	switch {
	case in.Claim != nil:
		obs, err = r.claim(ctx, in, m)
	default:
		var ok bool
		if obs, ok = r.takeListed(in); !ok {
			obs, err = r.ensure(ctx, m)
		}
	}
	if err != nil {
		r.forgetSettled(in.UID)
		r.guestError(ctx, in.UID, in.Namespace, in.Name, err)
	} else {
		r.guestOK(in.UID, in.Namespace, in.Name)
	}
	switch {
	case driver.IsTerminal(err):
		// The input cannot succeed as given: tell the user and wait for a
		// new intent instead of retrying.
		return 0, r.report(ctx, failed(in, r.node, err))
	case driver.IsFailing(err):
		// The user must see it, but it may pass (an image server back up):
		// report it and retry with backoff.
		if rerr := r.report(ctx, failed(in, r.node, err)); rerr != nil {
			return 0, rerr
		}
		return 0, errors.Wrap(err, "cannot ensure guest")
	case err != nil:
		return 0, errors.Wrap(err, "cannot ensure guest")
	}
	if err := r.report(ctx, report(in, obs)); err != nil {
		r.forgetSettled(in.UID)
		return 0, err
	}
	r.recordSettled(in, obs, time.Now())
	if obs.Phase == driver.PhaseProvisioning && hasImage(m) {
		// Likely waiting for an import: let the image loop report it.
		r.nudgeImages()
	}
	if transitional(obs.Phase) {
		return r.opts.PollTransitional, nil
	}
	if wait := r.addressPoll(uid, obs); wait > 0 {
		return wait, nil
	}
	if in.ObserveOnly {
		return r.opts.ObserveEvery, nil
	}
	return 0, nil
}

// addressPoll is how soon to look again at a running guest with an
// interface that has no address yet, or 0. No backend announces an address:
// on libvirt it is a DHCP lease, the guest agent's answer or an ARP entry,
// found only by looking. Without this a guest's address would show only
// at the next resync, up to ResyncEvery after the guest has one (make
// bench's real guest shows how long it takes). The interval grows with
// the wait, a quarter of it, from PollTransitional to ResyncEvery, so a
// guest that never takes an address (no DHCP on its network) costs no more
// than the resync after a few minutes.
func (r *Reconciler) addressPoll(uid string, obs driver.Observation) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if obs.Phase != driver.PhaseRunning || !slices.ContainsFunc(obs.Interfaces, func(i driver.Interface) bool { return len(i.IPs) == 0 }) {
		delete(r.addressless, uid)
		return 0
	}
	now := r.opts.Now()
	since, ok := r.addressless[uid]
	if !ok {
		since = now
		r.addressless[uid] = now
	}
	return min(max(now.Sub(since)/4, r.opts.PollTransitional), r.opts.ResyncEvery)
}

// remove deletes a guest whose intent is gone, then its report: the hub
// finishes a VM's deletion when the report disappears, so the report goes
// only once the guest is really gone.
func (r *Reconciler) remove(ctx context.Context, uid string) error {
	if err := r.call(OpDelete, func() error { return r.driver.Delete(ctx, uid) }); err != nil {
		r.guestError(ctx, uid, "", "", err)
		return errors.Wrap(err, "cannot delete guest")
	}
	r.guestErrors.forget(uid)
	return r.reports.delete(ctx, uid)
}

// report writes rep, as this node's, unless it says what the last report
// written said (wire.GuestReports' Equal: not when it was observed, which
// changes on every look and would turn each resync into a write per guest).
// Whatever the path that wrote it, it carries the restore the guest's
// intent asks for.
func (r *Reconciler) report(ctx context.Context, rep wire.Report) error {
	rep.Node = r.node
	rep.ObservedAt = r.opts.Now().UTC()
	rep.Restore = r.restoreOf(rep.UID)
	return r.reports.put(ctx, rep.UID, rep)
}

func hasImage(m driver.Machine) bool {
	for _, d := range m.Disks {
		if d.Image != nil {
			return true
		}
	}
	return false
}

func transitional(p driver.Phase) bool {
	switch p {
	case driver.PhaseProvisioning, driver.PhaseStarting, driver.PhaseStopping:
		return true
	}
	return false
}
