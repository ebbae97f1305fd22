package kubevirttest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// What virt-controller's migration controller (pkg/virt-controller/watch/
// migration) and virt-handler write, as the stand-in writes it too.
const (
	// DefaultUnschedulableTimeout is how long virt-controller leaves a
	// migration's target pod unschedulable before it deletes the pod and
	// fails the migration; a VMIM's
	// kubevirtv1.MigrationUnschedulablePodTimeoutSecondsAnnotation
	// overrides it.
	DefaultUnschedulableTimeout = 5 * time.Minute
	// FinalizedMigrationsKept is how many finished migrations of a VMI
	// virt-controller keeps: it deletes the oldest beyond them.
	FinalizedMigrationsKept = 5

	// Reasons of the events virt-controller records on a migration.
	ReasonFailedMigration     = "FailedMigration"
	ReasonSuccessfulMigration = "SuccessfulMigration"
	ReasonTargetUnschedulable = "migrationTargetPodUnschedulable"

	// eventSource is the component the stand-in records events as.
	eventSource = "virt-controller"
)

// Messages virt-api and virt-controller give a migration they refuse or
// fail, word for word.
const (
	msgVMIShutdown     = "Migration failed vmi shutdown during migration."
	msgTargetRemoved   = "Migration target pod was removed during active migration."
	msgStateCleared    = "VMI's migration state was cleared during the active migration."
	msgCanceled        = "Migration failed due to being canceled"
	msgSourceFailed    = "source node reported migration failed"
	msgSourceSucceeded = "Source node reported migration succeeded"
	msgFinalized       = "Cannot migrate VMI in finalized state."
)

// FailNextMigration makes the next migration of the VMI named vmi fail
// once it runs, as virt-handler reports a live migration libvirt gave up
// on: the VMI's status.migrationState says failed with reason, and the
// guest stays on its node.
func (c *FakeVirtController) FailNextMigration(vmi types.NamespacedName, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failNext[vmi] = reason
}

func (c *FakeVirtController) takeMigrationFailure(vmi types.NamespacedName) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reason, ok := c.failNext[vmi]
	delete(c.failNext, vmi)
	return reason, ok
}

// migrationsOf are the migrations of the VMI o, for the VMI watch.
func (c *FakeVirtController) migrationsOf(ctx context.Context, o client.Object) []reconcile.Request {
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := c.client.List(ctx, migs, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, m := range migs.Items {
		if m.Spec.VMIName == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Name}})
		}
	}
	return out
}

