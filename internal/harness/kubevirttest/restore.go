package kubevirttest

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	snapshotv1 "kubevirt.io/api/snapshot/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// firmwareUUIDNamespace is virt-controller's namespace for a VM's legacy
// firmware UUID (CalculateLegacyUUID), which a restore writes on the VM it
// restores in place.
var firmwareUUIDNamespace = uuid.MustParse("6a1a24a1-4061-4607-8bf4-a3963d0c5895")

// reconcileRestore plays KubeVirt's updateVMRestore for one restore (see
// setupSnapshots).
func (c *FakeVirtController) reconcileRestore(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r := &snapshotv1.VirtualMachineRestore{}
	if err := c.live.Get(ctx, req.NamespacedName, r); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if r.Status == nil {
		next := r.DeepCopy()
		next.Status = &snapshotv1.VirtualMachineRestoreStatus{Complete: ptr(false)}
		setRestoreConditions(next, corev1.ConditionTrue, corev1.ConditionFalse, "Initializing VirtualMachineRestore")
		return reconcile.Result{}, c.restoreStatus(ctx, r, next)
	}
	vm := &kubevirtv1.VirtualMachine{}
	switch err := c.live.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: r.Spec.Target.Name}, vm); {
	case kerrors.IsNotFound(err):
		vm = nil
	case err != nil:
		return reconcile.Result{}, errors.Wrap(err, "cannot get the restore's target")
	}
	if r.DeletionTimestamp != nil {
		return reconcile.Result{}, c.deleteRestore(ctx, r, vm)
	}
	if restoreComplete(r) || restoreFailed(r) {
		return reconcile.Result{}, nil
	}
	again := reconcile.Result{RequeueAfter: c.step}
	if vm == nil {
		// KubeVirt would create the VM from the snapshot; the stand-in
		// does not.
		return again, c.restoreError(ctx, r, "the stand-in restores to an existing VirtualMachine only", false)
	}
	if len(r.OwnerReferences) == 0 || controllerutil.AddFinalizer(r, FinalizerRestore) {
		controllerutil.AddFinalizer(r, FinalizerRestore)
		r.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID,
			Controller: ptr(true), BlockOwnerDeletion: ptr(true),
		}}
		return reconcile.Result{}, errors.Wrap(c.client.Update(ctx, r), "cannot hold the restore")
	}
	vmi, err := c.instanceOf(ctx, vm)
	if err != nil {
		return reconcile.Result{}, err
	}
	if vmi != nil {
		return again, c.targetNotReady(ctx, r, vm)
	}
	content, err := c.restoreContent(ctx, r)
	if err != nil {
		return again, c.restoreError(ctx, r, err.Error(), false)
	}
	restored := vm.Annotations[AnnotationLastRestore] == lastRestore(r)
	if src := content.Spec.Source.VirtualMachine; !restored && (src == nil || src.UID != vm.UID) {
		return again, c.restoreError(ctx, r, "restore source and restore target are different but restore target already exists", false)
	}
	if !restored {
		return again, c.rewriteTarget(ctx, r, vm, content)
	}
	if err := c.restoreInProgress(ctx, vm, nil); err != nil {
		return reconcile.Result{}, err
	}
	if err := c.restoreEvent(ctx, r, corev1.EventTypeNormal, ReasonRestoreComplete, "Successfully completed VirtualMachineRestore "+r.Name); err != nil {
		return reconcile.Result{}, err
	}
	next := r.DeepCopy()
	next.Status.Complete, next.Status.RestoreTime = ptr(true), ptr(metav1.Now())
	setRestoreConditions(next, corev1.ConditionFalse, corev1.ConditionTrue, "Operation complete")
	return reconcile.Result{}, c.restoreStatus(ctx, r, next)
}

func restoreComplete(r *snapshotv1.VirtualMachineRestore) bool {
	return r.Status != nil && r.Status.Complete != nil && *r.Status.Complete
}

func restoreFailed(r *snapshotv1.VirtualMachineRestore) bool {
	return r.Status != nil && findSnapshotCondition(r.Status.Conditions, snapshotv1.ConditionFailure) != nil
}

func findSnapshotCondition(cs []snapshotv1.Condition, t snapshotv1.ConditionType) *snapshotv1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

// lastRestore is what AnnotationLastRestore says of a VM r restored.
func lastRestore(r *snapshotv1.VirtualMachineRestore) string {
	return fmt.Sprintf("%s-%s", r.Name, r.UID)
}

