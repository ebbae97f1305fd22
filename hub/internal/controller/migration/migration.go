// Package migration reconciles VirtualMachineMigrations: it chooses the
// target node (placement's rules and the migration limits apply), records
// the migration on the VM, follows the source node's progress, and once
// the guest runs on the target moves the VM and its Volumes there.
//
// The VM controller does the publishing (see virtualmachine.MigrationOf):
// while the VM carries a sealed AnnotationMigration it tells the target to
// get ready (wire.Incoming) and then the source to migrate
// (wire.Migration). This controller only writes the Kubernetes side, in an
// order a restarted hub can pick up anywhere:
//
//  1. status Scheduled with the target, then the VM's AnnotationMigration;
//  2. status Running with the source's figures while it copies;
//  3. on success (the target reports the guest Running for this
//     migration): status Succeeded, the VM's Volumes bound to the target,
//     then the VM's node moved to the target with the source among its
//     AnnotationLeftovers, whose intent the VM controller then deletes;
//  4. on failure (the source reports it, and the target has no guest):
//     status Failed, then the VM's AnnotationMigration dropped with the
//     target among its leftovers. The guest runs on where it was.
package migration

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Finalizer keeps a VirtualMachineMigration that marked its VM until the
// move is over: deleting it cancels the move, and the hub follows it to
// its end either way.
const Finalizer = v1alpha1.Group + "/migration"

// Defaults of the migration limits, KubeVirt's.
const (
	DefaultPerFleet = 5
	DefaultPerNode  = 2
	// DefaultPerNamespace is virtfleet's own: fewer than the fleet's, so
	// that no one tenant takes every slot.
	DefaultPerNamespace = 2
)

// Event reasons, on the migration and on its VM.
const (
	ReasonScheduled event.Reason = "MigrationScheduled"
	ReasonSucceeded event.Reason = "Migrated"
	ReasonFailed    event.Reason = "MigrationFailed"
)

// waitRetry is how soon a migration that waits (for a slot, a target, the
// VM) is looked at again when nothing else wakes it.
const waitRetry = 5 * time.Second

// Options of the migration controller.
type Options struct {
	Pool   providerconfig.Fleets
	Placer *placement.Placer
	// Notifier wakes a migration when its VM's reports change; it must be
	// subscribed to every fleet (Fleet.Guests.Subscribe).
	Notifier *wake.Notifier
	// PerFleet, PerNode and PerNamespace bound the migrations under way at
	// once in a fleet, per node (as source or target) and per namespace;
	// zero takes the defaults.
	PerFleet, PerNode, PerNamespace int
}

// Reconciler reconciles VirtualMachineMigrations.
type Reconciler struct {
	kube client.Client
	// api reads from the API server itself, past the cache.
	api      client.Reader
	configs  *providerconfig.Resolver
	opts     Options
	recorder event.Recorder
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, mo Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, mo); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachineMigration controller"))
		}
	}, v1alpha1.VirtualMachineMigrationGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, mo Options) error {
	if mo.PerFleet <= 0 {
		mo.PerFleet = DefaultPerFleet
	}
	if mo.PerNode <= 0 {
		mo.PerNode = DefaultPerNode
	}
	if mo.PerNamespace <= 0 {
		mo.PerNamespace = DefaultPerNamespace
	}
	name := "virtualmachinemigration"
	r := &Reconciler{
		kube:     mgr.GetClient(),
		api:      mgr.GetAPIReader(),
		configs:  providerconfig.NewResolver(mgr.GetClient()),
		opts:     mo,
		recorder: event.NewAPIRecorder(mgr.GetEventRecorderFor(name)), //nolint:staticcheck // as the other controllers
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.VirtualMachineMigration{}).
		// A VM that changes phase (starts running), node or migration wakes
		// the migrations naming it; its other writes, a burst's status
		// writes above all, do not.
		Watches(&v1alpha1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, vm client.Object) []reconcile.Request {
			return r.migrationsOf(ctx, vm.GetNamespace(), vm.GetName())
		}), builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e ctrlevent.UpdateEvent) bool { return movesOrRuns(e.ObjectOld, e.ObjectNew) }})).
		WatchesRawSource(mo.Notifier.Source()).
		Complete(r)
}

