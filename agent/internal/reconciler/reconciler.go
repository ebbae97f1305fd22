// Package reconciler is the agent's desired-vs-observed loop. Intents say what
// the hub wants on this node; the Driver says what is there. For each guest
// the reconciler compares the two, acts through the Driver, and writes a
// report when what it would say has changed. It is level-triggered: intents,
// driver events and a periodic resync only put a guest's uid on a work queue,
// and the worker always starts from the current intent and observation.
package reconciler

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Reports is where the reconciler writes what it observed: the report half of
// bus.Bus.
type Reports interface {
	PutReport(ctx context.Context, r wire.Report) (uint64, error)
	DeleteReport(ctx context.Context, uid string) error
	PutVolumeReport(ctx context.Context, r wire.VolumeReport) (uint64, error)
	DeleteVolumeReport(ctx context.Context, uid string) error
	PutImageReport(ctx context.Context, r wire.ImageReport) (uint64, error)
	DeleteImageReport(ctx context.Context, uid string) error
}

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
	// Metrics are observed as the reconciler works; nil means the
	// process's (metrics.DefaultAgent).
	Metrics *metrics.AgentMetrics
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

// Reconciler makes one node's guests match its intents.
type Reconciler struct {
	node    string
	driver  driver.Driver
	reports Reports
	log     logging.Logger
	opts    Options
	metrics *metrics.AgentMetrics
	queue   workqueue.TypedRateLimitingInterface[string]
	// guestErrors and imageErrors are the errors last logged per guest
	// and per image, so each cause is logged once.
	guestErrors, imageErrors errorLog

	mu      sync.Mutex
	intents map[string]wire.Intent
	// volumes are the Volume intents, by Volume uid; on the queue as
	// volumeKey(uid).
	volumes map[string]wire.VolumeIntent
	// synced is set once the bus delivered every intent; before that an
	// absent intent may just not have arrived yet, so nothing is deleted.
	synced bool
	// written is the last report written per uid, to write only changes;
	// the guest gauge counts it (countGuests) whenever it changes.
	written map[string]wire.Report
	// writtenVolumes is the last VolumeReport written per Volume uid.
	writtenVolumes map[string]wire.VolumeReport
	// orphans are the node's released guests, by the uid they were
	// released under, as of the last resync or release.
	orphans map[string]driver.Observation
	// cleared are adopted orphans whose report this run deleted.
	cleared map[string]bool
	// imagesCleaned is set once the reports of images the intents name but
	// the node does not have were deleted (see staleImageReports).
	imagesCleaned bool

	// writtenImages is the last ImageReport written per image uid; only
	// the image loop uses it.
	writtenImages map[string]wire.ImageReport
	// imports are when the last import counted per image uid finished;
	// only the image loop uses it.
	imports map[string]time.Time
	// imagesNudge wakes the image loop.
	imagesNudge chan struct{}
	// peers are the other nodes' tunnel addresses, as the Fabric last
	// said; on the queue as fabricKey.
	peers []netip.Addr
	// addressless are the running guests seen with an interface that has
	// no address yet, by uid, with when that was first seen.
	addressless map[string]time.Time
}

// New returns a Reconciler for node. Call HandleIntent from the bus's
// intent watch and Run to start working.
func New(node string, d driver.Driver, reports Reports, log logging.Logger, o Options) *Reconciler {
	o.defaults()
	r := &Reconciler{
		node:    node,
		driver:  d,
		reports: reports,
		log:     log.WithValues("node", node),
		opts:    o,
		metrics: o.Metrics,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.RetryBase, o.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "guests-" + node},
		),
		intents:        map[string]wire.Intent{},
		volumes:        map[string]wire.VolumeIntent{},
		addressless:    map[string]time.Time{},
		written:        map[string]wire.Report{},
		writtenVolumes: map[string]wire.VolumeReport{},
		writtenImages:  map[string]wire.ImageReport{},
		imports:        map[string]time.Time{},
		orphans:        map[string]driver.Observation{},
		cleared:        map[string]bool{},
		imagesNudge:    make(chan struct{}, 1),
	}
	r.countGuests() // every phase at 0 from the start
	return r
}

// HandleIntent records an intent event from the bus and queues its guest.
// The Synced marker queues a full resync, which is what deletes guests whose
// intents vanished while the agent was away.
func (r *Reconciler) HandleIntent(ev bus.IntentEvent) {
	if ev.Volume != nil {
		r.handleVolumeIntent(*ev.Volume)
		return
	}
	if ev.Fabric != nil {
		r.handleFabric(*ev.Fabric)
		return
	}
	r.mu.Lock()
	switch {
	case ev.Synced:
		r.synced = true
	case ev.Deleted:
		delete(r.intents, ev.UID)
	default:
		r.intents[ev.UID] = ev.Intent
	}
	r.mu.Unlock()
	if ev.Synced {
		r.resync(context.Background())
		return
	}
	r.queue.Add(ev.UID)
}

