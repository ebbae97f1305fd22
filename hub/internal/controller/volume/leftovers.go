package volume

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// Leftovers deletes what a Volume let go after the fencing timeout leaves
// behind. Release leaves such a Volume's VolumeIntent{Absent} in place so
// that its node deletes the volume when its agent comes back; the agent then
// reports the volume Gone, and nobody is left to delete the intent. Leftovers
// does: when a node reports Gone for a Volume that no longer exists, it
// deletes the Volume's intent and then the report (the agent deletes the
// report itself when it sees the intent go, unless it was down then).
//
// Only an Absent intent makes an agent report Gone, so a Gone report never
// leads here to deleting an intent that asks for a volume to exist.
//
// A Volume that imported a volume and was deleted without the Delete
// management policy leaves its present intent and the node's Imported
// report; Leftovers deletes those too (the node keeps the volume), woken by
// the Volume's deletion as well as by reports.
//
// Each fleet's report watch starts with the current state of every report,
// so Leftovers sweeps a NATS server for leftovers whenever the hub connects
// to it, at hub start included.
type Leftovers struct {
	// api confirms, uncached, that a Volume the cache does not hold is
	// really gone and not merely not seen yet.
	api   client.Reader
	log   logging.Logger
	queue workqueue.TypedRateLimitingInterface[leftover]

	mu     sync.Mutex
	fleets []*fleet.Fleet
	// cached are the uids of the Volumes the cache holds, kept by its
	// informer's events (Setup): one entry per Volume, where a field
	// index by uid would hold two single-entry sets per Volume (one in
	// its namespace, one across namespaces).
	cached map[types.UID]struct{}
}

// leftover names a Volume uid whose report changed in one fleet.
type leftover struct {
	fleet *fleet.Fleet
	uid   string
}

// NewLeftovers returns Leftovers that know the cached Volumes from their
// informer's events (Setup) and look the others up in api, uncached.
func NewLeftovers(api client.Reader, log logging.Logger) *Leftovers {
	return &Leftovers{
		api:    api,
		log:    log,
		cached: map[types.UID]struct{}{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[leftover](apiwrites.BaseDelay, apiwrites.MaxDelay),
			workqueue.TypedRateLimitingQueueConfig[leftover]{Name: "volume-leftovers"}),
	}
}

// Watch makes l look at every Volume report of f. Call it for every Fleet
// before its watches start (fleet.NewPool's onNew).
func (l *Leftovers) Watch(f *fleet.Fleet) {
	l.mu.Lock()
	l.fleets = append(l.fleets, f)
	l.mu.Unlock()
	f.Volumes.Subscribe(func(uid string) { l.queue.Add(leftover{fleet: f, uid: uid}) })
}

// Cached tells l that the cache holds the Volume uid.
func (l *Leftovers) Cached(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cached[uid] = struct{}{}
}

// Deleted makes l look at Volume uid's reports in every fleet: it was just
// deleted, and the cache no longer holds it.
func (l *Leftovers) Deleted(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.cached, uid)
	for _, f := range l.fleets {
		l.queue.Add(leftover{fleet: f, uid: string(uid)})
	}
}

// isCached tells whether the cache holds the Volume uid.
func (l *Leftovers) isCached(uid string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.cached[types.UID(uid)]
	return ok
}

// Setup has l told of every Volume the cache holds and of every one
// deleted, and runs l with mgr, on the leader only.
func (l *Leftovers) Setup(ctx context.Context, mgr ctrl.Manager) error {
	inf, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.Volume{})
	if err != nil {
		return errors.Wrap(err, "cannot watch Volumes")
	}
	// A Volume's uid never changes, so its updates tell nothing new; a
	// relist delivers what vanished meanwhile as a deletion.
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if v, ok := o.(client.Object); ok {
				l.Cached(v.GetUID())
			}
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if v, ok := o.(client.Object); ok {
				l.Deleted(v.GetUID())
			}
		},
	})
	if err != nil {
		return errors.Wrap(err, "cannot watch Volume deletions")
	}
	return errors.Wrap(mgr.Add(l), "cannot add the Volume leftovers cleaner")
}

// Start implements manager.Runnable: it works off the reports until ctx is
// done.
func (l *Leftovers) Start(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		l.queue.ShutDown()
	}()
	for {
		item, shutdown := l.queue.Get()
		if shutdown {
			return nil
		}
		if err := l.Clean(ctx, item.fleet, item.uid); err != nil {
			l.log.Info("Cannot clean up after a deleted Volume; retrying", "uid", item.uid, "error", err)
			l.queue.AddRateLimited(item)
		} else {
			l.queue.Forget(item)
		}
		l.queue.Done(item)
	}
}

// Clean deletes the intent and report of Volume uid on every node of f
// that reported the volume Gone, or Imported, if the Volume no longer
// exists. With the Volume gone, no node is recorded for it any more:
// whichever node says its volume is gone, or that it observes it, has its
// own leftovers cleaned, and no other's.
func (l *Leftovers) Clean(ctx context.Context, f *fleet.Fleet, uid string) error {
	var gone []string
	for _, rep := range f.Volumes.All(uid) {
		if rep.Report.Gone || rep.Report.Imported {
			gone = append(gone, rep.Node)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	exists, err := l.exists(ctx, uid)
	if err != nil || exists {
		// An existing Volume's Release deletes its intent itself.
		return err
	}
	for _, node := range gone {
		if err := bus.Delete(ctx, f.Bus, wire.VolumeIntents, node, uid); err != nil {
			return errors.Wrapf(err, "cannot delete the intent of deleted Volume %s on node %s", uid, node)
		}
		if err := bus.Delete(ctx, f.Bus, wire.VolumeReports, node, uid); err != nil {
			return errors.Wrapf(err, "cannot delete the report of deleted Volume %s on node %s", uid, node)
		}
		l.log.Debug("Deleted the intent and report of a deleted Volume", "uid", uid, "node", node)
	}
	return nil
}

// exists tells whether a Volume with uid exists. The cache may not have seen
// a Volume yet (at hub start, or just after its creation), so "not in the
// cache" is confirmed uncached before anything is deleted.
func (l *Leftovers) exists(ctx context.Context, uid string) (bool, error) {
	if l.isCached(uid) {
		return true, nil
	}
	all := &metav1.PartialObjectMetadataList{}
	all.SetGroupVersionKind(v1alpha1.SchemeGroupVersion.WithKind("VolumeList"))
	if err := l.api.List(ctx, all); err != nil {
		return false, errors.Wrap(err, "cannot list Volumes")
	}
	for i := range all.Items {
		if string(all.Items[i].UID) == uid {
			return true, nil
		}
	}
	return false, nil
}
