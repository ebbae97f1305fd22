package virtualmachine

// This file is the reconcile of one VirtualMachine, top to bottom.
//
// crossplane-runtime's managed reconciler does what it is made for: a
// placed VM's external resource, its guest on its node, is observed,
// updated and deleted through Connect, Observe, Update and Delete, and the
// managed reconciler owns the finalizer, the Synced and Ready conditions,
// management policies, polling and the status write. Observe answers from
// the fleet's in-memory view of the nodes' reports and never waits on the
// network; Update publishes the intent; Delete deletes it.
//
// Two things do not fit its contract, so a plain reconciler (Reconcile,
// below) runs first and hands the VM to the managed one only when they do
// not apply:
//
//   - Placement. The managed reconciler would create a new resource in
//     Create, one VM at a time; the placement loop (Scheduler) binds new
//     VMs to nodes in batches against one view of the fleet. A VM that the
//     hub may create and that is on no node yet is the loop's, and skipped
//     here; once placed, its guest exists (its identity is the VM's uid on
//     that node), so Create is never reached for it.
//   - Releasing a guest that outlives its VM (no Delete policy, or
//     deleted with --cascade=orphan). The managed reconciler would drop
//     its finalizer without looking at the guest; here the intent is
//     replaced by a release marker and the finalizers go once the node
//     confirmed the release.
//
// Setup turns off what costs an API write per VM and guards nothing here:
// the external-name initializer (a guest is found by uid, not by name), the
// create-pending and create-succeeded annotations (the one fact a create
// must not lose, the node, is written by the placement loop before anything
// is published) and the creation grace period (Observe sees the nodes'
// reports as they change: there is no eventual consistency to wait out).

