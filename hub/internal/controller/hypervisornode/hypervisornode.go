// Package hypervisornode keeps one HypervisorNode per node that sends
// heartbeats: its backend, versions, labels, capacity, allocation, VMs and
// readiness, from the hub's view of the heartbeats (fleet.Fleet). A
// heartbeat that says the same again writes nothing; a change is written at
// most once per MinInterval per node, so a burst of placements costs a few
// writes per node, not one per VM.
package hypervisornode

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// Timings.
const (
	// MinInterval is the least time between two status writes of one node.
	MinInterval = 2 * time.Second
	// resyncEvery re-reads each node although nothing was heard of it: a
	// change whose notice was dropped (Changes is full) shows by then.
	resyncEvery = time.Minute
	// drainEvery looks again at a node being drained; its migrations'
	// progress wakes it sooner.
	drainEvery = 10 * time.Second
)

// maxRefusalsShown is how many refused claims the ClaimsAllowed condition
// names.
const maxRefusalsShown = 10

// Changes hears of nodes whose heartbeats changed (Fleet.SubscribeNodeChanges)
// and hands them to the controller.
type Changes struct {
	ch chan event.TypedGenericEvent[*v1alpha1.HypervisorNode]
}

// NewChanges returns a Changes with room for a burst of notices.
func NewChanges() *Changes {
	return &Changes{ch: make(chan event.TypedGenericEvent[*v1alpha1.HypervisorNode], 4096)}
}

// Notify queues node; it never blocks: a notice that finds no room is
// dropped, and the resync catches up.
func (c *Changes) Notify(node string) {
	o := &v1alpha1.HypervisorNode{}
	o.SetName(node)
	select {
	case c.ch <- event.TypedGenericEvent[*v1alpha1.HypervisorNode]{Object: o}:
	default:
	}
}

// Reconciler makes each HypervisorNode show what the fleets know of its node.
type Reconciler struct {
	kube   client.Client
	fleets func() []*fleet.Fleet
	log    logging.Logger
	now    func() time.Time

	mu      sync.Mutex
	written map[string]time.Time
}

// SetupGated adds the controller once the HypervisorNode CRD is established.
func SetupGated(mgr ctrl.Manager, o controller.Options, fleets func() []*fleet.Fleet, changes *Changes, allowances *fleet.Allowances) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, fleets, changes, allowances); err != nil {
			panic(errors.Wrap(err, "cannot set up the HypervisorNode controller"))
		}
	}, v1alpha1.HypervisorNodeGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind, v1alpha1.VirtualMachineMigrationGroupVersionKind)
	return nil
}

