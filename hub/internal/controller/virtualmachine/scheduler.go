package virtualmachine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// ReasonFailedScheduling is the event of a VM no node can take yet; its
// message says why, node by node.
const ReasonFailedScheduling event.Reason = "FailedScheduling"

// Sizes of the placement loop, for bursts of creates.
const (
	// schedulerBatch is the most VMs placed against one view of the fleet.
	// A burst's VMs arrive in the queue faster than they can be written,
	// so a batch fills up; placing a VM costs orders of magnitude less
	// than the write that records its node, so a batch is as large as the
	// writes that follow can usefully overlap.
	schedulerBatch = 64
	// schedulerWriters is how many of a batch's writes are in flight at
	// once. The control-plane limit the bench measures uses more writers
	// (bench's controlPlaneWriters) with the API server to itself; here
	// the hub's other controllers write at the same time (the status of
	// every VM, every Volume's binding and status), and more writers in
	// flight only queue in the API server and the client's rate limiter.
	schedulerWriters = 16
	// schedulerWorkers batches are placed at once: one batch's writes are
	// in flight while the next one is placed.
	schedulerWorkers = 2
)

// Scheduler is the hub's placement loop, built like kube-scheduler: it takes
// the VMs on no node from a queue in batches, places each batch against one
// view of the fleet (its nodes' heartbeats plus the Placer's reservations of
// placements the heartbeats do not count yet), and records each VM's node
// and the managed finalizer in one write. The VM controller acts only on
// VMs it has bound to a node.
//
// A VM whose namespace/name a guest was orphaned from (see observeRelease)
// is bound to that guest instead, whatever its policies let the hub create:
// the same write records the orphan's node and uid (AnnotationAdopted), and
// the node hands the guest over once the VM's intent claims it. A VM that
// keeps its guest gets FinalizerKeep in that write too. A VM importing a
// guest by external name is never bound here: its node is the user's to
// name.
//
// A VM that no node can take, or that would take its namespace past a
// TenantQuota (the quota package), stays Pending with the reason in its
// Ready condition and a FailedScheduling event, and is placed again as soon
// as the fleet changes: a node joins, comes back or has more room
// (RetryUnplaced from the fleet), a VM is deleted, a TenantQuota changes, or
// one of the Volumes, VirtualNetworks, DiskImages and PlacementGroups it
// may wait for changes. A VM adopting an orphan or bound again to its own
// guest passes no quota check: its guest is counted already.
type Scheduler struct {
	kube     client.Client
	cache    cache.Cache
	configs  *providerconfig.Resolver
	pool     providerconfig.Fleets
	placer   *placement.Placer
	quotas   *quota.Counter
	recorder event.Recorder
	log      logging.Logger
	policies bool

	queue workqueue.TypedRateLimitingInterface[types.NamespacedName]
	// unplaced are the VMs that found no node, placed again by
	// RetryUnplaced, with the uids of the images they wait for a holder
	// of (SourceWaitError.Unheld), placed again by RetryImage too.
	unplaced sync.Map // types.NamespacedName -> []string
}

// Placement failures back off from 50 ms (a lost conflict) to 30 s, the
// safety net for what RetryUnplaced does not hear of (a reservation that
// expires).
const (
	schedulerBaseDelay = 50 * time.Millisecond
	schedulerMaxDelay  = 30 * time.Second
)

// NewScheduler returns the placement loop; add it to mgr with SetupScheduler.
// It admits each VM it places past quotas first.
func NewScheduler(kube client.Client, informers cache.Cache, pool providerconfig.Fleets, placer *placement.Placer, quotas *quota.Counter, recorder event.Recorder, log logging.Logger, policies bool) *Scheduler {
	return (&Scheduler{
		kube:     kube,
		cache:    informers,
		configs:  providerconfig.NewResolver(kube),
		pool:     pool,
		placer:   placer,
		quotas:   quotas,
		recorder: recorder,
		log:      log.WithValues("controller", "virtualmachine-scheduler"),
		policies: policies,
	}).withBackoff(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](schedulerBaseDelay, schedulerMaxDelay))
}

// withBackoff gives s a queue that retries a VM after the delays of rl.
func (s *Scheduler) withBackoff(rl workqueue.TypedRateLimiter[types.NamespacedName]) *Scheduler {
	s.queue = workqueue.NewTypedRateLimitingQueueWithConfig(rl,
		workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "virtualmachine-scheduler"})
	return s
}