// reconcileMigration plays virt-api's admission, virt-controller's
// migration controller and the source's and target's virt-handler for one
// VirtualMachineInstanceMigration, one phase per step.
func (c *FakeVirtController) reconcileMigration(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	mig := &kubevirtv1.VirtualMachineInstanceMigration{}
	if err := c.live.Get(ctx, req.NamespacedName, mig); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := c.live.Get(ctx, types.NamespacedName{Namespace: mig.Namespace, Name: mig.Spec.VMIName}, vmi); kerrors.IsNotFound(err) {
		vmi = nil
	} else if err != nil {
		return reconcile.Result{}, err
	}
	switch {
	case mig.DeletionTimestamp != nil:
		return reconcile.Result{}, c.cancelMigration(ctx, mig, vmi)
	case mig.IsFinal():
		return reconcile.Result{}, c.finalizeMigration(ctx, mig, vmi)
	case vmi == nil && accepted(mig):
		// virt-controller deletes the migrations of a VMI that is gone.
		return reconcile.Result{}, c.deleteMigration(ctx, mig)
	}
	// What virt-api's mutating webhook adds to a new migration.
	if mig.Labels[kubevirtv1.MigrationSelectorLabel] != mig.Spec.VMIName || !controllerutil.ContainsFinalizer(mig, kubevirtv1.VirtualMachineInstanceMigrationFinalizer) {
		if mig.Labels == nil {
			mig.Labels = map[string]string{}
		}
		mig.Labels[kubevirtv1.MigrationSelectorLabel] = mig.Spec.VMIName
		controllerutil.AddFinalizer(mig, kubevirtv1.VirtualMachineInstanceMigrationFinalizer)
		return reconcile.Result{}, errors.Wrap(c.client.Update(ctx, mig), "cannot label the migration")
	}

	again := reconcile.Result{RequeueAfter: c.step}
	if mig.Status.Phase != kubevirtv1.MigrationPhaseUnset && vmi.IsFinal() {
		return reconcile.Result{}, c.failMigration(ctx, mig, msgVMIShutdown)
	}
	// Each phase lasts a step, however often the watches wake the
	// controller.
	if left := c.step - c.inPhase(mig); left > 0 {
		return reconcile.Result{RequeueAfter: left}, nil
	}
	switch mig.Status.Phase {
	case kubevirtv1.MigrationPhaseUnset:
		refusal, err := c.refusal(ctx, mig, vmi)
		if err != nil {
			return reconcile.Result{}, err
		}
		if refusal != "" {
			return reconcile.Result{}, c.failMigration(ctx, mig, refusal)
		}
		return again, c.setMigrationPhase(ctx, mig, kubevirtv1.MigrationPending)
	case kubevirtv1.MigrationPending:
		if vmi.Status.Phase != kubevirtv1.Running {
			// virt-controller makes no target pod for a VMI that does not
			// run (yet).
			return again, nil
		}
		if wait, err := c.backoff(ctx, mig); err != nil || wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, errors.Join(err, c.backingOff(ctx, mig, vmi))
		}
		return again, c.setMigrationPhase(ctx, mig, kubevirtv1.MigrationScheduling)
	case kubevirtv1.MigrationScheduling:
		target, err := c.migrationTarget(ctx, mig, vmi)
		if err != nil {
			return reconcile.Result{}, err
		}
		if target == "" {
			return c.unschedulable(ctx, mig, vmi)
		}
		c.mu.Lock()
		c.targets[mig.UID] = target
		c.mu.Unlock()
		return again, c.setMigrationPhase(ctx, mig, kubevirtv1.MigrationScheduled)
	case kubevirtv1.MigrationScheduled:
		// The hand-off: the VMI's migrationState tells virt-handler on
		// both nodes.
		c.mu.Lock()
		target := c.targets[mig.UID]
		c.mu.Unlock()
		if target == "" {
			return reconcile.Result{}, c.failMigration(ctx, mig, msgTargetRemoved)
		}
		if s := vmi.Status.MigrationState; s == nil || s.MigrationUID != mig.UID {
			vmi.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
				MigrationUID: mig.UID, SourceNode: vmi.Status.NodeName, TargetNode: target,
			}
			if err := c.client.Update(ctx, vmi); err != nil {
				return reconcile.Result{}, errors.Wrap(err, "cannot hand the migration off to the VMI")
			}
		}
		return again, c.setMigrationPhase(ctx, mig, kubevirtv1.MigrationPreparingTarget)
	}

	state := vmi.Status.MigrationState
	if state == nil || state.MigrationUID != mig.UID {
		return reconcile.Result{}, c.failMigration(ctx, mig, msgStateCleared)
	}
	now := metav1.Now()
	next := mig.Status.Phase
	switch mig.Status.Phase {
	case kubevirtv1.MigrationPreparingTarget:
		// The target's virt-handler readied the node and says where to
		// send the guest.
		address, err := c.nodeAddress(ctx, state.TargetNode)
		if err != nil {
			return reconcile.Result{}, err
		}
		state.TargetNodeAddress = address
		next = kubevirtv1.MigrationTargetReady
	case kubevirtv1.MigrationTargetReady:
		// The source's virt-handler starts the transfer.
		if state.StartTimestamp == nil {
			state.StartTimestamp = &now
		}
		state.Mode = kubevirtv1.MigrationPreCopy
		next = kubevirtv1.MigrationRunning
	case kubevirtv1.MigrationRunning:
		if state.Completed {
			// Decided by an earlier step, whose phase change was lost.
			return c.completeMigration(ctx, mig, state)
		}
		state.EndTimestamp, state.Completed = &now, true
		if reason, fail := c.takeMigrationFailure(types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}); fail {
			state.Failed, state.FailureReason = true, reason
		} else {
			// The guest runs on the target: the VMI is there now, and
			// the target's virt-handler applies a hot-plug that waited
			// for the move before it calls the migration complete.
			state.TargetNodeDomainDetected, state.TargetNodeDomainReadyTimestamp = true, &now
			vmi.Status.NodeName = state.TargetNode
			finishHotplug(vmi)
		}
		if err := c.client.Update(ctx, vmi); err != nil {
			return reconcile.Result{}, errors.Wrap(err, "cannot complete the migration on the VMI")
		}
		return c.completeMigration(ctx, mig, state)
	default:
		return reconcile.Result{}, nil // a phase of decentralized migrations, which the stand-in does not play
	}
	if err := c.client.Update(ctx, vmi); err != nil {
		return reconcile.Result{}, errors.Wrap(err, "cannot update the VMI's migration state")
	}
	return again, c.setMigrationPhase(ctx, mig, next)
}

