package virtualmachine

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// Restore is a restore a VM is under, as its AnnotationRestore says: the
// VirtualMachineRestore's uid and the uid of the snapshot it restores.
type Restore struct {
	ID       string
	Snapshot string
}

// String is the annotation's value.
func (r Restore) String() string { return r.ID + "/" + r.Snapshot }

// RestoreSeal is the hub's mark on the restore r of the VM uid. It is made
// apart from a migration's seal (MigrationSeal), so neither can stand for
// the other.
func RestoreSeal(f *fleet.Fleet, uid string, r Restore) string {
	return f.Seal(uid, r.Snapshot, "restore "+r.ID)
}

// RestoreOf is the restore vm is under: its AnnotationRestore, if the hub
// sealed it in f. A restore annotation written by hand is never acted on:
// a tenant could otherwise have a node revert a guest to any snapshot of
// its choosing, another VM's among them.
func RestoreOf(vm metav1.Object, f *fleet.Fleet) (Restore, bool) {
	id, snapshot, sealed := sealedPair(vm, v1alpha1.AnnotationRestore, v1alpha1.AnnotationRestoreSeal, func(id, snapshot string) string {
		return RestoreSeal(f, string(vm.GetUID()), Restore{ID: id, Snapshot: snapshot})
	})
	if !sealed {
		return Restore{}, false
	}
	return Restore{ID: id, Snapshot: snapshot}, true
}

// restore is what the intent to vm's node asks of a restore: the sealed
// restore the VM is under, but only for a node that announces snapshots
// (an older agent would not know the field, and would never report the
// restore over), and never during a migration, which moves the guest the
// restore is for.
func (e *external) restore(vm *v1alpha1.VirtualMachine, node string) *wire.Restore {
	r, ok := RestoreOf(vm, e.fleet)
	if !ok || !e.fleet.Node(node).Heartbeat.Snapshots {
		return nil
	}
	if _, migrating := MigrationOf(vm, e.fleet); migrating {
		return nil
	}
	return &wire.Restore{ID: r.ID, Snapshot: r.Snapshot}
}

// AdmittedNode is the node vm is on as this controller sees it: the node
// its annotation names, if the VM is admitted there (admitNode: the hub
// placed it, or its namespace may choose nodes, or the node runs this very
// guest). It is "" for a VM on no node, and an error for a node annotation
// the VM may not have, one written by hand above all: nothing is
// published to such a node, so nothing of the VM is there to act on. A VM
// whose annotations were rewound to an earlier sealed binding
// (Fleet.Replayed), or changed to a node it may not have, while it held a
// sealed binding is on that binding's node: its guest runs there until
// the hub restores the annotations.
func AdmittedNode(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (string, error) {
	held, err := f.Held(string(vm.UID))
	if err != nil {
		return "", err
	}
	if f.Replayed(vm) {
		return held.Node, nil
	}
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if node == "" || f.Sealed(vm) {
		return node, nil
	}
	g, err := providerconfig.GrantOf(ctx, kube, vm.Namespace)
	if err != nil {
		return "", err
	}
	if err := admitNode(vm, node, g, f); err != nil {
		if held != nil {
			// Its annotation was changed by hand; its guest runs on
			// under the binding it holds until the hub writes it back.
			return held.Node, nil
		}
		return "", errors.Wrapf(err, "VirtualMachine %s is not admitted to node %s", vm.Name, node)
	}
	return node, nil
}