// movesOrRuns says whether a VM's update concerns its migrations: its
// phase, node, migration or leftovers changed.
func movesOrRuns(before, after client.Object) bool {
	b, ok1 := before.(*v1alpha1.VirtualMachine)
	a, ok2 := after.(*v1alpha1.VirtualMachine)
	if !ok1 || !ok2 {
		return true
	}
	for _, k := range []string{v1alpha1.AnnotationNode, v1alpha1.AnnotationMigration, v1alpha1.AnnotationLeftovers} {
		if b.GetAnnotations()[k] != a.GetAnnotations()[k] {
			return true
		}
	}
	return b.Status.AtProvider.Phase != a.Status.AtProvider.Phase
}

// migrationsOf are the migrations of the VM namespace/name not yet over.
func (r *Reconciler) migrationsOf(ctx context.Context, namespace, name string) []reconcile.Request {
	l := &v1alpha1.VirtualMachineMigrationList{}
	if err := r.kube.List(ctx, l, client.InNamespace(namespace), client.MatchingFields{index.MigrationsOfVM.Index: name}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range l.Items {
		if !l.Items[i].Done() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	mig := &v1alpha1.VirtualMachineMigration{}
	if err := r.kube.Get(ctx, req.NamespacedName, mig); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	vm := &v1alpha1.VirtualMachine{}
	err := r.kube.Get(ctx, types.NamespacedName{Namespace: mig.Namespace, Name: string(mig.Spec.VMName)}, vm)
	switch {
	case kerrors.IsNotFound(err):
		if mig.Done() || meta.WasDeleted(mig) {
			return reconcile.Result{}, r.release(ctx, mig)
		}
		return reconcile.Result{}, r.fail(ctx, mig, nil, nil, fmt.Sprintf("VirtualMachine %s does not exist", mig.Spec.VMName))
	case err != nil:
		return reconcile.Result{}, errors.Wrap(err, "cannot get the VM")
	}
	pc, err := r.configs.Resolve(ctx, vm)
	if err != nil {
		return reconcile.Result{}, err
	}
	f, err := r.opts.Pool.Get(ctx, pc.Target)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !mig.Done() {
		r.opts.Notifier.RememberAs(string(vm.UID), mig)
	}
	m, migrating := virtualmachine.MigrationOf(vm, f)
	mine := migrating && m.ID == string(mig.UID)
	if meta.WasDeleted(mig) {
		return r.deleted(ctx, mig, vm, f, m, mine)
	}
	switch {
	case mig.Done() && mine:
		// The hub stopped between the status and the VM's write.
		return reconcile.Result{}, r.finish(ctx, mig, vm, f, m)
	case mig.Done():
		// Over, and the VM no longer names it: nothing more to hold it for.
		return reconcile.Result{}, r.release(ctx, mig)
	case mine:
		return r.follow(ctx, mig, vm, f, m)
	case migrating:
		return r.wait(ctx, mig, fmt.Sprintf("VM %s is being moved by another migration", vm.Name))
	}
	return r.schedule(ctx, mig, vm, f, pc.NodeSelector)
}

// schedule checks that the VM can move, waits for a slot under the limits,
// chooses the target and records it: in the status, then on the VM.
func (r *Reconciler) schedule(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, selector map[string]string) (reconcile.Result, error) {
	source := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	switch {
	case meta.WasDeleted(vm):
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("VirtualMachine %s is being deleted", vm.Name))
	case source == "":
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("VirtualMachine %s is on no node yet", vm.Name))
	case vm.Status.AtProvider.Phase != v1alpha1.PhaseRunning:
		// Running also says the VM was admitted to its node: the hub
		// publishes nothing to a node a VM may not be on.
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("VirtualMachine %s is %s; only a Running VM migrates live", vm.Name, vm.Status.AtProvider.Phase))
	case meta.GetExternalName(vm) != "":
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("VirtualMachine %s imports a guest virtfleet did not make; it does not migrate", vm.Name))
	}
	// A node of many hosts (a Nova cloud, a KubeVirt cluster) moves the VM
	// between its own hosts: the node stays, and its backend chooses the
	// host.
	within := f.Node(source).Heartbeat.HostMigration
	switch t := mig.Spec.TargetNode; {
	case within && t != "" && t != source:
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("node %s moves its VMs between its own hosts only; targetNode must be empty or %s", source, source))
	case !within && f.Node(source).Heartbeat.MigrationURI == "":
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("node %s takes no part in live migration: its agent announces no migration URI (--migration-uri), or its backend cannot migrate", source))
	}
	if !within {
		if refused, err := r.refuseSnapshots(ctx, mig, vm, f, source); err != nil || refused {
			return reconcile.Result{}, err
		}
	}
	busy, err := r.running(ctx, f)
	if err != nil {
		return reconcile.Result{}, err
	}
	if why := busy.full(r.opts, mig.Namespace, source); why != "" {
		return r.wait(ctx, mig, why)
	}
	if within {
		return r.record(ctx, mig, vm, f, source, source, fmt.Sprintf("node %s moves the VM to another of its hosts", source))
	}
	target, err := r.target(ctx, mig, vm, f, source, selector, busy)
	if err != nil {
		var noFit *placement.NoFitError
		if errors.As(err, &noFit) {
			return r.wait(ctx, mig, v1alpha1.MigrationNoTarget+": "+noFit.Error())
		}
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, err.Error())
	}
	return r.record(ctx, mig, vm, f, source, target, fmt.Sprintf("node %s gets ready to receive the VM", target))
}