// setRestoreConditions sets the restore's Progressing and Ready conditions,
// both for reason.
func setRestoreConditions(r *snapshotv1.VirtualMachineRestore, progressing, ready corev1.ConditionStatus, reason string) {
	r.Status.Conditions = setSnapshotCondition(r.Status.Conditions, snapshotv1.ConditionProgressing, progressing, reason)
	r.Status.Conditions = setSnapshotCondition(r.Status.Conditions, snapshotv1.ConditionReady, ready, reason)
}

// restoreStatus writes next's status over r's, when it changed.
func (c *FakeVirtController) restoreStatus(ctx context.Context, r, next *snapshotv1.VirtualMachineRestore) error {
	if equality.Semantic.DeepEqual(r.Status, next.Status) {
		return nil
	}
	return errors.Wrap(c.client.Status().Update(ctx, next), "cannot update the restore's status")
}

// restoreError is KubeVirt's doUpdateErrorWithFailure: a warning event,
// and conditions that say why the restore does not progress; with fail, a
// Failure condition that ends it.
func (c *FakeVirtController) restoreError(ctx context.Context, r *snapshotv1.VirtualMachineRestore, msg string, fail bool) error {
	reason, event := ReasonRestoreError, "VirtualMachineRestore encountered error "+msg
	next := r.DeepCopy()
	setRestoreConditions(next, corev1.ConditionFalse, corev1.ConditionFalse, msg)
	if fail {
		reason, event = ReasonRestoreFailed, "VirtualMachineRestore failed "+msg
		next.Status.Conditions = setSnapshotCondition(next.Status.Conditions, snapshotv1.ConditionFailure, corev1.ConditionTrue, msg)
	}
	if equality.Semantic.DeepEqual(r.Status, next.Status) {
		return nil // said already
	}
	return errors.Join(c.restoreEvent(ctx, r, corev1.EventTypeWarning, reason, event), c.restoreStatus(ctx, r, next))
}

// targetNotReady is KubeVirt's handleVMRestoreTargetNotReady: the target
// VM has a VMI, and the restore waits, fails or stops it as its
// targetReadinessPolicy says.
func (c *FakeVirtController) targetNotReady(ctx context.Context, r *snapshotv1.VirtualMachineRestore, vm *kubevirtv1.VirtualMachine) error {
	policy := snapshotv1.VirtualMachineRestoreWaitGracePeriodAndFail
	if r.Spec.TargetReadinessPolicy != nil {
		policy = *r.Spec.TargetReadinessPolicy
	}
	reason := MsgWaitGracePeriod
	switch policy {
	case snapshotv1.VirtualMachineRestoreWaitEventually:
		reason = MsgWaitEventually
	case snapshotv1.VirtualMachineRestoreFailImmediate:
		return c.restoreError(ctx, r, MsgTargetNotReadyFailed, true)
	case snapshotv1.VirtualMachineRestoreWaitGracePeriodAndFail:
		if time.Since(r.CreationTimestamp.Time) > snapshotv1.DefaultGracePeriod {
			return c.restoreError(ctx, r, MsgGracePeriodOver, true)
		}
	case snapshotv1.VirtualMachineRestoreStopTarget:
		// What virt-api's stop subresource does to a VM that should run.
		if strategy(vm) != kubevirtv1.RunStrategyHalted {
			next := vm.DeepCopy()
			next.Spec.RunStrategy, next.Spec.Running = ptr(kubevirtv1.RunStrategyHalted), nil //nolint:staticcheck // KubeVirt takes one of the two
			if err := c.client.Patch(ctx, next, client.MergeFrom(vm)); err != nil {
				return errors.Wrap(err, "cannot stop the restore's target")
			}
		}
		reason = MsgStopTarget
	default:
		return errors.Errorf("unknown targetReadinessPolicy: %v", policy)
	}
	next := r.DeepCopy()
	setRestoreConditions(next, corev1.ConditionFalse, corev1.ConditionFalse, reason)
	if equality.Semantic.DeepEqual(r.Status, next.Status) {
		return nil
	}
	event := MsgTargetVMIExists
	if policy == snapshotv1.VirtualMachineRestoreStopTarget {
		event = MsgStopTarget
	}
	return errors.Join(c.restoreEvent(ctx, r, corev1.EventTypeWarning, ReasonRestoreTargetNotReady, event), c.restoreStatus(ctx, r, next))
}