// unbound is whether vm is on no node, not being deleted, and names no
// guest by external name: an import names its node (see ImportNodeError),
// the placement loop never chooses one for it.
func unbound(vm *v1alpha1.VirtualMachine) bool {
	return vm.GetAnnotations()[v1alpha1.AnnotationNode] == "" && !meta.WasDeleted(vm) && meta.GetExternalName(vm) == ""
}

// needsPlacement is whether vm waits for the placement loop alone: unbound,
// and its management policies let the hub create it. The placement loop
// also binds an unbound VM that the hub may not create to a guest orphaned
// from its namespace/name, but such a VM is the managed reconciler's too,
// which shows it as not existing until then.
func needsPlacement(vm *v1alpha1.VirtualMachine, policies bool) bool {
	return unbound(vm) && managed.NewManagementPoliciesResolver(policies, vm.GetManagementPolicies()).ShouldCreate()
}

// SetupScheduler adds s to mgr, fed by the informers of VirtualMachines and
// of what a VM waits for.
func SetupScheduler(mgr ctrl.Manager, s *Scheduler) error {
	return errors.Wrap(mgr.Add(s), "cannot add the placement loop")
}

// Start implements manager.Runnable: it feeds the queue from the informers
// of VirtualMachines and of what a VM waits for, and runs the loop until
// ctx is done.
func (s *Scheduler) Start(ctx context.Context) error {
	feeds := []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{
		{&v1alpha1.VirtualMachine{}, s.onVM()},
		{&v1alpha1.Volume{}, s.onDependency()},
		{&v1alpha1.VirtualNetwork{}, s.onDependency()},
		{&v1alpha1.DiskImage{}, s.onDependency()},
		{&v1alpha1.VirtualMachineInstancetype{}, s.onDependency()},
		{&v1alpha1.VirtualMachineClusterInstancetype{}, s.onDependency()},
		{&v1alpha1.VirtualMachinePreference{}, s.onDependency()},
		{&v1alpha1.VirtualMachineClusterPreference{}, s.onDependency()},
		{&v1alpha1.PlacementGroup{}, s.onDependency()},
		{&v1alpha1.HypervisorNode{}, s.onCordon()},
		{&apisv1alpha1.TenantQuota{}, s.onQuota()},
	}
	for _, f := range feeds {
		i, err := s.cache.GetInformer(ctx, f.obj)
		if err != nil {
			return errors.Wrapf(err, "cannot watch %T", f.obj)
		}
		if _, err := i.AddEventHandler(f.h); err != nil {
			return errors.Wrapf(err, "cannot watch %T", f.obj)
		}
	}
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	var wg sync.WaitGroup
	for range schedulerWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s.placeBatch(ctx) { //nolint:revive // the loop is the call
			}
		}()
	}
	wg.Wait()
	return nil
}

// onVM is the VirtualMachine informer's handler.
func (s *Scheduler) onVM() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { s.enqueue(o) },
		UpdateFunc: func(old, o any) {
			if vm, ok := o.(*v1alpha1.VirtualMachine); ok && meta.WasDeleted(vm) {
				if prev, ok := old.(*v1alpha1.VirtualMachine); ok && !meta.WasDeleted(prev) {
					// Its room frees once its node deletes the guest;
					// until then the heartbeat counts it, and the heartbeat
					// that no longer does tells RetryUnplaced.
					s.forget(vm)
				}
				return
			}
			s.enqueue(o)
		},
		DeleteFunc: func(o any) {
			if vm, ok := o.(*v1alpha1.VirtualMachine); ok {
				s.forget(vm)
				// Its namespace holds less now: a VM over its quota
				// may fit.
				s.retryNamespace(vm.Namespace)
			}
		},
	}
}

// onQuota is the TenantQuota informer's handler: a VM over a limit may fit
// one raised or removed.
func (s *Scheduler) onQuota() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(any, any) { s.RetryUnplaced("") },
		DeleteFunc: func(any) { s.RetryUnplaced("") },
	}
}

// onDependency is the handler of the informers of Volumes, VirtualNetworks,
// DiskImages, instance types, preferences and PlacementGroups: a VM
// waiting for one may be placed now, and one a group's required rule kept
// Pending may fit the rule made a preference.
func (s *Scheduler) onDependency() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.RetryUnplaced("") },
		UpdateFunc: func(any, any) { s.RetryUnplaced("") },
	}
}

