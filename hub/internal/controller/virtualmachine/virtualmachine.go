// Package virtualmachine reconciles VirtualMachines in two loops, the way
// Kubernetes runs pods: the placement loop (Scheduler, scheduler.go) binds
// each new VM to a node, and the VM controller acts only on VMs so bound.
// The controller's reconcile of one VM reads top to bottom in reconcile.go;
// this file sets it up and holds what it calls to publish and to turn
// reports into status, conditions and events.
package virtualmachine

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Condition types beyond Crossplane's Ready and Synced.
const (
	// TypeRestartRequired is True while the guest runs an older shape than
	// its spec asks for; the new shape applies at the next start.
	TypeRestartRequired xpv2.ConditionType = "RestartRequired"
	// TypeNodeLost is True while the guest's node sends no heartbeat.
	TypeNodeLost xpv2.ConditionType = "NodeLost"
)

// Event reasons a user sees in kubectl describe vm.
const (
	ReasonScheduled       event.Reason = "Scheduled"
	ReasonStarted         event.Reason = "Started"
	ReasonStopped         event.Reason = "Stopped"
	ReasonPaused          event.Reason = "Paused"
	ReasonResumed         event.Reason = "Resumed"
	ReasonFailed          event.Reason = "Failed"
	ReasonRestartRequired event.Reason = "RestartRequired"
	ReasonNodeLost        event.Reason = "NodeLost"
	ReasonWaiting         event.Reason = "WaitingForDependencies"
	// ReasonRebound: a VM whose binding was removed by hand is bound again
	// to the node its guest runs on.
	ReasonRebound event.Reason = "Rebound"
)

// Options of the VirtualMachine controller.
type Options struct {
	Pool   *fleet.Pool
	Placer *placement.Placer
	// Scheduler is the placement loop; SetupGated starts it with the
	// controller.
	Scheduler *Scheduler
	// Quotas counts what each namespace holds, for the Scheduler and the
	// TenantQuotas' status.
	Quotas *quota.Counter
	// Notifier turns report changes into reconciles; it must be the one the
	// Pool's fleets report to.
	Notifier *wake.Notifier
	// FencingTimeout is how long a VM whose node is lost waits in deletion
	// before it is finalized without the node confirming the guest is gone.
	FencingTimeout time.Duration
	// FencingMargin is what a VM with availability Restart waits, beyond
	// its lost node's lease, before it is restarted on another node: the
	// clocks of hub and node may drift apart by this much while the lease
	// runs.
	FencingMargin time.Duration
	// Addresses gives the VMs' interfaces their addresses.
	Addresses *ipam.Allocator
	// Memory owns what the controller remembers of each VM.
	Memory *perobject.Owner
	// Polls spreads the drift polls of this and the other managed
	// controllers; nil polls each object every PollInterval.
	Polls *wake.Polls
	// StraySweep is how often the intents no VM binds are swept (Strays);
	// 0 means DefaultStraySweep.
	StraySweep time.Duration
	// IntentBytesPerNamespace bounds the bytes the intents of one
	// namespace's VMs take of the intents bucket, so that no one tenant
	// fills it; 0 bounds nothing.
	IntentBytesPerNamespace int64
}

// scheduledHold is how long the status of a VM whose intent was just
// published waits for its node's first report (apiwrites.Client.Hold). The
// report's status replaces phase Scheduled anyway, so writing Scheduled
// would only cost a write: with the hold, the VM goes from created to
// Running in three API writes (the create, the node and finalizer, the
// status) instead of four. A node answers almost at once when idle, but in
// a burst on a loaded machine placed→Running can take seconds, and a hold
// much shorter than that makes many VMs pay the fourth write. A node that
// never answers shows phase Scheduled after the hold.
const scheduledHold = 5 * time.Second

// SetupGated adds the controller once the CRD is established (safe-start).
func SetupGated(mgr ctrl.Manager, o controller.Options, vo Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, vo); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachine controller"))
		}
		if err := mgr.Add(vo.Scheduler); err != nil {
			panic(errors.Wrap(err, "cannot set up the placement loop"))
		}
		strays := NewStrays(mgr.GetCache(), mgr.GetAPIReader(), vo.Pool.Fleets, cmp.Or(vo.StraySweep, DefaultStraySweep), o.Logger.WithValues("sweep", "stray-intents"))
		if err := mgr.Add(strays); err != nil {
			panic(errors.Wrap(err, "cannot set up the sweep of stray intents"))
		}
	}, v1alpha1.VirtualMachineGroupVersionKind, v1alpha1.HypervisorNodeGroupVersionKind)
	return nil
}

