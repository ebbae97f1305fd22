package virtualmachine

import (
	"fmt"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		if src.URL != "" || src.VolumeRef != nil {
			continue
		}
		ext := meta.GetExternalName(img)
		if ext == "" {
			return errors.Errorf("DiskImage %s has no source: set spec.forProvider.source.url or source.volumeRef, or name an image of the node's backend in its %s annotation", name, meta.AnnotationKeyExternalName)
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
