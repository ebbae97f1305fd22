package virtualmachine

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

// admitNode says whether vm may be on node, the node its annotation names:
// the hub placed it there (the annotation carries the fleet's seal), or
// the node runs this very VM's guest (a report under its uid: a placement
// from before seals, whose intent only the hub can have published), or its
// namespace was granted what the annotation asks, an import or a node of
// its own choosing. Nothing is published to a node a VM is not admitted
// to, so a refused VM touches nothing there, and reveals nothing of it.
func admitNode(vm *v1alpha1.VirtualMachine, node string, g tenancy.Grant, f *fleet.Fleet) error {
	if ext := meta.GetExternalName(vm); ext != "" {
		return g.CheckImport("VirtualMachine", ext)
	}
	if f.Sealed(vm) {
		return nil
	}
	if _, ok := f.Guests.Report(node, string(vm.UID)); ok {
		return nil
	}
	return g.CheckNode("VirtualMachine", node)
}

// IsOn says whether vm is on node as AdmittedNode sees it in one of
// fleets, those node may belong to. Whatever counts a node's VMs, drains
// it or moves VMs off it asks this, never the node annotation alone: a
// tenant writes that annotation, and a VM refused there has nothing on the
// node, so it must count on no node and hold up no drain.
func IsOn(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine, node string, fleets []*fleet.Fleet) (bool, error) {
	// A VM whose binding was changed by hand is on its recorded node
	// (AdmittedNode), which its annotation no longer names.
	var b *v1alpha1.Binding
	for _, f := range fleets {
		held, err := f.Held(string(vm.UID))
		if err != nil {
			return false, err
		}
		b = cmp.Or(b, held)
	}
	if node == "" || (vm.GetAnnotations()[v1alpha1.AnnotationNode] != node && (b == nil || b.Node != node)) {
		return false, nil
	}
	var refused *tenancy.RefusedError
	for _, f := range fleets {
		switch bound, err := AdmittedNode(ctx, kube, vm, f); {
		case err == nil:
			return bound == node, nil
		case !errors.As(err, &refused):
			return false, err
		}
	}
	return false, nil
}

// AdmittedOn are those of vms that IsOn node. The result shares the VMs'
// contents with vms, which may be a cache's own: read it, never change it.
func AdmittedOn(ctx context.Context, kube client.Reader, vms []v1alpha1.VirtualMachine, node string, fleets []*fleet.Fleet) ([]v1alpha1.VirtualMachine, error) {
	out := make([]v1alpha1.VirtualMachine, 0, len(vms))
	for i := range vms {
		on, err := IsOn(ctx, kube, &vms[i], node, fleets)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot tell whether VirtualMachine %s/%s is on node %s", vms[i].Namespace, vms[i].Name, node)
		}
		if on {
			out = append(out, vms[i])
		}
	}
	return out, nil
}

// recordBinding records the sealed binding of vm, a placed VM, where the
// hub holds no record of it: a VM placed by a hub from before the records
// (Fleet.Record) has none until its intent is next published, and that
// may be never (an Observe-only VM, a spec its node no longer fits), while
// without a record an earlier binding's seal copied back by hand passes
// for the VM's own. The binding sealed in its annotations is the one the
// hub trusted until now, so it is recorded as it is, on the VM's first
// reconcile after the hub starts; the intent is left as published.
func (e *external) recordBinding(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	held, err := e.fleet.Held(string(vm.UID))
	if err != nil || held != nil {
		return err
	}
	b := e.fleet.Binding(vm)
	if b == nil {
		return nil
	}
	if err := e.fleet.Record(ctx, string(vm.UID), *b); err != nil {
		return e.busFailed(string(vm.UID), err)
	}
	return nil
}

// recordedAsShown says whether the hub's record of the VM's binding (held)
// is the binding the VM shows: one the hub sealed and has not recorded
// yet makes the VM out of date, so that its next publish records it.
func recordedAsShown(shown, held *v1alpha1.Binding) bool {
	return shown == nil || (held != nil && *shown == *held)
}

// admit says whether the VM may use what it refers to: a Volume bound to a
// node by hand (not boundByHub) or importing a node's volume, a DiskImage
// importing an image of the node's backend, a VirtualNetwork importing a
// node's network or joining a host bridge; each
// is refused unless g, its namespace's grant, allows it. It gives the
// images the sources g allows.
func (d *dependencies) admit(g tenancy.Grant, boundByHub func(metav1.Object) bool) error {
	volume := func(v *v1alpha1.Volume) error {
		node := v.GetAnnotations()[v1alpha1.AnnotationNode]
		switch ext := meta.GetExternalName(v); {
		case ext != "":
			return g.CheckImport(fmt.Sprintf("Volume %s", v.Name), ext)
		case node != "" && !boundByHub(v):
			return g.CheckNode(fmt.Sprintf("Volume %s", v.Name), node)
		}
		return nil
	}
	for i := range d.volumes {
		if err := volume(&d.volumes[i]); err != nil {
			return err
		}
	}
	for _, image := range slices.Sorted(maps.Keys(d.sources)) {
		if err := volume(d.sources[image]); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.images)) {
		img := d.images[name]
		src := img.Spec.ForProvider.Source
		if b := src.Backup; b != nil {
			if err := g.CheckBackupLocation(b.Location); err != nil {
				return err
			}
			if err := g.CheckRestoreFrom(cmp.Or(b.Namespace, img.Namespace)); err != nil {
				return err
			}
			continue
		}
		if src.URL != "" || src.VolumeRef != nil {
			continue
		}
		ext := meta.GetExternalName(img)
		if ext == "" {
			return errors.Errorf("DiskImage %s has no source: set spec.forProvider.source.url, source.volumeRef or source.backup, or name an image of the node's backend in its %s annotation", name, meta.AnnotationKeyExternalName)
		}
		if err := g.CheckImport(fmt.Sprintf("DiskImage %s", name), ext); err != nil {
			return err
		}
	}
	for i := range d.networks {
		if err := g.CheckNetwork(&d.networks[i]); err != nil {
			return err
		}
	}
	d.imageSources = g.ImageSources
	return nil
}

// RestoredBindingError is returned for a VM whose binding annotations
// were changed by hand, to an earlier sealed binding or to a node without
// a seal, while it held a sealed binding: the hub wrote that one back.
type RestoredBindingError struct {
	// Node is the node of the binding restored.
	Node string
}

func (e *RestoredBindingError) Error() string {
	return fmt.Sprintf("the VM's binding annotations were changed by hand; its guest runs on node %s, whose binding the hub restored", e.Node)
}

// restoreBinding writes back b, the binding the hub recorded for vm, over
// what its annotations were changed to, so the VM stays where its guest
// runs.
func (e *external) restoreBinding(ctx context.Context, vm *v1alpha1.VirtualMachine, b v1alpha1.Binding) error {
	if err := Annotate(ctx, e.kube, vm, func(a map[string]string) { e.fleet.Restore(vm, a, b) }); err != nil {
		return errors.Wrap(err, "cannot restore the VM's binding")
	}
	return &RestoredBindingError{Node: b.Node}
}