// backingOff says once per migration, as a warning event on its VMI, that
// the migration controller holds it in its backoff.
func (c *FakeVirtController) backingOff(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) error {
	c.mu.Lock()
	said := c.backedOff[mig.UID]
	c.backedOff[mig.UID] = true
	c.mu.Unlock()
	if said {
		return nil
	}
	return c.vmiEvent(ctx, vmi, corev1.EventTypeWarning, ReasonMigrationBackoff, fmt.Sprintf("backoff migrating vmi %s/%s", vmi.Namespace, vmi.Name))
}

// completeMigration ends a migration as the VMI's migration state says it
// ended.
func (c *FakeVirtController) completeMigration(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, state *kubevirtv1.VirtualMachineInstanceMigrationState) (reconcile.Result, error) {
	if state.Failed {
		return reconcile.Result{}, c.failMigration(ctx, mig, msgSourceFailed)
	}
	if err := c.event(ctx, mig, corev1.EventTypeNormal, ReasonSuccessfulMigration, msgSourceSucceeded); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, c.setMigrationPhase(ctx, mig, kubevirtv1.MigrationSucceeded)
}

// inPhase is how long the migration has been in its phase since the
// stand-in moved it there; a phase it did not set has lasted long enough.
// The phase transition timestamps are kept to the second only.
func (c *FakeVirtController) inPhase(mig *kubevirtv1.VirtualMachineInstanceMigration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entered[mig.UID]; ok && e.phase == mig.Status.Phase {
		return time.Since(e.at)
	}
	return c.step
}

// phaseEntered is when the stand-in moved a migration to a phase.
type phaseEntered struct {
	phase kubevirtv1.VirtualMachineInstanceMigrationPhase
	at    time.Time
}

// accepted reports whether the migration got past admission: it was
// Pending once.
func accepted(mig *kubevirtv1.VirtualMachineInstanceMigration) bool {
	return slices.ContainsFunc(mig.Status.PhaseTransitionTimestamps, func(t kubevirtv1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp) bool {
		return t.Phase == kubevirtv1.MigrationPending
	})
}

// refusal is what virt-api's admission webhook would refuse the migration
// with, or empty. No virt-api runs here, so a migration it would refuse
// fails instead, with its message.
func (c *FakeVirtController) refusal(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) (string, error) {
	switch {
	case vmi == nil:
		return fmt.Sprintf("the VMI \"%s/%s\" does not exist", mig.Namespace, mig.Spec.VMIName), nil
	case vmi.IsFinal():
		return msgFinalized, nil
	}
	for _, cond := range vmi.Status.Conditions {
		if cond.Type == kubevirtv1.VirtualMachineInstanceIsMigratable && cond.Status == corev1.ConditionFalse {
			return fmt.Sprintf("Cannot migrate VMI, Reason: %s, Message: %s", cond.Reason, cond.Message), nil
		}
	}
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := c.live.List(ctx, migs, client.InNamespace(mig.Namespace)); err != nil {
		return "", errors.Wrap(err, "cannot list migrations")
	}
	for _, other := range migs.Items {
		if other.UID == mig.UID || other.Spec.VMIName != mig.Spec.VMIName || other.IsFinal() {
			continue
		}
		// Of two created together, the first admitted wins.
		if other.Status.Phase != kubevirtv1.MigrationPhaseUnset || other.CreationTimestamp.Before(&mig.CreationTimestamp) ||
			(other.CreationTimestamp.Equal(&mig.CreationTimestamp) && other.Name < mig.Name) {
			return fmt.Sprintf("in-flight migration detected. Active migration job (%s) is currently already in progress for VMI %s.", other.UID, mig.Spec.VMIName), nil
		}
	}
	return "", nil
}

