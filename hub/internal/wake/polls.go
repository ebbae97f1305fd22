package wake

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
)

// DefaultPollsPerSecond is how many drift polls a managed controller of the
// hub makes per second at most, whatever the number of its objects.
const DefaultPollsPerSecond = 20

// pollJitter spreads each poll by up to this share of its interval either
// way, so objects created together do not come due together.
const pollJitter = 0.1

// Polls spreads the managed controllers' drift polls over time so that
// their rate stays within a budget however many objects there are.
//
// crossplane-runtime reconciles every object again one poll interval after
// the last reconcile, to notice drift. virtfleet learns of what nodes do
// from their reports at once (Notifier), so a poll finds nothing a report
// did not already say: it only guards against what went unreported. Yet
// at a fixed interval its cost grows with the fleet: ten thousand VMs and
// their Volumes polled every minute are over three hundred reconciles a
// second, which take the global reconcile budget (--max-reconcile-rate)
// from the VMs being created. With Polls a controller of n objects polls
// each every max(interval, n / perSecond), with a tenth of jitter.
type Polls struct {
	cache     cache.Cache
	perSecond float64
}

// NewPolls returns the polls of controllers whose objects c holds, each
// controller at most perSecond polls a second.
func NewPolls(c cache.Cache, perSecond float64) *Polls {
	return &Polls{cache: c, perSecond: perSecond}
}

// Hook returns the poll interval hook of the controller of obj's kind,
// for managed.WithPollIntervalHook. A nil Polls returns a hook that only
// adds jitter.
func (p *Polls) Hook(obj client.Object) managed.PollIntervalHook {
	var (
		once    sync.Once
		objects atomic.Int64
	)
	return func(_ resource.Managed, interval time.Duration) time.Duration {
		if p != nil {
			// Counted from the informer's own adds and deletes, from the
			// first poll on: the hook runs in a reconcile, so the cache
			// is started and the informer's existing objects are
			// delivered as adds.
			once.Do(func() { p.count(obj, &objects) })
			interval = p.spread(objects.Load(), interval)
		}
		return jitter(interval)
	}
}

// spread is the interval that polls each of n objects at most perSecond a
// second in all, and never more often than every interval.
func (p *Polls) spread(n int64, interval time.Duration) time.Duration {
	return max(interval, time.Duration(float64(n)/p.perSecond*float64(time.Second)))
}

// count keeps n at the number of objects of obj's kind in the cache. If the
// informer cannot be had, n stays 0 and polls keep their interval.
func (p *Polls) count(obj client.Object, n *atomic.Int64) {
	inf, err := p.cache.GetInformer(context.Background(), obj)
	if err != nil {
		return
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.Add(1) },
		DeleteFunc: func(any) { n.Add(-1) },
	})
}

// jitter is d moved by up to pollJitter of it either way.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*2-1)*pollJitter*float64(d)) //nolint:gosec // spreading polls, not a secret
}
