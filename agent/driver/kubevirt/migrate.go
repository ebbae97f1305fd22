package kubevirt

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// What virtfleet writes on the VirtualMachineInstanceMigrations it makes,
// besides LabelUID, the managed-by label and AnnotationNamespace and
// AnnotationName, as on its other objects.
const (
	// AnnotationMigration is the id of the migration the object is for.
	AnnotationMigration = "virtfleet.io/migration"
	// AnnotationMigratedVMI is the uid of the VMI it moves: once that VMI
	// shows the target node, so does Observe.
	AnnotationMigratedVMI = "virtfleet.io/vmi-uid"
)

// maxMigrations bounds the migrations whose status the driver keeps in
// memory; the oldest go first. A status forgotten is read again from its
// VirtualMachineInstanceMigration while KubeVirt keeps that.
const maxMigrations = 1024

var _ driver.HostMigrator = (*Driver)(nil)

// MigrationName is the VirtualMachineInstanceMigration of the migration
// with id: "vf-" and the id when that is a valid name, else "vf-" and a
// hash of it. A repeated MigrateHost finds it by this name rather than
// making a second.
func MigrationName(id string) string { return idName(id) }

// idName names the object of the act with id: "vf-" and the id when that
// is a valid name, else "vf-" and a hash of it, so a repeated call finds
// the object it made before.
func idName(id string) string {
	if name := "vf-" + id; len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(id))
	return "vf-" + hex.EncodeToString(sum[:16])
}

// MigrateHost implements driver.HostMigrator with KubeVirt's live
// migration: the first call of an id creates a VirtualMachineInstanceMigration
// of the guest's VMI, named MigrationName(id), whose addedNodeSelector pins
// the target to host (kubernetes.io/hostname) when host is not empty;
// KubeVirt's scheduler chooses otherwise. Later calls report the
// migration's phase and the migration state KubeVirt keeps on it and on the
// VMI. Succeeded is reported once the VMI the driver watches shows the
// target node, so Observe does too; Failed with KubeVirt's reason (the
// migration state's failureReason, else the warning events KubeVirt
// recorded on the migration). KubeVirt tells neither the bytes it moved
// nor the guest's downtime: both stay 0.
//
// The driver does not delete the migration once it is over: KubeVirt keeps
// finished migrations as the VMI's history (kubectl get vmim), deletes all
// but the newest five of a VMI itself, and deletes them with the VMI;
// deleting one that runs cancels it. Its final status is kept in memory
// too, so a migration KubeVirt deleted meanwhile still reports it, and one
// deleted before it finished reports Failed.
//
// A guest without a running VMI, one KubeVirt says is not LiveMigratable
// (with its reason), a host that is no schedulable Ready node or the one
// the guest runs on are Terminal. KubeVirt moves only guests whose PVCs
// are ReadWriteMany: the driver makes its PVCs with Config.AccessMode
// (ReadWriteOnce unless the agent is told otherwise), so a guest migrates
// where that is ReadWriteMany or its PVCs were made so beforehand.
// While another migration of the VMI runs (KubeVirt runs one at a time),
// KubeVirt's own for a CPU or memory hot-plug included, the error is
// retryable.
//
// Migrations are read from the API server, not from informers: they are
// read once per call, and a create must not miss one made a moment ago.
func (d *Driver) MigrateHost(ctx context.Context, m driver.Machine, id, host string) (driver.MigrationStatus, error) {
	if id == "" {
		return driver.MigrationStatus{}, driver.Terminalf("a migration needs an id")
	}
	if st, ok := d.migrations.final(m.UID, id); ok {
		return st, nil
	}
	c, err := d.client()
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	vm, vmi, err := d.get(ctx, c, m.UID)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	mig := &kubevirtv1.VirtualMachineInstanceMigration{}
	err = d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: MigrationName(id)}, mig)
	switch {
	case kerrors.IsNotFound(err) && d.migrations.started(m.UID, id):
		st := driver.MigrationStatus{ID: id, Phase: driver.MigrationFailed, FinishedAt: d.now(),
			Message: fmt.Sprintf("KubeVirt VirtualMachineInstanceMigration %s was deleted before it finished", MigrationName(id))}
		return d.migrations.record(m.UID, id, st), nil
	case kerrors.IsNotFound(err):
		return d.startMigration(ctx, c, m, vm, vmi, id, host)
	case err != nil:
		return driver.MigrationStatus{}, errors.Wrap(err, "cannot get the KubeVirt VirtualMachineInstanceMigration")
	case mig.Annotations[AnnotationMigration] != id || mig.Spec.VMIName != vm.Name:
		return driver.MigrationStatus{}, driver.Terminalf("KubeVirt VirtualMachineInstanceMigration %s/%s is not the one of migration %s of VirtualMachine %s", mig.Namespace, mig.Name, id, vm.Name)
	}
	if mig.Status.Phase == kubevirtv1.MigrationFailed || mig.Status.Phase == kubevirtv1.MigrationSucceeded {
		// KubeVirt writes the VMI's migration state (the failure's
		// reason, the target) before it ends the migration, and the cache
		// may not show it yet: a final status, which is kept, is made from
		// the VMI as the API server has it.
		if vmi, err = d.instance(ctx, d.live, vm); err != nil {
			return driver.MigrationStatus{}, err
		}
	}
	var warnings []string
	if mig.Status.Phase == kubevirtv1.MigrationFailed && failureReason(stateOf(mig, vmi)) == "" {
		// A courtesy: without the right to read events the failure is
		// still reported, without KubeVirt's reason.
		warnings, _ = d.warnings(ctx, mig)
	}
	st := migrationStatus(id, mig, vmi, warnings, d.now())
	if st.Phase == driver.MigrationSucceeded && !settled(mig, vmi) {
		st = driver.MigrationStatus{ID: id, Phase: driver.MigrationRunning, StartedAt: st.StartedAt,
			Message: st.Message + "; waiting for its VirtualMachineInstance to show it"}
	}
	return d.migrations.record(m.UID, id, st), nil
}