// migrationTarget is the node the target pod would be scheduled on: a
// schedulable Ready node other than the VMI's that matches the migration's
// addedNodeSelector and the VMI's own nodeSelector (whose keys win); the
// first by name, or none.
func (c *FakeVirtController) migrationTarget(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) (string, error) {
	want := maps.Clone(mig.Spec.AddedNodeSelector)
	if want == nil {
		want = map[string]string{}
	}
	maps.Copy(want, vmi.Spec.NodeSelector)
	selector := labels.SelectorFromSet(want)
	nodes := &corev1.NodeList{}
	if err := c.client.List(ctx, nodes); err != nil {
		return "", errors.Wrap(err, "cannot list nodes")
	}
	var names []string
	for _, n := range nodes.Items {
		if Schedulable(n) && n.Name != vmi.Status.NodeName && selector.Matches(labels.Set(n.Labels)) {
			names = append(names, n.Name)
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	slices.Sort(names)
	return names[0], nil
}

// unschedulable leaves a migration whose target pod fits no node in
// Scheduling, says so once, and fails it when the unschedulable timeout has
// passed since its target pod was made, as virt-controller deletes the pod.
func (c *FakeVirtController) unschedulable(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) (reconcile.Result, error) {
	c.mu.Lock()
	warned := c.warned[mig.UID]
	c.warned[mig.UID] = true
	c.mu.Unlock()
	if !warned {
		msg := fmt.Sprintf("Migration target pod for VMI [%s/%s] is currently unschedulable.", vmi.Namespace, vmi.Name)
		if err := c.event(ctx, mig, corev1.EventTypeWarning, ReasonTargetUnschedulable, msg); err != nil {
			return reconcile.Result{}, err
		}
	}
	timeout := DefaultUnschedulableTimeout
	if s, ok := mig.Annotations[kubevirtv1.MigrationUnschedulablePodTimeoutSecondsAnnotation]; ok {
		if n, err := strconv.Atoi(s); err == nil {
			timeout = time.Duration(n) * time.Second
		}
	}
	since := mig.CreationTimestamp.Time
	for _, t := range mig.Status.PhaseTransitionTimestamps {
		if t.Phase == kubevirtv1.MigrationScheduling {
			since = t.PhaseTransitionTimestamp.Time
		}
	}
	left := timeout - time.Since(since)
	if left <= 0 {
		return reconcile.Result{}, c.failMigration(ctx, mig, msgTargetRemoved)
	}
	return reconcile.Result{RequeueAfter: min(left, c.step)}, nil
}

// nodeAddress is the node's InternalIP, where virt-handler listens for
// migrations.
func (c *FakeVirtController) nodeAddress(ctx context.Context, name string) (string, error) {
	n := &corev1.Node{}
	if err := c.client.Get(ctx, types.NamespacedName{Name: name}, n); err != nil {
		return "", errors.Wrapf(err, "cannot get node %s", name)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address, nil
		}
	}
	return name, nil
}

// failMigration records why the migration failed, as a warning event on it
// as virt-controller does, and makes it Failed.
func (c *FakeVirtController) failMigration(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, message string) error {
	if err := c.event(ctx, mig, corev1.EventTypeWarning, ReasonFailedMigration, message); err != nil {
		return err
	}
	return c.setMigrationPhase(ctx, mig, kubevirtv1.MigrationFailed)
}

// cancelMigration aborts a migration deleted before it finished, and lets
// it go once it has: virt-handler aborts a transfer that runs.
func (c *FakeVirtController) cancelMigration(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) error {
	if mig.IsFinal() {
		c.forget(mig.UID)
		if controllerutil.RemoveFinalizer(mig, kubevirtv1.VirtualMachineInstanceMigrationFinalizer) {
			return errors.Wrap(client.IgnoreNotFound(c.client.Update(ctx, mig)), "cannot release the migration")
		}
		return nil
	}
	if vmi != nil && vmi.Status.MigrationState != nil && vmi.Status.MigrationState.MigrationUID == mig.UID && !vmi.Status.MigrationState.Completed {
		now := metav1.Now()
		state := vmi.Status.MigrationState
		state.AbortRequested, state.AbortStatus = true, kubevirtv1.MigrationAbortSucceeded
		state.Completed, state.Failed, state.EndTimestamp, state.FailureReason = true, true, &now, "Live migration aborted"
		if err := c.client.Update(ctx, vmi); err != nil {
			return errors.Wrap(err, "cannot abort the migration on the VMI")
		}
	}
	mig.Status.Conditions = append(mig.Status.Conditions, kubevirtv1.VirtualMachineInstanceMigrationCondition{
		Type: kubevirtv1.VirtualMachineInstanceMigrationAbortRequested, Status: corev1.ConditionTrue, LastProbeTime: metav1.Now(),
	})
	return c.failMigration(ctx, mig, msgCanceled)
}

// finalizeMigration keeps what the VMI says of a finished migration on it,
// releases it, and collects the migrations of its VMI beyond the newest
// FinalizedMigrationsKept finished ones, or all of them once the VMI is
// gone.
func (c *FakeVirtController) finalizeMigration(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, vmi *kubevirtv1.VirtualMachineInstance) error {
	if vmi != nil && vmi.Status.MigrationState != nil && vmi.Status.MigrationState.MigrationUID == mig.UID && !equalState(mig.Status.MigrationState, vmi.Status.MigrationState) {
		mig.Status.MigrationState = vmi.Status.MigrationState.DeepCopy()
		return errors.Wrap(c.client.Status().Update(ctx, mig), "cannot copy the migration state")
	}
	if controllerutil.RemoveFinalizer(mig, kubevirtv1.VirtualMachineInstanceMigrationFinalizer) {
		return errors.Wrap(c.client.Update(ctx, mig), "cannot release the migration")
	}
	c.forget(mig.UID)
	if vmi == nil && accepted(mig) {
		return c.deleteMigration(ctx, mig)
	}
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := c.live.List(ctx, migs, client.InNamespace(mig.Namespace)); err != nil {
		return errors.Wrap(err, "cannot list migrations")
	}
	var done []kubevirtv1.VirtualMachineInstanceMigration
	for _, m := range migs.Items {
		if m.Spec.VMIName == mig.Spec.VMIName && m.IsFinal() && m.DeletionTimestamp == nil {
			done = append(done, m)
		}
	}
	slices.SortFunc(done, func(a, b kubevirtv1.VirtualMachineInstanceMigration) int {
		if d := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); d != 0 {
			return d
		}
		return cmp.Compare(a.Name, b.Name)
	})
	for i := 0; i < len(done)-FinalizedMigrationsKept; i++ {
		if err := c.deleteMigration(ctx, &done[i]); err != nil {
			return err
		}
	}
	return nil
}