import (
	"cmp"
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// FinalizerKeep holds a VM whose management policies lack Delete until its
// node released the guest: the managed reconciler drops its own finalizer
// of such a VM without looking at the guest.
const FinalizerKeep = v1alpha1.Group + "/release-guest"

// releaseRetry is how soon a release that waits for its node is looked at
// again when no report wakes it first.
const releaseRetry = 5 * time.Second

// reconciler is the VM controller's reconciler: the plain half described
// at the top of this file, around crossplane-runtime's managed reconciler.
// In order:
//
//   - A VM on no node that the hub may create, or that adopts an orphan,
//     is the placement loop's: skipped; the loop's one write of its node
//     wakes this controller again.
//   - A deleted VM that keeps its guest is released (release), and never
//     reaches the managed reconciler.
//   - A placed VM that keeps its guest but that the placement loop did not
//     bind (an import whose node the user named, an Observe-only VM) gets
//     FinalizerKeep and the managed finalizer in one write first; one the
//     placement loop bound has them.
//   - A placed VM the hub holds no record of the binding of (one placed by
//     a hub from before the records) has its sealed binding recorded.
//   - The managed reconciler: Connect, Observe, then Update or Delete.
//   - An Observe-only VM with a guest to claim has its intent published:
//     the managed reconciler never calls Update for it.
type reconciler struct {
	cache   client.Reader
	managed reconcile.Reconciler
	c       *connector
}

// Reconcile implements reconcile.Reconciler.
func (a *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	vm := &v1alpha1.VirtualMachine{}
	if err := a.cache.Get(ctx, req.NamespacedName, vm); err != nil {
		return a.managed.Reconcile(ctx, req)
	}
	switch {
	case a.c.releases(vm):
		return a.release(ctx, vm)
	case needsPlacement(vm, a.c.policies):
		// The cache only moves forward, so the managed reconciler, which
		// reads the VM again, never sees it unplaced once this check saw
		// it placed.
		return reconcile.Result{}, nil
	}
	if err := a.c.keepFinalizer(ctx, vm); err != nil {
		return reconcile.Result{}, err
	}
	if err := a.recordBinding(ctx, vm); err != nil {
		return reconcile.Result{}, err
	}
	if wrote, err := a.c.recordShape(ctx, vm); err != nil || wrote {
		// The status write passes no event filter of this controller
		// (it watches desired state): come back to publish the new shape.
		return reconcile.Result{Requeue: wrote}, err
	}
	if moved, err := a.restartElsewhere(ctx, vm); err != nil || moved {
		// Moved: the write wakes this controller again, and the managed
		// reconciler then publishes to the new node.
		return reconcile.Result{}, err
	}
	res, err := a.managed.Reconcile(ctx, req)
	if err != nil {
		return res, err
	}
	return res, a.publishObserveOnly(ctx, vm)
}

// recordBinding has the hub record the binding of a placed VM it holds no
// record of (external.recordBinding). Most VMs have one: only those
// without are connected for it.
func (a *reconciler) recordBinding(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if meta.WasDeleted(vm) || vm.GetAnnotations()[v1alpha1.AnnotationNode] == "" {
		return nil
	}
	for _, f := range a.c.opts.Pool.Fleets() {
		if held, err := f.Held(string(vm.UID)); err != nil || held != nil {
			// Unread records fail Observe, which comes back for them.
			return nil
		}
	}
	ext, err := a.c.connect(ctx, vm)
	if err != nil {
		// The managed reconciler's Connect fails the same way, and shows
		// it in the VM's Synced condition.
		return nil
	}
	return ext.recordBinding(ctx, vm)
}

// restartElsewhere moves a VM with availability Restart off its node once
// the node is lost and fenced, and any VM off a lost node removed for good
// (restart.go); true when it did.
func (a *reconciler) restartElsewhere(ctx context.Context, vm *v1alpha1.VirtualMachine) (bool, error) {
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if meta.WasDeleted(vm) || node == "" {
		return false, nil
	}
	if !vm.Spec.ForProvider.RestartsElsewhere() {
		if removed, err := removedForGood(ctx, a.cache, node); err != nil || !removed {
			return false, err
		}
	}
	ext, err := a.c.connect(ctx, vm)
	if err != nil {
		// The managed reconciler's Connect fails the same way, and shows
		// it in the VM's Synced condition.
		return false, nil
	}
	return ext.restartElsewhere(ctx, vm)
}

// releases is whether vm is deleted and its guest outlives it, or it still
// holds FinalizerKeep.
func (c *connector) releases(vm *v1alpha1.VirtualMachine) bool {
	if !meta.WasDeleted(vm) {
		return false
	}
	return meta.FinalizerExists(vm, FinalizerKeep) || (keepsGuest(vm, c.policies) && meta.FinalizerExists(vm, managed.FinalizerName))
}

// release reconciles the deletion of a VM that keeps its guest.
func (a *reconciler) release(ctx context.Context, vm *v1alpha1.VirtualMachine) (reconcile.Result, error) {
	if !keepsGuest(vm, a.c.policies) {
		// Its policies gained Delete after FinalizerKeep was added.
		if meta.FinalizerExists(vm, managed.FinalizerName) {
			return a.managed.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vm)}) // the guest is deleted first
		}
		return reconcile.Result{}, a.finalize(ctx, vm)
	}
	ext, err := a.c.connect(ctx, vm)
	if err != nil {
		return reconcile.Result{}, err
	}
	obs, err := ext.observeRelease(ctx, vm, vm.GetAnnotations()[v1alpha1.AnnotationNode])
	var releasing *ReleasingError
	switch {
	case errors.As(err, &releasing):
		return reconcile.Result{RequeueAfter: releaseRetry}, nil
	case err != nil:
		return reconcile.Result{}, err
	case obs.ResourceExists:
		return reconcile.Result{RequeueAfter: releaseRetry}, nil
	}
	// The guest runs on with its addresses: they stay held for it, and go
	// to the VM that adopts it.
	if err := a.c.opts.Addresses.Keep(ctx, vm); err != nil {
		return reconcile.Result{}, errors.Wrap(err, "cannot keep the released guest's addresses")
	}
	return reconcile.Result{}, a.finalize(ctx, vm)
}

// finalize drops the release finalizer and the managed one with it.
func (a *reconciler) finalize(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	meta.RemoveFinalizer(vm, FinalizerKeep)
	meta.RemoveFinalizer(vm, managed.FinalizerName)
	err := a.c.kube.Update(ctx, vm)
	return errors.Wrap(client.IgnoreNotFound(err), "cannot remove the VM's finalizers")
}