// refuseSnapshots fails the migration of a VM with snapshots on source,
// which would not follow it to another node, and says so on the VM too:
// its owner deletes the snapshots, or keeps the VM where it is.
func (r *Reconciler) refuseSnapshots(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, source string) (bool, error) {
	snapshots, err := virtualmachine.SnapshotsOn(ctx, r.kube, vm, source)
	if err != nil || len(snapshots) == 0 {
		return false, err
	}
	why := virtualmachine.SnapshotsHold(snapshots, source)
	if err := r.fail(ctx, mig, vm, f, why); err != nil {
		return true, err
	}
	r.recorder.Event(vm, event.Warning(ReasonFailed, errors.New(why)))
	return true, nil
}

// deleted cancels the migration being deleted if it still runs, and lets
// it go once it is over: a migration under way is never forgotten, or the
// VM could be left half moved.
func (r *Reconciler) deleted(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, m virtualmachine.Migration, mine bool) (reconcile.Result, error) {
	switch {
	case mine && mig.Done():
		if err := r.finish(ctx, mig, vm, f, m); err != nil {
			return reconcile.Result{}, err
		}
	case mine:
		if vm.GetAnnotations()[v1alpha1.AnnotationMigrationCancel] != m.ID {
			if err := r.patchVM(ctx, vm, func(a map[string]string) {
				a[v1alpha1.AnnotationMigrationCancel] = m.ID
			}); err != nil {
				return reconcile.Result{}, err
			}
		}
		return r.follow(ctx, mig, vm, f, m)
	}
	return reconcile.Result{}, r.release(ctx, mig)
}

// release removes the migration's finalizer.
func (r *Reconciler) release(ctx context.Context, mig *v1alpha1.VirtualMachineMigration) error {
	if !meta.FinalizerExists(mig, Finalizer) {
		return nil
	}
	meta.RemoveFinalizer(mig, Finalizer)
	return errors.Wrap(client.IgnoreNotFound(r.kube.Update(ctx, mig)), "cannot remove the migration's finalizer")
}