func equalState(a, b *kubevirtv1.VirtualMachineInstanceMigrationState) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.MigrationUID == b.MigrationUID && a.Completed == b.Completed && a.Failed == b.Failed &&
		a.TargetNode == b.TargetNode && a.SourceNode == b.SourceNode && a.FailureReason == b.FailureReason &&
		a.StartTimestamp.Equal(b.StartTimestamp) && a.EndTimestamp.Equal(b.EndTimestamp)
}

func (c *FakeVirtController) deleteMigration(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration) error {
	if controllerutil.RemoveFinalizer(mig, kubevirtv1.VirtualMachineInstanceMigrationFinalizer) {
		if err := c.client.Update(ctx, mig); err != nil {
			return errors.Wrap(client.IgnoreNotFound(err), "cannot release the migration")
		}
	}
	return errors.Wrap(client.IgnoreNotFound(c.client.Delete(ctx, mig, client.Preconditions{UID: &mig.UID})), "cannot delete the migration")
}

// forget drops what the stand-in keeps of a migration that is over.
func (c *FakeVirtController) forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.targets, uid)
	delete(c.warned, uid)
	delete(c.backedOff, uid)
	delete(c.entered, uid)
}

// setMigrationPhase moves the migration to phase and stamps the change, as
// virt-controller does.
func (c *FakeVirtController) setMigrationPhase(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, phase kubevirtv1.VirtualMachineInstanceMigrationPhase) error {
	mig.Status.Phase = phase
	mig.Status.PhaseTransitionTimestamps = append(mig.Status.PhaseTransitionTimestamps, kubevirtv1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{
		Phase: phase, PhaseTransitionTimestamp: metav1.Now(),
	})
	if err := c.client.Status().Update(ctx, mig); err != nil {
		return errors.Wrapf(err, "cannot move the migration to %s", phase)
	}
	if !mig.IsFinal() {
		c.mu.Lock()
		c.entered[mig.UID] = phaseEntered{phase: phase, at: time.Now()}
		c.mu.Unlock()
	}
	return nil
}

