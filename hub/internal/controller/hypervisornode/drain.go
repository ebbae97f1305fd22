package hypervisornode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
)

// LabelDrain marks the VirtualMachineMigrations a drain created with a hash
// of the drained node's name (a node name may be longer than a label
// value).
const LabelDrain = v1alpha1.Group + "/drain"

// drainLabel is the LabelDrain value of node.
func drainLabel(node string) string {
	h := sha256.Sum256([]byte(node))
	return hex.EncodeToString(h[:8])
}

// drain moves the VMs of node away, one VirtualMachineMigration per VM,
// and says how far it got. A VM that keeps its place (evictionStrategy
// None), whose snapshots live on the node (they would not follow it),
// whose migration finds no node to go to (capacity, a placement group's
// rule), or whose drain migration failed blocks the drain until someone
// acts:
// deleting the snapshots, or the failed migration, has the drain try
// again. A node that moves its VMs between its own hosts keeps their
// snapshots wherever they run.
func (r *Reconciler) drain(ctx context.Context, node string, hb wire.NodeHeartbeat, vms []v1alpha1.VirtualMachine) (*v1alpha1.DrainStatus, error) {
	st := &v1alpha1.DrainStatus{Phase: v1alpha1.DrainDrained, Remaining: int32(len(vms))} //nolint:gosec // far fewer VMs than 2^31 on one node
	var blocked []string
	for i := range vms {
		vm := &vms[i]
		if s := vm.Spec.ForProvider.EvictionStrategy; s != nil && *s == v1alpha1.EvictionNone {
			blocked = append(blocked, fmt.Sprintf("%s/%s stays (evictionStrategy None)", vm.Namespace, vm.Name))
			continue
		}
		l := &v1alpha1.VirtualMachineMigrationList{}
		if err := r.kube.List(ctx, l, client.InNamespace(vm.Namespace), client.MatchingFields{index.MigrationsOfVM.Index: vm.Name}); err != nil {
			return nil, errors.Wrapf(err, "cannot list the migrations of VM %s/%s", vm.Namespace, vm.Name)
		}
		if i := slices.IndexFunc(l.Items, func(m v1alpha1.VirtualMachineMigration) bool { return !m.Done() }); i >= 0 {
			if m := l.Items[i]; m.Status.Phase == v1alpha1.MigrationPending && strings.HasPrefix(m.Status.Message, v1alpha1.MigrationNoTarget) {
				blocked = append(blocked, fmt.Sprintf("%s/%s: migration %s waits: %s", vm.Namespace, vm.Name, m.Name, m.Status.Message))
				continue
			}
			st.Migrating++
			continue
		}
		if !hb.HostMigration {
			snapshots, err := virtualmachine.SnapshotsOn(ctx, r.kube, vm, node)
			if err != nil {
				return nil, err
			}
			if len(snapshots) > 0 {
				blocked = append(blocked, fmt.Sprintf("%s/%s: %s", vm.Namespace, vm.Name, virtualmachine.SnapshotsHold(snapshots, node)))
				continue
			}
		}
		name := drainMigrationName(vm.Name, node)
		if i := slices.IndexFunc(l.Items, func(m v1alpha1.VirtualMachineMigration) bool { return m.Name == name }); i >= 0 && l.Items[i].Status.Phase == v1alpha1.MigrationFailed {
			blocked = append(blocked, fmt.Sprintf("%s/%s: migration %s failed (%s); delete it to try again", vm.Namespace, vm.Name, name, l.Items[i].Status.Message))
			continue
		}
		m := &v1alpha1.VirtualMachineMigration{}
		m.SetNamespace(vm.Namespace)
		m.SetName(name)
		m.SetLabels(map[string]string{LabelDrain: drainLabel(node)})
		m.Spec.VMName = v1alpha1.LocalName(vm.Name)
		if err := r.kube.Create(ctx, m); err != nil && !kerrors.IsAlreadyExists(err) {
			return nil, errors.Wrapf(err, "cannot create the migration of VM %s/%s", vm.Namespace, vm.Name)
		}
		st.Migrating++
	}
	switch {
	case st.Remaining == 0:
	case st.Migrating > 0:
		st.Phase = v1alpha1.DrainDraining
	default:
		st.Phase = v1alpha1.DrainBlocked
	}
	if len(blocked) > 0 {
		st.Message = "waiting for " + strings.Join(blocked, "; ")
	}
	return st, nil
}

// drainMigrationName names the migration a drain of node makes for a VM: a
// second drain of the node finds it, and one of another node makes its own.
func drainMigrationName(vm, node string) string {
	suffix := "-drain-" + drainLabel(node)[:10]
	if len(vm)+len(suffix) > 253 {
		vm = vm[:253-len(suffix)]
	}
	return vm + suffix
}
