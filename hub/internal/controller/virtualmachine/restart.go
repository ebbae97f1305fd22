package virtualmachine

// A VM with availability Restart whose node is lost is started on another
// node, once the lost node has fenced itself; this file is how.
//
// The lost node's agent destroys the guests whose intents set Fence once it
// has not stored a heartbeat for its lease (the heartbeat's
// FenceAfterMillis), counting from the send time of its last stored
// heartbeat. The hub counts from when it received that heartbeat (the
// fleet's LastSeen), which is later, and adds a margin (--fencing-margin)
// for the two clocks' drift: at LastSeen + lease + margin the old copy is
// gone, and not before does the hub start the new one. It never guesses:
// a node that announced no lease (0: it never fences itself), a node the
// hub has not heard from since it started (its lease is not known), a VM
// whose node never confirmed the spec it now has (the guest there may come
// from an intent without Fence), or a VM with a Volume on its node's own
// storage stays where it is, and says why.
//
// An administrator who deletes a lost node's HypervisorNode removes the
// node for good (hypervisornode's removed forgets it once no VM is bound
// to it). That is taken as the administrator's word that the node's
// guests are gone, as Kubernetes takes a deleted Node's pods to be: the
// node's VMs are restarted elsewhere at once, whatever their availability
// and whether or not the node could fence itself. A VM with a Volume on
// the node's own storage, or one that imports or only observes its guest,
// still stays, and says why.
//
// The restart is a few writes, in an order a hub restarted between any two
// of them resumes from: each Volume's node and seal moved to the target
// (as a migration that succeeded moves them), then the VM in one write:
// its node and a fresh seal, the lost node among its leftovers (so its
// intent there is deleted and its late reports are not foreign), and
// AnnotationRestartedFrom for the story. Until the VM's write, the VM is
// still on the lost node, and the next reconcile sends it where its
// Volumes went (restartTarget) and moves the rest. The managed reconciler
// then publishes the intent to the target, as for any placed VM.
//
// Not covered: a hub that stops between the Volumes' writes and the VM's,
// and the lost node back before it resumes. The VM stays on its node and
// its Volumes are on the target; its reconcile fails until they are bound
// back by hand.

