package apiwrites

import (
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
)

// Per-item retry delays: doubling from BaseDelay up to MaxDelay.
const (
	BaseDelay = 50 * time.Millisecond
	MaxDelay  = 30 * time.Second
)

// ControllerRateLimiter retries a resource after BaseDelay, doubling up to
// MaxDelay while it keeps failing.
//
// crossplane-runtime's default starts at 1 s, and its managed reconciler
// turns every lost write conflict into a plain requeue that goes through this
// limiter (errors.SilentlyRequeueOnConflict). Conflicts are routine here: the
// reconciler writes a VM several times while creating it, so the next
// reconcile often reads a cache one write behind. With the default, a VM
// whose report had arrived would wait a second or more for its status, and
// a burst would take many times as long. The cache
// catches up far sooner than that, so the first retry comes almost at once;
// real failures still back off.
func ControllerRateLimiter() ratelimiter.ControllerRateLimiter {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](BaseDelay, MaxDelay)
}
