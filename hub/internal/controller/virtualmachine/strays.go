package virtualmachine

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// DefaultStraySweep is how often Strays sweeps when the hub is not told
// otherwise: a stray guest is a leak, not an emergency, and each sweep
// lists every intent of every fleet.
const DefaultStraySweep = 5 * time.Minute

// Strays deletes every guest intent that no VirtualMachine binds to its
// node, and with it, through the node's agent, its guest. The VM
// controller deletes what it published whenever a VM it reconciles moves
// or goes; what it never reconciles again stays without this sweep: the
// intent of a VM whose finalizer was removed by hand while the hub was
// stopped (or whose namespace went that way), the old node's intent of a
// VM whose binding was edited by hand, an intent written into the bucket
// with the hub's credentials by mistake or replayed from an earlier
// binding.
//
// An intent is bound, and kept, when a VirtualMachine of its uid is on its
// node as the VM controller acts on it (AdmittedNode), or the node is the
// target of the VM's sealed migration, or one of the VM's leftovers, which
// the VM controller deletes itself once it has seen them go. Anything else
// is stray. Each sweep reads the VMs from the cache, once; a stray is
// confirmed by reading its VM from the API server, uncached, since the
// cache may be behind a binding just written, and deleted only at the
// revision listed, so an intent published after the listing stays.
type Strays struct {
	// cache answers the sweep; api confirms a stray, uncached.
	cache, api client.Reader
	fleets     func() []*fleet.Fleet
	every      time.Duration
	log        logging.Logger
}

// NewStrays returns a sweep of the intents of fleets every period.
func NewStrays(cache, api client.Reader, fleets func() []*fleet.Fleet, every time.Duration, log logging.Logger) *Strays {
	return &Strays{cache: cache, api: api, fleets: fleets, every: every, log: log}
}

// Start implements manager.Runnable: it sweeps every period until ctx is
// done, on the leader only (two hubs sweeping would race each other's
// placements).
func (s *Strays) Start(ctx context.Context) error {
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			for _, f := range s.fleets() {
				if err := s.Sweep(ctx, f); err != nil {
					s.log.Info("Cannot sweep the intents for strays; the next sweep tries again", "error", err)
				}
			}
		}
	}
}

// Sweep deletes the stray guest intents of f once.
func (s *Strays) Sweep(ctx context.Context, f *fleet.Fleet) error {
	entries, err := f.Bus.List(ctx, wire.BucketIntents)
	if err != nil {
		return err
	}
	// The cache's own objects, uncopied: a sweep lists the whole fleet,
	// and only reads it.
	l := &v1alpha1.VirtualMachineList{}
	if err := s.cache.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
		return errors.Wrap(err, "cannot list VirtualMachines")
	}
	cached := make(map[types.UID]*v1alpha1.VirtualMachine, len(l.Items))
	for i := range l.Items {
		cached[l.Items[i].UID] = &l.Items[i]
	}
	var fresh map[types.UID]*v1alpha1.VirtualMachine
	vms := &objects{
		cached: func(context.Context) (map[types.UID]bool, error) { return uidsOf(cached), nil },
		current: func(ctx context.Context) (map[types.UID]bool, error) {
			var err error
			if fresh == nil {
				fresh, err = s.current(ctx)
			}
			return uidsOf(fresh), err
		},
	}
	volumes := &objects{
		cached:  func(ctx context.Context) (map[types.UID]bool, error) { return volumeUIDs(ctx, s.cache) },
		current: func(ctx context.Context) (map[types.UID]bool, error) { return volumeUIDs(ctx, s.api) },
	}
	for _, e := range entries {
		if uid, ok := wire.BindingUID(e.Key); ok {
			if err := s.sweepRecord(ctx, f, e, uid, vms); err != nil {
				return err
			}
			continue
		}
		if uid, ok := wire.SizeUID(e.Key); ok {
			if err := s.sweepRecord(ctx, f, e, uid, volumes); err != nil {
				return err
			}
			continue
		}
		node, rest, err := wire.ParseKey(e.Key)
		if err != nil {
			continue
		}
		uid, ok := wire.GuestIntents.UID(rest)
		if !ok {
			continue
		}
		if vm, ok := cached[types.UID(uid)]; ok {
			if bound, err := s.binds(ctx, f, vm, node); err != nil || bound {
				continue
			}
		}
		if fresh == nil {
			if fresh, err = s.current(ctx); err != nil {
				return err
			}
		}
		reason := metrics.ReasonVMGone
		if vm, ok := fresh[types.UID(uid)]; ok {
			if bound, err := s.binds(ctx, f, vm, node); err != nil || bound {
				continue
			}
			reason = metrics.ReasonNotBound
		}
		s.delete(ctx, f, e, node, uid, reason)
	}
	return nil
}