// restoreContent is the ready content of the restore's ready snapshot, or
// why there is none, in KubeVirt's words.
func (c *FakeVirtController) restoreContent(ctx context.Context, r *snapshotv1.VirtualMachineRestore) (*snapshotv1.VirtualMachineSnapshotContent, error) {
	key := r.Namespace + "/" + r.Spec.VirtualMachineSnapshotName
	s := &snapshotv1.VirtualMachineSnapshot{}
	switch err := c.live.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: r.Spec.VirtualMachineSnapshotName}, s); {
	case kerrors.IsNotFound(err):
		return nil, errors.Errorf("VMSnapshot %s does not exist", key)
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the restore's snapshot")
	case s.Status != nil && s.Status.Phase == snapshotv1.Failed:
		return nil, errors.Errorf("VMSnapshot %s failed and is invalid to use", key)
	case s.Status == nil || s.Status.ReadyToUse == nil || !*s.Status.ReadyToUse:
		return nil, errors.Errorf("VMSnapshot %s not ready", key)
	case s.Status.VirtualMachineSnapshotContentName == nil:
		return nil, errors.Errorf("no snapshot content name in %s", key)
	}
	content := &snapshotv1.VirtualMachineSnapshotContent{}
	contentKey := r.Namespace + "/" + *s.Status.VirtualMachineSnapshotContentName
	switch err := c.live.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: *s.Status.VirtualMachineSnapshotContentName}, content); {
	case kerrors.IsNotFound(err):
		return nil, errors.Errorf("VMSnapshotContent %s does not exist", contentKey)
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the restore's snapshot content")
	case content.Status == nil || content.Status.ReadyToUse == nil || !*content.Status.ReadyToUse:
		return nil, errors.Errorf("VMSnapshotContent %s not ready", contentKey)
	}
	return content, nil
}

// restoreInProgress sets the VM's status.restoreInProgress to name (nil:
// clears it), as KubeVirt marks a VM while it restores it.
func (c *FakeVirtController) restoreInProgress(ctx context.Context, vm *kubevirtv1.VirtualMachine, name *string) error {
	if equality.Semantic.DeepEqual(vm.Status.RestoreInProgress, name) {
		return nil
	}
	vm.Status.RestoreInProgress = name
	return errors.Wrap(c.client.Status().Update(ctx, vm), "cannot mark the VM's restore")
}

// rewriteTarget is KubeVirt's reconcileVolumeRestores and Reconcile of the
// target: one step records each volume's restored PVC, the next makes the
// PVCs and rewrites the VM.
func (c *FakeVirtController) rewriteTarget(ctx context.Context, r *snapshotv1.VirtualMachineRestore, vm *kubevirtv1.VirtualMachine, content *snapshotv1.VirtualMachineSnapshotContent) error {
	if p := vm.Status.RestoreInProgress; p != nil && *p != r.Name {
		return c.restoreError(ctx, r, fmt.Sprintf("vm restore %s in progress", *p), false)
	}
	if err := c.restoreInProgress(ctx, vm, ptr(r.Name)); err != nil {
		return err
	}
	if len(r.Status.Restores) != len(content.Spec.VolumeBackups) {
		next := r.DeepCopy()
		next.Status.Restores = nil
		for _, b := range content.Spec.VolumeBackups {
			next.Status.Restores = append(next.Status.Restores, snapshotv1.VolumeRestore{
				VolumeName: b.VolumeName, PersistentVolumeClaimName: restoredName(r, b), VolumeSnapshotName: ptrValue(b.VolumeSnapshotName),
			})
		}
		setRestoreConditions(next, corev1.ConditionTrue, corev1.ConditionFalse, "Creating new PVCs")
		return c.restoreStatus(ctx, r, next)
	}
	for i, b := range content.Spec.VolumeBackups {
		if name := r.Status.Restores[i].PersistentVolumeClaimName; name != b.PersistentVolumeClaim.Name {
			pvc := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name, Labels: b.PersistentVolumeClaim.Labels,
					Annotations: map[string]string{"restore.kubevirt.io/name": r.Name}},
				Spec: *b.PersistentVolumeClaim.Spec.DeepCopy(),
			}
			pvc.Spec.VolumeName = ""
			if err := c.client.Create(ctx, pvc); err != nil && !kerrors.IsAlreadyExists(err) {
				return errors.Wrap(err, "cannot create a restored PVC")
			}
		}
	}
	next := vm.DeepCopy()
	next.Spec = *content.Spec.Source.VirtualMachine.Spec.DeepCopy()
	// The VM keeps the run strategy it had before the restore.
	if vm.Spec.Running != nil { //nolint:staticcheck // older clients still set it
		next.Spec.Running, next.Spec.RunStrategy = ptr(false), nil //nolint:staticcheck // as KubeVirt does
	} else {
		next.Spec.RunStrategy, next.Spec.Running = ptr(strategy(vm)), nil //nolint:staticcheck // as KubeVirt does
	}
	for i, v := range next.Spec.Template.Spec.Volumes {
		for _, vr := range r.Status.Restores {
			if vr.VolumeName == v.Name {
				next.Spec.Template.Spec.Volumes[i] = restoredVolume(next, v, vr.PersistentVolumeClaimName)
			}
		}
	}
	if next.Spec.Template.Spec.Domain.Firmware == nil {
		next.Spec.Template.Spec.Domain.Firmware = &kubevirtv1.Firmware{}
	}
	if next.Spec.Template.Spec.Domain.Firmware.UUID == "" {
		next.Spec.Template.Spec.Domain.Firmware.UUID = types.UID(uuid.NewSHA1(firmwareUUIDNamespace, []byte(vm.Name)).String())
	}
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[AnnotationLastRestore] = lastRestore(r)
	if err := c.client.Update(ctx, next); err != nil {
		return errors.Wrap(err, "cannot restore the VM")
	}
	n := r.DeepCopy()
	setRestoreConditions(n, corev1.ConditionTrue, corev1.ConditionFalse, "Updating target spec")
	n.Status.Conditions = setSnapshotCondition(n.Status.Conditions, snapshotv1.ConditionReady, corev1.ConditionFalse, "Waiting for target update")
	return c.restoreStatus(ctx, r, n)
}