import (
	"context"
	"fmt"
	"strings"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// Event reasons of a restart on another node.
const (
	// ReasonRestartedElsewhere: the VM was moved off its lost node.
	ReasonRestartedElsewhere event.Reason = "RestartedElsewhere"
	// ReasonNotRestarted: the VM waits for its lost node, and why.
	ReasonNotRestarted event.Reason = "NotRestartedElsewhere"
)

// DefaultFencingMargin is what the hub adds to a lost node's lease before
// it restarts the node's VMs elsewhere.
const DefaultFencingMargin = 5 * time.Second

// restartRetry is how soon a VM due to restart that no node could take is
// looked at again when no change of the fleet wakes it first.
const restartRetry = 10 * time.Second

// restartElsewhere restarts vm on another node when its node is lost and
// the node's lease has run out (see the top of this file); it says whether
// it moved the VM. Otherwise it notes, for the NodeLost condition, when
// the VM will be restarted or why it will not, and records a Warning event
// once for each reason it stays.
func (e *external) restartElsewhere(ctx context.Context, vm *v1alpha1.VirtualMachine) (bool, error) {
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	n := e.fleet.Node(node)
	if meta.WasDeleted(vm) || node == "" || !n.Lost {
		e.state.restarts.Delete(vm.UID)
		return false, nil
	}
	removed, err := removedForGood(ctx, e.kube, node)
	if err != nil {
		return false, err
	}
	if !removed && !vm.Spec.ForProvider.RestartsElsewhere() {
		e.state.restarts.Delete(vm.UID)
		return false, nil
	}
	uid, now := string(vm.UID), e.current()
	lease := time.Duration(n.Heartbeat.FenceAfterMillis) * time.Millisecond
	if why := e.unrestartable(vm, node, lease, removed); why != "" {
		e.stays(vm, why, true)
		return false, nil
	}
	if m, ok := MigrationOf(vm, e.fleet); ok {
		// The migration controller ends a migration under way: it fails
		// it when its target is lost, or moves the VM once the guest runs
		// there. Moving the VM here too would race its writes; this looks
		// again once the migration is over.
		e.stays(vm, fmt.Sprintf("the VM is restarted on another node once its live migration to node %s is over", m.Target), false)
		return false, nil
	}
	fenced := n.LastSeen.Add(lease)
	deadline := fenced.Add(e.opts.FencingMargin)
	if wait := deadline.Sub(now); wait > 0 && !removed {
		e.opts.Notifier.NotifyAfter(uid, wait)
		e.stays(vm, fmt.Sprintf("the VM is restarted on another node at %s, once the node's lease of %s and a margin of %s have run out since its last heartbeat",
			deadline.UTC().Format(time.RFC3339), lease, e.opts.FencingMargin), false)
		return false, nil
	}
	d, err := e.resolve(ctx, vm)
	if err != nil {
		// The managed reconciler says the same in the VM's Synced.
		e.stays(vm, "cannot restart the VM on another node yet: "+err.Error(), false)
		return false, nil
	}
	if v, local := d.nodeLocal(); local {
		e.stays(vm, fmt.Sprintf("cannot restart elsewhere: Volume %s is on node %s's own storage (it names no storagePool)", v, node), true)
		return false, nil
	}
	if len(d.sources) > 0 {
		e.stays(vm, "cannot restart elsewhere: a Volume of the VM is made from a DiskImage that clones a Volume of node "+node, true)
		return false, nil
	}
	target, err := e.restartTarget(ctx, vm, d, node, n)
	if err != nil {
		e.opts.Notifier.NotifyAfter(uid, restartRetry)
		e.stays(vm, "the VM is restarted on another node as soon as one can take it: "+err.Error(), true)
		return false, nil
	}
	// The guest must come back, so its snapshots, which stay with the
	// lost node, do not hold it there; they are Lost, and said to be.
	snapshots, err := SnapshotsOn(ctx, e.kube, vm, node)
	if err != nil {
		return false, err
	}
	for i := range d.volumes {
		if err := e.bindVolume(ctx, d.volumes[i].DeepCopy(), target, node); err != nil {
			return false, err
		}
	}
	patch := client.MergeFromWithOptions(vm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	a := vm.GetAnnotations()
	// The guest it adopted stays on the lost node, fenced: the target
	// makes a new one.
	e.fleet.Bind(vm, a, target, "")
	WithLeftover(e.fleet, uid, a, node)
	a[v1alpha1.AnnotationRestartedFrom] = node + "@" + now.UTC().Format(time.RFC3339)
	if err := e.kube.Patch(ctx, vm, patch); err != nil {
		if kerrors.IsConflict(err) {
			return false, nil // the write that conflicted wakes this controller again
		}
		return false, errors.Wrap(err, "cannot record the node the VM restarts on")
	}
	e.state.restarts.Delete(vm.UID)
	metrics.RestartsElsewhere.WithLabelValues().Inc()
	metrics.LostToRestart.WithLabelValues().Observe(now.Sub(n.LastSeen).Seconds())
	e.log.Info("Restarted elsewhere: its node is lost and fenced", "namespace", vm.Namespace, "name", vm.Name, "from", node, "to", target)
	if removed {
		e.event(vm, event.Warning(ReasonNodeLost, errors.Errorf("node %s lost at %s and removed for good (its HypervisorNode deleted): the guest there is taken to be gone",
			node, n.LostSince.UTC().Format(time.RFC3339))))
	} else {
		e.event(vm, event.Warning(ReasonNodeLost, errors.Errorf("node %s lost at %s; its lease of %s ran out at %s: the guest there is fenced",
			node, n.LostSince.UTC().Format(time.RFC3339), lease, fenced.UTC().Format(time.RFC3339))))
	}
	e.event(vm, event.Normal(ReasonRestartedElsewhere, "restarted on node "+target))
	if len(snapshots) > 0 {
		e.event(vm, event.Warning(ReasonSnapshotsLost, errors.Errorf("snapshots %s stayed on lost node %s and are lost: the VM runs on node %s without them",
			strings.Join(snapshots, ", "), node, target)))
	}
	return true, nil
}

// removedForGood says whether an administrator deleted node's
// HypervisorNode, the way to remove a node for good.
func removedForGood(ctx context.Context, kube client.Reader, node string) (bool, error) {
	n := &v1alpha1.HypervisorNode{}
	err := kube.Get(ctx, types.NamespacedName{Name: node}, n)
	if kerrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot read HypervisorNode %s", node)
	}
	return meta.WasDeleted(n), nil
}

// unrestartable says why the VM on the lost node must not be restarted
// elsewhere at all while the node stays lost, or "" when it may be once
// the node's lease has run out, or at once when the node was removed for
// good: the administrator's word stands for the node's own fencing.
func (e *external) unrestartable(vm *v1alpha1.VirtualMachine, node string, lease time.Duration, removed bool) string {
	if ext := meta.GetExternalName(vm); ext != "" || ObserveOnly(vm) {
		return "the VM imports or only observes its guest, which is not virtfleet's to make on another node; the VM is not restarted elsewhere"
	}
	if removed {
		return ""
	}
	if _, heard := e.fleet.Heard(node); !heard {
		return fmt.Sprintf("the hub has not heard from node %s since it started, so it does not know the node's lease; the VM is not restarted elsewhere", node)
	}
	if lease <= 0 {
		return fmt.Sprintf("node %s does not fence itself (FenceAfter 0); the VM is not restarted elsewhere", node)
	}
	// The node fences the guest only if the intent it acted on set Fence,
	// which the VM's spec decides: it must have confirmed the spec the VM
	// has now.
	rep, ok := e.fleet.Guests.Report(node, string(vm.UID))
	if !ok || rep.Report.ObservedGeneration < vm.Generation {
		var got int64
		if ok {
			got = rep.Report.ObservedGeneration
		}
		return fmt.Sprintf("node %s never confirmed the VM's current spec (generation %d; it acted on %d), so the guest there may not be fenced; the VM is not restarted elsewhere", node, vm.Generation, got)
	}
	return ""
}

// restartTarget chooses the node vm restarts on in place of the lost node:
// the least allocated live node that fits, as the placement loop places a
// new VM (backend, node selector, room, shared pools), but never the lost
// node, and on the overlay exactly when the lost node was (the VM keeps
// its addresses only on a network that spans both). Its Volumes, all on
// shared pools, do not tie it to the lost node; but a Volume bound to
// another node already, moved there by an earlier try of this restart
// that stopped before the VM's write or by another VM using it, takes the
// VM there too.
func (e *external) restartTarget(ctx context.Context, vm *v1alpha1.VirtualMachine, d dependencies, lost string, n fleet.NodeStatus) (string, error) {
	required := ""
	for _, v := range d.volumes {
		switch bound := v.GetAnnotations()[v1alpha1.AnnotationNode]; {
		case bound == "" || bound == lost || bound == required:
		case required == "":
			required = bound
		default:
			return "", errors.Errorf("the VM's Volumes are bound to nodes %s and %s; a VM can only use volumes of one node", required, bound)
		}
	}
	req, uid := requestOn(vm, d, e.defaults, required), string(vm.UID)
	var err error
	if req.Group, err = MovedGroupOf(ctx, e.kube, vm, e.fleet); err != nil {
		return "", err
	}
	if r, ok := e.opts.Placer.Reserved(uid); ok && r == lost {
		// Room held on the lost node; Place would answer it again.
		e.opts.Placer.Release(uid)
	}
	overlay := n.Heartbeat.TunnelAddress != ""
	var nodes []placement.Node
	for _, c := range MarkCordoned(ctx, e.kube, e.fleet.Nodes()) {
		if c.Name == lost || (e.fleet.Node(c.Name).Heartbeat.TunnelAddress != "") != overlay {
			continue
		}
		nodes = append(nodes, c)
	}
	return e.opts.Placer.Place(nodes, req)
}

// stays notes msg as what the NodeLost condition of vm says; a warning is
// also recorded as an event, once as long as it stays the same.
func (e *external) stays(vm *v1alpha1.VirtualMachine, msg string, warn bool) {
	if prev, _ := e.state.restarts.Load(vm.UID); prev == msg {
		return
	}
	e.state.restarts.Store(vm.UID, msg)
	if warn {
		e.event(vm, event.Warning(ReasonNotRestarted, errors.New(msg)))
	}
}

// current is the time on the controller's clock.
func (c *connector) current() time.Time {
	if c.clock != nil {
		return c.clock()
	}
	return time.Now()
}
