package virtualmachine

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// TypeMigrating is True while the VM moves live to another node.
const TypeMigrating xpv2.ConditionType = "Migrating"

// Migration is a live migration a VM is under, as its AnnotationMigration
// says: the VirtualMachineMigration's uid and the target node.
type Migration struct {
	ID     string
	Target string
}

// String is the annotation's value.
func (m Migration) String() string { return m.ID + "/" + m.Target }

// MigrationSeal is the hub's mark on the migration m of the VM uid.
func MigrationSeal(f *fleet.Fleet, uid string, m Migration) string {
	return f.Seal(uid, m.Target, "migration "+m.ID)
}

// MigrationOf is the live migration vm is under: its AnnotationMigration,
// if the hub sealed it in f. A migration annotation written by hand is
// never acted on.
func MigrationOf(vm metav1.Object, f *fleet.Fleet) (Migration, bool) {
	id, target, sealed := sealedPair(vm, v1alpha1.AnnotationMigration, v1alpha1.AnnotationMigrationSeal, func(id, target string) string {
		return MigrationSeal(f, string(vm.GetUID()), Migration{ID: id, Target: target})
	})
	if id == "" {
		return Migration{}, false
	}
	return Migration{ID: id, Target: target}, sealed
}

// sealedPair reads obj's annotation "<a>/<b>", the way the hub records an
// act on a VM (a migration, a restore), and says whether its seal
// annotation holds the mark seal makes of it. a and b are empty when the
// annotation is absent or malformed; a malformed one is never sealed.
func sealedPair(obj metav1.Object, annotation, sealAnnotation string, seal func(a, b string) string) (a, b string, sealed bool) {
	v := obj.GetAnnotations()
	a, b, ok := strings.Cut(v[annotation], "/")
	if !ok || a == "" || b == "" {
		return "", "", false
	}
	return a, b, hmac.Equal([]byte(v[sealAnnotation]), []byte(seal(a, b)))
}

// Leftovers are the nodes vm's AnnotationLeftovers lists, sealed or not:
// what the hub wrote. The hub acts on SealedLeftovers only.
func Leftovers(vm metav1.Object) []string {
	return leftovers(vm.GetAnnotations())
}

// SealedLeftovers are the nodes vm's AnnotationLeftovers lists, if the hub
// sealed the list in f (LeftoversSeal); none if not. A tenant can write
// the annotation, and the stray sweep keeps the VM's intents on the nodes
// it names.
func SealedLeftovers(vm metav1.Object, f *fleet.Fleet) []string {
	return sealedLeftovers(f, string(vm.GetUID()), vm.GetAnnotations())
}

// LeftoversSeal is the hub's mark on the leftovers list of the VM uid.
func LeftoversSeal(f *fleet.Fleet, uid, list string) string {
	return f.Seal(uid, list, "leftovers")
}

// sealedLeftovers are the nodes the annotations a of the VM uid list as
// left, if the hub sealed the list.
func sealedLeftovers(f *fleet.Fleet, uid string, a map[string]string) []string {
	l := a[v1alpha1.AnnotationLeftovers]
	if l == "" || !hmac.Equal([]byte(a[v1alpha1.AnnotationLeftoversSeal]), []byte(LeftoversSeal(f, uid, l))) {
		return nil
	}
	return strings.Split(l, ",")
}

