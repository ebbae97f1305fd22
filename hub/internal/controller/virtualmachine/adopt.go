package virtualmachine

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// Event reasons of orphaning, adopting and importing.
const (
	ReasonOrphaned event.Reason = "Orphaned"
	ReasonAdopted  event.Reason = "Adopted"
)

// ReleasingError is what Observe returns while a deleted VM's node has not
// confirmed the release of its guest; the VM keeps its finalizer until then.
type ReleasingError struct{ Node string }

func (e *ReleasingError) Error() string {
	return fmt.Sprintf("waiting for node %s to release the guest: the VM is deleted without the Delete management policy, so its guest stays as it is", e.Node)
}

// ImportNodeError says an imported guest's node is not known.
type ImportNodeError struct{ ExternalName string }

func (e *ImportNodeError) Error() string {
	return fmt.Sprintf("the VM imports guest %q: set the annotation %s to the node that has it", e.ExternalName, v1alpha1.AnnotationNode)
}

// keepsGuest is whether deleting the VM leaves its guest: its management
// policies lack Delete, or it was deleted with propagationPolicy Orphan
// (kubectl delete --cascade=orphan), which the API server shows as the
// orphan finalizer until the garbage collector has run.
// policies is whether management policies are enabled.
func keepsGuest(vm *v1alpha1.VirtualMachine, policies bool) bool {
	return !managed.NewManagementPoliciesResolver(policies, vm.GetManagementPolicies()).ShouldDelete() ||
		slices.Contains(vm.GetFinalizers(), metav1.FinalizerOrphanDependents)
}

// observeRelease replaces the intent of a deleted VM by a release marker and
// reports the guest as existing until the node confirmed it released it;
// then it deletes the marker, so nothing of the VM is left in NATS but the
// node's report of its orphan. Only the plain half of the reconcile calls
// it, never Observe: it publishes.
func (e *external) observeRelease(ctx context.Context, vm *v1alpha1.VirtualMachine, node string) (managed.ExternalObservation, error) {
	if node == "" {
		return managed.ExternalObservation{ResourceExists: false}, nil
	}
	uid := string(vm.UID)
	if rep, ok := e.fleet.Guests.Report(node, uid); ok && rep.Report.Released {
		if err := bus.Delete(ctx, e.fleet.Bus, wire.GuestIntents, node, uid); err != nil {
			return managed.ExternalObservation{}, e.busFailed(uid, errors.Wrapf(err, "cannot delete the release marker on node %s", node))
		}
		e.state.published.Delete(vm.UID)
		e.state.intentBytes.free(vm.UID)
		e.state.deleted.Store(vm.UID, struct{}{})
		e.opts.Placer.Release(uid)
		e.recorder.Event(vm, event.Normal(ReasonOrphaned, fmt.Sprintf("The guest stays on node %s as it is, orphaned; a VirtualMachine %s/%s adopts it", node, vm.Namespace, vm.Name)))
		return managed.ExternalObservation{ResourceExists: false}, nil
	}
	marker := wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: uid, Namespace: vm.Namespace, Name: vm.Name, Generation: vm.Generation, Release: true,
		Seal: e.fleet.OrphanSeal(uid, node, vm.Namespace, vm.Name)}
	if published, _ := e.state.published.Load(vm.UID); published != fingerprint(marker) {
		if _, err := bus.Put(ctx, e.fleet.Bus, wire.GuestIntents, node, marker.UID, marker); err != nil {
			return managed.ExternalObservation{}, e.busFailed(uid, errors.Wrapf(err, "cannot publish the release marker to node %s", node))
		}
		e.state.published.Store(vm.UID, fingerprint(marker))
	}
	return managed.ExternalObservation{}, &ReleasingError{Node: node}
}

// claimOf is the existing guest the VM takes over or observes, if any.
func claimOf(vm *v1alpha1.VirtualMachine) *wire.Claim {
	if ext := meta.GetExternalName(vm); ext != "" {
		return &wire.Claim{ExternalName: ext}
	}
	if uid := vm.GetAnnotations()[v1alpha1.AnnotationAdopted]; uid != "" {
		return &wire.Claim{Orphan: uid}
	}
	return nil
}

// ObserveOnly is whether a resource's management policies only let the
// hub look: neither create nor update (managementPolicies [Observe]).
func ObserveOnly(mg resource.Manageable) bool {
	if len(mg.GetManagementPolicies()) == 0 {
		return false
	}
	for _, p := range mg.GetManagementPolicies() {
		switch p {
		case xpv2.ManagementActionAll, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate:
			return false
		}
	}
	return true
}

// withClaim adds to in the guest the VM claims; an intent that only
// observes carries no machine, which the node would not use.
func withClaim(vm *v1alpha1.VirtualMachine, in wire.Intent) wire.Intent {
	in.Claim = claimOf(vm)
	if in.Claim != nil && ObserveOnly(vm) {
		in.ObserveOnly, in.Machine = true, wire.Machine{}
	}
	return in
}