// startMigration checks that KubeVirt can move the guest and asks it to.
func (d *Driver) startMigration(ctx context.Context, c client.Client, m driver.Machine, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, id, host string) (driver.MigrationStatus, error) {
	switch {
	case vmi == nil || vmi.DeletionTimestamp != nil:
		return driver.MigrationStatus{}, driver.Terminalf("the guest is not running: KubeVirt VirtualMachine %s has no VirtualMachineInstance", vm.Name)
	case vmi.Status.Phase != kubevirtv1.Running:
		return driver.MigrationStatus{}, driver.Terminalf("the guest is not running: its KubeVirt VirtualMachineInstance is %s", cmp.Or(string(vmi.Status.Phase), "Pending"))
	}
	for _, cond := range vmi.Status.Conditions {
		if cond.Type == kubevirtv1.VirtualMachineInstanceIsMigratable && cond.Status == corev1.ConditionFalse {
			return driver.MigrationStatus{}, driver.Terminalf("KubeVirt cannot migrate the guest live: %s: %s", cond.Reason, cond.Message)
		}
	}
	var selector map[string]string
	if host != "" {
		node := &corev1.Node{}
		err := c.Get(ctx, types.NamespacedName{Name: host}, node)
		switch {
		case kerrors.IsNotFound(err):
			return driver.MigrationStatus{}, driver.Terminalf("host %s is no node of the KubeVirt cluster", host)
		case err != nil:
			return driver.MigrationStatus{}, errors.Wrapf(err, "cannot get node %s", host)
		case host == vmi.Status.NodeName:
			return driver.MigrationStatus{}, driver.Terminalf("the guest already runs on host %s", host)
		case !schedulable(*node):
			return driver.MigrationStatus{}, driver.Terminalf("host %s is cordoned or not Ready: KubeVirt cannot move the guest there", host)
		}
		selector = map[string]string{corev1.LabelHostname: cmp.Or(node.Labels[corev1.LabelHostname], host)}
	}
	if err := d.inFlight(ctx, vmi.Name); err != nil {
		return driver.MigrationStatus{}, err
	}
	mig := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: d.namespace,
			Name:      MigrationName(id),
			Labels:    map[string]string{LabelUID: m.UID, labelManagedBy: managedBy},
			Annotations: map[string]string{
				AnnotationNamespace: vm.Annotations[AnnotationNamespace], AnnotationName: vm.Annotations[AnnotationName],
				AnnotationMigration: id, AnnotationMigratedVMI: string(vmi.UID),
			},
		},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name, AddedNodeSelector: selector},
	}
	err := c.Create(ctx, mig)
	switch {
	case kerrors.IsAlreadyExists(err):
		// Another call made it a moment ago; the next one reads it.
		st := driver.MigrationStatus{ID: id, Phase: driver.MigrationRunning, StartedAt: d.now(), Message: progress[kubevirtv1.MigrationPhaseUnset]("", "")}
		return d.migrations.record(m.UID, id, st), nil
	case kerrors.IsInvalid(err) || kerrors.IsBadRequest(err) || kerrors.IsForbidden(err):
		// virt-api's admission refuses what KubeVirt cannot migrate, and
		// a second migration of a VMI (ensureNoMigrationConflict), which
		// KubeVirt itself may have begun since the check above: that one
		// waits for the other to finish.
		if busy := d.inFlight(ctx, vmi.Name); busy != nil {
			return driver.MigrationStatus{}, busy
		}
		return driver.MigrationStatus{}, driver.Terminal(errors.Wrap(err, "KubeVirt refused the migration"))
	case err != nil:
		return driver.MigrationStatus{}, errors.Wrap(err, "cannot create the KubeVirt VirtualMachineInstanceMigration")
	}
	return d.migrations.record(m.UID, id, migrationStatus(id, mig, vmi, nil, d.now())), nil
}