// onCordon is the HypervisorNode informer's handler: a VM may fit on a
// node uncordoned, or whose HypervisorNode, cordoned, was deleted.
func (s *Scheduler) onCordon() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, o any) {
			before, ok1 := old.(*v1alpha1.HypervisorNode)
			after, ok2 := o.(*v1alpha1.HypervisorNode)
			closed := func(n *v1alpha1.HypervisorNode) bool { return n.Spec.Unschedulable || n.Spec.Drain }
			if ok1 && ok2 && closed(before) && !closed(after) {
				s.RetryUnplaced(after.Name)
			}
		},
		DeleteFunc: func(any) { s.RetryUnplaced("") },
	}
}

func (s *Scheduler) enqueue(o any) {
	vm, ok := o.(*v1alpha1.VirtualMachine)
	if !ok || !unbound(vm) {
		return
	}
	s.queue.Add(client.ObjectKeyFromObject(vm))
}

func (s *Scheduler) forget(vm *v1alpha1.VirtualMachine) {
	s.unplaced.Delete(client.ObjectKeyFromObject(vm))
}

// RetryUnplaced queues every VM that found no node; the fleet calls it when
// a node joins, comes back or has more room (the argument is the node).
func (s *Scheduler) RetryUnplaced(string) {
	s.unplaced.Range(func(k, _ any) bool {
		s.queue.Add(k.(types.NamespacedName)) //nolint:forcetypeassert // only keys are stored
		return true
	})
}

// RetryImage queues every VM that found no node because no node held the
// DiskImage of uid; the fleet calls it when a node's report of the image
// changes. The DiskImage's status may not change when a node reports the
// image Ready again (it lists the nodes that made it), so its informer
// does not wake such a VM.
func (s *Scheduler) RetryImage(uid string) {
	s.unplaced.Range(func(k, v any) bool {
		if unheld, _ := v.([]string); slices.Contains(unheld, uid) {
			s.queue.Add(k.(types.NamespacedName)) //nolint:forcetypeassert // only keys are stored
		}
		return true
	})
}

// retryNamespace queues every VM of namespace that found no node.
func (s *Scheduler) retryNamespace(namespace string) {
	s.unplaced.Range(func(k, _ any) bool {
		if key := k.(types.NamespacedName); key.Namespace == namespace { //nolint:forcetypeassert // only keys are stored
			s.queue.Add(key)
		}
		return true
	})
}

// next takes a batch from the queue, blocking for its first VM; it returns
// nil once the queue shuts down.
func (s *Scheduler) next() []types.NamespacedName {
	first, shutdown := s.queue.Get()
	if shutdown {
		return nil
	}
	batch := []types.NamespacedName{first}
	for len(batch) < schedulerBatch && s.queue.Len() > 0 {
		k, shutdown := s.queue.Get()
		if shutdown {
			break
		}
		batch = append(batch, k)
	}
	return batch
}

// binding is a VM placed in a batch whose node is not recorded yet.
type binding struct {
	vm   *v1alpha1.VirtualMachine
	node string
	// orphan is the uid of the guest on node the VM adopts, if any.
	orphan string
	// fleet seals the binding (Fleet.Bind).
	fleet *fleet.Fleet
	// rebound is set when node already runs the VM's guest (guestNode).
	rebound bool
	// volumes are the VM's Volumes as placement admitted them: those on
	// no node have their sizes recorded before the binding is written
	// (recordAdmittedSizes).
	volumes []v1alpha1.Volume
}

// guestNode is the node of f that reports vm's own guest, for a VM that is
// bound to no node: one whose binding was removed by hand (kubectl
// annotate vm x compute.virtfleet.io/node-). Its guest runs on where it
// ran, so the VM is bound there again rather than placed anew, which would
// start a second guest beside the first. Guests of the VM on several nodes
// (a binding removed during a migration) are an error no placement mends.
func guestNode(f *fleet.Fleet, vm *v1alpha1.VirtualMachine) (string, bool, error) {
	var nodes []string
	for _, r := range f.Guests.All(string(vm.UID)) {
		if r.Report.Orphan == nil {
			nodes = append(nodes, r.Node)
		}
	}
	switch len(nodes) {
	case 0:
		return "", false, nil
	case 1:
		return nodes[0], true, nil
	default:
		return "", false, errors.Errorf("guests of the VM run on nodes %s, and its binding was removed: delete the VM, or bind it to one of them by hand as an administrator", strings.Join(nodes, ", "))
	}
}

