package kubevirttest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	snapshotv1 "kubevirt.io/api/snapshot/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// What KubeVirt's snapshot and restore controllers (pkg/storage/snapshot)
// write, word for word, as the stand-in writes it too.
const (
	FinalizerSnapshot        = "snapshot.kubevirt.io/vmsnapshot-protection"
	FinalizerSnapshotContent = "snapshot.kubevirt.io/vmsnapshotcontent-protection"
	FinalizerRestore         = "snapshot.kubevirt.io/vmrestore-protection"
	// AnnotationLastRestore, on a restored VM, is the restore's name and
	// uid: a restore that finds it has rewritten the VM already.
	AnnotationLastRestore = "restore.kubevirt.io/lastRestoreUID"

	ReasonRestoreComplete       = "VirtualMachineRestoreComplete"
	ReasonRestoreError          = "VirtualMachineRestoreError"
	ReasonRestoreFailed         = "Operation failed"
	ReasonRestoreTargetNotReady = "RestoreTargetNotReady"

	MsgSourceMissing        = "Source does not exist"
	MsgDeadlineExceeded     = "snapshot deadline exceeded"
	MsgTargetVMIExists      = "Restore target VMI still exists, please stop the restore target to proceed with restore"
	MsgTargetNotReadyFailed = "Restore target VMI must be powered off before restore operation"
	MsgWaitEventually       = "Waiting for target VM to be powered off. Please stop the restore target to proceed with restore"
	MsgStopTarget           = "Automatically stopping restore target for restore operation"
)

// The messages KubeVirt gives a restore whose target still runs under its
// default targetReadinessPolicy, WaitGracePeriod.
var (
	MsgWaitGracePeriod = fmt.Sprintf("Waiting for target VM to be powered off. Please stop the restore target to proceed with restore, or the operation will fail after %s", snapshotv1.DefaultGracePeriod)
	MsgGracePeriodOver = fmt.Sprintf("Restore target failed to be ready within %s. Please power off the target VM before attempting restore", snapshotv1.DefaultGracePeriod)
)