// Setup adds the controller that reconciles VirtualMachines.
func Setup(mgr ctrl.Manager, o controller.Options, vo Options) error {
	name := managed.ControllerName(v1alpha1.VirtualMachineGroupKind)
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor(name)) //nolint:staticcheck // crossplane-runtime still records through the old events API
	log := o.Logger.WithValues("controller", name)
	c := &connector{
		log:      log,
		kube:     mgr.GetClient(),
		reader:   mgr.GetAPIReader(),
		configs:  providerconfig.NewResolver(mgr.GetClient()),
		opts:     vo,
		recorder: recorder,
		state:    newState(vo.Memory),
		policies: o.Features.Enabled(feature.EnableBetaManagementPolicies),
	}
	// The status of a VM just published waits for the node's first report
	// (apiwrites.Client.Hold), so the hub's manager must carry its client.
	holder, ok := mgr.GetClient().(*apiwrites.Client)
	if !ok {
		return errors.New("the VirtualMachine controller needs the hub's client: make its manager with apiwrites.ForManager")
	}
	c.holder = holder
	opts := []managed.ReconcilerOption{
		managed.WithTypedExternalConnector[*v1alpha1.VirtualMachine](c),
		managed.WithLogger(log),
		managed.WithPollInterval(o.PollInterval),
		managed.WithPollIntervalHook(vo.Polls.Hook(&v1alpha1.VirtualMachine{})),
		managed.WithRecorder(recorder),
		// The guest's identity is the VM's uid on the node the placement
		// loop recorded, and publishing an intent is idempotent, so a hub
		// that crashed mid-publish can safely publish again.
		managed.WithDeterministicExternalName(true),
		// Observe answers from the reports the moment they change, so there
		// is no eventual consistency to wait out after a create; waiting
		// would only hold up the deletion of a VM deleted right after it
		// was created.
		managed.WithCreationGracePeriod(0),
		// Safeguards turned off because each costs an API write per VM and
		// guards nothing here (see the top of reconcile.go). The finalizer
		// is recorded with the node, in the placement loop's one write, so
		// the reconciler's AddFinalizer finds it there.
		managed.WithInitializers(),
		managed.WithCriticalAnnotationUpdater(skipCriticalAnnotations),
	}
	if o.Features.Enabled(feature.EnableBetaManagementPolicies) {
		opts = append(opts, managed.WithManagementPolicies())
	}
	if o.MetricOptions != nil {
		opts = append(opts, managed.WithMetricRecorder(o.MetricOptions.MRMetrics))
	}
	r := managed.NewReconciler(mgr, resource.ManagedKind(v1alpha1.VirtualMachineGroupVersionKind), opts...)

	waiting := func(u inuse.User) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return index.Requests(ctx, mgr.GetClient(), u, o)
		})
	}
	copts := o.ForControllerRuntime()
	copts.RateLimiter = apiwrites.ControllerRateLimiter()
	rec := &reconciler{cache: mgr.GetClient(), managed: ratelimiter.NewReconciler(name, r, o.GlobalRateLimiter), c: c}
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(copts).
		WithEventFilter(resource.DesiredStateChanged()).
		For(&v1alpha1.VirtualMachine{}).
		// A Volume wakes the VMs using it (attaching it, or whose guest
		// still holds it) when it is created, deleted or changed in spec,
		// not when it is bound to the node of a VM that attaches it; and on
		// any change the VMs booting from a DiskImage that clones it, which
		// wait for it to be bound.
		Watches(&v1alpha1.Volume{}, waiting(index.VolumeUsers), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.Volume{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return cloneUsersOf(ctx, mgr.GetClient(), o)
		})).
		Watches(&v1alpha1.VirtualNetwork{}, waiting(index.NetworkUsers)).
		Watches(&v1alpha1.DiskImage{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return imageUsersOf(ctx, mgr.GetClient(), o)
		})).
		// A namespace with room again grows the Volumes a quota held: its
		// TenantQuota changed or gone, or one of its Volumes gone.
		Watches(&apisv1alpha1.TenantQuota{}, c.state.held.onQuota()).
		Watches(&v1alpha1.Volume{}, c.state.held.onVolumeGone()).
		// A node an administrator removes for good wakes the VMs bound to
		// it, which restart elsewhere once it is lost (restart.go).
		Watches(&v1alpha1.HypervisorNode{}, waiting(index.NodeUsers), builder.WithPredicates(removalStarted)).
		WatchesRawSource(vo.Notifier.Source()).
		Complete(rec)
}

