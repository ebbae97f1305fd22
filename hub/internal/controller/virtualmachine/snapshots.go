package virtualmachine

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// ReasonSnapshotsLost is the Warning event of a VM restarted away from its
// lost node, whose snapshots stayed there.
const ReasonSnapshotsLost event.Reason = "SnapshotsLost"

// SnapshotsOn are the names of vm's VirtualMachineSnapshots that live on
// node, or are about to, sorted. libvirt keeps a guest's snapshots inside
// its node's qcow2 files, which a live migration's storage copy does not
// carry: a VM with such snapshots cannot move without losing them. Failed
// and Lost snapshots hold nothing there, one on another node holds nothing
// here, and one of another VM under the same name (made after this one
// was deleted) is not vm's.
func SnapshotsOn(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine, node string) ([]string, error) {
	l := &v1alpha1.VirtualMachineSnapshotList{}
	if err := kube.List(ctx, l, client.InNamespace(vm.Namespace), client.MatchingFields{index.SnapshotsOfVM.Index: vm.Name}); err != nil {
		return nil, errors.Wrapf(err, "cannot list the snapshots of VM %s", vm.Name)
	}
	var out []string
	for i := range l.Items {
		st := l.Items[i].Status
		switch {
		case st.Phase == v1alpha1.SnapshotFailed || st.Phase == v1alpha1.SnapshotLost:
		case st.SourceUID != "" && st.SourceUID != string(vm.UID):
		case st.Node != "" && st.Node != node:
		default:
			out = append(out, l.Items[i].Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// KeepsSnapshots says why node cannot take or restore a snapshot now, and
// whether that is final: its backend keeps none, which no wait changes.
// A node lost, or not heard from since the hub started, may yet answer;
// until its heartbeat is read, whether it keeps snapshots is not known.
// It is "" when the node can.
func KeepsSnapshots(f *fleet.Fleet, node string) (why string, final bool) {
	return offers(f, node, func(h wire.NodeHeartbeat) bool { return h.Snapshots }, "keeps no snapshots")
}

// TakesBackups says, as KeepsSnapshots does, why node cannot be asked for
// a backup now, or ever (final).
func TakesBackups(f *fleet.Fleet, node string) (why string, final bool) {
	return offers(f, node, func(h wire.NodeHeartbeat) bool { return h.Backups }, "takes no backups")
}

// offers says why node cannot be asked for what its heartbeat announces
// with has: it is lost or not heard from yet (wait), or it lacks it
// (final).
func offers(f *fleet.Fleet, node string, has func(wire.NodeHeartbeat) bool, lacks string) (why string, final bool) {
	n, heard := f.Heard(node)
	switch {
	case f.Node(node).Lost:
		return fmt.Sprintf("node %s sends no heartbeat; waiting for it to be back", node), false
	case !heard:
		return fmt.Sprintf("waiting for the first heartbeat of node %s", node), false
	case !has(n.Heartbeat):
		return fmt.Sprintf("node %s (backend %s) %s", node, n.Heartbeat.Backend, lacks), true
	}
	return "", false
}

// SnapshotsHold says why vm, whose snapshots SnapshotsOn found on node,
// cannot move: what a migration or a drain refused with tells the user
// what to do.
func SnapshotsHold(snapshots []string, node string) string {
	return fmt.Sprintf("VM has snapshots %s on node %s that cannot move with it: delete them first", strings.Join(snapshots, ", "), node)
}
