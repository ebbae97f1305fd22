package hypervisornode

import (
	"context"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// Finalizer holds a HypervisorNode an administrator deleted until the hub
// has forgotten the node (removed).
const Finalizer = v1alpha1.Group + "/hypervisornode"

// Removal timings.
const (
	// markersEvery looks again at a node whose reports' delete markers
	// are on their way to the bucket, through the node's own stream.
	markersEvery = time.Second
	// vmsEvery looks again at a node whose removal waits for its VMs;
	// each VM that leaves the node also wakes it.
	vmsEvery = 30 * time.Second
	// maxVMsNamed bounds the VMs a waiting removal names in its log.
	maxVMsNamed = 5
)

// removed forgets a node whose HypervisorNode an administrator deleted,
// the way to remove a node for good: once the node is lost, its keys on
// the wire go (its reports, through delete markers every hub sees, and the
// intents left for it), then what NATS keeps for it (its reports stream,
// which holds its bound of the JetStream store however long the node is
// gone), then the hub's memory of it. A node heard from later is a new
// node.
//
// A node that still sends heartbeats is not forgotten: its HypervisorNode
// goes, and comes back at its next heartbeat, as it always did. A lost
// node that VMs are still bound to keeps its HypervisorNode until they are
// deleted or moved (availability: Restart moves them): their reports are
// the hub's evidence for fencing.
func (r *Reconciler) removed(ctx context.Context, n *v1alpha1.HypervisorNode, st fleet.NodeStatus, heardBy *fleet.Fleet) (reconcile.Result, error) {
	name := n.Name
	if !controllerutil.ContainsFinalizer(n, Finalizer) {
		return reconcile.Result{}, nil
	}
	switch {
	case heardBy != nil && !st.Lost:
		return reconcile.Result{}, r.release(ctx, n)
	case !st.Lost:
		// Not heard from since the hub started, nor lost yet: every live
		// node sends a heartbeat before it would be.
		return reconcile.Result{RequeueAfter: MinInterval}, nil
	}
	vms, err := r.vmsOn(ctx, name, heardBy)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(vms) > 0 {
		named := make([]string, 0, maxVMsNamed)
		for _, vm := range vms[:min(len(vms), maxVMsNamed)] {
			named = append(named, vm.Namespace+"/"+vm.Name)
		}
		r.log.Info("A removed node is forgotten once no VM is bound to it: delete or move them", "node", name, "vms", len(vms), "first", strings.Join(named, ", "))
		return reconcile.Result{RequeueAfter: vmsEvery}, nil
	}
	fleets := r.fleets()
	if heardBy != nil {
		fleets = []*fleet.Fleet{heardBy}
	}
	markers := false
	for _, f := range fleets {
		reported, err := forgetKeys(ctx, f.Bus, name)
		if err != nil {
			return reconcile.Result{}, err
		}
		markers = markers || reported
	}
	if markers {
		return reconcile.Result{RequeueAfter: markersEvery}, nil
	}
	for _, f := range fleets {
		if err := f.Bus.DropNode(ctx, name); err != nil {
			return reconcile.Result{}, errors.Wrapf(err, "cannot forget node %s", name)
		}
		f.Forget(name)
	}
	if err := r.release(ctx, n); err != nil {
		return reconcile.Result{}, err
	}
	r.log.Info("Forgot a node removed for good", "node", name, "lostSince", st.LostSince.UTC().Format(time.RFC3339))
	return reconcile.Result{}, nil
}

// release lets n go.
func (r *Reconciler) release(ctx context.Context, n *v1alpha1.HypervisorNode) error {
	controllerutil.RemoveFinalizer(n, Finalizer)
	err := r.kube.Update(ctx, n)
	return errors.Wrapf(err, "cannot let HypervisorNode %s go", n.Name)
}

// forgetKeys deletes node's keys in b's reports and intents buckets, and
// says whether it found any of its reports: their delete markers reach the
// bucket through the node's stream, which must stay until they have.
func forgetKeys(ctx context.Context, b bus.Bus, node string) (reported bool, err error) {
	for _, bucket := range []string{wire.BucketReports, wire.BucketIntents} {
		entries, err := b.List(ctx, bucket)
		if err != nil {
			return false, errors.Wrapf(err, "cannot list the keys of node %s", node)
		}
		for _, e := range entries {
			if of, _, err := wire.ParseKey(e.Key); err != nil || of != node {
				continue
			}
			reported = reported || bucket == wire.BucketReports
			if err := b.Delete(ctx, bucket, e.Key); err != nil {
				return false, errors.Wrapf(err, "cannot delete %s of node %s", e.Key, node)
			}
		}
	}
	return reported, nil
}