// removalStarted passes the update that marks an object deleted.
var removalStarted = predicate.Funcs{
	CreateFunc:  func(ctrlevent.CreateEvent) bool { return false },
	DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return false },
	GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil
	},
}

// skipCriticalAnnotations writes nothing; see Setup.
var skipCriticalAnnotations = managed.CriticalAnnotationUpdateFn(func(context.Context, client.Object) error { return nil })

// imageUsersOf wakes the VMs whose Volumes are made from the DiskImage o.
func imageUsersOf(ctx context.Context, kube client.Reader, o client.Object) []reconcile.Request {
	l := &v1alpha1.VolumeList{}
	if err := kube.List(ctx, l, client.InNamespace(o.GetNamespace()), client.MatchingFields{index.ImageUsers.Index: o.GetName()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range l.Items {
		out = append(out, index.Requests(ctx, kube, index.VolumeUsers, &l.Items[i])...)
	}
	return out
}

// request is what placement needs to know of the VM; defaults is the
// ProviderConfig's node selector.
func request(vm *v1alpha1.VirtualMachine, d dependencies, defaults map[string]string) (placement.Request, error) {
	required, err := d.boundNode()
	if err != nil {
		return placement.Request{}, err
	}
	return requestOn(vm, d, defaults, required), nil
}

// requestOn is what placement needs to know of the VM, bound to node
// required if it is set.
func requestOn(vm *v1alpha1.VirtualMachine, d dependencies, defaults map[string]string, required string) placement.Request {
	fp := vm.Spec.ForProvider
	req := placement.Request{
		UID:          string(vm.UID),
		Resources:    Resources(vm),
		NodeSelector: NodeSelector(defaults, fp.NodeSelector),
		RequiredNode: required,
		Pools:        d.pools(),
		HeldImages:   d.heldImages(),
	}
	if fp.Backend != nil {
		req.Backend = string(*fp.Backend)
	}
	return req
}

// Resources is what vm takes of a node: its shape (VirtualMachine.Shape),
// which for a VM of an instance type is the one recorded from the type.
func Resources(vm *v1alpha1.VirtualMachine) placement.Resources {
	vcpu, memory, _ := vm.Shape()
	return placement.Resources{VCPU: int64(vcpu), MemoryBytes: memory.Value()}
}

// bindVolumes binds vm's unbound node-local Volumes to its node, so the
// next VM that uses them is placed there too. One given to vm after its
// placement is admitted to the namespace's quota first (admitAttached),
// and forgotten if its binding fails.
func (e *external) bindVolumes(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, node string) error {
	for i := range d.volumes {
		v := &d.volumes[i]
		if err := e.admitAttached(ctx, vm, d, v); err != nil {
			return err
		}
		if err := e.bindVolume(ctx, v.DeepCopy(), node, ""); err != nil {
			if d.attached[v.UID] && e.opts.Quotas != nil {
				e.opts.Quotas.ForgetVolume(v.UID, vm.UID)
			}
			return err
		}
	}
	return nil
}

// followMove moves the Volumes bindVolumes just bound to node from during
// a migration to the VM's node, if the migration ended meanwhile, and then
// fails the reconcile so that the next one reads the VM as it is now. The
// migration controller binds the VM's Volumes to the target and then moves
// the VM; a Volume given to the VM at that moment may be bound here, from
// a read of the VM taken before the move, to the source the guest left.
// Two objects cannot be written at once, so each side reads the other's
// object after its own write: the migration controller binds the VM's
// Volumes again once it moved the VM, and this reads the VM from the API
// server once it bound them. One of the two sees the other's write.
func (e *external) followMove(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, from string) error {
	var bound []*v1alpha1.Volume
	for i := range d.volumes {
		if d.volumes[i].GetAnnotations()[v1alpha1.AnnotationNode] == "" {
			bound = append(bound, d.volumes[i].DeepCopy())
		}
	}
	if len(bound) == 0 {
		return nil
	}
	now := &v1alpha1.VirtualMachine{}
	if err := e.reader.Get(ctx, client.ObjectKeyFromObject(vm), now); err != nil {
		return errors.Wrap(err, "cannot read the VM again after binding its Volumes")
	}
	node := now.GetAnnotations()[v1alpha1.AnnotationNode]
	if node == from || node == "" || !e.fleet.Sealed(now) {
		return nil
	}
	names := make([]string, len(bound))
	for i, v := range bound {
		// v is as read before the binding: the write conflicts, and
		// bindVolume reads it again, bound to from.
		if err := e.bindVolume(ctx, v, node, from); err != nil {
			return err
		}
		names[i] = v.Name
	}
	return errors.Errorf("the VM moved to node %s while Volumes %s were bound to node %s; they follow it", node, strings.Join(names, ", "), from)
}

// bindVolume binds v, read from the cache, to node, unless it is bound
// there already; one bound to node from, if set, is moved (a Volume on a
// shared pool follows its VM off a lost node), and one bound to any other
// node is an error. The write is optimistic, since another VM's reconcile
// may bind it at the same time; when it conflicts, v is read again from
// the API server and bound if it still is not. The cached copy is often
// merely out of date: the Volume's own controller wrote its status
// meanwhile. In a large burst many bindings conflict this way, and giving
// up on each would fail its VM's reconcile and cost a status write showing
// the error.
func (e *external) bindVolume(ctx context.Context, v *v1alpha1.Volume, node, from string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		switch bound := v.GetAnnotations()[v1alpha1.AnnotationNode]; bound {
		case "", from:
		case node:
			return nil
		default:
			return errors.Errorf("Volume %s was bound to node %s meanwhile", v.Name, bound)
		}
		patch := client.MergeFromWithOptions(v.DeepCopy(), client.MergeFromWithOptimisticLock{})
		meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: node, v1alpha1.AnnotationSeal: e.fleet.Seal(string(v.UID), node, "")})
		// The Volume's own controller adds its finalizer too, but maybe not
		// yet: without it a Volume deleted now would go at once and leave
		// its disk on the node. Bound and finalized in one write.
		meta.AddFinalizer(v, managed.FinalizerName)
		// Without waiting for the cache to show the binding: this
		// controller never reads it back to write it again, and in a
		// burst the wait held a worker per VM.
		err := apiwrites.Direct(e.kube).Patch(ctx, v, patch)
		if kerrors.IsConflict(err) {
			fresh := &v1alpha1.Volume{}
			if gerr := e.reader.Get(ctx, client.ObjectKeyFromObject(v), fresh); gerr != nil {
				return gerr
			}
			*v = *fresh
		}
		return err
	})
	return errors.Wrapf(err, "cannot bind Volume %s to node %s", v.Name, node)
}