// inFlight is a retryable error naming the migration of the VMI named vmi
// that has not finished, if one has not: KubeVirt runs one at a time. Its
// workload updater makes one of its own to complete a CPU or memory
// hot-plug (it moves the guest into a pod of the new shape).
func (d *Driver) inFlight(ctx context.Context, vmi string) error {
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := d.live.List(ctx, migs, client.InNamespace(d.namespace)); err != nil {
		return errors.Wrap(err, "cannot list KubeVirt VirtualMachineInstanceMigrations")
	}
	for _, other := range migs.Items {
		if other.Spec.VMIName != vmi || other.IsFinal() {
			continue
		}
		if _, ok := other.Annotations[kubevirtv1.WorkloadUpdateMigrationAnnotation]; ok {
			return errors.Errorf("KubeVirt runs one migration of a guest at a time, and its own migration %s, which applies a CPU or memory hot-plug, has not finished", other.Name)
		}
		return errors.Errorf("KubeVirt runs one migration of a guest at a time, and its migration %s has not finished", other.Name)
	}
	return nil
}

// stateOf is the migration state KubeVirt keeps of mig: on it, or, until it
// is copied there once the migration is over, on the VMI it moves.
func stateOf(mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) *kubevirtv1.VirtualMachineInstanceMigrationState {
	if s := mig.Status.MigrationState; s != nil && s.MigrationUID == mig.UID {
		return s
	}
	if vmi != nil && vmi.Status.MigrationState != nil && vmi.Status.MigrationState.MigrationUID == mig.UID {
		return vmi.Status.MigrationState
	}
	return nil
}

// settled reports whether the VMI the driver sees shows where a succeeded
// migration moved it: the VMI it moved is gone, or runs on the target, or
// a later migration has moved it on since (KubeVirt's workload updater
// makes one for a CPU or memory hot-plug): its migration state names one
// that started once this one ended. An older state, of a VMI read before
// this migration reached it, does not count.
func settled(mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) bool {
	s := stateOf(mig, vmi)
	if s == nil || vmi == nil || string(vmi.UID) != mig.Annotations[AnnotationMigratedVMI] || vmi.Status.NodeName == s.TargetNode {
		return true
	}
	later := vmi.Status.MigrationState
	return later != nil && later.MigrationUID != mig.UID && later.StartTimestamp != nil && s.EndTimestamp != nil &&
		!later.StartTimestamp.Before(s.EndTimestamp)
}

// progress says what KubeVirt does in each phase of a migration that
// runs, given the source and target nodes as far as KubeVirt has told them.
var progress = map[kubevirtv1.VirtualMachineInstanceMigrationPhase]func(source, target string) string{
	kubevirtv1.MigrationPhaseUnset: func(string, string) string { return "waiting for KubeVirt to accept the migration" },
	kubevirtv1.MigrationPending:    func(string, string) string { return "KubeVirt accepted the migration" },
	kubevirtv1.MigrationScheduling: func(string, string) string { return "KubeVirt is scheduling the migration's target pod" },
	kubevirtv1.MigrationScheduled:  func(string, string) string { return "the migration's target pod is running" },
	kubevirtv1.MigrationPreparingTarget: func(_, target string) string {
		return fmt.Sprintf("KubeVirt is preparing node %s for the guest", target)
	},
	kubevirtv1.MigrationTargetReady: func(_, target string) string {
		return fmt.Sprintf("node %s is ready to receive the guest", target)
	},
	kubevirtv1.MigrationRunning: func(source, target string) string {
		return fmt.Sprintf("KubeVirt is moving the guest from node %s to node %s", source, target)
	},
}