// Setup adds the controller, and keeps allowances (when not nil) as the
// HypervisorNodes' specs say.
func Setup(mgr ctrl.Manager, o controller.Options, fleets func() []*fleet.Fleet, changes *Changes, allowances *fleet.Allowances) error {
	if allowances != nil {
		if err := mgr.Add(&allowanceWatch{cache: mgr.GetCache(), allowances: allowances}); err != nil {
			return errors.Wrap(err, "cannot watch what HypervisorNodes allow")
		}
	}
	r := NewReconciler(mgr.GetClient(), fleets, o.Logger.WithValues("controller", "hypervisornode"))
	return ctrl.NewControllerManagedBy(mgr).
		Named("hypervisornode").
		For(&v1alpha1.HypervisorNode{}).
		// A VM placed on a node, or gone from it, changes its count; its
		// status writes do not. A VM whose seal comes or goes may be
		// admitted to its node or no longer: Reconcile decides.
		Watches(&v1alpha1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if node := o.GetAnnotations()[v1alpha1.AnnotationNode]; node != "" {
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: node}}}
			}
			return nil
		}), builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				old, now := e.ObjectOld.GetAnnotations(), e.ObjectNew.GetAnnotations()
				return old[v1alpha1.AnnotationNode] != now[v1alpha1.AnnotationNode] || old[v1alpha1.AnnotationSeal] != now[v1alpha1.AnnotationSeal]
			},
		})).
		// A drain follows its migrations; a migration that ends may also
		// free a slot for the next.
		Watches(&v1alpha1.VirtualMachineMigration{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			m, ok := o.(*v1alpha1.VirtualMachineMigration)
			if !ok || m.Status.SourceNode == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: m.Status.SourceNode}}}
		})).
		WatchesRawSource(source.Channel(changes.ch, &handler.TypedEnqueueRequestForObject[*v1alpha1.HypervisorNode]{})).
		// Not o's options: their rate limiter is the one the hub's managed
		// resources share, whose budget a node's bookkeeping must not
		// spend in a burst of VMs. The default limiter and one worker
		// suffice for a write every MinInterval per node.
		WithOptions(crcontroller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// NewReconciler writes with kube and reads the nodes of fleets.
func NewReconciler(kube client.Client, fleets func() []*fleet.Fleet, log logging.Logger) *Reconciler {
	return &Reconciler{kube: kube, fleets: fleets, log: log, now: time.Now, written: map[string]time.Time{}}
}

// Reconcile creates the HypervisorNode of a node that sends heartbeats, and
// writes its status when what it shows changed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	st, heardBy := r.node(name)
	known := heardBy != nil
	n := &v1alpha1.HypervisorNode{}
	err := r.kube.Get(ctx, req.NamespacedName, n)
	switch {
	case kerrors.IsNotFound(err):
		if !known || st.Lost {
			// Never heard from since the hub started, or lost: an
			// administrator deleted it on purpose, or it is not a node.
			r.forget(name)
			return reconcile.Result{}, nil
		}
		n.SetName(name)
		n.SetFinalizers([]string{Finalizer})
		if err := r.kube.Create(ctx, n); err != nil {
			return reconcile.Result{}, errors.Wrapf(err, "cannot create HypervisorNode %s", name)
		}
		r.log.Info("Created the HypervisorNode of a node that sends heartbeats", "node", name)
	case err != nil:
		return reconcile.Result{}, errors.Wrapf(err, "cannot get HypervisorNode %s", name)
	case !n.DeletionTimestamp.IsZero():
		return r.removed(ctx, n, st, heardBy)
	case !controllerutil.ContainsFinalizer(n, Finalizer):
		// Made before the hub held HypervisorNodes, or by hand.
		controllerutil.AddFinalizer(n, Finalizer)
		if err := r.kube.Update(ctx, n); err != nil {
			return reconcile.Result{}, errors.Wrapf(err, "cannot hold HypervisorNode %s", name)
		}
	}
	if !known && !st.Lost {
		// Not heard from since the hub started: shown lost once every live
		// node has had time to send a heartbeat.
		return reconcile.Result{RequeueAfter: MinInterval}, nil
	}
	vms, err := r.vmsOn(ctx, name, heardBy)
	if err != nil {
		return reconcile.Result{}, err
	}
	want := n.DeepCopy()
	if known {
		want.Status = status(st, n.Status.Conditions)
	}
	// What the heartbeats said before the hub started is not known now:
	// an unheard node keeps what was shown, and only its VMs and
	// readiness change.
	want.Status.VirtualMachines = int32(len(vms)) //nolint:gosec // far fewer VMs than 2^31 on one node
	meta.SetStatusCondition(&want.Status.Conditions, ready(st))
	if known {
		meta.SetStatusCondition(&want.Status.Conditions, claimsAllowed(st.Refused))
	}
	want.Status.Drain = nil
	next := resyncEvery
	if n.Spec.Drain {
		if want.Status.Drain, err = r.drain(ctx, name, st.Heartbeat, vms); err != nil {
			return reconcile.Result{}, err
		}
		if want.Status.Drain.Phase != v1alpha1.DrainDrained {
			next = drainEvery
		}
	}
	if equality.Semantic.DeepEqual(n.Status, want.Status) {
		return reconcile.Result{RequeueAfter: next}, nil
	}
	if wait := r.wait(name); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	if err := r.kube.Status().Update(ctx, want); err != nil {
		return reconcile.Result{}, errors.Wrapf(err, "cannot write the status of HypervisorNode %s", name)
	}
	r.wrote(name)
	return reconcile.Result{RequeueAfter: next}, nil
}

// status is what a node's HypervisorNode shows of its latest heartbeat;
// conditions are its current ones, whose transition times are kept where
// the status is the same (see ready).
func status(st fleet.NodeStatus, conditions []metav1.Condition) v1alpha1.HypervisorNodeStatus {
	hb := st.Heartbeat
	out := v1alpha1.HypervisorNodeStatus{
		Backend:      hb.Backend,
		Hypervisor:   hb.Hypervisor,
		AgentVersion: hb.AgentVersion,
		Labels:       hb.Labels,
		Capacity:     resources(hb.Capacity.VCPU, hb.Capacity.MemoryBytes, hb.Capacity.StorageBytes),
		Allocated:    resources(hb.Allocated.VCPU, hb.Allocated.MemoryBytes, hb.Allocated.StorageBytes),
		Conditions:   append([]metav1.Condition(nil), conditions...),
	}
	out.Summary = fmt.Sprintf("%d/%d vCPU, %s/%s", hb.Allocated.VCPU, hb.Capacity.VCPU, out.Allocated.Memory.String(), out.Capacity.Memory.String())
	return out
}