// record writes the chosen target in the migration's status, then, sealed,
// on the VM, which has the VM controller tell the nodes. The migration
// gets its finalizer first: once the VM is marked, the migration must
// stay until the move is over.
func (r *Reconciler) record(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, source, target, msg string) (reconcile.Result, error) {
	if !meta.FinalizerExists(mig, Finalizer) {
		meta.AddFinalizer(mig, Finalizer)
		if err := r.kube.Update(ctx, mig); err != nil {
			return reconcile.Result{}, errors.Wrap(err, "cannot add the migration's finalizer")
		}
	}
	now := metav1.Now()
	st := v1alpha1.VirtualMachineMigrationStatus{Phase: v1alpha1.MigrationScheduled, SourceNode: source, TargetNode: target, StartTime: &now, Message: msg}
	if err := r.setStatus(ctx, mig, st); err != nil {
		return reconcile.Result{}, err
	}
	m := virtualmachine.Migration{ID: string(mig.UID), Target: target}
	err := r.patchVM(ctx, vm, func(a map[string]string) {
		a[v1alpha1.AnnotationMigration] = m.String()
		a[v1alpha1.AnnotationMigrationSeal] = virtualmachine.MigrationSeal(f, string(vm.UID), m)
	})
	if err != nil {
		return reconcile.Result{}, err
	}
	r.recorder.Event(mig, event.Normal(ReasonScheduled, fmt.Sprintf("Moving VM %s from node %s to node %s", vm.Name, source, target)))
	return reconcile.Result{RequeueAfter: waitRetry}, nil
}

// target chooses where the VM goes: the node the spec names, if the
// namespace may choose nodes, else the least allocated that fits, among the
// nodes that receive live migrations and join the same overlay as the source
// (the VM keeps its addresses only on a network that spans both).
func (r *Reconciler) target(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, source string, selector map[string]string, busy load) (string, error) {
	if t := mig.Spec.TargetNode; t != "" {
		g, err := providerconfig.GrantOf(ctx, r.kube, mig.Namespace)
		if err != nil {
			return "", err
		}
		if err := g.CheckTargetNode(t); err != nil {
			return "", err
		}
		if t == source {
			return "", errors.Errorf("the VM runs on node %s already", t)
		}
	}
	overlay := f.Node(source).Heartbeat.TunnelAddress != ""
	var nodes []placement.Node
	for _, n := range virtualmachine.MarkCordoned(ctx, r.kube, f.Nodes()) {
		hb := f.Node(n.Name).Heartbeat
		if n.Name == source || hb.MigrationURI == "" || (hb.TunnelAddress != "") != overlay || busy.nodes[n.Name] >= r.opts.PerNode {
			continue
		}
		nodes = append(nodes, n)
	}
	pools, err := r.pools(ctx, vm)
	if err != nil {
		return "", err
	}
	fp := vm.Spec.ForProvider
	req := placement.Request{
		UID:          reservation(string(mig.UID)),
		Resources:    virtualmachine.Resources(vm),
		NodeSelector: virtualmachine.NodeSelector(selector, fp.NodeSelector),
		RequiredNode: mig.Spec.TargetNode,
		Pools:        pools,
	}
	if fp.Backend != nil {
		req.Backend = string(*fp.Backend)
	}
	if req.Group, err = virtualmachine.MovedGroupOf(ctx, r.kube, vm, f); err != nil {
		return "", err
	}
	return r.opts.Placer.Place(nodes, req)
}

// pools are the shared storage pools of the VM's Volumes: the target must
// reach every one, or the guest finds no disk there.
func (r *Reconciler) pools(ctx context.Context, vm *v1alpha1.VirtualMachine) ([]string, error) {
	var out []string
	for _, a := range vm.Spec.ForProvider.DiskAttachments {
		v := &v1alpha1.Volume{}
		if err := r.kube.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: string(a.Name)}, v); err != nil {
			return nil, errors.Wrapf(err, "cannot get Volume %s", a.Name)
		}
		if p := v.Spec.ForProvider.StoragePool; p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// reservation is the placer's key of the room migration id holds on its
// target.
func reservation(id string) string { return "migration/" + id }

// load is what migrations run in a fleet: how many, and how many from or
// to each node and in each namespace.
type load struct {
	fleet      int
	nodes      map[string]int
	namespaces map[string]int
}

