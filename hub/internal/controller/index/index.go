// Package index owns the field indexes by which a resource finds the
// resources that use it: VirtualMachines by the Volumes and VirtualNetworks
// they attach, Volumes by the DiskImage they are made from. Each index is
// described once, as the inuse.User of the used kind, so the indexer the
// manager registers and the names the inuse controller watches for are the
// same function.
package index

import (
	"context"
	"slices"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
)

// VolumeUsers are the VirtualMachines using a Volume: those attaching it,
// through spec.forProvider.diskAttachments, and those whose guest still
// holds it, through status.atProvider.disks. A disk removed from the spec
// stays on the guest until it releases it (a detach the guest has not
// acknowledged, or one only a restart makes): until then the Volume is in
// use, and deleting it would delete the disk under the guest. Each name is
// listed once, the spec's first, in its order.
var VolumeUsers = vmUser("spec.forProvider.diskAttachments.name+status.atProvider.disks", func(vm *v1alpha1.VirtualMachine) []string {
	names := make([]string, 0, len(vm.Spec.ForProvider.DiskAttachments))
	for _, a := range vm.Spec.ForProvider.DiskAttachments {
		names = append(names, string(a.Name))
	}
	for _, d := range vm.Status.AtProvider.Disks {
		if !slices.Contains(names, d) {
			names = append(names, d)
		}
	}
	return names
})

// NetworkUsers are the VirtualMachines attached to a VirtualNetwork, through
// spec.forProvider.virtualNetworks. A network shows the nodes its VMs run
// on.
var NetworkUsers = withNode(vmUser("spec.forProvider.virtualNetworks", func(vm *v1alpha1.VirtualMachine) []string {
	names := make([]string, 0, len(vm.Spec.ForProvider.VirtualNetworks))
	for _, n := range vm.Spec.ForProvider.VirtualNetworks {
		names = append(names, string(n))
	}
	return names
}), func(o client.Object) string {
	if vm, ok := o.(*v1alpha1.VirtualMachine); ok {
		return vm.Status.AtProvider.Node
	}
	return ""
})

// withNode is u whose objects are on the node node says.
func withNode(u inuse.User, node func(client.Object) string) inuse.User {
	u.Node = node
	return u
}

// ImageUsers are the Volumes made from a DiskImage, through
// spec.forProvider.source.diskImageRef.
var ImageUsers = inuse.User{
	Kind:    v1alpha1.VolumeKind,
	New:     func() client.Object { return &v1alpha1.Volume{} },
	NewList: func() client.ObjectList { return &v1alpha1.VolumeList{} },
	Index:   "spec.forProvider.source.diskImageRef.name",
	Uses: func(o client.Object) []string {
		v, ok := o.(*v1alpha1.Volume)
		if !ok || v.Spec.ForProvider.Source == nil || v.Spec.ForProvider.Source.DiskImageRef == nil {
			return nil
		}
		return []string{string(v.Spec.ForProvider.Source.DiskImageRef.Name)}
	},
	// An image is placed on the nodes its Volumes are bound to.
	Node: func(o client.Object) string { return o.GetAnnotations()[v1alpha1.AnnotationNode] },
}

// NodeUsers are the VirtualMachines whose node annotation names a node
// (its HypervisorNode). A tenant can write that annotation, and an index
// function knows neither the fleet's seal key nor the grants, which change
// without the VM changing: these are the VMs that claim the node, and a
// reader keeps those virtualmachine.IsOn the node before counting them,
// draining them or waiting for them.
var NodeUsers = vmUser("metadata.annotations.node", func(vm *v1alpha1.VirtualMachine) []string {
	if node := vm.GetAnnotations()[v1alpha1.AnnotationNode]; node != "" {
		return []string{node}
	}
	return nil
})

// PlacementGroupMembers are the VirtualMachines in a PlacementGroup,
// through spec.forProvider.placementGroup.
var PlacementGroupMembers = vmUser("spec.forProvider.placementGroup", func(vm *v1alpha1.VirtualMachine) []string {
	if g := vm.Spec.ForProvider.PlacementGroup; g != nil {
		return []string{string(*g)}
	}
	return nil
})

// MigrationsOfVM are the VirtualMachineMigrations moving a VirtualMachine,
// through spec.vmName.
var MigrationsOfVM = inuse.User{
	Kind:    v1alpha1.VirtualMachineMigrationKind,
	New:     func() client.Object { return &v1alpha1.VirtualMachineMigration{} },
	NewList: func() client.ObjectList { return &v1alpha1.VirtualMachineMigrationList{} },
	Index:   "spec.vmName",
	Uses: func(o client.Object) []string {
		if m, ok := o.(*v1alpha1.VirtualMachineMigration); ok {
			return []string{string(m.Spec.VMName)}
		}
		return nil
	},
}

// SnapshotsOfVM are the VirtualMachineSnapshots of a VirtualMachine,
// through spec.vmName: a VM with snapshots on its node does not move, and
// one being restored takes no snapshot.
var SnapshotsOfVM = inuse.User{
	Kind:    v1alpha1.VirtualMachineSnapshotKind,
	New:     func() client.Object { return &v1alpha1.VirtualMachineSnapshot{} },
	NewList: func() client.ObjectList { return &v1alpha1.VirtualMachineSnapshotList{} },
	Index:   "spec.vmName",
	Uses: func(o client.Object) []string {
		if s, ok := o.(*v1alpha1.VirtualMachineSnapshot); ok {
			return []string{string(s.Spec.VMName)}
		}
		return nil
	},
}