// setupSnapshots registers the stand-in's snapshot and restore
// controllers with mgr.
//
// It plays KubeVirt's snapshot controller for
// VirtualMachineSnapshots of VirtualMachines: it holds the snapshot with
// its finalizer, makes its VirtualMachineSnapshotContent
// (vmsnapshot-content-<uid>) with the VM as it is — or, while a VMI runs,
// the VM the VMI was started from (its ControllerRevision) with the VM's
// volumes now — and a volumeBackup per PVC, naming the VolumeSnapshot
// KubeVirt would make; the content is ready the next time round, since no
// CSI snapshotter runs here. The snapshot is InProgress meanwhile, with
// indications Online and Paused or GuestAgent or NoGuestAgent for a VM
// with a VMI, then Succeeded and readyToUse with the content's
// creationTime. One whose source is absent stays InProgress ("Source
// does not exist") until its failureDeadline (5 minutes by default) fails
// it, as KubeVirt's does. Deleting it deletes its content under the
// deletionPolicy Delete (the default). KubeVirt's lock of the source
// (status.snapshotInProgress and a finalizer on the VM), its check that
// the PVCs are bound and populated, and guest-agent freezes are not
// played.
//
// It plays KubeVirt's restore controller for VirtualMachineRestores of an
// existing VirtualMachine from a ready snapshot: while the VM has a VMI it
// does as targetReadinessPolicy says (WaitGracePeriod by default: a warning
// event and the conditions say so, and the restore fails after
// DefaultGracePeriod; FailImmediate fails it; StopTarget halts the VM).
// Then it rewrites the VM's spec with the content's (its runStrategy kept,
// the legacy firmware UUID set, each backed-up volume on its restored PVC:
// the same one under volumeRestorePolicy InPlace, restore-<uid>-<volume>
// made from the backup otherwise), keeps the VM's metadata, marks it with
// AnnotationLastRestore, and completes the restore. The PVCs hold no data
// here, so an InPlace restore leaves them as they are.
func (c *FakeVirtController) setupSnapshots(mgr ctrl.Manager, options controller.Options) error {
	err := ctrl.NewControllerManagedBy(mgr).
		Named("fake-virt-snapshot-controller").
		For(&snapshotv1.VirtualMachineSnapshot{}).
		WithOptions(options).
		Complete(reconcile.Func(c.reconcileSnapshot))
	if err != nil {
		return errors.Wrap(err, "cannot set up the fake snapshot controller")
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("fake-virt-restore-controller").
		For(&snapshotv1.VirtualMachineRestore{}).
		WithOptions(options).
		Complete(reconcile.Func(c.reconcileRestore))
	return errors.Wrap(err, "cannot set up the fake restore controller")
}

// reconcileSnapshot plays KubeVirt's updateVMSnapshot and
// updateVMSnapshotContent for one snapshot.
func (c *FakeVirtController) reconcileSnapshot(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	s := &snapshotv1.VirtualMachineSnapshot{}
	if err := c.live.Get(ctx, req.NamespacedName, s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	vm, err := c.snapshotSource(ctx, s)
	if err != nil {
		return reconcile.Result{}, err
	}
	content := &snapshotv1.VirtualMachineSnapshotContent{}
	switch err := c.live.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: contentName(s)}, content); {
	case kerrors.IsNotFound(err):
		content = nil
	case err != nil:
		return reconcile.Result{}, errors.Wrap(err, "cannot get the snapshot's content")
	}
	if s.DeletionTimestamp != nil {
		return reconcile.Result{}, c.deleteSnapshot(ctx, s, content)
	}
	if controllerutil.AddFinalizer(s, FinalizerSnapshot) {
		return reconcile.Result{}, errors.Wrap(c.client.Update(ctx, s), "cannot hold the snapshot")
	}
	switch {
	case content == nil && vm != nil && progressing(s) && !deadlineExceeded(s):
		if content, err = c.newContent(ctx, s, vm); err != nil {
			return reconcile.Result{}, err
		}
		if err := c.client.Create(ctx, content); err != nil && !kerrors.IsAlreadyExists(err) {
			return reconcile.Result{}, errors.Wrap(err, "cannot create the snapshot's content")
		}
		content.Status = nil
	case content != nil && content.Status == nil:
		// The VolumeSnapshots a CSI snapshotter would take are taken.
		now := metav1.Now()
		content.Status = &snapshotv1.VirtualMachineSnapshotContentStatus{CreationTime: &now, ReadyToUse: ptr(true)}
		if err := c.client.Status().Update(ctx, content); err != nil {
			return reconcile.Result{}, errors.Wrap(err, "cannot make the snapshot's content ready")
		}
	}
	if err := c.setSnapshotStatus(ctx, s, vm, content); err != nil {
		return reconcile.Result{}, err
	}
	if !progressing(s) {
		return reconcile.Result{}, nil
	}
	if left := untilDeadline(s); left > 0 && left < c.step {
		return reconcile.Result{RequeueAfter: left}, nil
	}
	return reconcile.Result{RequeueAfter: c.step}, nil
}

// snapshotSource is the VM the snapshot is of; nil when there is none.
func (c *FakeVirtController) snapshotSource(ctx context.Context, s *snapshotv1.VirtualMachineSnapshot) (*kubevirtv1.VirtualMachine, error) {
	if s.Spec.Source.Kind != "VirtualMachine" {
		return nil, errors.Errorf("unknown source %+v", s.Spec.Source)
	}
	vm := &kubevirtv1.VirtualMachine{}
	switch err := c.live.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.Source.Name}, vm); {
	case kerrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the snapshot's source")
	}
	return vm, nil
}

// contentName is KubeVirt's GetVMSnapshotContentName.
func contentName(s *snapshotv1.VirtualMachineSnapshot) string {
	if s.Status != nil && s.Status.VirtualMachineSnapshotContentName != nil {
		return *s.Status.VirtualMachineSnapshotContentName
	}
	return "vmsnapshot-content-" + string(s.UID)
}

func progressing(s *snapshotv1.VirtualMachineSnapshot) bool {
	return s.Status == nil || (s.Status.Phase != snapshotv1.Failed && s.Status.Phase != snapshotv1.Succeeded)
}

// untilDeadline is how long the snapshot has left to succeed; 0 when it
// has no deadline (a failureDeadline of 0).
func untilDeadline(s *snapshotv1.VirtualMachineSnapshot) time.Duration {
	deadline := snapshotv1.DefaultFailureDeadline
	if s.Spec.FailureDeadline != nil {
		deadline = s.Spec.FailureDeadline.Duration
	}
	if deadline == 0 {
		return 0
	}
	return time.Until(s.CreationTimestamp.Add(deadline))
}

