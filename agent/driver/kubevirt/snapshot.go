package kubevirt

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	kubevirtv1 "kubevirt.io/api/core/v1"
	snapshotv1 "kubevirt.io/api/snapshot/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Snapshots on KubeVirt are KubeVirt's own (snapshot.kubevirt.io/v1beta1):
// a VirtualMachineSnapshot of the guest's VirtualMachine, named
// SnapshotName(id), labelled like the driver's other objects and
// annotated with AnnotationSnapshot. KubeVirt keeps the VM's spec in a
// VirtualMachineSnapshotContent and each PVC in a CSI VolumeSnapshot, and
// deletes both with the snapshot (its deletionPolicy Delete). It keeps no
// guest memory, so a snapshot with memory of a running guest is refused;
// a running guest is snapshotted online, frozen through its guest agent
// where one is connected (KubeVirt's indication GuestAgent).
//
// A revert is a VirtualMachineRestore, named RestoreName(id), of the
// stopped VM: KubeVirt restores only a VM without a VMI (the default
// targetReadinessPolicy, WaitGracePeriod, waits for one to go and fails
// after five minutes; StopTarget would stop it through virt-api without
// the driver's bookkeeping), so the driver stops the guest as Ensure does
// and waits until its VMI is gone first. The restore uses
// volumeRestorePolicy InPlace: the disks stay the PVCs of the disks' names
// (KubeVirt's default makes PVCs of new names, which the Machine does not
// know). KubeVirt rewrites the VM's spec from the snapshot, keeps its run
// strategy (Halted) and its metadata; the driver writes back what it
// records on the VM should a KubeVirt not keep it, and deletes the restore
// once it is complete, so a later revert to the same snapshot makes a new
// one. The next Ensure starts the guest, with the Machine's shape.
var _ driver.Snapshotter = (*Driver)(nil)

// AnnotationSnapshot, on a VirtualMachineSnapshot or
// VirtualMachineRestore the driver made, is the id of the snapshot.
const AnnotationSnapshot = "virtfleet.io/snapshot"

// AnnotationLastRestore, on a KubeVirt VirtualMachine, names the last named
// revert made of it (driver.RevertRequest.Restore), which is never made
// again.
const AnnotationLastRestore = "virtfleet.io/last-restore"

// snapshotPoll is how often TakeSnapshot and RevertSnapshot read what they
// wait for: KubeVirt takes a snapshot in seconds.
const snapshotPoll = 100 * time.Millisecond

// cleanupTimeout bounds the delete of a snapshot whose taking failed,
// made after the caller's context may have ended.
const cleanupTimeout = 10 * time.Second

// SnapshotName is the VirtualMachineSnapshot of the snapshot with id.
func SnapshotName(id string) string { return idName(id) }

// RestoreName is the VirtualMachineRestore of a revert to the snapshot
// with id.
func RestoreName(id string) string { return idName(id + "-restore") }

// TakeSnapshot implements driver.Snapshotter.
func (d *Driver) TakeSnapshot(ctx context.Context, uid string, r driver.SnapshotRequest) (driver.Snapshot, error) {
	if r.ID == "" {
		return driver.Snapshot{}, driver.Terminalf("a snapshot needs an id")
	}
	c, err := d.client()
	if err != nil {
		return driver.Snapshot{}, err
	}
	vm, vmi, err := d.get(ctx, c, uid)
	if err != nil {
		return driver.Snapshot{}, err
	}
	s, err := d.snapshot(ctx, uid, r.ID)
	switch {
	case err != nil:
		return driver.Snapshot{}, err
	case s != nil && snapshotReady(s):
		return snapshotOf(s), nil
	case s == nil && r.Memory && vmi != nil:
		return driver.Snapshot{}, driver.Terminalf("KubeVirt keeps no guest memory in its snapshots (kubevirt/kubevirt#10609): take a snapshot without includeMemory")
	}
	started := d.now()
	if s == nil {
		s = d.newSnapshot(vm, uid, r.ID)
		err := c.Create(ctx, s)
		switch {
		case err == nil, kerrors.IsAlreadyExists(err):
		case kerrors.IsInvalid(err) || kerrors.IsBadRequest(err) || kerrors.IsForbidden(err):
			// virt-api's admission refuses what KubeVirt will not take.
			return driver.Snapshot{}, driver.Terminal(errors.Wrap(err, "KubeVirt refused the snapshot"))
		default:
			return driver.Snapshot{}, errors.Wrap(err, "cannot create the KubeVirt VirtualMachineSnapshot")
		}
	}
	s, err = d.waitSnapshot(ctx, s)
	if err != nil {
		return driver.Snapshot{}, err
	}
	out := snapshotOf(s)
	out.Duration = d.now().Sub(started)
	return out, nil
}

