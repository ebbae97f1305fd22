// Package volume reconciles Volumes with the inuse controller: a Volume's
// users are the VirtualMachines attaching it or whose guest still holds it
// (index.VolumeUsers), and its deletion is held while they do. It also
// removes a deleted Volume's storage from its node: then Releaser.Release
// asks the Volume's node to delete the volume, with a VolumeIntent{Absent},
// and lets the Volume go once the node reports it gone.
// The image the volume was made from is then pruned by the node after its
// DiskImage's pruneAfter.
package volume

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// ReasonNodeLost is the event of a Volume let go without its node confirming
// that the volume is gone.
const ReasonNodeLost event.Reason = "NodeLost"

// Kind is the Volume kind for the inuse controller, without the release of
// the volume on its node and the import of an existing one (see
// SetupGated).
var Kind = inuse.Kind[*v1alpha1.Volume]{
	GroupKind:        v1alpha1.VolumeGroupKind,
	GroupVersionKind: v1alpha1.VolumeGroupVersionKind,
	New:              func() *v1alpha1.Volume { return &v1alpha1.Volume{} },
	User:             index.VolumeUsers,
	Observe:          observe,
	// A new VM binds an unbound Volume to its node (bindVolumes), once
	// placed.
	AwaitsBinding: func(v *v1alpha1.Volume) bool { return v.GetAnnotations()[v1alpha1.AnnotationNode] == "" },
}

func observe(_ context.Context, _ client.Reader, v *v1alpha1.Volume, users inuse.Users) (xpv2.Condition, error) {
	node := v.GetAnnotations()[v1alpha1.AnnotationNode]
	v.Status.AtProvider.Node, v.Status.AtProvider.AttachedTo = node, users.Names()
	v.Status.AtProvider.Phase = v1alpha1.PhasePending
	if node != "" {
		v.Status.AtProvider.Phase = v1alpha1.PhaseRunning
	}
	return xpv2.Available(), nil
}

// SetupGated adds the Volume controller once the CRD is established: a
// deleted Volume goes once its node deleted the volume, and a Volume with an
// external name imports that volume of its node. The Releaser reaches the
// nodes through pool, gives up on a node lost for longer than fencing, and
// is woken by notifier, which the pool's fleets must feed with
// Fleet.Volumes.Subscribe.
func SetupGated(mgr ctrl.Manager, o controller.Options, pool Fleets, fencing time.Duration, notifier *wake.Notifier, memory *perobject.Owner, polls *wake.Polls, quotas *quota.Counter) error {
	return inuse.SetupGated(mgr, o, releasing(mgr, pool, fencing, notifier, memory, quotas), memory, polls)
}

// Setup is SetupGated without waiting for the CRD, for a manager that
// has it already.
func Setup(mgr ctrl.Manager, o controller.Options, pool Fleets, fencing time.Duration, notifier *wake.Notifier, memory *perobject.Owner, polls *wake.Polls, quotas *quota.Counter) error {
	return inuse.Setup(mgr, o, releasing(mgr, pool, fencing, notifier, memory, quotas), memory, polls)
}

// releasing is Kind with a Releaser's release of the volume on its node and
// import of an existing one.
func releasing(mgr ctrl.Manager, pool Fleets, fencing time.Duration, notifier *wake.Notifier, memory *perobject.Owner, quotas *quota.Counter) inuse.Kind[*v1alpha1.Volume] {
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor(managed.ControllerName(v1alpha1.VolumeGroupKind))) //nolint:staticcheck // crossplane-runtime still records through the old events API
	r := NewReleaser(mgr.GetClient(), pool, fencing, notifier, recorder, memory)
	r.quotas = quotas
	k := Kind
	k.Observe, k.Release = r.Observe, r.Release
	k.Sources = []source.Source{notifier.Source()}
	return k
}

// Fleets finds the Fleet of a NATS server; *fleet.Pool is one.
type Fleets interface {
	Get(ctx context.Context, t fleet.Target) (*fleet.Fleet, error)
}

// Releaser deletes Volumes' volumes on their nodes, and has the nodes
// observe the volumes Volumes import.
type Releaser struct {
	kube     client.Reader
	configs  *providerconfig.Resolver
	pool     Fleets
	notifier *wake.Notifier
	fencing  time.Duration
	recorder event.Recorder
	now      func() time.Time
	// quotas, if set, let a Volume on no node say that its namespace's
	// quota keeps it from being made.
	quotas *quota.Counter
	// published holds the import intent last written of each Volume, and
	// the node it was written to.
	published *perobject.Map[publishedIntent]
}

// publishedIntent is an import intent as written to one node.
type publishedIntent struct {
	node   string
	intent wire.VolumeIntent
}

