package virtualmachine

import (
	"context"
	"fmt"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

// MissingGroupError says that the PlacementGroup a VM names does not
// exist.
type MissingGroupError struct {
	Namespace, Name string
}

func (e *MissingGroupError) Error() string {
	return fmt.Sprintf("waiting for PlacementGroup %s in namespace %s: create it and the VM is placed by it", e.Name, e.Namespace)
}

// GroupOf is vm's placement group as placement reads it: the group's
// policy, and the nodes the other VMs of vm's namespace that name it are
// on in f, as IsOn has it (a node annotation a tenant wrote places no
// member anywhere). A VM that names no group has none; one that names a
// group that does not exist waits for it, with a MissingGroupError saying
// so: a misspelt name, or a group applied after its VMs, must not place
// them as if they had none. Placing the VM reads it; a live migration's
// target and an HA restart's read MovedGroupOf, so the group holds
// wherever the hub chooses a node.
func GroupOf(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (*placement.Group, error) {
	name := vm.Spec.ForProvider.PlacementGroup
	if name == nil {
		return nil, nil
	}
	pg := &v1alpha1.PlacementGroup{}
	switch err := kube.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: string(*name)}, pg); {
	case kerrors.IsNotFound(err):
		return nil, &MissingGroupError{Namespace: vm.Namespace, Name: string(*name)}
	case err != nil:
		return nil, errors.Wrapf(err, "cannot get PlacementGroup %s", *name)
	}
	g := &placement.Group{
		Key:          vm.Namespace + "/" + pg.Name,
		Name:         pg.Name,
		AntiAffinity: pg.Spec.Policy == v1alpha1.PlacementAntiAffinity,
		Required:     pg.Spec.IsRequired(),
		TopologyKey:  pg.Spec.TopologyKey,
	}
	members, err := index.VirtualMachines(ctx, kube, index.PlacementGroupMembers, pg)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot list the VMs of PlacementGroup %s", pg.Name)
	}
	for i := range members {
		m := &members[i]
		if m.UID == vm.UID {
			continue
		}
		node := m.GetAnnotations()[v1alpha1.AnnotationNode]
		on, err := IsOn(ctx, kube, m, node, []*fleet.Fleet{f})
		if err != nil {
			return nil, errors.Wrapf(err, "cannot tell where VM %s of PlacementGroup %s is", m.Name, pg.Name)
		}
		if on {
			if g.Members == nil {
				g.Members = map[string]string{}
			}
			g.Members[string(m.UID)] = node
		}
	}
	return g, nil
}

// MovedGroupOf is GroupOf for a VM placed already, which a live migration
// or an HA restart moves: a group deleted since binds it no more. Waiting
// for the group there would keep a drained node's VM from leaving, and a
// lost node's VM from ever running again, for a rule nobody keeps.
func MovedGroupOf(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine, f *fleet.Fleet) (*placement.Group, error) {
	g, err := GroupOf(ctx, kube, vm, f)
	if missing := (*MissingGroupError)(nil); errors.As(err, &missing) {
		return nil, nil
	}
	return g, err
}