// keepFinalizer adds FinalizerKeep, and the managed finalizer in the same
// write, to a placed VM whose guest outlives it; the placement loop records
// both with the node of the VMs it binds, so the one extra write is for the
// VMs it does not (an import whose node the user named, an Observe-only
// VM).
func (c *connector) keepFinalizer(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if meta.WasDeleted(vm) || vm.GetAnnotations()[v1alpha1.AnnotationNode] == "" || !keepsGuest(vm, c.policies) || meta.FinalizerExists(vm, FinalizerKeep) {
		return nil
	}
	meta.AddFinalizer(vm, FinalizerKeep)
	meta.AddFinalizer(vm, managed.FinalizerName)
	err := c.kube.Update(ctx, vm)
	if kerrors.IsConflict(err) {
		return nil // the write that conflicted wakes this controller again
	}
	return errors.Wrap(err, "cannot add the finalizer that releases the guest")
}

// publishObserveOnly publishes the intent of a placed Observe-only VM with
// a guest to claim, unless this hub already published that very intent.
func (a *reconciler) publishObserveOnly(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if node == "" || meta.WasDeleted(vm) || !ObserveOnly(vm) || claimOf(vm) == nil {
		return nil
	}
	if published, _ := a.c.state.published.Load(vm.UID); published == fingerprint(intent(vm, dependencies{})) {
		return nil
	}
	ext, err := a.c.connect(ctx, vm)
	if err != nil {
		return err
	}
	return ext.publish(ctx, vm, dependencies{}, node)
}

// state is what the controller remembers of each VM across reconciles; the
// hub's perobject.Owner forgets a VM's once it is gone. All of it can be
// lost: after a restart each VM's intent is published again (writing the
// same intent twice changes nothing) and a deletion deletes its intent
// again.
type state struct {
	// published is the fingerprint of the intents last published.
	published *perobject.Map[string]
	// deleted holds the VMs whose intents are deleted.
	deleted *perobject.Map[struct{}]
	// restarts are, for the VMs with availability Restart on a lost node,
	// when they will be restarted elsewhere or why not (restart.go).
	restarts *perobject.Map[string]
	// intentBytes is what each VM's intents take of its namespace's share
	// of the intents bucket.
	intentBytes *intentBytes
	// held are the VMs whose Volumes' growth a quota holds.
	held heldGrowths
}

func newState(memory *perobject.Owner) *state {
	return &state{published: perobject.NewMap[string](memory), deleted: perobject.NewMap[struct{}](memory), restarts: perobject.NewMap[string](memory), intentBytes: newIntentBytes(memory),
		held: heldGrowths{vms: perobject.NewMap[types.NamespacedName](memory)}}
}

type connector struct {
	log  logging.Logger
	kube client.Client
	// reader reads from the API server, not the cache: a Volume whose
	// cached copy was out of date when the hub bound it.
	reader   client.Reader
	configs  *providerconfig.Resolver
	opts     Options
	recorder event.Recorder
	state    *state
	// policies is whether management policies are enabled.
	policies bool
	// holder holds back the status write of a VM just published.
	holder *apiwrites.Client
	// clock is the time; nil means time.Now.
	clock func() time.Time
}

// Connect finds the fleet the VM's ProviderConfig names.
func (c *connector) Connect(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.TypedExternalClient[*v1alpha1.VirtualMachine], error) {
	return c.connect(ctx, vm)
}

// connect is Connect, typed for the plain half of the reconcile.
func (c *connector) connect(ctx context.Context, vm *v1alpha1.VirtualMachine) (*external, error) {
	pc, err := c.configs.Resolve(ctx, vm)
	if err != nil {
		return nil, err
	}
	f, err := c.opts.Pool.Get(ctx, pc.Target)
	if err != nil {
		return nil, fleet.QuietWhileStarting(err)
	}
	g, err := providerconfig.GrantOf(ctx, c.kube, vm.Namespace)
	if err != nil {
		return nil, err
	}
	c.opts.Notifier.Remember(vm)
	return &external{connector: c, fleet: f, grant: g, defaults: pc.NodeSelector}, nil
}

