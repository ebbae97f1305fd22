// Package virtualmachine reconciles VirtualMachines: it places each on a
// node, publishes its intent to that node, and turns the node's reports into
// status, conditions and events.
package virtualmachine

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/requeue"
	"github.com/virtfleet/virtfleet/hub/internal/controller/writes"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
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
	ReasonFailed          event.Reason = "Failed"
	ReasonRestartRequired event.Reason = "RestartRequired"
	ReasonNodeLost        event.Reason = "NodeLost"
	ReasonWaiting         event.Reason = "WaitingForDependencies"
)

// Options of the VirtualMachine controller.
type Options struct {
	Pool   *fleet.Pool
	Placer *placement.Placer
	// Notifier turns report changes into reconciles; it must be the one the
	// Pool's fleets report to.
	Notifier *fleet.Notifier
	// FencingTimeout is how long a VM whose node is lost waits in deletion
	// before it is finalized without the node confirming the guest is gone.
	FencingTimeout time.Duration
}

// scheduledHold is how long the status of a VM just placed waits for its
// node's first report. A node usually answers within tens of milliseconds,
// and then phase Scheduled would be written only to be replaced at once:
// the VM goes from created to Running in three API writes (the create, the
// node and finalizer, the status) instead of four.
const scheduledHold = 500 * time.Millisecond

// SetupGated adds the controller once the CRD is established (safe-start).
func SetupGated(mgr ctrl.Manager, o controller.Options, vo Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, vo); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachine controller"))
		}
	}, v1alpha1.VirtualMachineGroupVersionKind)
	return nil
}

// Setup adds the controller that reconciles VirtualMachines.
func Setup(mgr ctrl.Manager, o controller.Options, vo Options) error {
	name := managed.ControllerName(v1alpha1.VirtualMachineGroupKind)
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor(name)) //nolint:staticcheck // crossplane-runtime still records through the old events API
	c := &connector{
		kube:     mgr.GetClient(),
		configs:  providerconfig.NewResolver(mgr.GetClient()),
		opts:     vo,
		recorder: recorder,
		state:    &state{},
		policies: o.Features.Enabled(feature.EnableBetaManagementPolicies),
	}
	// With the client of writes.SkipUnchangedStatus, the status of a VM just
	// placed waits for the node's first report; with another, it is
	// written at once.
	c.deferrer, _ = mgr.GetClient().(writes.StatusDeferrer)
	opts := []managed.ReconcilerOption{
		managed.WithTypedExternalConnector[*v1alpha1.VirtualMachine](c),
		managed.WithLogger(o.Logger.WithValues("controller", name)),
		managed.WithPollInterval(o.PollInterval),
		managed.WithRecorder(recorder),
		// The guest's identity is the VM's uid and Create is idempotent
		// (the node is recorded before the intent is published), so a hub
		// that crashed mid-create can safely create again.
		managed.WithDeterministicExternalName(true),
		// Observe answers from the reports the moment they change, so there
		// is no eventual consistency to wait out after a create; waiting
		// would only hold up the deletion of a VM deleted right after it
		// was created.
		managed.WithCreationGracePeriod(0),
		// Fewer writes per VM (the hub's throughput is bounded by its API
		// write rate). No external-name annotation: a guest is found by the
		// VM's uid, never by a name. And the create-succeeded and
		// create-failed annotations are not written: they only guard
		// non-deterministic external names, and the one fact a create must
		// not lose, the node, is recorded before the intent is published.
		// Observe itself places a new VM (see schedule), which also spares
		// the create-pending annotation and the separate finalizer write.
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
	copts.RateLimiter = requeue.ControllerRateLimiter()
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(copts).
		WithEventFilter(resource.DesiredStateChanged()).
		For(&v1alpha1.VirtualMachine{}).
		// A Volume wakes the VMs attaching it when it is created, deleted or
		// changed in spec, not when it is bound to the node of a VM that
		// attaches it; and on any change the VMs booting from a DiskImage
		// that clones it, which wait for it to be bound.
		Watches(&v1alpha1.Volume{}, waiting(index.VolumeUsers), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.Volume{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return cloneUsersOf(ctx, mgr.GetClient(), o)
		})).
		Watches(&v1alpha1.VirtualNetwork{}, waiting(index.NetworkUsers)).
		Watches(&v1alpha1.DiskImage{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return imageUsersOf(ctx, mgr.GetClient(), o)
		})).
		WatchesRawSource(vo.Notifier.Source()).
		Complete(ratelimiter.NewReconciler(name, &releaser{inner: r, c: c}, o.GlobalRateLimiter))
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