// ready is the Ready condition of a node. Its transition time is when the
// node was lost, or, set by meta.SetStatusCondition, when it became ready.
func ready(st fleet.NodeStatus) metav1.Condition {
	if !st.Lost {
		return metav1.Condition{Type: v1alpha1.NodeConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.NodeReasonHeartbeating, Message: "The node's heartbeats arrive"}
	}
	c := metav1.Condition{Type: v1alpha1.NodeConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.NodeReasonLost,
		Message: "No heartbeat since the hub started", LastTransitionTime: metav1.NewTime(st.LostSince)}
	if !st.LastSeen.IsZero() {
		c.Message = "No heartbeat since " + st.LastSeen.UTC().Format(time.RFC3339)
	}
	return c
}

// claimsAllowed is the ClaimsAllowed condition of a node whose heartbeat's
// refused claims are refused.
func claimsAllowed(refused []fleet.Refusal) metav1.Condition {
	if len(refused) == 0 {
		return metav1.Condition{Type: v1alpha1.NodeConditionClaimsAllowed, Status: metav1.ConditionTrue, Reason: v1alpha1.NodeReasonClaimsAllowed,
			Message: "Every label, shared pool and address the node claims counts"}
	}
	each := make([]string, 0, min(len(refused), maxRefusalsShown)+1)
	for _, r := range refused[:min(len(refused), maxRefusalsShown)] {
		each = append(each, r.String())
	}
	if len(refused) > maxRefusalsShown {
		// A node's claims are bounded only by its heartbeat's size; the
		// condition must still fit in a write.
		each = append(each, fmt.Sprintf("and %d more", len(refused)-maxRefusalsShown))
	}
	return metav1.Condition{Type: v1alpha1.NodeConditionClaimsAllowed, Status: metav1.ConditionFalse, Reason: v1alpha1.NodeReasonClaimsRefused,
		Message: "The hub ignores what the node claims of " + strings.Join(each, "; ")}
}

func resources(vcpu, memory, storage int64) v1alpha1.NodeResources {
	r := v1alpha1.NodeResources{VCPU: vcpu, Memory: *resource.NewQuantity(memory, resource.BinarySI)}
	if storage > 0 {
		r.Storage = resource.NewQuantity(storage, resource.BinarySI)
	}
	return r
}

// node is what the fleets know of node, and the fleet that heard from it
// since the hub started; of a node none heard from, what the first fleet
// says (lost once the hub has watched long enough, see Fleet.Node), and
// no fleet.
func (r *Reconciler) node(name string) (fleet.NodeStatus, *fleet.Fleet) {
	fleets := r.fleets()
	for _, f := range fleets {
		if s, ok := f.Heard(name); ok {
			return s, f
		}
	}
	if len(fleets) == 0 {
		return fleet.NodeStatus{}, nil
	}
	return fleets[0].Node(name), nil
}

// vmsOn are the VMs on node, those the VM controller admits there
// (virtualmachine.IsOn) in heardBy, the node's fleet; of a node no fleet
// heard from, in any fleet. The index finds every VM whose annotation
// names the node, but a tenant can write that annotation: a VM it refuses
// has nothing on the node, so it is not counted, drained or waited for.
func (r *Reconciler) vmsOn(ctx context.Context, node string, heardBy *fleet.Fleet) ([]v1alpha1.VirtualMachine, error) {
	claim := &v1alpha1.VirtualMachineList{}
	if err := r.kube.List(ctx, claim, client.MatchingFields{index.NodeUsers.Index: node}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, errors.Wrapf(err, "cannot count the VMs on %s", node)
	}
	fleets := r.fleets()
	if heardBy != nil {
		fleets = []*fleet.Fleet{heardBy}
	}
	vms, err := virtualmachine.AdmittedOn(ctx, r.kube, claim.Items, node, fleets)
	return vms, errors.Wrapf(err, "cannot count the VMs on %s", node)
}

// wait is how long until node's status may be written again.
func (r *Reconciler) wait(node string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return MinInterval - r.now().Sub(r.written[node])
}

func (r *Reconciler) wrote(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.written[node] = r.now()
}

func (r *Reconciler) forget(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.written, node)
}
