package kubevirttest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// virt-controller's workload updater (pkg/virt-controller/watch/
// workload-updater/workload-updater.go) is what completes a CPU or memory
// hot-plug: a running VMI with the condition HotVCPUChange (any status) or
// HotMemoryChange True needs a migration into a virt-launcher pod sized
// for its new shape. When the VMI is LiveMigratable, is not migrating and
// no migration of it is unfinished, it creates a
// VirtualMachineInstanceMigration named kubevirt-workload-update-…
// annotated WorkloadUpdateMigrationAnnotation; the target's virt-handler
// applies the change when the guest arrives (migration-target.go's
// finalizeMigration: hotplugCPU, hotplugMemory), so the shape changes
// only with a migration that succeeds, whichever made it. A migration
// that fails leaves the conditions: the updater makes another, which
// virt-controller's migration controller holds Pending while it backs off
// (handleMigrationBackoff, see backoff). A VMI that is not LiveMigratable
// is not moved: its HotVCPUChange stays until the VM restarts (KubeVirt
// refuses memory of such a VMI up front with RestartRequired, see
// hotplugMemory, but not CPU sockets).
//
// The stand-in runs as if the KubeVirt CR's workloadUpdateStrategy listed
// LiveMigrate only (without it KubeVirt never completes a hot-plug; with
// Evict too, it would evict a VMI it cannot migrate). It does not play
// KubeVirt's throttle (one pass at most every 5 s, the queue keyed by the
// KubeVirt CR) nor its cap of ParallelMigrationsPerCluster: it acts on
// each VMI as soon as it changes.

// WorkloadUpdatePrefix is the generateName of the migrations the workload
// updater makes.
const WorkloadUpdatePrefix = "kubevirt-workload-update-"

// Reasons of the events the workload updater and the migration
// controller record on a VMI.
const (
	ReasonSuccessfulCreate      = "SuccessfulCreate"
	ReasonFailedCreate          = "FailedCreate"
	ReasonSuccessfulChangeAbort = "SuccessfulChangeAbortion"
	ReasonMigrationBackoff      = "MigrationBackoff"
)

// firstMigrationBackoff is how long the migration controller holds a
// workload update migration after one failed; it doubles with each
// further failure.
const firstMigrationBackoff = 20 * time.Second

// reconcileWorkloadUpdate is the workload updater's pass over one VMI.
func (c *FakeVirtController) reconcileWorkloadUpdate(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := c.live.Get(ctx, req.NamespacedName, vmi); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if vmi.Status.Phase != kubevirtv1.Running || vmi.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := c.live.List(ctx, migs, client.InNamespace(vmi.Namespace)); err != nil {
		return reconcile.Result{}, errors.Wrap(err, "cannot list migrations")
	}
	var unfinished, ours []kubevirtv1.VirtualMachineInstanceMigration
	for _, m := range migs.Items {
		if m.Spec.VMIName != vmi.Name || m.IsFinal() {
			continue
		}
		unfinished = append(unfinished, m)
		if _, ok := m.Annotations[kubevirtv1.WorkloadUpdateMigrationAnnotation]; ok {
			ours = append(ours, m)
		}
	}
	if abortChange(vmi) && len(ours) > 0 {
		// shouldAbortMigration: the change it was made for is gone.
		for i := range ours {
			if err := client.IgnoreNotFound(c.client.Delete(ctx, &ours[i])); err != nil {
				return reconcile.Result{}, errors.Wrap(err, "cannot abort a workload update migration")
			}
			if err := c.vmiEvent(ctx, vmi, corev1.EventTypeNormal, ReasonSuccessfulChangeAbort, "Aborted change for vmi: "+vmi.Name); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{}, nil
	}
	if !hotplugInProgress(vmi) || migrating(vmi) || len(unfinished) > 0 || vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceIsMigratable) != corev1.ConditionTrue {
		return reconcile.Result{}, nil
	}
	mig := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: vmi.Namespace, GenerateName: WorkloadUpdatePrefix,
			Annotations: map[string]string{kubevirtv1.WorkloadUpdateMigrationAnnotation: ""},
		},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
	}
	if err := c.client.Create(ctx, mig); err != nil {
		return reconcile.Result{}, errors.Join(err, c.vmiEvent(ctx, vmi, corev1.EventTypeWarning, ReasonFailedCreate,
			fmt.Sprintf("Error creating a Migration for automated workload update: %v", err)))
	}
	return reconcile.Result{}, c.vmiEvent(ctx, vmi, corev1.EventTypeNormal, ReasonSuccessfulCreate,
		fmt.Sprintf("Created Migration %s for automated workload update", mig.Name))
}