// state is what the controller remembers across reconciles. All of it can be
// lost: after a restart each VM's intent is published again (writing the same
// intent twice changes nothing) and a deletion deletes its intent again.
type state struct {
	published sync.Map // uid -> fingerprint of the last intent published
	deleted   sync.Map // uid -> struct{}: the intent is gone
}

type connector struct {
	kube     client.Client
	configs  *providerconfig.Resolver
	opts     Options
	recorder event.Recorder
	state    *state
	// policies is whether management policies are enabled.
	policies bool
	// deferrer, if set, holds back the status write of a VM just placed.
	deferrer writes.StatusDeferrer
}

// Connect finds the fleet the VM's ProviderConfig names.
func (c *connector) Connect(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.TypedExternalClient[*v1alpha1.VirtualMachine], error) {
	pc, err := c.configs.Resolve(ctx, vm)
	if err != nil {
		return nil, err
	}
	f, err := c.opts.Pool.Get(ctx, pc.Target)
	if err != nil {
		return nil, err
	}
	c.opts.Notifier.Remember(vm)
	return &external{connector: c, fleet: f, nodeSelector: pc.NodeSelector}, nil
}

type external struct {
	*connector
	fleet        *fleet.Fleet
	nodeSelector map[string]string
}

// Observe answers from the fleet's in-memory view; it never waits on NATS.
//
// A VM on no node yet is placed here, not in Create: the managed reconciler
// writes the VM twice before it calls Create (the finalizer, then the
// create-pending annotation) and its status once after, where scheduling
// here takes a single write for the node and the finalizer together. Since
// the guest's identity is the VM's uid and publishing an intent twice
// changes nothing, nothing else of Create's protocol is needed.
func (e *external) Observe(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.ExternalObservation, error) {
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if meta.WasDeleted(vm) {
		e.opts.Notifier.Placed(string(vm.UID), true)
		if e.keepsGuest(vm) {
			return e.observeRelease(ctx, vm, node)
		}
		return e.observeDeletion(vm, node), nil
	}
	if node == "" {
		var err error
		if node, err = e.adopt(ctx, vm); err != nil {
			return managed.ExternalObservation{}, err
		}
	}
	if node == "" {
		if !e.mayCreate(vm) {
			return managed.ExternalObservation{ResourceExists: false}, nil
		}
		var err error
		node, err = e.schedule(ctx, vm)
		e.opts.Notifier.Placed(string(vm.UID), node != "")
		if err != nil {
			return managed.ExternalObservation{}, err
		}
	}

	uid := string(vm.UID)
	before := vm.Status.AtProvider
	obs := before
	e.fleet.FlagForeign(fleet.KindVM, vm, node)
	if rep, ok := e.fleet.Report(node, uid); ok {
		e.opts.Placer.Confirm(uid, rep.ReceivedAt)
		obs = observation(rep.Report, vm.Spec.ForProvider.VirtualNetworks)
	} else if obs.Phase == "" || obs.Phase == v1alpha1.PhasePending || obs.Phase == v1alpha1.PhaseUnknown {
		obs.Phase, obs.Node = v1alpha1.PhaseScheduled, node
	}
	n := e.fleet.Node(node)
	if n.Lost {
		obs.Phase = v1alpha1.PhaseUnknown
	}
	vm.Status.AtProvider = obs
	e.setConditions(vm, obs, node, n)
	e.recordTransition(vm, before, obs, node)

	d, err := resolve(ctx, e.kube, vm)
	upToDate := err == nil
	if upToDate {
		published, _ := e.state.published.Load(uid)
		upToDate = published == fingerprint(intent(vm, d))
	}
	upToDate, err = e.afterObserve(ctx, vm, node, upToDate)
	return managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: upToDate}, err
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
			e.recorder.Event(vm, event.Warning(ReasonNodeLost, errors.Errorf(
				"node %s has been lost since %s; finalized after the fencing timeout (%s) without the node confirming that the guest is gone",
				node, n.LostSince.UTC().Format(time.RFC3339), e.opts.FencingTimeout)))
			return managed.ExternalObservation{ResourceExists: false}
		}
	}
	e.fleet.FlagForeign(fleet.KindVM, vm, node)
	_, reported := e.fleet.Report(node, uid)
	_, deleted := e.state.deleted.Load(uid)
	return managed.ExternalObservation{ResourceExists: reported || !deleted}
}