// leftovers are the nodes the annotations a list as left.
func leftovers(a map[string]string) []string {
	v := a[v1alpha1.AnnotationLeftovers]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// WithLeftover adds node to the sealed leftovers of the annotations a of
// the VM uid, and seals the list again; nodes listed by hand are dropped.
func WithLeftover(f *fleet.Fleet, uid string, a map[string]string, node string) {
	l := sealedLeftovers(f, uid, a)
	if !slices.Contains(l, node) {
		l = append(l, node)
	}
	slices.Sort(l)
	setLeftovers(f, uid, a, l)
}

// setLeftovers records l, sealed, as the leftovers in the annotations a of
// the VM uid.
func setLeftovers(f *fleet.Fleet, uid string, a map[string]string, l []string) {
	if len(l) == 0 {
		delete(a, v1alpha1.AnnotationLeftovers)
		delete(a, v1alpha1.AnnotationLeftoversSeal)
		return
	}
	v := strings.Join(l, ",")
	a[v1alpha1.AnnotationLeftovers] = v
	a[v1alpha1.AnnotationLeftoversSeal] = LeftoversSeal(f, uid, v)
}

// Annotate changes vm's annotations with fn, under optimistic locking:
// what another controller recorded on the VM meanwhile (a migration, a
// restore, a move) is never overwritten with what this one read before.
// A conflict is returned as such; the write that caused it wakes the
// caller's controller again.
func Annotate(ctx context.Context, kube client.Client, vm *v1alpha1.VirtualMachine, fn func(a map[string]string)) error {
	patch := client.MergeFromWithOptions(vm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if vm.GetAnnotations() == nil {
		vm.SetAnnotations(map[string]string{})
	}
	fn(vm.GetAnnotations())
	return kube.Patch(ctx, vm, patch)
}

// plan is every intent the VM's nodes must hold, by node: its own node's,
// and during a migration the target's. The source is told to migrate once
// the target said it is ready for this migration, and from then on for
// good: a source told to migrate never starts the guest again, so it must
// not be told otherwise while the guest may be gone from it.
func (e *external) plan(vm *v1alpha1.VirtualMachine, d dependencies, node string) map[string]wire.Intent {
	in := intent(vm, d)
	e.holdGrowth(vm, node, &in.Machine)
	in.Restore = e.restore(vm, node)
	out := map[string]wire.Intent{node: in}
	m, ok := MigrationOf(vm, e.fleet)
	switch {
	case !ok:
		return out
	case m.Target == node:
		// A move between the node's own hosts: the node alone takes part.
		in.Migration = &wire.Migration{ID: m.ID, TargetNode: node, Cancel: cancelled(vm, m)}
		out[node] = in
		return out
	}
	uid := string(vm.UID)
	target := in
	target.Incoming = &wire.Incoming{ID: m.ID, SourceNode: node}
	out[m.Target] = target
	ready := false
	if r, ok := e.fleet.Guests.Report(m.Target, uid); ok && r.Report.Incoming == m.ID {
		ready = true
	}
	if r, ok := e.fleet.Guests.Report(node, uid); ok && r.Report.Migration != nil && r.Report.Migration.ID == m.ID {
		ready = true
	}
	if ready {
		source := in
		source.Migration = &wire.Migration{ID: m.ID, TargetNode: m.Target, TargetURI: e.fleet.Node(m.Target).Heartbeat.MigrationURI, Cancel: cancelled(vm, m)}
		out[node] = source
	}
	return out
}

// cancelled says whether the migration m of vm is to be aborted.
func cancelled(vm metav1.Object, m Migration) bool {
	return vm.GetAnnotations()[v1alpha1.AnnotationMigrationCancel] == m.ID
}

// planFingerprint identifies a plan; a plan of the VM's node alone has its
// intent's fingerprint.
func planFingerprint(p map[string]wire.Intent, node string) string {
	if len(p) == 1 {
		return fingerprint(p[node])
	}
	h := sha256.New()
	for _, n := range slices.Sorted(maps.Keys(p)) {
		fmt.Fprintf(h, "%s=%s;", n, fingerprint(p[n]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// placedOn are the nodes that may speak for vm: its node, the target of
// its migration and the nodes it left.
func (e *external) placedOn(vm *v1alpha1.VirtualMachine, node string) []string {
	out := []string{node}
	if m, ok := MigrationOf(vm, e.fleet); ok && m.Target != node {
		out = append(out, m.Target)
	}
	return append(out, e.left(vm, node)...)
}

// left are the nodes the VM left, as its sealed AnnotationLeftovers lists
// them, but never its node nor the target of its migration: the hub
// deletes the VM's intent on each node it names.
func (e *external) left(vm *v1alpha1.VirtualMachine, node string) []string {
	m, _ := MigrationOf(vm, e.fleet)
	var out []string
	for _, n := range SealedLeftovers(vm, e.fleet) {
		if n != node && n != m.Target {
			out = append(out, n)
		}
	}
	return out
}

// clearLeftovers deletes the VM's intent on each node it left, and drops
// from the annotation the nodes whose report is gone (they hold nothing of
// the VM any more) and those it may not name.
func (e *external) clearLeftovers(ctx context.Context, vm *v1alpha1.VirtualMachine, node string) error {
	all := SealedLeftovers(vm, e.fleet)
	if len(all) == 0 {
		return nil
	}
	uid := string(vm.UID)
	var keep []string
	for _, n := range e.left(vm, node) {
		if err := bus.Delete(ctx, e.fleet.Bus, wire.GuestIntents, n, uid); err != nil {
			return e.busFailed(uid, errors.Wrapf(err, "cannot delete the intent on node %s, which the VM left", n))
		}
		if _, reported := e.fleet.Guests.Report(n, uid); reported {
			keep = append(keep, n)
		}
	}
	if len(keep) == len(all) {
		return nil
	}
	return errors.Wrap(Annotate(ctx, e.kube, vm, func(a map[string]string) { setLeftovers(e.fleet, uid, a, keep) }), "cannot record the nodes the VM left")
}

// migratingCondition shows a migration in progress, and that it is over
// on a VM that showed one.
func (e *external) migratingCondition(vm *v1alpha1.VirtualMachine, node string) {
	m, ok := MigrationOf(vm, e.fleet)
	if !ok {
		if vm.GetCondition(TypeMigrating).Status == corev1.ConditionTrue {
			vm.SetConditions(xpv2.Condition{Type: TypeMigrating, Status: corev1.ConditionFalse, Reason: "NotMigrating", LastTransitionTime: now()})
		}
		return
	}
	msg := fmt.Sprintf("moving live from node %s to node %s", node, m.Target)
	if r, ok := e.fleet.Guests.Report(node, string(vm.UID)); ok && r.Report.Migration != nil && r.Report.Migration.ID == m.ID {
		if mr := r.Report.Migration; mr.TotalBytes > 0 {
			msg += fmt.Sprintf(": %d of %d MiB copied", mr.ProcessedBytes>>20, mr.TotalBytes>>20)
		}
	}
	vm.SetConditions(xpv2.Condition{Type: TypeMigrating, Status: corev1.ConditionTrue, Reason: "Migrating", Message: msg, LastTransitionTime: now()})
}