// migrationStatus maps a VirtualMachineInstanceMigration, the VMI it
// moves (nil if none) and the warning events KubeVirt recorded on it to
// the driver's status. The migration started when it was asked for, or
// when KubeVirt started the transfer if it tells.
func migrationStatus(id string, mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance, warnings []string, now time.Time) driver.MigrationStatus {
	s := stateOf(mig, vmi)
	if s == nil {
		s = &kubevirtv1.VirtualMachineInstanceMigrationState{}
	}
	st := driver.MigrationStatus{ID: id, Phase: driver.MigrationRunning, StartedAt: cmp.Or(timeOf(s.StartTimestamp), mig.CreationTimestamp.Time, now)}
	switch mig.Status.Phase {
	case kubevirtv1.MigrationSucceeded:
		st.Phase, st.FinishedAt = driver.MigrationSucceeded, finishedAt(mig, s, now)
		st.Message = fmt.Sprintf("KubeVirt moved the guest from node %s to node %s; it reports neither the bytes moved nor the downtime", s.SourceNode, s.TargetNode)
	case kubevirtv1.MigrationFailed:
		reason := failureReason(s)
		switch {
		case reason != "":
		case slices.ContainsFunc(mig.Status.Conditions, func(c kubevirtv1.VirtualMachineInstanceMigrationCondition) bool {
			return c.Type == kubevirtv1.VirtualMachineInstanceMigrationAbortRequested && c.Status == corev1.ConditionTrue
		}):
			reason = "the migration was cancelled: its VirtualMachineInstanceMigration was deleted"
		case len(warnings) > 0:
			reason = strings.Join(warnings, "; ")
		default:
			reason = "the migration failed, and KubeVirt gives no reason"
		}
		st.Phase, st.FinishedAt = driver.MigrationFailed, finishedAt(mig, s, now)
		st.Message = "KubeVirt: " + reason
	default:
		if say, ok := progress[mig.Status.Phase]; ok {
			st.Message = say(s.SourceNode, s.TargetNode)
		} else {
			st.Message = "KubeVirt reports the migration " + string(mig.Status.Phase)
		}
	}
	return st
}

// failureReason is why the migration failed as KubeVirt's migration state
// says, if it does.
func failureReason(s *kubevirtv1.VirtualMachineInstanceMigrationState) string {
	if s == nil {
		return ""
	}
	return s.FailureReason
}

// finishedAt is when the migration ended: when the transfer did, else when
// KubeVirt marked it final, else now.
func finishedAt(mig *kubevirtv1.VirtualMachineInstanceMigration, s *kubevirtv1.VirtualMachineInstanceMigrationState, now time.Time) time.Time {
	if s.EndTimestamp != nil {
		return s.EndTimestamp.Time
	}
	for _, t := range slices.Backward(mig.Status.PhaseTransitionTimestamps) {
		if t.Phase == mig.Status.Phase {
			return t.PhaseTransitionTimestamp.Time
		}
	}
	return now
}

func timeOf(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

// warnings are the distinct messages of the warning events KubeVirt
// recorded on mig, oldest first: where virt-controller says why a
// migration failed before its transfer began.
func (d *Driver) warnings(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration) ([]string, error) {
	events := &corev1.EventList{}
	if err := d.live.List(ctx, events, client.InNamespace(mig.Namespace), client.MatchingFields{"involvedObject.uid": string(mig.UID)}); err != nil {
		return nil, errors.Wrap(err, "cannot list the events of the KubeVirt VirtualMachineInstanceMigration")
	}
	at := func(e corev1.Event) time.Time {
		return cmp.Or(e.EventTime.Time, e.LastTimestamp.Time, e.CreationTimestamp.Time)
	}
	slices.SortStableFunc(events.Items, func(a, b corev1.Event) int {
		// client-go's recorder names events by when they happened.
		return cmp.Or(at(a).Compare(at(b)), cmp.Compare(a.Name, b.Name))
	})
	var out []string
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning && e.Message != "" && !slices.Contains(out, e.Message) {
			out = append(out, e.Message)
		}
	}
	return out, nil
}

// migrationKey names one migration of one guest.
type migrationKey struct{ uid, id string }

// migrationLog is the last status of each migration the driver saw, while
// the process lives and up to maxMigrations of them.
type migrationLog struct {
	mu     sync.Mutex
	status map[migrationKey]driver.MigrationStatus
	order  []migrationKey
}

// final is the final status of the migration, if it is over.
func (l *migrationLog) final(uid, id string) (driver.MigrationStatus, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.status[migrationKey{uid, id}]
	return st, ok && st.Phase != driver.MigrationRunning
}

// started reports whether the driver saw the migration before.
func (l *migrationLog) started(uid, id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.status[migrationKey{uid, id}]
	return ok
}

// record keeps st as the migration's last status and returns it; the
// oldest migration is forgotten when there are too many.
func (l *migrationLog) record(uid, id string, st driver.MigrationStatus) driver.MigrationStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.status == nil {
		l.status = map[migrationKey]driver.MigrationStatus{}
	}
	k := migrationKey{uid, id}
	if _, ok := l.status[k]; !ok {
		l.order = append(l.order, k)
	}
	l.status[k] = st
	for len(l.order) > maxMigrations {
		delete(l.status, l.order[0])
		l.order = l.order[1:]
	}
	return st
}