// schedule places a new VM, records the node and the managed finalizer on
// the VM in one write, and only then binds its Volumes and publishes its
// intent: a hub that crashes in between finds the node on the VM and
// publishes to it, so a guest is never placed twice. It returns the node
// once it is recorded, even when what follows fails (Update retries it).
func (e *external) schedule(ctx context.Context, vm *v1alpha1.VirtualMachine) (string, error) {
	d, err := resolve(ctx, e.kube, vm)
	if err != nil {
		e.waiting(vm, err)
		return "", err
	}
	node, err := e.place(ctx, vm, d)
	if err != nil {
		e.waiting(vm, err)
		return "", err
	}
	// Placed once recorded, even if what follows fails and is retried.
	e.recorder.Event(vm, event.Normal(ReasonScheduled, fmt.Sprintf("Placed on node %s", node)))
	if err := e.ensure(ctx, vm, d, node); err != nil {
		return node, err
	}
	vm.Status.AtProvider.Phase, vm.Status.AtProvider.Node = v1alpha1.PhaseScheduled, node
	vm.SetConditions(xpv2.Creating())
	if e.deferrer != nil {
		// The report's arrival reconciles the VM; without one in time, the
		// timer does, and the held status is written.
		uid, f := string(vm.UID), e.fleet
		e.deferrer.DeferStatus(vm, scheduledHold)
		e.opts.Notifier.NotifyAfterIf(uid, scheduledHold, func() bool { _, reported := f.Report(node, uid); return !reported })
	}
	return node, nil
}

// mayCreate is whether the VM's management policies let the hub create its
// guest.
func (e *external) mayCreate(vm *v1alpha1.VirtualMachine) bool {
	return managed.NewManagementPoliciesResolver(e.policies, vm.GetManagementPolicies()).ShouldCreate()
}

// Create is reached only when Observe did not place the VM, which it does
// whenever the VM may be created; it places it the same way.
func (e *external) Create(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.ExternalCreation, error) {
	_, err := e.schedule(ctx, vm)
	return managed.ExternalCreation{}, err
}

// request is what placement needs to know of the VM.
func (e *external) request(vm *v1alpha1.VirtualMachine, d dependencies) (placement.Request, error) {
	required, err := d.boundNode()
	if err != nil {
		return placement.Request{}, err
	}
	fp := vm.Spec.ForProvider
	req := placement.Request{
		UID:          string(vm.UID),
		Resources:    placement.Resources{VCPU: int64(fp.Vcpu), MemoryBytes: fp.Memory.Value()},
		NodeSelector: nodeSelector(e.nodeSelector, fp.NodeSelector),
		RequiredNode: required,
	}
	if fp.Backend != nil {
		req.Backend = string(*fp.Backend)
	}
	return req, nil
}