// snapshot reads the VirtualMachineSnapshot of snapshot id of guest uid
// from the API server; nil when there is none. One of that name that is
// not it is a Terminal error.
func (d *Driver) snapshot(ctx context.Context, uid, id string) (*snapshotv1.VirtualMachineSnapshot, error) {
	s := &snapshotv1.VirtualMachineSnapshot{}
	switch err := d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: SnapshotName(id)}, s); {
	case kerrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the KubeVirt VirtualMachineSnapshot")
	case s.Labels[LabelUID] != uid || s.Annotations[AnnotationSnapshot] != id:
		return nil, driver.Terminalf("KubeVirt VirtualMachineSnapshot %s/%s is not snapshot %s of guest %s", s.Namespace, s.Name, id, uid)
	}
	return s, nil
}

// newSnapshot is the VirtualMachineSnapshot of snapshot id of vm, the
// guest uid's.
func (d *Driver) newSnapshot(vm *kubevirtv1.VirtualMachine, uid, id string) *snapshotv1.VirtualMachineSnapshot {
	return &snapshotv1.VirtualMachineSnapshot{
		ObjectMeta: d.actMeta(vm, uid, SnapshotName(id), id),
		Spec: snapshotv1.VirtualMachineSnapshotSpec{
			Source:         vmRef(vm),
			DeletionPolicy: ptr(snapshotv1.VirtualMachineSnapshotContentDelete),
		},
	}
}

// actMeta is the metadata of an object the driver makes for an act on vm,
// the guest uid's, about snapshot id: labelled and annotated like its
// other objects.
func (d *Driver) actMeta(vm *kubevirtv1.VirtualMachine, uid, name, id string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: d.namespace,
		Name:      name,
		Labels:    map[string]string{LabelUID: uid, labelManagedBy: managedBy},
		Annotations: map[string]string{
			AnnotationNamespace: vm.Annotations[AnnotationNamespace], AnnotationName: vm.Annotations[AnnotationName],
			AnnotationSnapshot: id,
		},
	}
}

func vmRef(vm *kubevirtv1.VirtualMachine) corev1.TypedLocalObjectReference {
	return corev1.TypedLocalObjectReference{APIGroup: ptr(kubevirtv1.GroupVersion.Group), Kind: "VirtualMachine", Name: vm.Name}
}

func snapshotReady(s *snapshotv1.VirtualMachineSnapshot) bool {
	return s.Status != nil && s.Status.ReadyToUse != nil && *s.Status.ReadyToUse && s.DeletionTimestamp == nil
}

// snapshotFailure is why KubeVirt failed the snapshot; empty while it
// has not.
func snapshotFailure(s *snapshotv1.VirtualMachineSnapshot) string {
	if s.Status == nil {
		return ""
	}
	failure := findCondition(s.Status.Conditions, snapshotv1.ConditionFailure)
	if s.Status.Phase != snapshotv1.Failed && (failure == nil || failure.Status != corev1.ConditionTrue) {
		return ""
	}
	if failure != nil {
		return cmp.Or(failure.Message, failure.Reason)
	}
	return cmp.Or(errorMessage(s.Status.Error), "KubeVirt failed the snapshot and gives no reason")
}

// snapshotProgress is what KubeVirt says of a snapshot it has not
// finished.
func snapshotProgress(s *snapshotv1.VirtualMachineSnapshot) string {
	if s == nil || s.Status == nil {
		return "KubeVirt has not taken it up"
	}
	say := []string{"phase " + cmp.Or(string(s.Status.Phase), "unset")}
	if p := findCondition(s.Status.Conditions, snapshotv1.ConditionProgressing); p != nil {
		say = append(say, p.Reason)
	}
	if msg := errorMessage(s.Status.Error); msg != "" {
		say = append(say, msg)
	}
	return strings.Join(say, ": ")
}