func deadlineExceeded(s *snapshotv1.VirtualMachineSnapshot) bool {
	if s.Status != nil && s.Status.Phase == snapshotv1.Failed {
		return true
	}
	return progressing(s) && untilDeadline(s) < 0
}

// newContent is the content KubeVirt's createContent makes of vm for s.
func (c *FakeVirtController) newContent(ctx context.Context, s *snapshotv1.VirtualMachineSnapshot, vm *kubevirtv1.VirtualMachine) (*snapshotv1.VirtualMachineSnapshotContent, error) {
	source, err := c.snapshotVM(ctx, vm)
	if err != nil {
		return nil, err
	}
	var backups []snapshotv1.VolumeBackup
	for _, v := range vm.Spec.Template.Spec.Volumes {
		name := claimName(v)
		if name == "" {
			continue
		}
		pvc := &corev1.PersistentVolumeClaim{}
		switch err := c.live.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: name}, pvc); {
		case kerrors.IsNotFound(err):
			continue // KubeVirt skips it too, with a warning
		case err != nil:
			return nil, errors.Wrap(err, "cannot get a PVC to snapshot")
		}
		backups = append(backups, snapshotv1.VolumeBackup{
			VolumeName:            v.Name,
			PersistentVolumeClaim: snapshotv1.PersistentVolumeClaim{ObjectMeta: simplified(pvc.ObjectMeta), Spec: *pvc.Spec.DeepCopy()},
			VolumeSnapshotName:    ptr(fmt.Sprintf("vmsnapshot-%s-volume-%s", s.UID, v.Name)),
		})
	}
	return &snapshotv1.VirtualMachineSnapshotContent{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: contentName(s), Finalizers: []string{FinalizerSnapshotContent}},
		Spec: snapshotv1.VirtualMachineSnapshotContentSpec{
			VirtualMachineSnapshotName: ptr(s.Name),
			Source:                     snapshotv1.SourceSpec{VirtualMachine: source},
			VolumeBackups:              backups,
		},
	}, nil
}

// snapshotVM is the VM a snapshot keeps, as KubeVirt's source Spec makes
// it: the VM as it is when it has no VMI, else the VM its VMI was started
// from, with the VM's volumes, disks and dataVolumeTemplates now.
func (c *FakeVirtController) snapshotVM(ctx context.Context, vm *kubevirtv1.VirtualMachine) (*snapshotv1.VirtualMachine, error) {
	out := &snapshotv1.VirtualMachine{ObjectMeta: simplified(vm.ObjectMeta), Spec: *vm.Spec.DeepCopy()}
	vmi, err := c.instanceOf(ctx, vm)
	if err != nil || vmi == nil {
		return out, err
	}
	cr := &appsv1.ControllerRevision{}
	if err := c.live.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vmi.Status.VirtualMachineRevisionName}, cr); err != nil {
		return nil, errors.Wrapf(err, "cannot get vm revision %q", vmi.Status.VirtualMachineRevisionName)
	}
	started := &snapshotv1.VirtualMachine{}
	if err := json.Unmarshal(cr.Data.Raw, started); err != nil {
		return nil, errors.Wrap(err, "cannot decode the VM's revision")
	}
	out.Spec, out.Status = started.Spec, started.Status
	out.Spec.Template.Spec.Volumes = vm.Spec.Template.Spec.Volumes
	out.Spec.Template.Spec.Domain.Devices.Disks = vm.Spec.Template.Spec.Domain.Devices.Disks
	out.Spec.DataVolumeTemplates = vm.Spec.DataVolumeTemplates
	return out, nil
}

// instanceOf is the VMI of vm, or nil.
func (c *FakeVirtController) instanceOf(ctx context.Context, vm *kubevirtv1.VirtualMachine) (*kubevirtv1.VirtualMachineInstance, error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	switch err := c.live.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, vmi); {
	case kerrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the VM's VMI")
	}
	return vmi, nil
}

// simplified is KubeVirt's getSimplifiedMetaObject.
func simplified(m metav1.ObjectMeta) metav1.ObjectMeta {
	out := m.DeepCopy()
	out.ManagedFields = nil
	return *out
}