// running counts the migrations under way in f.
func (r *Reconciler) running(ctx context.Context, f *fleet.Fleet) (load, error) {
	l := &v1alpha1.VirtualMachineMigrationList{}
	if err := r.kube.List(ctx, l); err != nil {
		return load{}, errors.Wrap(err, "cannot list migrations")
	}
	out := load{nodes: map[string]int{}, namespaces: map[string]int{}}
	for i := range l.Items {
		st := l.Items[i].Status
		if st.Phase != v1alpha1.MigrationScheduled && st.Phase != v1alpha1.MigrationRunning {
			continue
		}
		if _, known := f.Heard(st.SourceNode); !known {
			continue // another fleet's
		}
		out.fleet++
		out.nodes[st.SourceNode]++
		if st.TargetNode != st.SourceNode {
			out.nodes[st.TargetNode]++
		}
		out.namespaces[l.Items[i].Namespace]++
	}
	return out, nil
}

// full says why no migration of namespace may start now from source: the
// fleet, the node or the namespace runs as many as the limits allow. The
// namespace's limit keeps one tenant's migrations from taking every slot
// of the fleet, and with them its administrator's drains.
func (l load) full(o Options, namespace, source string) string {
	switch {
	case l.fleet >= o.PerFleet:
		return fmt.Sprintf("waiting for a free slot: %d migrations run in the fleet (at most %d at once)", l.fleet, o.PerFleet)
	case l.nodes[source] >= o.PerNode:
		return fmt.Sprintf("waiting for a free slot: %d migrations run from or to node %s (at most %d at once)", l.nodes[source], source, o.PerNode)
	case l.namespaces[namespace] >= o.PerNamespace:
		return fmt.Sprintf("waiting for a free slot: %d migrations run in namespace %s (at most %d at once)", l.namespaces[namespace], namespace, o.PerNamespace)
	}
	return ""
}

// follow mirrors the source's progress and ends the migration when the
// guest runs on the target, or when the source says it failed.
func (r *Reconciler) follow(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, m virtualmachine.Migration) (reconcile.Result, error) {
	uid, source := string(vm.UID), vm.GetAnnotations()[v1alpha1.AnnotationNode]
	var progress *wire.MigrationReport
	if rep, ok := f.Guests.Report(source, uid); ok && rep.Report.Migration != nil && rep.Report.Migration.ID == m.ID {
		progress = rep.Report.Migration
	}
	st := mig.Status
	st.SourceNode, st.TargetNode = source, m.Target
	withProgress(&st, progress)
	arrived := false
	if rep, ok := f.Guests.Report(m.Target, uid); ok && rep.Report.Incoming == m.ID && rep.Report.Phase == wire.PhaseRunning {
		arrived = true
	}
	switch {
	case m.Target == source:
		// Within the node, the node's word is all there is.
		arrived = progress != nil && progress.Phase == wire.MigrationSucceeded
	case arrived && progress != nil && progress.Phase == wire.MigrationRunning:
		// The guest runs on the target; the source reads libvirt's final
		// figures (the downtime) and clears what it left, and says so.
		st.Message = fmt.Sprintf("the VM runs on node %s; node %s finishes the migration", m.Target, source)
		arrived = false
	}
	switch {
	case arrived:
		st.Phase, st.Message = v1alpha1.MigrationSucceeded, fmt.Sprintf("the VM runs on node %s", m.Target)
		if m.Target == source && progress.Message != "" {
			// Which of its hosts the backend moved the guest to.
			st.Message += ": " + progress.Message
		}
		if st.EndTime == nil {
			now := metav1.Now()
			st.EndTime = &now
		}
		if err := r.setStatus(ctx, mig, st); err != nil {
			return reconcile.Result{}, err
		}
		observeSucceeded(st)
		return reconcile.Result{}, r.finish(ctx, mig, vm, f, m)
	case progress != nil && progress.Phase == wire.MigrationFailed:
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("node %s could not move the VM: %s", source, progress.Message))
	case f.Node(m.Target).Lost:
		return reconcile.Result{}, r.fail(ctx, mig, vm, f, fmt.Sprintf("node %s, the target, was lost", m.Target))
	case progress != nil:
		st.Phase = v1alpha1.MigrationRunning
		if progress.Message != "" {
			st.Message = progress.Message
		}
	}
	return reconcile.Result{RequeueAfter: waitRetry}, r.setStatus(ctx, mig, st)
}