// placeBatch places one batch and records it; false once the queue shut
// down.
func (s *Scheduler) placeBatch(ctx context.Context) bool {
	batch := s.next()
	if batch == nil {
		return false
	}
	defer func() {
		for _, k := range batch {
			s.queue.Done(k)
		}
	}()
	// One view of each fleet for the whole batch; the Placer adds the
	// reservations of the batch's own placements as it goes.
	b := &batchView{configs: map[configKey]providerconfig.Config{}, nodes: map[*fleet.Fleet][]placement.Node{}}
	var bound []binding
	for _, key := range batch {
		vm := &v1alpha1.VirtualMachine{}
		if err := s.cache.Get(ctx, key, vm); err != nil || !unbound(vm) {
			s.queue.Forget(key)
			s.unplaced.Delete(key)
			continue
		}
		bd, err := s.place(ctx, vm, b)
		switch {
		case errors.Is(err, errNothingToPlace):
			s.queue.Forget(key)
			s.unplaced.Delete(key)
		case errors.Is(err, fleet.ErrReportsNotSynced):
			// Whether an orphan waits for the VM is not known yet: no
			// status write. RetryUnplaced runs once the fleet has read
			// the reports (Fleet.SubscribeSynced), however long its
			// backoff has grown.
			s.unplaced.Store(key, []string(nil))
			s.queue.AddRateLimited(key)
		case err != nil:
			s.unplaceable(ctx, vm, err)
		default:
			bound = append(bound, bd)
		}
	}
	s.record(ctx, bound)
	return true
}

// batchView is what a batch reads once: each ProviderConfig (reading one
// reads its credentials' Secret from the API server, which the cache does
// not hold) and each fleet's nodes.
type batchView struct {
	configs map[configKey]providerconfig.Config
	nodes   map[*fleet.Fleet][]placement.Node
}

type configKey struct{ kind, namespace, name string }

// errNothingToPlace is place's answer for a VM the hub may not create and
// with no orphan to adopt: the managed reconciler shows it as not existing.
var errNothingToPlace = errors.New("the VM may not be created and adopts no orphan")

// place binds vm to the guest orphaned from its namespace/name, if there is
// one: same node, and the orphan recorded so the node hands it over; else
// it chooses vm's node against the batch's view of its fleet.
func (s *Scheduler) place(ctx context.Context, vm *v1alpha1.VirtualMachine, b *batchView) (binding, error) {
	ref := vm.GetProviderConfigReference()
	if ref == nil {
		return binding{}, errors.New("the VM names no ProviderConfig")
	}
	ck := configKey{kind: ref.Kind, name: ref.Name}
	if ref.Kind != apisv1alpha1.ClusterProviderConfigKind {
		ck.namespace = vm.Namespace
	}
	pc, ok := b.configs[ck]
	if !ok {
		var err error
		if pc, err = s.configs.Resolve(ctx, vm); err != nil {
			return binding{}, err
		}
		b.configs[ck] = pc
	}
	f, err := s.pool.Get(ctx, pc.Target)
	if err != nil {
		return binding{}, err
	}
	if node, found, err := guestNode(f, vm); err != nil || found {
		return binding{vm: vm, node: node, fleet: f, rebound: true}, err
	}
	o, found, err := f.Orphan(vm.Namespace, vm.Name)
	switch {
	case err != nil:
		return binding{}, err
	case found:
		return binding{vm: vm, node: o.Node, orphan: o.UID, fleet: f}, nil
	case !managed.NewManagementPoliciesResolver(s.policies, vm.GetManagementPolicies()).ShouldCreate():
		return binding{}, errNothingToPlace
	}
	if err := s.recordShape(ctx, vm); err != nil {
		return binding{}, err
	}
	d, err := resolve(ctx, s.cache, vm, heldIn(f.Images))
	if err != nil {
		return binding{}, err
	}
	g, err := providerconfig.GrantOf(ctx, s.cache, vm.Namespace)
	if err != nil {
		return binding{}, err
	}
	if err := d.admit(g, f.Sealed); err != nil {
		return binding{}, err
	}
	req, err := request(vm, d, pc.NodeSelector)
	if err != nil {
		return binding{}, err
	}
	if req.Group, err = GroupOf(ctx, s.cache, vm, f); err != nil {
		return binding{}, err
	}
	if err := s.quotas.Admit(ctx, vm, quota.Placement{Volumes: d.volumes, Addresses: addressesOf(vm, d)}); err != nil {
		return binding{}, err
	}
	nodes, ok := b.nodes[f]
	if !ok {
		nodes = MarkCordoned(ctx, s.cache, f.Nodes())
		b.nodes[f] = nodes
	}
	node, err := s.placer.Place(nodes, req)
	if err != nil {
		s.quotas.Forget(vm.UID)
		return binding{}, errors.Wrap(err, "cannot place the VM")
	}
	return binding{vm: vm, node: node, fleet: f, volumes: d.volumes}, nil
}