type external struct {
	*connector
	fleet *fleet.Fleet
	// grant is what the VM's namespace may reach beyond its own.
	grant tenancy.Grant
	// defaults is the node selector of the VM's ProviderConfig.
	defaults map[string]string
}

// Observe answers from the fleet's in-memory view; it never waits on NATS,
// and it makes no API write and publishes nothing. It records the events a
// change of the node's report is worth.
//
// The guest exists from the moment the placement loop recorded its node:
// its identity is the VM's uid on that node, and Update publishes the
// intent that makes it so (publishing is idempotent; after a hub restart
// an intent the bucket already held as it should be is not published
// again, see published). Observing it as not existing until its
// node reports would send every new VM through Create, which costs the
// create-pending annotation write per VM and adds nothing: the one fact a
// create must not lose, the node, is already recorded.
func (e *external) Observe(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.ExternalObservation, error) {
	held, err := e.fleet.Held(string(vm.UID))
	if err != nil {
		return managed.ExternalObservation{}, fleet.QuietWhileStarting(err)
	}
	metrics.VMObserves.WithLabelValues().Inc()
	if e.fleet.Replayed(vm) {
		return managed.ExternalObservation{}, e.restoreBinding(ctx, vm, *held)
	}
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if node != "" {
		if err := admitNode(vm, node, e.grant, e.fleet); err != nil {
			if held != nil {
				// The guest runs on under the sealed binding the VM
				// holds: neither Failed nor gone.
				return managed.ExternalObservation{}, e.restoreBinding(ctx, vm, *held)
			}
			if meta.WasDeleted(vm) {
				// Nothing was published to a node the VM was refused.
				return managed.ExternalObservation{ResourceExists: false}, nil
			}
			vm.Status.AtProvider.Phase = v1alpha1.PhaseFailed
			vm.SetConditions(notReady(v1alpha1.PhaseFailed, err.Error()))
			return managed.ExternalObservation{}, err
		}
	}
	if meta.WasDeleted(vm) {
		if keepsGuest(vm, e.policies) && node != "" {
			// The plain half releases such a guest and never hands its VM
			// to the managed reconciler; were it handed one anyway, the
			// guest must neither be deleted nor the VM let go.
			return managed.ExternalObservation{}, &ReleasingError{Node: node}
		}
		return e.observeDeletion(vm, node), nil
	}
	if node == "" {
		if ext := meta.GetExternalName(vm); ext != "" {
			// An import names its guest's node; the placement loop never
			// chooses one for it.
			err := &ImportNodeError{ExternalName: ext}
			vm.Status.AtProvider.Phase = v1alpha1.PhasePending
			vm.SetConditions(notReady(v1alpha1.PhasePending, err.Error()))
			return managed.ExternalObservation{}, err
		}
		// Only a VM the hub may not create gets here unplaced: the
		// placement loop places the others, and adopts orphans, before
		// this controller sees them.
		return managed.ExternalObservation{ResourceExists: false}, nil
	}

	uid := string(vm.UID)
	before := vm.Status.AtProvider
	obs := before
	e.flagForeign(vm, node)
	if rep, ok := e.fleet.Guests.Report(node, uid); ok {
		e.opts.Placer.Confirm(uid, rep.ReceivedAt)
		obs = observation(rep.Report, vm.Spec.ForProvider.VirtualNetworks)
	} else if obs.Phase == "" || obs.Phase == v1alpha1.PhasePending || obs.Phase == v1alpha1.PhaseUnknown {
		obs.Phase, obs.Node = v1alpha1.PhaseScheduled, node
	}
	n := e.fleet.Node(node)
	if n.Lost {
		obs.Phase = v1alpha1.PhaseUnknown
	}
	obs.Declared = declared(vm)
	// Shown, never read back: the hub holds its own record (Fleet.Held).
	obs.Binding = cmp.Or(e.fleet.Binding(vm), held)
	vm.Status.AtProvider = obs
	e.setConditions(vm, obs, node, n)
	e.recordTransition(vm, before, obs, node)

	e.migratingCondition(vm, node)

	d, err := e.resolve(ctx, vm)
	if len(d.heldGrowth) > 0 {
		e.sayHeldGrowth(vm, d.heldGrowth)
	}
	e.state.held.note(vm, len(d.heldGrowth) > 0)
	upToDate := err == nil && e.knownAddresses(vm, &d, n) && len(SealedLeftovers(vm, e.fleet)) == 0 && recordedAsShown(obs.Binding, held) && len(d.grows) == 0
	if upToDate {
		upToDate = e.published(vm, e.plan(vm, d, node), node)
	}
	return managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: upToDate}, nil
}