// ensure binds the VM's Volumes to node and publishes its intent there. A
// Volume another VM bound to another node meanwhile makes it fail: the
// guest would not find its disk.
func (e *external) ensure(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, node string) error {
	bound, err := d.boundNode()
	if err != nil {
		return err
	}
	if m, ok := MigrationOf(vm, e.fleet); ok && (bound == node || bound == m.Target) {
		// During a migration the VM's Volumes are bound to the target just
		// before the VM moves there. A Volume given to the VM meanwhile is
		// admitted and bound beside them, as on a VM that stays: published
		// unbound, it would pass only the quota's question, and two given
		// at once could both pass a quota that takes one.
		if err := e.bindVolumes(ctx, vm, d, bound); err != nil {
			return err
		}
		if err := e.followMove(ctx, vm, d, bound); err != nil {
			return err
		}
		return e.publish(ctx, vm, d, node)
	}
	if bound != "" && bound != node && len(d.volumesOn(bound)) == 0 {
		return errors.Errorf("the VM is on node %s but a cloned image of its volumes is on node %s; delete and re-create the VM to place it there", node, bound)
	}
	if bound != "" && bound != node {
		// Most often a Volume of another node added to a placed VM's
		// diskAttachments: never attached (no other node's disk is
		// reachable from here), and the guest runs on as last published.
		return errors.Errorf("Volume %s is on node %s and the VM runs on node %s: a VM attaches only volumes of its own node; remove it from spec.forProvider.diskAttachments, or delete and re-create the VM to place it on node %s", strings.Join(d.volumesOn(bound), ", "), bound, node, bound)
	}
	if err := e.bindVolumes(ctx, vm, d, node); err != nil {
		return err
	}
	return e.publish(ctx, vm, d, node)
}