func (e *external) place(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies) (string, error) {
	req, err := e.request(vm, d)
	if err != nil {
		return "", err
	}
	node, err := e.opts.Placer.Place(e.fleet.Nodes(), req)
	if err != nil {
		return "", errors.Wrap(err, "cannot place the VM")
	}
	meta.AddAnnotations(vm, map[string]string{v1alpha1.AnnotationNode: node})
	meta.AddFinalizer(vm, managed.FinalizerName)
	if e.keepsGuest(vm) {
		meta.AddFinalizer(vm, FinalizerKeep)
	}
	if err := e.kube.Update(ctx, vm); err != nil {
		// A conflict means this reconcile read an old VM, maybe from
		// before an earlier one recorded this very node: keep the
		// reservation, which expires unless the node confirms it.
		if !kerrors.IsConflict(err) {
			e.opts.Placer.Release(string(vm.UID))
		}
		return "", errors.Wrap(err, "cannot record the chosen node")
	}
	return node, nil
}

// bindVolumes binds the VM's unbound node-local Volumes to its node, so the
// next VM that uses them is placed there too.
func (e *external) bindVolumes(ctx context.Context, d dependencies, node string) error {
	for i := range d.volumes {
		v := &d.volumes[i]
		if v.GetAnnotations()[v1alpha1.AnnotationNode] != "" {
			continue
		}
		// Optimistic: another VM's reconcile may bind it at the same time.
		patch := client.MergeFromWithOptions(v.DeepCopy(), client.MergeFromWithOptimisticLock{})
		meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: node})
		// The Volume's own controller adds its finalizer too, but maybe not
		// yet: without it a Volume deleted now would go at once and leave
		// its disk on the node. Bound and finalized in one write.
		meta.AddFinalizer(v, managed.FinalizerName)
		if err := e.kube.Patch(ctx, v, patch); err != nil {
			return errors.Wrapf(err, "cannot bind Volume %s to node %s", v.Name, node)
		}
	}
	return nil
}

// ensure binds the VM's Volumes to node and publishes its intent there. A
// Volume another VM bound to another node meanwhile makes it fail: the
// guest would not find its disk.
func (e *external) ensure(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, node string) error {
	bound, err := d.boundNode()
	if err != nil {
		return err
	}
	if bound != "" && bound != node {
		return errors.Errorf("the VM is on node %s but its volumes are on node %s; delete and re-create the VM to place it there", node, bound)
	}
	if err := e.bindVolumes(ctx, d, node); err != nil {
		return err
	}
	return e.publish(ctx, vm, d, node)
}

func (e *external) publish(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, node string) error {
	in := intent(vm, d)
	if _, err := e.fleet.Bus.PutIntent(ctx, node, in); err != nil {
		return errors.Wrapf(err, "cannot publish the intent to node %s", node)
	}
	e.state.published.Store(in.UID, fingerprint(in))
	e.state.deleted.Delete(in.UID)
	return nil
}

// Update publishes the intent again after the spec or the restart
// annotation changed, or when this hub has not published it yet (it just
// started, or a publish failed). The node decides what a running guest can
// take live; the rest shows up as RestartRequired.
func (e *external) Update(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.ExternalUpdate, error) {
	d, err := resolve(ctx, e.kube, vm)
	if err != nil {
		return managed.ExternalUpdate{}, err
	}
	return managed.ExternalUpdate{}, e.ensure(ctx, vm, d, vm.GetAnnotations()[v1alpha1.AnnotationNode])
}

// Delete removes the intent, which tells the node to delete the guest. The
// VM's Volumes and VirtualNetworks stay.
func (e *external) Delete(ctx context.Context, vm *v1alpha1.VirtualMachine) (managed.ExternalDelete, error) {
	node, uid := vm.GetAnnotations()[v1alpha1.AnnotationNode], string(vm.UID)
	vm.Status.AtProvider.Phase = v1alpha1.PhaseDeleting
	vm.SetConditions(xpv2.Deleting())
	if err := e.fleet.Bus.DeleteIntent(ctx, node, uid); err != nil {
		return managed.ExternalDelete{}, errors.Wrapf(err, "cannot delete the intent on node %s", node)
	}
	e.state.deleted.Store(uid, struct{}{})
	e.state.published.Delete(uid)
	e.opts.Placer.Release(uid)
	return managed.ExternalDelete{}, nil
}