// published says whether the nodes hold the intents p of vm on node as
// this hub last published them. A hub that just started has published
// nothing itself, but the bucket may have held p already when it read it,
// from the hub before it (Fleet.FoundIntent): then p counts as published
// (and its bytes as the namespace's), and no Update publishes it again,
// so a restarted hub neither writes nor tells of an update for a VM that
// did not change.
func (e *external) published(vm *v1alpha1.VirtualMachine, p map[string]wire.Intent, node string) bool {
	want := planFingerprint(p, node)
	if last, ok := e.state.published.Load(vm.UID); ok {
		return last == want
	}
	held := true
	size, err := encodeIntents(p, func(n string, v []byte) {
		// Every one asked, so that each is answered once.
		held = e.fleet.FoundIntent(n, p[n].UID, v) && held
	})
	if err != nil || !held {
		return false
	}
	e.state.intentBytes.settle(vm.UID, vm.Namespace, size)
	e.state.published.Store(vm.UID, want)
	return true
}

// resolve reads what the VM refers to and admits it (dependencies.admit).
// The VM itself was admitted to its node (admitNode), so a Volume bound to
// that same node chooses nothing the VM does not have already, sealed or
// not: one bound by a hub from before seals, say, whose VM runs on.
func (e *external) resolve(ctx context.Context, vm *v1alpha1.VirtualMachine) (dependencies, error) {
	d, err := resolve(ctx, e.kube, vm, heldIn(e.fleet.Images))
	if err != nil {
		return d, err
	}
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	boundByHub := func(o metav1.Object) bool {
		return e.fleet.Sealed(o) || (node != "" && o.GetAnnotations()[v1alpha1.AnnotationNode] == node)
	}
	if err := d.admit(e.grant, boundByHub); err != nil {
		return d, err
	}
	if err := e.sizeVolumes(ctx, &d); err != nil {
		return d, err
	}
	return d, d.resolveBackups(ctx, e.kube)
}

// flagForeign has the fleet flag the reports about vm from nodes other
// than node.
func (e *external) flagForeign(vm *v1alpha1.VirtualMachine, node string) {
	e.fleet.Guests.FlagForeign(vm, e.placedOn(vm, node)...)
}

// observeDeletion reports the guest as existing until its node confirmed the
// deletion by removing the report, or, when the node is lost, until the
// fencing timeout has passed: a delete never hangs forever.
func (e *external) observeDeletion(vm *v1alpha1.VirtualMachine, node string) managed.ExternalObservation {
	if node == "" {
		return managed.ExternalObservation{ResourceExists: false}
	}
	uid := string(vm.UID)
	vm.Status.AtProvider.Phase = v1alpha1.PhaseDeleting
	vm.SetConditions(xpv2.Deleting())
	if n := e.fleet.Node(node); n.Lost {
		waited := time.Since(vm.DeletionTimestamp.Time)
		if waited < e.opts.FencingTimeout {
			// Come back when the timeout is up, not at the next backoff.
			e.opts.Notifier.NotifyAfter(uid, e.opts.FencingTimeout-waited)
		} else {
			e.event(vm, event.Warning(ReasonNodeLost, errors.Errorf(
				"node %s has been lost since %s; finalized after the fencing timeout (%s) without the node confirming that the guest is gone",
				node, n.LostSince.UTC().Format(time.RFC3339), e.opts.FencingTimeout)))
			return managed.ExternalObservation{ResourceExists: false}
		}
	}
	e.flagForeign(vm, node)
	_, reported := e.fleet.Guests.Report(node, uid)
	_, deleted := e.state.deleted.Load(vm.UID)
	return managed.ExternalObservation{ResourceExists: reported || !deleted}
}

