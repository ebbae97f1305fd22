package apiwrites

import (
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// RetryQuietly wraps err, which a retry soon mends and nobody need act on
// (a hub still reading its view of the nodes as it starts), so that
// crossplane-runtime's managed reconciler requeues the resource through the
// controller's rate limiter without recording it: no Warning event and no
// Synced condition written, as for a lost write conflict, the one error
// it takes so. Anything else it shows the user.
func RetryQuietly(err error) error {
	if err == nil {
		return nil
	}
	return &quietRetry{err: err}
}

// quietRetry is an error that reads as a Conflict to
// k8s.io/apimachinery's errors.IsConflict.
type quietRetry struct{ err error }

func (e *quietRetry) Error() string { return e.err.Error() }
func (e *quietRetry) Unwrap() error { return e.err }

// Status implements apimachinery's APIStatus.
func (e *quietRetry) Status() metav1.Status {
	return metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonConflict, Code: http.StatusConflict, Message: e.err.Error()}
}