// busFailed returns err, a write to the fleet's NATS server that failed,
// after asking for uid to be reconciled again as soon as the server is back
// (Notifier.NotifyOnSync) rather than when the reconcile's backoff expires.
func (e *external) busFailed(uid string, err error) error {
	e.opts.Notifier.NotifyOnSync(e.fleet, uid)
	return err
}

// publish deletes the VM's intents on the nodes it left before it puts the
// new ones: a node restarted elsewhere while cut off reads its intents
// afresh before it starts a fenced guest again, and finds this one gone.
func (e *external) publish(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, node string) error {
	if err := e.clearLeftovers(ctx, vm, node); err != nil {
		return err
	}
	if b := e.fleet.Binding(vm); b != nil {
		if err := e.fleet.Record(ctx, string(vm.UID), *b); err != nil {
			return e.busFailed(string(vm.UID), err)
		}
	}
	if err := e.recordGrowth(ctx, &d); err != nil {
		return err
	}
	p := e.plan(vm, d, node)
	size, err := e.state.intentBytes.reserve(vm.UID, vm.Namespace, p, e.opts.IntentBytesPerNamespace)
	if err != nil {
		return err
	}
	for _, n := range slices.Sorted(maps.Keys(p)) {
		if _, err := bus.Put(ctx, e.fleet.Bus, wire.GuestIntents, n, p[n].UID, p[n]); err != nil {
			return e.busFailed(string(vm.UID), errors.Wrapf(err, "cannot publish the intent to node %s", n))
		}
	}
	e.state.intentBytes.settle(vm.UID, vm.Namespace, size)
	e.state.published.Store(vm.UID, planFingerprint(p, node))
	e.state.deleted.Delete(vm.UID)
	return nil
}

// sayHeldGrowth adds to vm's Ready message why its Volumes in held keep
// their size.
func (e *external) sayHeldGrowth(vm *v1alpha1.VirtualMachine, held []string) {
	ready := vm.GetCondition(xpv2.TypeReady)
	ready.Message = strings.TrimPrefix(ready.Message+"; "+strings.Join(held, "; "), "; ")
	vm.SetConditions(ready)
}

// setConditions turns an observation into Ready, RestartRequired and NodeLost.
func (e *external) setConditions(vm *v1alpha1.VirtualMachine, obs v1alpha1.VirtualMachineObservation, node string, n fleet.NodeStatus) {
	switch {
	case obs.Phase == v1alpha1.PhaseRunning:
		// A running guest's node may still have something to say: what it
		// could not apply live (a disk it could not grow, and why).
		ready := xpv2.Available()
		ready.Message = reportMessage(e.fleet, node, string(vm.UID))
		// Nor can the node always take a larger shape: the guest runs on
		// as it is, and the message says which field waits and why.
		var m wire.Machine
		m.VCPU, m.MemoryBytes = declaredShape(vm)
		if held := e.holdGrowth(vm, node, &m); held != "" {
			ready.Message = strings.TrimPrefix(ready.Message+"; "+held, "; ")
		}
		vm.SetConditions(ready)
	case obs.Phase == v1alpha1.PhasePaused && vm.GetAnnotations()[v1alpha1.AnnotationPaused] == "true":
		// A paused guest runs no instruction and so answers nothing, on
		// its network or its console, until it is resumed: it is not
		// Ready, as a paused KubeVirt VMI is not. The reason says it is
		// paused, and the message how to resume it.
		vm.SetConditions(notReady(obs.Phase, pausedMessage))
	default:
		vm.SetConditions(notReady(obs.Phase, reportMessage(e.fleet, node, string(vm.UID))))
	}
	rr := xpv2.Condition{Type: TypeRestartRequired, Status: corev1.ConditionFalse, Reason: "UpToDate", LastTransitionTime: now()}
	if obs.RestartRequired {
		rr.Status, rr.Reason = corev1.ConditionTrue, "SpecChanged"
		rr.Message = "the spec changed while the VM runs; the change applies at the next start (restart it with the compute.virtfleet.io/restart-requested-at annotation)"
		if msg := reportMessage(e.fleet, node, string(vm.UID)); msg != "" {
			// What waits, as the node names it: a disk the guest has
			// not released, a maximum it cannot grow beyond.
			rr.Message += ": " + msg
		}
	}
	vm.SetConditions(rr)
	nl := xpv2.Condition{Type: TypeNodeLost, Status: corev1.ConditionFalse, Reason: "HeartbeatFresh", LastTransitionTime: now()}
	if n.Lost {
		nl.Status, nl.Reason = corev1.ConditionTrue, "HeartbeatExpired"
		nl.Message = fmt.Sprintf("node %s has sent no heartbeat since %s; %s", node, n.LostSince.UTC().Format(time.RFC3339), e.restartNote(vm))
	}
	vm.SetConditions(nl)
}