// setSnapshotStatus writes the snapshot's status as KubeVirt's
// updateSnapshotStatus derives it.
func (c *FakeVirtController) setSnapshotStatus(ctx context.Context, s *snapshotv1.VirtualMachineSnapshot, vm *kubevirtv1.VirtualMachine, content *snapshotv1.VirtualMachineSnapshotContent) error {
	next := s.DeepCopy()
	st := next.Status
	if st == nil {
		st = &snapshotv1.VirtualMachineSnapshotStatus{ReadyToUse: ptr(false)}
		next.Status = st
	}
	if vm != nil {
		st.SourceUID = &vm.UID
	}
	if content != nil && content.Status != nil {
		st.VirtualMachineSnapshotContentName = &content.Name
		st.CreationTime, st.ReadyToUse, st.Error = content.Status.CreationTime, content.Status.ReadyToUse, content.Status.Error
	}
	switch {
	case deadlineExceeded(next):
		st.Phase = snapshotv1.Failed
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionFailure, corev1.ConditionTrue, MsgDeadlineExceeded)
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionProgressing, corev1.ConditionFalse, "Operation failed")
	case st.Phase == snapshotv1.Succeeded || st.CreationTime != nil:
		st.Phase = snapshotv1.Succeeded
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionProgressing, corev1.ConditionFalse, "Operation complete")
		if content != nil {
			st.SnapshotVolumes = &snapshotv1.SnapshotVolumesLists{}
			for _, b := range content.Spec.VolumeBackups {
				st.SnapshotVolumes.IncludedVolumes = append(st.SnapshotVolumes.IncludedVolumes, b.VolumeName)
			}
		}
	case vm == nil:
		st.Phase = snapshotv1.InProgress
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionProgressing, corev1.ConditionFalse, MsgSourceMissing)
	default:
		st.Phase = snapshotv1.InProgress
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionProgressing, corev1.ConditionTrue, "Source locked and operation in progress")
		vmi, err := c.instanceOf(ctx, vm)
		if err != nil {
			return err
		}
		setIndications(st, vmi)
	}
	if st.ReadyToUse != nil && *st.ReadyToUse {
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionReady, corev1.ConditionTrue, "Ready")
	} else {
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionReady, corev1.ConditionFalse, "Not ready")
	}
	if st.Error != nil {
		st.Conditions = setSnapshotCondition(st.Conditions, snapshotv1.ConditionProgressing, corev1.ConditionFalse, "In error state")
	}
	if equality.Semantic.DeepEqual(s.Status, next.Status) {
		return nil
	}
	if err := c.client.Status().Update(ctx, next); err != nil {
		return errors.Wrap(err, "cannot update the snapshot's status")
	}
	*s = *next
	return nil
}

// indicationMessages are KubeVirt's words for each indication.
var indicationMessages = map[snapshotv1.Indication]string{
	snapshotv1.VMSnapshotOnlineSnapshotIndication: "Snapshot taken while the VM was running. Consistency depends on guest-agent quiescing.",
	snapshotv1.VMSnapshotGuestAgentIndication:     "Guest agent was active and attempted to quiesce the filesystem for application consistency.",
	snapshotv1.VMSnapshotNoGuestAgentIndication:   "Guest agent was not available. Snapshot is crash-consistent and may not be application-consistent.",
	snapshotv1.VMSnapshotPausedIndication:         "Snapshot taken while the VM was paused. Snapshot is crash-consistent and may not be application-consistent.",
}

// setIndications is KubeVirt's updateSnapshotSourceIndications: a VM with
// a VMI is Online, and Paused, or GuestAgent when an agent is connected,
// or NoGuestAgent. The stand-in's VMIs have no agent connected.
func setIndications(st *snapshotv1.VirtualMachineSnapshotStatus, vmi *kubevirtv1.VirtualMachineInstance) {
	if vmi == nil {
		st.Indications, st.SourceIndications = nil, nil
		return
	}
	has := func(t kubevirtv1.VirtualMachineInstanceConditionType) bool {
		return slices.ContainsFunc(vmi.Status.Conditions, func(c kubevirtv1.VirtualMachineInstanceCondition) bool {
			return c.Type == t && c.Status == corev1.ConditionTrue
		})
	}
	indications := append([]snapshotv1.Indication{}, st.Indications...)
	add := func(i snapshotv1.Indication) {
		if !slices.Contains(indications, i) {
			indications = append(indications, i)
		}
	}
	add(snapshotv1.VMSnapshotOnlineSnapshotIndication)
	switch {
	case has(kubevirtv1.VirtualMachineInstancePaused):
		add(snapshotv1.VMSnapshotPausedIndication)
	case has(kubevirtv1.VirtualMachineInstanceAgentConnected):
		add(snapshotv1.VMSnapshotGuestAgentIndication)
	default:
		add(snapshotv1.VMSnapshotNoGuestAgentIndication)
	}
	slices.Sort(indications)
	st.Indications, st.SourceIndications = indications, nil
	for _, i := range indications {
		st.SourceIndications = append(st.SourceIndications, snapshotv1.SourceIndication{Indication: i, Message: indicationMessages[i]})
	}
}