// addressesOf is how many addresses the hub is to give vm: one on each of
// its networks whose addresses are the hub's, none for a guest imported by
// its external name, which keeps its own.
func addressesOf(vm *v1alpha1.VirtualMachine, d dependencies) int64 {
	if meta.GetExternalName(vm) != "" {
		return 0
	}
	var n int64
	for i := range d.networks {
		if ipam.Addressed(&d.networks[i]) {
			n++
		}
	}
	return n
}

// recordShape records vm's shape from its instance type and preference
// (instancetype.go) before it is placed, so its node is chosen for the
// shape it will run with. The status write leaves vm with the new
// resourceVersion, so the batch's write of its node follows from it.
func (s *Scheduler) recordShape(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	changed, err := recordShape(ctx, s.cache, vm)
	if err != nil || !changed {
		return err
	}
	return errors.Wrap(s.kube.Status().Update(ctx, vm), "cannot record the VM's shape")
}

// MarkCordoned marks the nodes whose HypervisorNode is unschedulable or
// being drained. A node whose HypervisorNode cannot be read stays
// schedulable. The nodes are read in one uncopied list, not one Get (a deep
// copy) each: every batch the scheduler places asks about every node.
func MarkCordoned(ctx context.Context, cache client.Reader, nodes []placement.Node) []placement.Node {
	l := &v1alpha1.HypervisorNodeList{}
	if err := cache.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
		return nodes
	}
	cordoned := map[string]bool{}
	for i := range l.Items {
		if n := &l.Items[i]; n.Spec.Unschedulable || n.Spec.Drain {
			cordoned[n.Name] = true
		}
	}
	for i := range nodes {
		if cordoned[nodes[i].Name] {
			nodes[i].Unschedulable = true
		}
	}
	return nodes
}

// record writes the node, the orphan adopted and the finalizers of each
// binding, after the sizes of the Volumes it makes, up to
// schedulerWriters at once.
func (s *Scheduler) record(ctx context.Context, bound []binding) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, schedulerWriters)
	for _, b := range bound {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.bind(ctx, b)
		}()
	}
	wg.Wait()
}

func (s *Scheduler) bind(ctx context.Context, b binding) {
	vm, key, uid := b.vm, client.ObjectKeyFromObject(b.vm), string(b.vm.UID)
	if err := recordAdmittedSizes(ctx, b.fleet, b.volumes); err != nil {
		s.placer.Release(uid)
		s.quotas.Forget(b.vm.UID)
		s.log.Info("Cannot record the sizes of the Volumes admitted", "namespace", key.Namespace, "name", key.Name, "error", err)
		s.queue.AddRateLimited(key)
		return
	}
	a := vm.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	b.fleet.Bind(vm, a, b.node, b.orphan)
	vm.SetAnnotations(a)
	meta.AddFinalizer(vm, managed.FinalizerName)
	if keepsGuest(vm, s.policies) {
		// Held until its node released the guest (see reconciler.release).
		meta.AddFinalizer(vm, FinalizerKeep)
	}
	if err := s.kube.Update(ctx, vm); err != nil {
		// A conflict means the batch read an old VM, maybe from before an
		// earlier batch recorded this very node: keep the reservation,
		// which expires unless the node confirms it, so the retry finds
		// the same node.
		if !kerrors.IsConflict(err) {
			s.placer.Release(uid)
			s.quotas.Forget(b.vm.UID)
			s.log.Info("Cannot record the chosen node", "namespace", key.Namespace, "name", key.Name, "node", b.node, "error", err)
		}
		s.queue.AddRateLimited(key)
		return
	}
	s.queue.Forget(key)
	s.unplaced.Delete(key)
	if b.orphan != "" {
		s.log.Debug("Adopting", "namespace", key.Namespace, "name", key.Name, "node", b.node, "orphan", b.orphan)
		s.recorder.Event(vm, event.Normal(ReasonAdopted, fmt.Sprintf("Adopting the guest orphaned from %s/%s on node %s", vm.Namespace, vm.Name, b.node)))
		return
	}
	if b.rebound {
		s.log.Info("Bound again to the node its guest runs on: its binding was removed by hand", "namespace", key.Namespace, "name", key.Name, "node", b.node)
		s.recorder.Event(vm, event.Warning(ReasonRebound, errors.Errorf("Bound again to node %s, where its guest runs: the VM's binding was removed by hand", b.node)))
		return
	}
	metrics.PlacementDuration.WithLabelValues().Observe(time.Since(vm.CreationTimestamp.Time).Seconds())
	s.log.Debug("Placed", "namespace", key.Namespace, "name", key.Name, "node", b.node)
	s.recorder.Event(vm, event.Normal(ReasonScheduled, fmt.Sprintf("Placed on node %s", b.node)))
}