// Run works the queue until ctx is done: workers, driver events as triggers,
// a full resync every Options.ResyncEvery, and the node's image reports.
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
	events := r.driver.Events()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			r.resync(ctx)
		case ev, ok := <-events:
			if !ok {
				events = nil // driver closed; the resync still runs
				continue
			}
			if ev.Kind == driver.EventResync || ev.UID == "" {
				r.resync(ctx)
				continue
			}
			r.queue.Add(ev.UID)
		}
	}
	r.queue.ShutDown()
	wg.Wait()
}

// resync queues every guest the node should have or has. Until the intents
// are synced only the intents are queued: a guest without an intent might be
// one whose intent has not arrived yet.
func (r *Reconciler) resync(ctx context.Context) {
	r.mu.Lock()
	uids := make([]string, 0, len(r.intents)+len(r.volumes))
	for uid := range r.intents {
		uids = append(uids, uid)
	}
	for uid := range r.volumes {
		uids = append(uids, volumeKey(uid))
	}
	synced := r.synced
	if synced {
		// A report whose guest went out of band (an orphan deleted by
		// hand) is looked at, and deleted, too.
		for uid := range r.written {
			uids = append(uids, uid)
		}
	}
	r.mu.Unlock()
	for _, uid := range uids {
		r.queue.Add(uid)
	}
	if !synced {
		return
	}
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
	for _, g := range guests {
		r.queue.Add(g.UID)
	}
	r.mu.Lock()
	for uid := range r.orphans {
		r.queue.Add(uid)
	}
	r.mu.Unlock()
}

func (r *Reconciler) processNext(ctx context.Context) bool {
	uid, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(uid)

	var (
		requeueAfter time.Duration
		err          error
	)
	if v, ok := volumeUID(uid); ok {
		requeueAfter, err = r.reconcileVolume(ctx, v)
	} else if uid == fabricKey {
		err = r.reconcileFabric(ctx)
	} else {
		requeueAfter, err = r.reconcile(ctx, uid)
	}
	switch {
	case err != nil:
		r.log.Debug("Cannot reconcile; backing off", "key", uid, "error", err)
		r.queue.AddRateLimited(uid)
	default:
		r.queue.Forget(uid)
		if requeueAfter > 0 {
			r.queue.AddAfter(uid, requeueAfter)
		}
	}
	return true
}

// reconcile converges one guest. It returns an error to be retried with
// backoff, or how soon to look again when the guest is mid-transition.
func (r *Reconciler) reconcile(ctx context.Context, uid string) (time.Duration, error) {
	r.mu.Lock()
	in, wanted := r.intents[uid]
	synced := r.synced
	if !wanted || in.Release {
		delete(r.addressless, uid)
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
	case in.Claim != nil:
		obs, err = r.claim(ctx, in, m)
	default:
		obs, err = r.ensure(ctx, m)
	}
	if err != nil {
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
		return 0, err
	}
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
	if err := r.reports.DeleteReport(ctx, uid); err != nil {
		return errors.Wrap(err, "cannot delete report")
	}
	r.mu.Lock()
	delete(r.written, uid)
	r.countGuests()
	r.mu.Unlock()
	return nil
}

// report writes rep unless it says what the last written report said.
// ObservedAt and the interfaces' LastSeen are not compared: they change on
// every look and would turn each resync into a write per guest.
func (r *Reconciler) report(ctx context.Context, rep wire.Report) error {
	r.mu.Lock()
	last, ok := r.written[rep.UID]
	r.mu.Unlock()
	if ok && sameReport(last, rep) {
		return nil
	}
	rep.ProtocolVersion = wire.ProtocolVersion
	rep.ObservedAt = r.opts.Now().UTC()
	if _, err := r.reports.PutReport(ctx, rep); err != nil {
		return errors.Wrap(err, "cannot put report")
	}
	r.mu.Lock()
	r.written[rep.UID] = rep
	r.countGuests()
	r.mu.Unlock()
	return nil
}

func sameReport(a, b wire.Report) bool {
	a.ObservedAt, b.ObservedAt = time.Time{}, time.Time{}
	a.ProtocolVersion, b.ProtocolVersion = 0, 0
	a.Interfaces, b.Interfaces = withoutLastSeen(a.Interfaces), withoutLastSeen(b.Interfaces)
	return reflect.DeepEqual(a, b)
}

func withoutLastSeen(in []wire.Interface) []wire.Interface {
	if in == nil {
		return nil
	}
	out := make([]wire.Interface, len(in))
	for i, iface := range in {
		iface.LastSeen = time.Time{}
		out[i] = iface
	}
	return out
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
