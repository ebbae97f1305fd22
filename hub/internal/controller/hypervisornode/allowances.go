package hypervisornode

import (
	"context"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// allowanceWatch hands every HypervisorNode's spec to the fleets'
// Allowances as the informer sees it, so what a node's heartbeat claims
// counts as its administrator allows from the first heartbeat read.
type allowanceWatch struct {
	cache      cache.Cache
	allowances *fleet.Allowances
}

// NeedLeaderElection is false: every hub replica reads heartbeats, and
// each must bound them.
func (w *allowanceWatch) NeedLeaderElection() bool { return false }

// Start keeps the allowances until ctx is done.
func (w *allowanceWatch) Start(ctx context.Context) error {
	inf, err := w.cache.GetInformer(ctx, &v1alpha1.HypervisorNode{})
	if err != nil {
		return errors.Wrap(err, "cannot watch HypervisorNodes")
	}
	set := func(o any) {
		if n, ok := o.(*v1alpha1.HypervisorNode); ok {
			w.allowances.Set(n.Name, &n.Spec)
		}
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, o any) { set(o) },
		DeleteFunc: func(o any) {
			if gone, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = gone.Obj
			}
			if n, ok := o.(*v1alpha1.HypervisorNode); ok {
				w.allowances.Set(n.Name, nil)
			}
		},
	})
	if err != nil {
		return errors.Wrap(err, "cannot watch HypervisorNodes")
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	if toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		w.allowances.MarkSynced()
	}
	<-ctx.Done()
	return nil
}