func errorMessage(e *snapshotv1.Error) string {
	if e == nil || e.Message == nil {
		return ""
	}
	return *e.Message
}

func findCondition(cs []snapshotv1.Condition, t snapshotv1.ConditionType) *snapshotv1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

// waitSnapshot waits until KubeVirt has taken s and returns it. A
// snapshot KubeVirt failed, or did not take before ctx ended, is deleted:
// it is no snapshot the guest has.
func (d *Driver) waitSnapshot(ctx context.Context, s *snapshotv1.VirtualMachineSnapshot) (*snapshotv1.VirtualMachineSnapshot, error) {
	var last *snapshotv1.VirtualMachineSnapshot
	var failed error
	err := wait.PollUntilContextCancel(ctx, snapshotPoll, true, func(ctx context.Context) (bool, error) {
		got := &snapshotv1.VirtualMachineSnapshot{}
		switch err := d.live.Get(ctx, client.ObjectKeyFromObject(s), got); {
		case kerrors.IsNotFound(err):
			failed = errors.Errorf("KubeVirt VirtualMachineSnapshot %s/%s was deleted before it was taken", s.Namespace, s.Name)
			return true, nil
		case err != nil:
			return false, nil // the API server may come back before ctx ends
		}
		last = got
		if why := snapshotFailure(got); why != "" {
			failed = errors.Errorf("KubeVirt failed VirtualMachineSnapshot %s/%s: %s", s.Namespace, s.Name, why)
			return true, nil
		}
		return snapshotReady(got), nil
	})
	if err == nil && failed == nil {
		return last, nil
	}
	if failed == nil {
		failed = errors.Wrapf(err, "KubeVirt did not take VirtualMachineSnapshot %s/%s in time (%s)", s.Namespace, s.Name, snapshotProgress(last))
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := d.live.Delete(cctx, s); client.IgnoreNotFound(err) != nil {
		return nil, errors.Join(failed, errors.Wrap(err, "cannot delete the KubeVirt VirtualMachineSnapshot"))
	}
	return nil, failed
}

// snapshotOf is what the driver reports of a snapshot KubeVirt took: when
// KubeVirt made its content, and whether the guest ran and its agent
// froze it. KubeVirt tells no size.
func snapshotOf(s *snapshotv1.VirtualMachineSnapshot) driver.Snapshot {
	out := driver.Snapshot{ID: s.Annotations[AnnotationSnapshot]}
	if s.Status == nil {
		return out
	}
	if s.Status.CreationTime != nil {
		out.CreatedAt = s.Status.CreationTime.Time
	}
	out.Online = slices.Contains(s.Status.Indications, snapshotv1.VMSnapshotOnlineSnapshotIndication)
	out.Frozen = slices.Contains(s.Status.Indications, snapshotv1.VMSnapshotGuestAgentIndication)
	return out
}

// Snapshots implements driver.Snapshotter: the ready VirtualMachineSnapshots
// labelled with uid, read from the API server.
func (d *Driver) Snapshots(ctx context.Context, uid string) ([]driver.Snapshot, error) {
	if _, err := d.client(); err != nil {
		return nil, err
	}
	list := &snapshotv1.VirtualMachineSnapshotList{}
	if err := d.live.List(ctx, list, client.InNamespace(d.namespace), client.MatchingLabels{LabelUID: uid}); err != nil {
		return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachineSnapshots")
	}
	var out []driver.Snapshot
	for i := range list.Items {
		if s := &list.Items[i]; snapshotReady(s) && s.Annotations[AnnotationSnapshot] != "" {
			out = append(out, snapshotOf(s))
		}
	}
	slices.SortFunc(out, func(a, b driver.Snapshot) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// DeleteSnapshot implements driver.Snapshotter. KubeVirt deletes the
// snapshot's content and volume snapshots with it.
func (d *Driver) DeleteSnapshot(ctx context.Context, uid, id string) error {
	if _, err := d.client(); err != nil {
		return err
	}
	s, err := d.snapshot(ctx, uid, id)
	switch {
	case driver.IsTerminal(err), err == nil && s == nil:
		return nil // not the guest's: it has none of that id
	case err != nil:
		return err
	case s.DeletionTimestamp != nil:
		return nil
	}
	err = d.live.Delete(ctx, s, client.Preconditions{UID: &s.UID})
	return errors.Wrap(client.IgnoreNotFound(err), "cannot delete the KubeVirt VirtualMachineSnapshot")
}

// RevertSnapshot implements driver.Snapshotter. KubeVirt's snapshots hold
// no memory, so the guest is left stopped whatever req.Running says.
func (d *Driver) RevertSnapshot(ctx context.Context, uid string, req driver.RevertRequest) error {
	id := req.Snapshot
	c, err := d.client()
	if err != nil {
		return err
	}
	vm, _, err := d.get(ctx, c, uid)
	if err != nil {
		return err
	}
	if req.Restore != "" && vm.Annotations[AnnotationLastRestore] == req.Restore {
		return nil
	}
	s, err := d.snapshot(ctx, uid, id)
	switch {
	case err != nil:
		return err
	case s == nil || !snapshotReady(s):
		return driver.Terminalf("guest %s has no snapshot %s", uid, id)
	}
	r, err := d.restore(ctx, uid, id)
	if err != nil {
		return err
	}
	if r == nil {
		if vm, err = d.stopForRestore(ctx, c, uid); err != nil {
			return err
		}
		r = &snapshotv1.VirtualMachineRestore{
			ObjectMeta: d.actMeta(vm, uid, RestoreName(id), id),
			Spec: snapshotv1.VirtualMachineRestoreSpec{
				Target:                     vmRef(vm),
				VirtualMachineSnapshotName: s.Name,
				VolumeRestorePolicy:        ptr(snapshotv1.VolumeRestorePolicyInPlace),
			},
		}
		err := c.Create(ctx, r)
		switch {
		case err == nil, kerrors.IsAlreadyExists(err):
		case kerrors.IsInvalid(err) || kerrors.IsBadRequest(err) || kerrors.IsForbidden(err):
			return driver.Terminal(errors.Wrap(err, "KubeVirt refused the restore"))
		default:
			return errors.Wrap(err, "cannot create the KubeVirt VirtualMachineRestore")
		}
	}
	if err := d.waitRestore(ctx, r); err != nil {
		return err
	}
	if req.Restore != "" {
		vm.Annotations = merged(vm.Annotations, map[string]string{AnnotationLastRestore: req.Restore})
	}
	if err := d.keepRecords(ctx, c, uid, vm); err != nil {
		return err
	}
	// Done: a later revert to this snapshot makes a new restore.
	err = c.Delete(ctx, r, client.PropagationPolicy(metav1.DeletePropagationBackground))
	return errors.Wrap(client.IgnoreNotFound(err), "cannot delete the finished KubeVirt VirtualMachineRestore")
}

// restore reads the VirtualMachineRestore of a revert of guest uid to
// snapshot id; nil when there is none.
func (d *Driver) restore(ctx context.Context, uid, id string) (*snapshotv1.VirtualMachineRestore, error) {
	r := &snapshotv1.VirtualMachineRestore{}
	switch err := d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: RestoreName(id)}, r); {
	case kerrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the KubeVirt VirtualMachineRestore")
	case r.Labels[LabelUID] != uid || r.Annotations[AnnotationSnapshot] != id:
		return nil, driver.Terminalf("KubeVirt VirtualMachineRestore %s/%s is not a revert of guest %s to snapshot %s", r.Namespace, r.Name, uid, id)
	}
	return r, nil
}

// stopForRestore stops guest uid as Ensure stops a guest (a paused one
// resumed first, runStrategy Halted, no VMI counted from then on) and
// waits until KubeVirt has removed its VMI. It returns the stopped VM.
func (d *Driver) stopForRestore(ctx context.Context, c client.Client, uid string) (*kubevirtv1.VirtualMachine, error) {
	var vm *kubevirtv1.VirtualMachine
	err := d.retry(c, func(r client.Reader) error {
		got, vmi, err := d.get(ctx, r, uid)
		if err != nil {
			return err
		}
		if err := d.resumeToStop(ctx, vmi); err != nil {
			return err
		}
		next := got.DeepCopy()
		next.Spec.RunStrategy, next.Spec.Running = ptr(runStrategy(false)), nil //nolint:staticcheck // KubeVirt takes one of the two
		next.Annotations = merged(next.Annotations, map[string]string{AnnotationVMI: ""})
		vm = next
		if equalVM(got, next) {
			return nil
		}
		return errors.Wrap(patch(ctx, c, got, next), "cannot stop the KubeVirt VirtualMachine")
	})
	if err != nil {
		return nil, err
	}
	err = wait.PollUntilContextCancel(ctx, snapshotPoll, true, func(ctx context.Context) (bool, error) {
		vmi, err := d.instance(ctx, d.live, vm)
		return err == nil && vmi == nil, nil
	})
	return vm, errors.Wrapf(err, "KubeVirt did not stop VirtualMachine %s/%s for the restore in time", vm.Namespace, vm.Name)
}

// waitRestore waits until KubeVirt has completed r. One KubeVirt failed is
// deleted, so the next revert makes a new one; one that has not finished
// when ctx ends is left for it to find.
func (d *Driver) waitRestore(ctx context.Context, r *snapshotv1.VirtualMachineRestore) error {
	var failed error
	var progress string
	err := wait.PollUntilContextCancel(ctx, snapshotPoll, true, func(ctx context.Context) (bool, error) {
		got := &snapshotv1.VirtualMachineRestore{}
		switch err := d.live.Get(ctx, client.ObjectKeyFromObject(r), got); {
		case kerrors.IsNotFound(err):
			failed = errors.Errorf("KubeVirt VirtualMachineRestore %s/%s was deleted before it completed", r.Namespace, r.Name)
			return true, nil
		case err != nil || got.Status == nil:
			return false, nil
		}
		if f := findCondition(got.Status.Conditions, snapshotv1.ConditionFailure); f != nil && f.Status == corev1.ConditionTrue {
			failed = errors.Errorf("KubeVirt failed VirtualMachineRestore %s/%s: %s", r.Namespace, r.Name, cmp.Or(f.Message, f.Reason))
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if err := d.live.Delete(cctx, got); client.IgnoreNotFound(err) != nil {
				failed = errors.Join(failed, errors.Wrap(err, "cannot delete the failed KubeVirt VirtualMachineRestore"))
			}
			return true, nil
		}
		if ready := findCondition(got.Status.Conditions, snapshotv1.ConditionReady); ready != nil {
			progress = ready.Reason
		}
		return got.Status.Complete != nil && *got.Status.Complete, nil
	})
	if failed != nil {
		return failed
	}
	return errors.Wrapf(err, "KubeVirt did not complete VirtualMachineRestore %s/%s in time (%s)", r.Namespace, r.Name, cmp.Or(progress, "not taken up"))
}

// keepRecords writes back on the restored VM what the driver recorded on
// was, the VM before the restore: its label and every annotation of
// virtfleet's (restart and reset nonces handled, restarts counted, whose
// VM it is). KubeVirt v1.7.0 keeps a restored VM's metadata; this keeps a
// revert from replaying an act where a KubeVirt does not.
func (d *Driver) keepRecords(ctx context.Context, c client.Client, uid string, was *kubevirtv1.VirtualMachine) error {
	return d.retry(d.live, func(r client.Reader) error {
		vm := &kubevirtv1.VirtualMachine{}
		if err := r.Get(ctx, client.ObjectKeyFromObject(was), vm); err != nil {
			return errors.Wrap(err, "cannot get the restored KubeVirt VirtualMachine")
		}
		next := vm.DeepCopy()
		next.Labels = merged(next.Labels, map[string]string{LabelUID: uid})
		for k, v := range was.Annotations {
			if strings.HasPrefix(k, "virtfleet.io/") {
				next.Annotations = merged(next.Annotations, map[string]string{k: v})
			}
		}
		if maps(vm.Labels, next.Labels) && maps(vm.Annotations, next.Annotations) {
			return nil
		}
		return errors.Wrap(patch(ctx, c, vm, next), "cannot keep the driver's records on the restored KubeVirt VirtualMachine")
	})
}