// RestoresOfSnapshot are the VirtualMachineRestores restoring a
// VirtualMachineSnapshot, through spec.snapshotName: a snapshot being
// restored is not deleted until the restore is over.
var RestoresOfSnapshot = inuse.User{
	Kind:    v1alpha1.VirtualMachineRestoreKind,
	New:     func() client.Object { return &v1alpha1.VirtualMachineRestore{} },
	NewList: func() client.ObjectList { return &v1alpha1.VirtualMachineRestoreList{} },
	Index:   "spec.snapshotName",
	Uses: func(o client.Object) []string {
		if r, ok := o.(*v1alpha1.VirtualMachineRestore); ok {
			return []string{string(r.Spec.SnapshotName)}
		}
		return nil
	},
}

// ClonesOfSnapshot are the VirtualMachineClones copying a
// VirtualMachineSnapshot, through spec.source.name where spec.source.kind
// is VirtualMachineSnapshot: the snapshot is not deleted until the clone
// is over.
var ClonesOfSnapshot = inuse.User{
	Kind:    v1alpha1.VirtualMachineCloneKind,
	New:     func() client.Object { return &v1alpha1.VirtualMachineClone{} },
	NewList: func() client.ObjectList { return &v1alpha1.VirtualMachineCloneList{} },
	Index:   "spec.source.snapshotName",
	Uses: func(o client.Object) []string {
		if c, ok := o.(*v1alpha1.VirtualMachineClone); ok && c.Spec.Source.Kind == v1alpha1.CloneFromVirtualMachineSnapshot {
			return []string{string(c.Spec.Source.Name)}
		}
		return nil
	},
}

// ImagesOfSnapshot are the DiskImages copying a Volume as a
// VirtualMachineSnapshot holds it, through
// spec.forProvider.source.snapshotRef: the snapshot is not deleted until
// the image is made.
var ImagesOfSnapshot = inuse.User{
	Kind:    v1alpha1.DiskImageKind,
	New:     func() client.Object { return &v1alpha1.DiskImage{} },
	NewList: func() client.ObjectList { return &v1alpha1.DiskImageList{} },
	Index:   "spec.forProvider.source.snapshotRef.name",
	Uses: func(o client.Object) []string {
		if img, ok := o.(*v1alpha1.DiskImage); ok && img.Spec.ForProvider.Source.SnapshotRef != nil {
			return []string{string(img.Spec.ForProvider.Source.SnapshotRef.Name)}
		}
		return nil
	},
}

// all are the indexes Setup registers.
var all = []inuse.User{VolumeUsers, NetworkUsers, ImageUsers, NodeUsers, PlacementGroupMembers, MigrationsOfVM, SnapshotsOfVM, RestoresOfSnapshot, ClonesOfSnapshot, ImagesOfSnapshot}

// vmUser describes VirtualMachines as users of what index names.
func vmUser(index string, uses func(*v1alpha1.VirtualMachine) []string) inuse.User {
	return inuse.User{
		Kind:    v1alpha1.VirtualMachineKind,
		New:     func() client.Object { return &v1alpha1.VirtualMachine{} },
		NewList: func() client.ObjectList { return &v1alpha1.VirtualMachineList{} },
		Index:   index,
		Uses: func(o client.Object) []string {
			if vm, ok := o.(*v1alpha1.VirtualMachine); ok {
				return uses(vm)
			}
			return nil
		},
	}
}

// Setup registers every index. They serve several controllers, so they must
// exist before any of them starts, whatever order their gates open in.
func Setup(ctx context.Context, mgr ctrl.Manager) error {
	return Register(ctx, mgr.GetFieldIndexer())
}

// Register registers every index with indexer, a manager's or a bare
// informer cache's.
func Register(ctx context.Context, indexer client.FieldIndexer) error {
	for _, u := range all {
		if err := indexer.IndexField(ctx, u.New(), u.Index, u.Uses); err != nil {
			return errors.Wrapf(err, "cannot index %ss by %s", u.Kind, u.Index)
		}
	}
	return nil
}

// VirtualMachines lists the VirtualMachines in o's namespace whose field u
// indexes names o; u is VolumeUsers, NetworkUsers or
// PlacementGroupMembers. Read from a cache, the VMs are the cache's own,
// not copies (a network's users are every VM of a fleet): the caller reads
// them and never changes them.
func VirtualMachines(ctx context.Context, kube client.Reader, u inuse.User, o client.Object) ([]v1alpha1.VirtualMachine, error) {
	l := &v1alpha1.VirtualMachineList{}
	if err := kube.List(ctx, l, client.InNamespace(o.GetNamespace()), client.MatchingFields{u.Index: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, errors.Wrap(err, "cannot list VirtualMachines")
	}
	return l.Items, nil
}

// Requests are reconcile requests for the VirtualMachines VirtualMachines
// lists; a failed list requests none.
func Requests(ctx context.Context, kube client.Reader, u inuse.User, o client.Object) []reconcile.Request {
	vms, err := VirtualMachines(ctx, kube, u, o)
	if err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(vms))
	for i := range vms {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&vms[i])})
	}
	return out
}
