package virtualmachine

import (
	"fmt"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

// UnmetError is Update's answer for a VM whose spec now asks for what its
// node does not offer: a node selector its node no longer matches, a
// Volume in a shared storage pool the node does not reach, another
// backend. Placement checked all of it once; the VM's owner (or the
// ProviderConfig's, or the node's labels) changed it since.
//
// Nothing is published then: the guest runs on as last published, never
// deleted and never changed behind the owner's back, and the VM says so in
// Synced and a Warning event, naming the field, until the field is changed
// back or the node offers it again. The VM is not moved: as Kubernetes
// leaves a pod whose node no longer matches its selector where it runs
// (IgnoredDuringExecution) and KubeVirt a VMI, moving it is its owner's
// choice (delete and re-create it, or migrate it); and moving it on a
// label's change would let whoever sets labels move guests.
//
// What the VM's namespace was granted (a node of its choosing, imports,
// host bridges, image sources, backup locations) is checked at each
// publish too, before this: by admitNode in Observe and by resolve in
// Update. A grant withdrawn stops every publish until it is given back.
type UnmetError struct {
	Node string
	// Field is what of the spec the node does not offer.
	Field string
	// Reason says what the node lacks.
	Reason string
}

func (e *UnmetError) Error() string {
	return fmt.Sprintf("cannot apply the spec on node %s: %s asks for what the node does not offer (%s); the guest runs on as last published. Change %s back, or delete and re-create the VM to place it anew",
		e.Node, e.Field, e.Reason, e.Field)
}

// unmet is the UnmetError of vm on node, whose dependencies d are
// resolved, or nil when node offers what vm asks for. A node the hub has
// no heartbeat of says nothing it could be checked against, and a VM
// under a migration is checked against its target by the migration: nil.
func (e *external) unmet(vm *v1alpha1.VirtualMachine, d dependencies, node string) error {
	if _, ok := MigrationOf(vm, e.fleet); ok {
		return nil
	}
	n, ok := e.fleet.Placeable(node)
	if !ok {
		return nil
	}
	req := requestOn(vm, d, e.defaults, "")
	reason, cause := placement.Unmet(n, req)
	if reason == "" {
		return nil
	}
	field := map[placement.Cause]string{
		placement.CauseBackend:  "spec.forProvider.backend",
		placement.CauseSelector: "spec.forProvider.nodeSelector",
		placement.CausePool:     "spec.forProvider.diskAttachments (the storagePool of a Volume)",
	}[cause]
	if cause == placement.CauseSelector {
		// The VM's own selector matches: the label is one the
		// ProviderConfig's default selector asks for.
		own := req
		own.NodeSelector = vm.Spec.ForProvider.NodeSelector
		if r, _ := placement.Unmet(n, own); r == "" {
			field = "the nodeSelector of the VM's ProviderConfig"
		}
	}
	return &UnmetError{Node: node, Field: field, Reason: reason}
}