// setSnapshotCondition is KubeVirt's updateCondition: a condition of the same
// type is replaced only when its status or reason changed.
func setSnapshotCondition(cs []snapshotv1.Condition, t snapshotv1.ConditionType, status corev1.ConditionStatus, reason string) []snapshotv1.Condition {
	c := snapshotv1.Condition{Type: t, Status: status, Reason: reason, LastTransitionTime: metav1.Now()}
	for i := range cs {
		if cs[i].Type == t {
			if cs[i].Status != status || cs[i].Reason != reason {
				cs[i] = c
			}
			return cs
		}
	}
	return append(cs, c)
}

// deleteSnapshot lets a deleted snapshot go, with its content unless the
// deletionPolicy is Retain and the content is ready.
func (c *FakeVirtController) deleteSnapshot(ctx context.Context, s *snapshotv1.VirtualMachineSnapshot, content *snapshotv1.VirtualMachineSnapshotContent) error {
	ready := content != nil && content.Status != nil && content.Status.ReadyToUse != nil && *content.Status.ReadyToUse
	retain := s.Spec.DeletionPolicy != nil && *s.Spec.DeletionPolicy == snapshotv1.VirtualMachineSnapshotContentRetain
	if content != nil {
		if controllerutil.RemoveFinalizer(content, FinalizerSnapshotContent) {
			if err := c.client.Update(ctx, content); err != nil {
				return errors.Wrap(client.IgnoreNotFound(err), "cannot release the snapshot's content")
			}
		}
		if !retain || !ready {
			if err := c.client.Delete(ctx, content); client.IgnoreNotFound(err) != nil {
				return errors.Wrap(err, "cannot delete the snapshot's content")
			}
		}
	}
	if controllerutil.RemoveFinalizer(s, FinalizerSnapshot) {
		return errors.Wrap(client.IgnoreNotFound(c.client.Update(ctx, s)), "cannot release the snapshot")
	}
	return nil
}

// revision records vm as virt-controller's createVMRevision does when it
// starts it: a ControllerRevision revision-start-vm-<uid>-<generation>,
// owned by the VM, holding the VM; older ones of the VM go. Its name goes
// in the VMI's status.virtualMachineRevisionName.
func (c *FakeVirtController) revision(ctx context.Context, vm *kubevirtv1.VirtualMachine) (string, error) {
	prefix := fmt.Sprintf("revision-start-vm-%s-", vm.UID)
	name := fmt.Sprintf("%s%d", prefix, vm.Generation)
	crs := &appsv1.ControllerRevisionList{}
	if err := c.live.List(ctx, crs, client.InNamespace(vm.Namespace)); err != nil {
		return "", errors.Wrap(err, "cannot list controller revisions")
	}
	for _, cr := range crs.Items {
		if strings.HasPrefix(cr.Name, prefix) && cr.Name != name {
			if err := c.client.Delete(ctx, &cr); client.IgnoreNotFound(err) != nil {
				return "", errors.Wrap(err, "cannot delete an older VM revision")
			}
		}
	}
	raw, err := json.Marshal(vm)
	if err != nil {
		return "", errors.Wrap(err, "cannot encode the VM's revision")
	}
	cr := &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: vm.Namespace, Name: name,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vm, kubevirtv1.VirtualMachineGroupVersionKind)},
		},
		Data:     runtime.RawExtension{Raw: raw},
		Revision: vm.Generation,
	}
	if err := c.client.Create(ctx, cr); err != nil && !kerrors.IsAlreadyExists(err) {
		return "", errors.Wrap(err, "cannot create the VM's revision")
	}
	return name, nil
}