// errNotPlaced is Create's answer: a VM the hub may create is placed by the
// placement loop before this controller sees it, and published by Update.
var errNotPlaced = errors.New("the VM is on no node yet; the placement loop places it")

// Create is never reached for a VM the hub may create (see Observe).
func (e *external) Create(context.Context, *v1alpha1.VirtualMachine) (managed.ExternalCreation, error) {
	return managed.ExternalCreation{}, errNotPlaced
}

// Update publishes the intent again after the spec or the restart
// annotation changed, or when this hub has not published it yet (it just
// started, or a publish failed). The node decides what a running guest can
// take live; the rest shows up as RestartRequired. What placement checked
// of the node is checked again first (UnmetError): a spec its node no
// longer fits is not published.
func (e *external) Update(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.ExternalUpdate, error) {
	d, err := e.resolve(ctx, vm)
	if err != nil {
		return managed.ExternalUpdate{}, err
	}
	node, uid := vm.GetAnnotations()[v1alpha1.AnnotationNode], string(vm.UID)
	if err := e.unmet(vm, d, node); err != nil {
		return managed.ExternalUpdate{}, err
	}
	if err := e.allocate(ctx, vm, &d, e.fleet.Node(node)); err != nil {
		return managed.ExternalUpdate{}, err
	}
	if err := e.ensure(ctx, vm, d, node); err != nil {
		return managed.ExternalUpdate{}, err
	}
	// The node's first report reconciles the VM; without one in time, the
	// timer does, and the held status is written then. A report that came
	// after Observe read none is held for too: this reconcile's Scheduled
	// is already out of date, and the reconcile the report queued writes
	// what it says.
	f := e.fleet
	e.holder.Hold(vm, scheduledHold, justPublished)
	e.opts.Notifier.NotifyAfterIf(uid, scheduledHold, func() bool { _, reported := f.Guests.Report(node, uid); return !reported })
	return managed.ExternalUpdate{}, nil
}

// justPublished is the status a Hold may drop: phase Scheduled, and the
// reconcile that wrote it succeeded. Anything else, a reconcile error above
// all, is written.
func justPublished(o client.Object) bool {
	vm, ok := o.(*v1alpha1.VirtualMachine)
	return ok && vm.Status.AtProvider.Phase == v1alpha1.PhaseScheduled &&
		vm.GetCondition(xpv2.TypeSynced).Status == corev1.ConditionTrue
}

// Delete removes the intent, which tells the node to delete the guest, and
// releases the VM's addresses. The VM's Volumes and VirtualNetworks stay.
func (e *external) Delete(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.ExternalDelete, error) {
	node, uid := vm.GetAnnotations()[v1alpha1.AnnotationNode], string(vm.UID)
	vm.Status.AtProvider.Phase = v1alpha1.PhaseDeleting
	vm.SetConditions(xpv2.Deleting())
	// The target of a migration under way and the nodes the VM left may
	// hold it too.
	for _, n := range e.placedOn(vm, node) {
		if err := bus.Delete(ctx, e.fleet.Bus, wire.GuestIntents, n, uid); err != nil {
			return managed.ExternalDelete{}, e.busFailed(uid, errors.Wrapf(err, "cannot delete the intent on node %s", n))
		}
	}
	if err := e.fleet.Unrecord(ctx, uid); err != nil {
		return managed.ExternalDelete{}, e.busFailed(uid, err)
	}
	// Freed as the guest goes: the allocator hands a released address out
	// again only after the rest of the network's range, long after.
	if err := e.opts.Addresses.Release(ctx, vm); err != nil {
		return managed.ExternalDelete{}, errors.Wrap(err, "cannot release the VM's addresses")
	}
	e.state.deleted.Store(vm.UID, struct{}{})
	e.state.published.Delete(vm.UID)
	e.state.intentBytes.free(vm.UID)
	e.opts.Placer.Release(uid)
	return managed.ExternalDelete{}, nil
}

// event records ev on vm.
func (e *external) event(vm *v1alpha1.VirtualMachine, ev event.Event) {
	e.recorder.Event(vm, ev)
}

// Disconnect implements managed.TypedExternalClient; the fleet's connection
// outlives the reconcile.
func (e *external) Disconnect(context.Context) error { return nil }