// objects answers whether an object of one kind exists: from the cache
// when it shows it, else from the API server, since the cache may be behind
// an object just made. Each is listed at most once a sweep, and only when
// a record asks.
type objects struct {
	cached, current func(ctx context.Context) (map[types.UID]bool, error)
	inCache, listed map[types.UID]bool
}

func (o *objects) has(ctx context.Context, uid types.UID) (bool, error) {
	var err error
	if o.inCache == nil {
		if o.inCache, err = o.cached(ctx); err != nil {
			return false, err
		}
	}
	if o.inCache[uid] {
		return true, nil
	}
	if o.listed == nil {
		if o.listed, err = o.current(ctx); err != nil {
			return false, err
		}
	}
	return o.listed[uid], nil
}

// sweepRecord deletes e, the hub's record of the object of uid in the
// intents bucket (a VM's binding, a Volume's size), once no such object
// exists: a VM deleted without its guest (released as an orphan), or a
// Volume deleted without its disk, leaves its record behind.
func (s *Strays) sweepRecord(ctx context.Context, f *fleet.Fleet, e bus.Entry, uid string, of *objects) error {
	if ok, err := of.has(ctx, types.UID(uid)); err != nil || ok {
		return err
	}
	if err := f.Bus.DeleteAt(ctx, wire.BucketIntents, e.Key, e.Revision); err != nil {
		s.log.Debug("Cannot delete the record of an object gone; the next sweep tries again", "key", e.Key, "error", err)
	}
	return nil
}

// volumeUIDs are the uids of the Volumes r holds; a cache's are read
// uncopied.
func volumeUIDs(ctx context.Context, r client.Reader) (map[types.UID]bool, error) {
	l := &v1alpha1.VolumeList{}
	if err := r.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, errors.Wrap(err, "cannot list Volumes")
	}
	out := make(map[types.UID]bool, len(l.Items))
	for i := range l.Items {
		out[l.Items[i].UID] = true
	}
	return out, nil
}

// uidsOf are the uids of vms.
func uidsOf(vms map[types.UID]*v1alpha1.VirtualMachine) map[types.UID]bool {
	out := make(map[types.UID]bool, len(vms))
	for uid := range vms {
		out[uid] = true
	}
	return out
}

// delete deletes the stray intent e of guest uid on node, unless it
// changed since it was listed.
func (s *Strays) delete(ctx context.Context, f *fleet.Fleet, e bus.Entry, node, uid, reason string) {
	var conflict *bus.ConflictError
	switch err := f.Bus.DeleteAt(ctx, wire.BucketIntents, e.Key, e.Revision); {
	case errors.As(err, &conflict):
		s.log.Debug("A stray intent changed since it was listed; left to the next sweep", "node", node, "uid", uid)
	case err != nil:
		s.log.Info("Cannot delete a stray intent; the next sweep tries again", "node", node, "uid", uid, "error", err)
	default:
		metrics.StrayIntentsDeleted.WithLabelValues(reason).Inc()
		s.log.Info("Deleted an intent no VirtualMachine binds, and so its guest", "node", node, "uid", uid, "reason", reason)
	}
}

// current are the VirtualMachines the API server holds, by uid: those the
// cache does not show may be merely not seen yet.
func (s *Strays) current(ctx context.Context) (map[types.UID]*v1alpha1.VirtualMachine, error) {
	l := &v1alpha1.VirtualMachineList{}
	if err := s.api.List(ctx, l); err != nil {
		return nil, errors.Wrap(err, "cannot list VirtualMachines from the API server")
	}
	out := make(map[types.UID]*v1alpha1.VirtualMachine, len(l.Items))
	for i := range l.Items {
		out[l.Items[i].UID] = &l.Items[i]
	}
	return out, nil
}

// binds says whether vm binds its guest to node in f (see Strays). An
// error says nothing either way: the intent stays until a sweep can tell.
func (s *Strays) binds(ctx context.Context, f *fleet.Fleet, vm *v1alpha1.VirtualMachine, node string) (bool, error) {
	if slices.Contains(SealedLeftovers(vm, f), node) {
		return true, nil
	}
	if m, ok := MigrationOf(vm, f); ok && m.Target == node {
		return true, nil
	}
	bound, err := AdmittedNode(ctx, s.cache, vm, f)
	var refused *tenancy.RefusedError
	switch {
	case errors.As(err, &refused):
		return false, nil
	case err != nil:
		s.log.Info("Cannot tell whether a VirtualMachine binds its intent; kept", "namespace", vm.Namespace, "name", vm.Name, "node", node, "error", err)
		return false, err
	}
	return bound == node, nil
}