// restartNote says whether the VM on a lost node is restarted on another
// node: when, or why not, as the plain half of the reconcile noted it
// (restart.go), which notes nothing of a VM without availability Restart
// on a node not removed for good: it is not.
func (e *external) restartNote(vm *v1alpha1.VirtualMachine) string {
	if note, ok := e.state.restarts.Load(vm.UID); ok {
		return note
	}
	return "the VM is not started elsewhere"
}

// recordTransition emits the events a user follows in kubectl describe.
func (e *external) recordTransition(vm *v1alpha1.VirtualMachine, before, after v1alpha1.VirtualMachineObservation, node string) {
	if before.Phase != after.Phase {
		switch after.Phase {
		case v1alpha1.PhaseRunning:
			if before.Phase == v1alpha1.PhasePaused {
				e.event(vm, event.Normal(ReasonResumed, fmt.Sprintf("Resumed on node %s", after.Node)))
				break
			}
			e.event(vm, event.Normal(ReasonStarted, fmt.Sprintf("Running on node %s", after.Node)))
			if firstStart(vm, before, after) {
				backend := cmp.Or(e.fleet.Node(node).Heartbeat.Backend, metrics.BackendNone)
				took := time.Since(vm.CreationTimestamp.Time).Seconds()
				metrics.CreateToRunning.WithLabelValues(backend).Observe(took)
			}
		case v1alpha1.PhaseStopped:
			e.event(vm, event.Normal(ReasonStopped, fmt.Sprintf("Stopped on node %s", after.Node)))
		case v1alpha1.PhasePaused:
			e.event(vm, event.Normal(ReasonPaused, fmt.Sprintf("Paused on node %s", after.Node)))
		case v1alpha1.PhaseFailed:
			msg := reportMessage(e.fleet, node, string(vm.UID))
			e.log.Info("VM failed on its node", "namespace", vm.Namespace, "name", vm.Name, "node", node, "message", msg)
			e.event(vm, event.Warning(ReasonFailed, errors.New(msg)))
		case v1alpha1.PhaseUnknown:
			e.event(vm, event.Warning(ReasonNodeLost, errors.Errorf("node %s sends no heartbeat; the VM's state is unknown", node)))
		}
	}
	if after.RestartRequired && !before.RestartRequired {
		e.event(vm, event.Normal(ReasonRestartRequired, "The spec changed while the VM runs; the change applies at the next start"))
	}
}

// firstStart is whether a transition to Running is the VM's first start as
// created: from a phase before any start, never restarted, and its spec
// never changed (a stop and start changes spec.running).
func firstStart(vm *v1alpha1.VirtualMachine, before, after v1alpha1.VirtualMachineObservation) bool {
	switch before.Phase {
	case "", v1alpha1.PhasePending, v1alpha1.PhaseScheduled, v1alpha1.PhaseProvisioning, v1alpha1.PhaseStarting:
		return vm.Generation <= 1 && after.RestartCount == 0
	}
	return false
}

func reportMessage(f *fleet.Fleet, node, uid string) string {
	if r, ok := f.Guests.Report(node, uid); ok && r.Report.Message != "" {
		return r.Report.Message
	}
	return ""
}

// pausedMessage explains the Ready condition of a VM paused as its
// annotation asks.
const pausedMessage = "the guest is paused, as the " + v1alpha1.AnnotationPaused + " annotation asks; remove the annotation to resume it"

func now() metav1.Time { return metav1.Now() }

func notReady(phase v1alpha1.Phase, msg string) xpv2.Condition {
	return xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionFalse, Reason: xpv2.ConditionReason(phase), Message: msg, LastTransitionTime: now()}
}