// hotplugInProgress is the workload updater's isHotplugInProgress.
func hotplugInProgress(vmi *kubevirtv1.VirtualMachineInstance) bool {
	return vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange) != "" ||
		vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceMemoryChange) == corev1.ConditionTrue
}

// abortChange is the workload updater's shouldAbortMigration but for the
// count of its migrations: no hot-plug waits for one, and the VMI's last
// migration did not reach a target domain (KubeVirt looks at whichever
// migration the VMI's state names).
func abortChange(vmi *kubevirtv1.VirtualMachineInstance) bool {
	if hotplugInProgress(vmi) {
		return false
	}
	return vmi.Status.MigrationState == nil || vmi.Status.MigrationState.TargetNodeDomainReadyTimestamp == nil
}

// vmisOfMigration is the VMI a migration moves, for the workload
// updater's watch of migrations: one that ends may let it make the next.
func vmisOfMigration(_ context.Context, o client.Object) []reconcile.Request {
	mig, ok := o.(*kubevirtv1.VirtualMachineInstanceMigration)
	if !ok || mig.Spec.VMIName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: mig.Namespace, Name: mig.Spec.VMIName}}}
}

// backoff is how long the migration controller still holds mig Pending
// (handleMigrationBackoff): only the newest of a VMI's workload update and
// evacuation migrations is held, 20 s after the one before it failed,
// doubled for each further failure since the last that succeeded (those
// deleted are skipped). KubeVirt orders them by creation time, which is
// kept to the second; of two made in the same second, the one unfinished
// is taken as the newer, as the updater makes one only when none is.
func (c *FakeVirtController) backoff(ctx context.Context, mig *kubevirtv1.VirtualMachineInstanceMigration) (time.Duration, error) {
	if _, ok := mig.Annotations[kubevirtv1.FuncTestForceIgnoreMigrationBackoffAnnotation]; ok || !backoffEligible(mig) {
		return 0, nil
	}
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := c.live.List(ctx, migs, client.InNamespace(mig.Namespace)); err != nil {
		return 0, errors.Wrap(err, "cannot list migrations")
	}
	eligible := slices.DeleteFunc(migs.Items, func(m kubevirtv1.VirtualMachineInstanceMigration) bool {
		return m.Spec.VMIName != mig.Spec.VMIName || !backoffEligible(&m)
	})
	if len(eligible) < 2 {
		return 0, nil
	}
	slices.SortFunc(eligible, func(a, b kubevirtv1.VirtualMachineInstanceMigration) int {
		return cmp.Or(b.CreationTimestamp.Compare(a.CreationTimestamp.Time), compareFinal(a, b))
	})
	if eligible[0].UID != mig.UID {
		return 0, nil
	}
	var backoff time.Duration
	for _, m := range eligible[1:] {
		if m.Status.Phase == kubevirtv1.MigrationSucceeded {
			break
		}
		if m.DeletionTimestamp != nil {
			continue
		}
		if m.Status.Phase == kubevirtv1.MigrationFailed {
			backoff = max(firstMigrationBackoff, 2*backoff)
		}
	}
	if backoff == 0 {
		return 0, nil
	}
	var failed time.Time
	for _, t := range eligible[1].Status.PhaseTransitionTimestamps {
		if t.Phase == kubevirtv1.MigrationFailed {
			failed = t.PhaseTransitionTimestamp.Time
			break
		}
	}
	return time.Until(failed.Add(backoff)), nil
}

// compareFinal orders an unfinished migration before a finished one.
func compareFinal(a, b kubevirtv1.VirtualMachineInstanceMigration) int {
	switch {
	case a.IsFinal() == b.IsFinal():
		return 0
	case a.IsFinal():
		return 1
	}
	return -1
}

// backoffEligible is whether KubeVirt backs off before mig: a migration
// of the workload updater or of the evacuation controller.
func backoffEligible(mig *kubevirtv1.VirtualMachineInstanceMigration) bool {
	_, update := mig.Annotations[kubevirtv1.WorkloadUpdateMigrationAnnotation]
	_, evacuation := mig.Annotations[kubevirtv1.EvacuationMigrationAnnotation]
	return update || evacuation
}

// vmiEvent records an event on the VMI, as virt-controller's recorder
// would.
func (c *FakeVirtController) vmiEvent(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, kind, reason, message string) error {
	return c.recordEvent(ctx, corev1.ObjectReference{
		APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachineInstance",
		Namespace: vmi.Namespace, Name: vmi.Name, UID: vmi.UID, ResourceVersion: vmi.ResourceVersion,
	}, kind, reason, message)
}