// unplaceable shows why vm is on no node, in its status and an event when
// that changed, and in the log at debug level every time; and keeps it for
// RetryUnplaced, with a backoff as the safety net.
func (s *Scheduler) unplaceable(ctx context.Context, vm *v1alpha1.VirtualMachine, cause error) {
	key := client.ObjectKeyFromObject(vm)
	var wait *SourceWaitError
	var unheld []string
	if errors.As(cause, &wait) {
		unheld = wait.Unheld
	}
	s.unplaced.Store(key, unheld)
	s.queue.AddRateLimited(key)
	s.log.Debug("Cannot place", "namespace", key.Namespace, "name", key.Name, "reason", cause.Error())
	for _, r := range refusalReasons(cause) {
		metrics.PlacementRefusals.WithLabelValues(r).Inc()
	}
	before := vm.DeepCopy()
	vm.Status.AtProvider.Phase = v1alpha1.PhasePending
	// Ready says why the VM is not running, and Synced, as for any
	// reconcile that failed, what stopped the hub.
	vm.SetConditions(notReady(v1alpha1.PhasePending, cause.Error()), xpv2.ReconcileError(cause))
	if before.Status.AtProvider.Phase == vm.Status.AtProvider.Phase && before.Status.Equal(&vm.Status.ConditionedStatus) {
		return
	}
	s.log.Info("Cannot place the VM", "namespace", key.Namespace, "name", key.Name, "reason", cause.Error())
	s.recorder.Event(vm, event.Warning(ReasonFailedScheduling, cause))
	if err := s.kube.Status().Update(ctx, vm); err != nil && !kerrors.IsConflict(err) {
		s.log.Info("Cannot show why the VM is on no node", "namespace", key.Namespace, "name", key.Name, "error", err)
	}
}

// Reasons of the placement-refusals metric beside placement's causes.
const (
	refusalForbidden = "forbidden"
	refusalQuota     = "quota"
	refusalWaiting   = "waiting"
	refusalOther     = "other"
)

// RefusalReasons are every reason the placement-refusals metric counts, for
// its series to start at zero.
func RefusalReasons() []string {
	out := []string{refusalForbidden, refusalQuota, refusalWaiting, refusalOther}
	for _, c := range placement.Causes {
		out = append(out, string(c))
	}
	return out
}

// refusalReasons are the placement-refusals metric's reasons for cause: the
// distinct causes of a NoFitError, forbidden for what the namespace was not
// granted, quota for a limit of its TenantQuotas, waiting for what does not
// exist yet (or a cloned image's source, or a node holding the image), other
// for the rest.
func refusalReasons(cause error) []string {
	var (
		noFit    *placement.NoFitError
		refused  *tenancy.RefusedError
		exceeded *quota.ExceededError
		missing  *MissingError
		template *MissingTemplateError
		group    *MissingGroupError
		source   *SourceWaitError
	)
	switch {
	case errors.As(cause, &noFit):
		causes := noFit.DistinctCauses()
		out := make([]string, len(causes))
		for i, c := range causes {
			out[i] = string(c)
		}
		return out
	case errors.As(cause, &refused):
		return []string{refusalForbidden}
	case errors.As(cause, &exceeded):
		return []string{refusalQuota}
	case errors.As(cause, &missing), errors.As(cause, &template), errors.As(cause, &group), errors.As(cause, &source):
		return []string{refusalWaiting}
	default:
		return []string{refusalOther}
	}
}