// restoredName is KubeVirt's restoreVolumeName: the override's name, the
// backed-up PVC's own under volumeRestorePolicy InPlace, else
// restore-<restore uid>-<volume>.
func restoredName(r *snapshotv1.VirtualMachineRestore, b snapshotv1.VolumeBackup) string {
	for _, o := range r.Spec.VolumeRestoreOverrides {
		if o.VolumeName == b.VolumeName && o.RestoreName != "" {
			return o.RestoreName
		}
	}
	if r.Spec.VolumeRestorePolicy != nil && *r.Spec.VolumeRestorePolicy == snapshotv1.VolumeRestorePolicyInPlace {
		return b.PersistentVolumeClaim.Name
	}
	return fmt.Sprintf("restore-%s-%s", r.UID, b.VolumeName)
}

// restoredVolume is volume v of the restored vm on its restored PVC, as
// KubeVirt's generateRestoredVMSpec makes it: a dataVolume of a
// dataVolumeTemplate is renamed with its template, any other dataVolume
// becomes a persistentVolumeClaim.
func restoredVolume(vm *kubevirtv1.VirtualMachine, v kubevirtv1.Volume, claim string) kubevirtv1.Volume {
	switch {
	case v.PersistentVolumeClaim != nil:
		v.PersistentVolumeClaim = v.PersistentVolumeClaim.DeepCopy()
		v.PersistentVolumeClaim.ClaimName = claim
	case v.DataVolume != nil:
		for i := range vm.Spec.DataVolumeTemplates {
			if vm.Spec.DataVolumeTemplates[i].Name == v.DataVolume.Name {
				vm.Spec.DataVolumeTemplates[i].Name = claim
				v.DataVolume = &kubevirtv1.DataVolumeSource{Name: claim}
				return v
			}
		}
		v = kubevirtv1.Volume{Name: v.Name, VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
		}}}
	}
	return v
}

// deleteRestore lets a deleted restore go, clearing its mark on the VM.
func (c *FakeVirtController) deleteRestore(ctx context.Context, r *snapshotv1.VirtualMachineRestore, vm *kubevirtv1.VirtualMachine) error {
	if !controllerutil.ContainsFinalizer(r, FinalizerRestore) {
		return nil
	}
	if vm != nil && vm.Status.RestoreInProgress != nil && *vm.Status.RestoreInProgress == r.Name {
		if err := c.restoreInProgress(ctx, vm, nil); err != nil {
			return err
		}
	}
	controllerutil.RemoveFinalizer(r, FinalizerRestore)
	return errors.Wrap(client.IgnoreNotFound(c.client.Update(ctx, r)), "cannot release the restore")
}

// restoreEvent records an event on the restore, as virt-controller's
// recorder would.
func (c *FakeVirtController) restoreEvent(ctx context.Context, r *snapshotv1.VirtualMachineRestore, kind, reason, message string) error {
	ref := corev1.ObjectReference{
		APIVersion: snapshotv1.SchemeGroupVersion.String(), Kind: "VirtualMachineRestore",
		Namespace: r.Namespace, Name: r.Name, UID: r.UID, ResourceVersion: r.ResourceVersion,
	}
	return c.recordEvent(ctx, ref, kind, reason, message)
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