// event records an event on the migration, as virt-controller's recorder
// would.
func (c *FakeVirtController) event(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration, kind, reason, message string) error {
	return c.recordEvent(ctx, corev1.ObjectReference{
		APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachineInstanceMigration",
		Namespace: mig.Namespace, Name: mig.Name, UID: mig.UID, ResourceVersion: mig.ResourceVersion,
	}, kind, reason, message)
}

// recordEvent records an event on the object ref names, as
// virt-controller's recorder would.
func (c *FakeVirtController) recordEvent(ctx context.Context, ref corev1.ObjectReference, kind, reason, message string) error {
	now := metav1.Now()
	e := &corev1.Event{
		// client-go's recorder names events so that they list in order.
		ObjectMeta:     metav1.ObjectMeta{Namespace: ref.Namespace, Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano())},
		InvolvedObject: ref,
		Reason:         reason, Message: message, Type: kind,
		Source:         corev1.EventSource{Component: eventSource},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	return errors.Wrap(c.client.Create(ctx, e), "cannot record an event")
}

// migrating is whether a migration of the VMI transfers it now, when
// virt-controller shows its VM as Migrating.
func migrating(vmi *kubevirtv1.VirtualMachineInstance) bool {
	s := vmi.Status.MigrationState
	return s != nil && s.StartTimestamp != nil && s.EndTimestamp == nil
}

// liveMigratable is the LiveMigratable condition virt-handler gives a
// running VMI: false, with KubeVirt's reason and message, when a PVC it
// uses (a dataVolume's included) cannot be attached to two nodes at once
// (not ReadWriteMany).
func (c *FakeVirtController) liveMigratable(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (kubevirtv1.VirtualMachineInstanceCondition, error) {
	cond := kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}
	for _, v := range vmi.Spec.Volumes {
		name := claimName(v)
		if name == "" {
			continue
		}
		pvc := &corev1.PersistentVolumeClaim{}
		if err := c.client.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: name}, pvc); err != nil && !kerrors.IsNotFound(err) {
			return cond, errors.Wrap(err, "cannot get a PVC")
		}
		if !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
			cond.Status, cond.Reason = corev1.ConditionFalse, kubevirtv1.VirtualMachineInstanceReasonDisksNotMigratable
			cond.Message = fmt.Sprintf("cannot migrate VMI: PVC %s is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)", name)
			return cond, nil
		}
	}
	return cond, nil
}