// NewReleaser returns a Releaser that reaches the nodes through the fleets of
// pool, gives up on a node lost for longer than fencing (the VMs' fencing
// timeout), and is woken by notifier, which the pool's fleets must feed with
// Fleet.Volumes.Subscribe.
func NewReleaser(kube client.Client, pool Fleets, fencing time.Duration, notifier *wake.Notifier, recorder event.Recorder, memory *perobject.Owner) *Releaser {
	return &Releaser{
		published: perobject.NewMap[publishedIntent](memory),
		kube:      kube,
		configs:   providerconfig.NewResolver(kube),
		pool:      pool,
		notifier:  notifier,
		fencing:   fencing,
		recorder:  recorder,
		now:       time.Now,
	}
}

// Release is inuse.Kind.Release for Volumes, called only with the Delete
// management policy: without it the volume stays on its node, imported or
// not. An unbound Volume never had a volume made for it and is released at
// once, and so is one that imports a volume another Volume imported first.
// A bound one is released once its node reports the volume gone, then its
// intent is deleted; or, when the node has been lost for longer than the
// fencing timeout, at once with a Warning event, its intent left in place so
// that the node deletes the volume when its agent comes back (Leftovers then
// deletes the intent).
func (r *Releaser) Release(ctx context.Context, v *v1alpha1.Volume) (bool, error) {
	node := v.GetAnnotations()[v1alpha1.AnnotationNode]
	if node == "" {
		return r.forgetSize(ctx, v)
	}
	if ext := meta.GetExternalName(v); ext != "" {
		// A volume the namespace may not import was never asked of the
		// node, and one another Volume imported first is that Volume's:
		// this one never had it and leaves it alone.
		if refusal, err := r.importRefusal(ctx, v, ext); err != nil || refusal != nil {
			return err == nil, err
		}
		if owner, err := firstImporter(ctx, r.kube, v, node); err != nil || owner != nil {
			return err == nil, err
		}
	}
	f, err := r.fleetOf(ctx, v)
	if err != nil {
		return false, err
	}
	uid := string(v.UID)

	f.Volumes.FlagForeign(v, node)
	rep, reported := f.Volumes.Report(node, uid)
	if reported && rep.Report.Gone {
		if err := bus.Delete(ctx, f.Bus, wire.VolumeIntents, node, uid); err != nil {
			return false, errors.Wrapf(err, "cannot delete the volume intent on node %s", node)
		}
		// The size the hub admitted goes with the disk.
		if err := f.UnrecordSize(ctx, uid); err != nil {
			return false, err
		}
		return true, nil
	}
	in := intentOf(v)
	in.Absent = true
	r.published.Delete(v.UID)
	if _, err := bus.Put(ctx, f.Bus, wire.VolumeIntents, node, in.UID, in); err != nil {
		return false, errors.Wrapf(err, "cannot ask node %s to delete the volume", node)
	}
	if n := f.Node(node); n.Lost {
		lost := r.now().Sub(n.LostSince)
		if lost >= r.fencing {
			r.recorder.Event(v, event.Warning(ReasonNodeLost, errors.Errorf(
				"node %s has been lost since %s; the Volume is deleted after the fencing timeout (%s) without the node confirming that its volume is gone; the node deletes it when its agent comes back",
				node, n.LostSince.UTC().Format(time.RFC3339), r.fencing)))
			return true, nil
		}
		// Come back when the timeout is up, not at the next backoff.
		r.notifier.NotifyAfter(uid, r.fencing-lost)
	}
	if reported && rep.Report.Message != "" {
		return false, errors.New(fmt.Sprintf("node %s cannot delete the volume yet: %s", node, rep.Report.Message))
	}
	return false, nil
}

// forgetSize removes the size the placement of a VM recorded for v, a
// Volume on no node, if it recorded one: the VM went before it bound v,
// and the record goes with v. v is released all the same when its
// ProviderConfig cannot be read: it never was on a node.
func (r *Releaser) forgetSize(ctx context.Context, v *v1alpha1.Volume) (bool, error) {
	f, err := r.fleetOf(ctx, v)
	if err != nil {
		// Nothing of v is on a node to wait for.
		return true, nil
	}
	if _, ok, err := f.SizeInEffect(string(v.UID)); err != nil || !ok {
		return err == nil, err
	}
	if err := f.UnrecordSize(ctx, string(v.UID)); err != nil {
		return false, err
	}
	return true, nil
}

// fleetOf is the Fleet of v's ProviderConfig, whose reports about v now
// wake it.
func (r *Releaser) fleetOf(ctx context.Context, v *v1alpha1.Volume) (*fleet.Fleet, error) {
	pc, err := r.configs.Resolve(ctx, v)
	if err != nil {
		return nil, err
	}
	f, err := r.pool.Get(ctx, pc.Target)
	if err != nil {
		return nil, err
	}
	r.notifier.Remember(v)
	return f, nil
}

// importRefusal is why v's namespace may not import the volume ext (a
// tenancy.RefusedError), or nil when it may; err is a failure to read the
// grants, which a retry mends.
func (r *Releaser) importRefusal(ctx context.Context, v *v1alpha1.Volume, ext string) (refusal, err error) {
	g, err := providerconfig.GrantOf(ctx, r.kube, v.Namespace)
	if err != nil {
		return nil, err
	}
	return g.CheckImport("Volume", ext), nil
}