// Disconnect implements managed.TypedExternalClient; the fleet's connection
// outlives the reconcile.
func (e *external) Disconnect(context.Context) error { return nil }

func (e *external) waiting(vm *v1alpha1.VirtualMachine, err error) {
	vm.Status.AtProvider.Phase = v1alpha1.PhasePending
	vm.SetConditions(notReady(v1alpha1.PhasePending, err.Error()))
}

// setConditions turns an observation into Ready, RestartRequired and NodeLost.
func (e *external) setConditions(vm *v1alpha1.VirtualMachine, obs v1alpha1.VirtualMachineObservation, node string, n fleet.NodeStatus) {
	switch {
	case obs.Phase == v1alpha1.PhaseRunning:
		vm.SetConditions(xpv2.Available())
	default:
		vm.SetConditions(notReady(obs.Phase, reportMessage(e.fleet, node, string(vm.UID))))
	}
	rr := xpv2.Condition{Type: TypeRestartRequired, Status: corev1.ConditionFalse, Reason: "UpToDate", LastTransitionTime: now()}
	if obs.RestartRequired {
		rr.Status, rr.Reason = corev1.ConditionTrue, "SpecChanged"
		rr.Message = "the spec changed while the VM runs; the change applies at the next start (restart it with the compute.virtfleet.io/restart-requested-at annotation)"
	}
	vm.SetConditions(rr)
	nl := xpv2.Condition{Type: TypeNodeLost, Status: corev1.ConditionFalse, Reason: "HeartbeatFresh", LastTransitionTime: now()}
	if n.Lost {
		nl.Status, nl.Reason = corev1.ConditionTrue, "HeartbeatExpired"
		nl.Message = fmt.Sprintf("node %s has sent no heartbeat since %s; the VM is not started elsewhere", node, n.LostSince.UTC().Format(time.RFC3339))
	}
	vm.SetConditions(nl)
}

// recordTransition emits the events a user follows in kubectl describe.
func (e *external) recordTransition(vm *v1alpha1.VirtualMachine, before, after v1alpha1.VirtualMachineObservation, node string) {
	if before.Phase != after.Phase {
		switch after.Phase {
		case v1alpha1.PhaseRunning:
			e.recorder.Event(vm, event.Normal(ReasonStarted, fmt.Sprintf("Running on node %s", after.Node)))
		case v1alpha1.PhaseStopped:
			e.recorder.Event(vm, event.Normal(ReasonStopped, fmt.Sprintf("Stopped on node %s", after.Node)))
		case v1alpha1.PhaseFailed:
			e.recorder.Event(vm, event.Warning(ReasonFailed, errors.New(reportMessage(e.fleet, node, string(vm.UID)))))
		case v1alpha1.PhaseUnknown:
			e.recorder.Event(vm, event.Warning(ReasonNodeLost, errors.Errorf("node %s sends no heartbeat; the VM's state is unknown", node)))
		}
	}
	if after.RestartRequired && !before.RestartRequired {
		e.recorder.Event(vm, event.Normal(ReasonRestartRequired, "The spec changed while the VM runs; the change applies at the next start"))
	}
}

func reportMessage(f *fleet.Fleet, node, uid string) string {
	if r, ok := f.Report(node, uid); ok && r.Report.Message != "" {
		return r.Report.Message
	}
	return ""
}

func now() metav1.Time { return metav1.Now() }

func notReady(phase v1alpha1.Phase, msg string) xpv2.Condition {
	return xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionFalse, Reason: xpv2.ConditionReason(phase), Message: msg, LastTransitionTime: now()}
}