// observeSucceeded counts a migration that just succeeded, with its
// figures.
func observeSucceeded(st v1alpha1.VirtualMachineMigrationStatus) {
	metrics.Migrations.WithLabelValues(metrics.ResultSucceeded).Inc()
	if st.StartTime != nil && st.EndTime != nil {
		metrics.MigrationDuration.WithLabelValues().Observe(st.EndTime.Sub(st.StartTime.Time).Seconds())
	}
	if st.DowntimeMilliseconds > 0 {
		metrics.MigrationDowntime.WithLabelValues().Observe(float64(st.DowntimeMilliseconds) / 1000)
	}
}

// withProgress copies the source's figures into st.
func withProgress(st *v1alpha1.VirtualMachineMigrationStatus, p *wire.MigrationReport) {
	if p == nil {
		return
	}
	st.TotalBytes, st.TransferredBytes, st.DowntimeMilliseconds = p.TotalBytes, p.ProcessedBytes, p.DowntimeMilliseconds
	if p.StartedAt != nil {
		t := metav1.NewTime(*p.StartedAt)
		st.StartTime = &t
	}
	if p.FinishedAt != nil {
		t := metav1.NewTime(*p.FinishedAt)
		st.EndTime = &t
	}
}

// finish moves the VM to the target of the migration that succeeded: its
// Volumes first, then the VM itself, with the source among its leftovers.
func (r *Reconciler) finish(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, m virtualmachine.Migration) error {
	if mig.Status.Phase == v1alpha1.MigrationFailed {
		return r.abandon(ctx, vm, f, m)
	}
	source := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if m.Target == source {
		r.recorder.Event(mig, event.Normal(ReasonSucceeded, fmt.Sprintf("Moved live between the hosts of node %s", source)))
		r.opts.Placer.Release(reservation(m.ID))
		return r.patchVM(ctx, vm, dropMigration)
	}
	if err := r.rebindAll(ctx, vm, source, m.Target, f); err != nil {
		return err
	}
	err := r.patchVM(ctx, vm, func(a map[string]string) {
		f.Bind(vm, a, m.Target, a[v1alpha1.AnnotationAdopted])
		dropMigration(a)
		virtualmachine.WithLeftover(f, string(vm.UID), a, source)
	})
	if err != nil {
		return err
	}
	// A Volume given to the VM meanwhile may have been bound to the source
	// by a VM reconcile that read the VM before this moved it. The VM
	// controller reads the VM again after such a binding and moves what
	// it bound after this; what it bound before, this moves now.
	if err := r.rebindAll(ctx, vm, source, m.Target, f); err != nil {
		return err
	}
	msg := fmt.Sprintf("Moved live from node %s to node %s", source, m.Target)
	if d := mig.Status.DowntimeMilliseconds; d > 0 {
		msg += fmt.Sprintf(" (downtime %d ms)", d)
	}
	r.recorder.Event(mig, event.Normal(ReasonSucceeded, msg))
	r.recorder.Event(vm, event.Normal(ReasonSucceeded, msg))
	r.opts.Placer.Release(reservation(m.ID))
	return nil
}

// rebindAll binds the Volumes vm attaches that are bound to from to node
// to.
func (r *Reconciler) rebindAll(ctx context.Context, vm *v1alpha1.VirtualMachine, from, to string, f *fleet.Fleet) error {
	for _, a := range vm.Spec.ForProvider.DiskAttachments {
		if err := r.rebind(ctx, vm.Namespace, string(a.Name), from, to, f); err != nil {
			return err
		}
	}
	return nil
}

// rebind binds the Volume namespace/name, bound to from, to node to. It
// reads the Volume from the API server: a binding the cache has not shown
// yet must not be missed.
func (r *Reconciler) rebind(ctx context.Context, namespace, name, from, to string, f *fleet.Fleet) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v := &v1alpha1.Volume{}
		if err := r.api.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, v); err != nil {
			return err
		}
		if v.GetAnnotations()[v1alpha1.AnnotationNode] != from {
			return nil // bound already, or not this VM's node's
		}
		patch := client.MergeFromWithOptions(v.DeepCopy(), client.MergeFromWithOptimisticLock{})
		meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: to, v1alpha1.AnnotationSeal: f.Seal(string(v.UID), to, "")})
		return r.kube.Patch(ctx, v, patch)
	})
	return errors.Wrapf(client.IgnoreNotFound(err), "cannot bind Volume %s to node %s", name, to)
}

// fail ends the migration as Failed with why, and lets the VM go on where
// it runs.
func (r *Reconciler) fail(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, why string) error {
	st := mig.Status
	st.Phase, st.Message = v1alpha1.MigrationFailed, why
	if st.SourceNode == "" && vm != nil {
		// Where the VM stayed; a drain of it hears of the failure so.
		st.SourceNode = vm.GetAnnotations()[v1alpha1.AnnotationNode]
	}
	now := metav1.Now()
	st.EndTime = &now
	if err := r.setStatus(ctx, mig, st); err != nil {
		return err
	}
	metrics.Migrations.WithLabelValues(metrics.ResultFailed).Inc()
	r.recorder.Event(mig, event.Warning(ReasonFailed, errors.New(why)))
	r.opts.Placer.Release(reservation(string(mig.UID)))
	if vm == nil {
		return nil
	}
	m, ok := virtualmachine.MigrationOf(vm, f)
	if !ok || m.ID != string(mig.UID) {
		return nil
	}
	r.recorder.Event(vm, event.Warning(ReasonFailed, errors.New(why)))
	return r.abandon(ctx, vm, f, m)
}

// abandon drops the failed migration m from the VM; its target goes among
// the leftovers, so whatever it got ready goes.
func (r *Reconciler) abandon(ctx context.Context, vm *v1alpha1.VirtualMachine, f *fleet.Fleet, m virtualmachine.Migration) error {
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	return r.patchVM(ctx, vm, func(a map[string]string) {
		dropMigration(a)
		if m.Target != node {
			virtualmachine.WithLeftover(f, string(vm.UID), a, m.Target)
		}
	})
}

// dropMigration removes the migration from a VM's annotations a.
func dropMigration(a map[string]string) {
	delete(a, v1alpha1.AnnotationMigration)
	delete(a, v1alpha1.AnnotationMigrationSeal)
	delete(a, v1alpha1.AnnotationMigrationCancel)
}

// wait keeps the migration Pending with why, and looks again later.
func (r *Reconciler) wait(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, why string) (reconcile.Result, error) {
	st := mig.Status
	st.Phase, st.Message = v1alpha1.MigrationPending, why
	return reconcile.Result{RequeueAfter: waitRetry}, r.setStatus(ctx, mig, st)
}

// setStatus writes st unless it is what the migration shows.
func (r *Reconciler) setStatus(ctx context.Context, mig *v1alpha1.VirtualMachineMigration, st v1alpha1.VirtualMachineMigrationStatus) error {
	if equality.Semantic.DeepEqual(mig.Status, st) {
		return nil
	}
	mig.Status = st
	return errors.Wrap(r.kube.Status().Update(ctx, mig), "cannot update the migration's status")
}

// patchVM changes the VM's annotations with fn (virtualmachine.Annotate).
func (r *Reconciler) patchVM(ctx context.Context, vm *v1alpha1.VirtualMachine, fn func(a map[string]string)) error {
	return errors.Wrap(virtualmachine.Annotate(ctx, r.kube, vm, fn), "cannot record the migration on the VM")
}
