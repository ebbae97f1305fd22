package kubevirt

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Ensure implements driver.Driver.
func (d *Driver) Ensure(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	if err := validate(m); err != nil {
		return driver.Observation{}, err
	}
	c, err := d.client()
	if err != nil {
		return driver.Observation{}, err
	}
	var o driver.Observation
	err = d.retry(c, func(r client.Reader) (err error) {
		o, err = d.ensure(ctx, c, r, m)
		return err
	})
	if err != nil {
		return o, err
	}
	if o, err = d.imports(ctx, m, o); err != nil {
		return o, err
	}
	if msg := d.growDisks(ctx, c, m); msg != "" {
		o.Message = strings.TrimPrefix(o.Message+"; "+msg, "; ")
	}
	return o, nil
}

// ensure is one read-modify-write of Ensure: reads through reader, writes
// through c. An imported guest's definition is its own: only its power
// state and restarts are driven.
func (d *Driver) ensure(ctx context.Context, c client.Client, reader client.Reader, m driver.Machine) (driver.Observation, error) {
	vm, vmi, err := d.get(ctx, reader, m.UID)
	var notOurs *NotOursError
	switch {
	case errors.As(err, &notOurs):
		return driver.Observation{}, driver.Terminal(err)
	case err != nil && !driver.IsNotFound(err):
		return driver.Observation{}, err
	}
	// A VM that exists keeps the maxima it has while they hold m's shape;
	// an imported one's definition is its own and only read from want.
	var prev *kubevirtv1.VirtualMachineInstanceTemplateSpec
	if vm != nil && !imported(vm) {
		prev = template(vm)
	}
	want, err := newVM(m, d.namespace, prev)
	if err != nil {
		return driver.Observation{}, err
	}
	live := vmi != nil && vmi.DeletionTimestamp == nil && !vmi.IsFinal()
	// A guest running inline (made before the agent knew of instance
	// types) keeps running so; it takes its type at its next start.
	if m.Instancetype != nil && (vm == nil || (!imported(vm) && (!live || vm.Spec.Instancetype != nil))) {
		if err := typed(m, want); err != nil {
			return driver.Observation{}, err
		}
	}
	if vm == nil {
		return d.create(ctx, c, m, want)
	}
	next := vm.DeepCopy()
	reshaped, err := reshapedFor(m, vm, want)
	if err != nil {
		return driver.Observation{}, err
	}
	// A VM that leaves its type for a shape of its own changes at its
	// next start, as KubeVirt would have it.
	retyped := !imported(vm) && (vm.Spec.Instancetype == nil) != (want.Spec.Instancetype == nil)
	reshaped = reshaped || (retyped && vm.Spec.Instancetype != nil)
	if !imported(vm) && !reshaped && shape(vm.Spec.Template) == shape(want.Spec.Template) {
		// vCPUs and memory within the maxima: KubeVirt hot-plugs them
		// into a running VMI, and a stopped guest starts with them;
		// those of a type come with another type (another revision).
		resize(next.Spec.Template, want.Spec.Template)
		rename(next, want)
	}
	if !imported(vm) && (reshaped || (!live && (retyped || !slices.Equal(dataClaims(vm.Spec.Template), dataClaims(want.Spec.Template))))) {
		// Takes effect when KubeVirt next creates the VMI; a new disk's
		// image still being checked holds the new shape back until then.
		// Data disks of a guest without a VMI go with it; those of a
		// running guest are hot-plugged below.
		progress, err := d.ensureVolumes(ctx, c, m)
		if err != nil {
			return driver.Observation{}, err
		}
		if progress == "" {
			next.Spec.Template = want.Spec.Template
			if !sameInstancetype(next, want) {
				next.Spec.Instancetype = want.Spec.Instancetype
			}
			if want.Spec.Instancetype == nil {
				delete(next.Annotations, AnnotationInstancetypeShape)
			}
		}
	}
	hotplug := !imported(vm) && live && !reshaped
	if hotplug {
		dropUnpluggable(next.Spec.Template, want.Spec.Template)
	}
	wasRunning := wantsRunning(vm, vmi)
	if wasRunning != m.Running {
		next.Spec.RunStrategy, next.Spec.Running = want.Spec.RunStrategy, nil //nolint:staticcheck // KubeVirt takes one of the two
	}
	if !m.Running {
		if err := d.resumeToStop(ctx, vmi); err != nil {
			return driver.Observation{}, err
		}
	}
	next.Annotations = merged(next.Annotations, want.Annotations)
	count, seen := restarts(vm, vmi)
	restart, hard := d.restartTarget(next, vmi, m, wasRunning)
	switch {
	case !m.Running:
		// A stopped guest has no VMI to count recreations from, and a
		// restart asked for meanwhile is satisfied by the next start.
		next.Annotations[AnnotationVMI] = ""
		next.Annotations[AnnotationRestartNonce] = m.RestartNonce
	case restart != nil && restart.UID != types.UID(next.Annotations[AnnotationRestartVMI]):
		count++
		next.Annotations[AnnotationRestartVMI] = string(restart.UID)
		fallthrough
	default:
		next.Annotations[AnnotationVMI] = seen
		next.Annotations[AnnotationRestartNonce] = m.RestartNonce
	}
	if _, recorded := next.Annotations[AnnotationResetNonce]; recorded || m.ResetNonce != "" {
		// Handled by the restart just recorded, or by the next start; an
		// empty one asks for none, so the same nonce asks again.
		next.Annotations[AnnotationResetNonce] = m.ResetNonce
	}
	next.Annotations[AnnotationRestarts] = strconv.Itoa(int(count))
	if !equalVM(vm, next) {
		moved := !sameInstancetype(vm, next)
		if moved {
			if err := d.ensureInstancetype(ctx, c, next); err != nil {
				return driver.Observation{}, err
			}
		}
		if err := patch(ctx, c, vm, next); err != nil {
			return driver.Observation{}, errors.Wrap(err, "cannot update the KubeVirt VirtualMachine")
		}
		if moved && vm.Spec.Instancetype != nil {
			if err := d.pruneInstancetypes(ctx, c); err != nil {
				return driver.Observation{}, err
			}
		}
	}
	var note string
	if hotplug && restart == nil && m.Running && wasRunning {
		if note, err = d.hotplug(ctx, c, m, next, want); err != nil {
			return driver.Observation{}, err
		}
	}
	if restart != nil {
		// Only that VMI: never a replacement KubeVirt made meanwhile. A
		// reset gives the guest no time to shut down.
		opts := []client.DeleteOption{client.Preconditions{UID: &restart.UID}}
		if hard {
			opts = append(opts, client.GracePeriodSeconds(0))
		}
		err := c.Delete(ctx, restart, opts...)
		if err != nil && !kerrors.IsNotFound(err) && !kerrors.IsConflict(err) {
			return driver.Observation{}, errors.Wrap(err, "cannot delete the VMI to restart the guest")
		}
		vmi = nil
	}
	o := observe(next, vmi, d.now())
	if note != "" {
		o.Message = strings.TrimPrefix(o.Message+"; "+note, "; ")
	}
	if !m.Running || !wasRunning || !runs(vmi) {
		// A VMI that is not running yet (a new one after a start or a
		// restart) is paused by a later call, once it runs.
		return o, nil
	}
	switch {
	case m.Paused && !pausedVMI(vmi):
		if err := d.subresource(ctx, vmi, "pause", &kubevirtv1.PauseOptions{}); err != nil {
			return driver.Observation{}, err
		}
		// virt-api answers once virt-handler paused the guest; the
		// condition that says so comes with a later VMI update.
		if o.Phase == driver.PhaseRunning {
			o.Phase = driver.PhasePaused
		}
	case !m.Paused && pausedVMI(vmi):
		if err := d.subresource(ctx, vmi, "unpause", &kubevirtv1.UnpauseOptions{}); err != nil {
			return driver.Observation{}, err
		}
		if o.Phase == driver.PhasePaused {
			o.Phase = driver.PhaseRunning
		}
	}
	return o, nil
}

// resumeToStop resumes vmi if it is paused, before KubeVirt stops it:
// resumed, the guest shuts down cleanly; paused, it would be killed once
// its grace period is over.
func (d *Driver) resumeToStop(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) error {
	if !runs(vmi) || !pausedVMI(vmi) {
		return nil
	}
	return d.subresource(ctx, vmi, "unpause", &kubevirtv1.UnpauseOptions{})
}

// runs is whether vmi is a VMI KubeVirt runs and keeps running: one that
// can be paused and unpaused.
func runs(vmi *kubevirtv1.VirtualMachineInstance) bool {
	return vmi != nil && vmi.DeletionTimestamp == nil && vmi.Status.Phase == kubevirtv1.Running
}

// subresource asks KubeVirt's subresource API (served by virt-api through
// the API server) for the VMI's subresource sub, pause or unpause, with
// opts, as virtctl does. virt-api refuses with a conflict what the VMI's
// state does not allow (not running, already paused, not paused): the
// informers were behind, and the caller comes back.
func (d *Driver) subresource(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, sub string, opts any) error {
	return d.put(ctx, "virtualmachineinstances", "VMI", vmi.Namespace, vmi.Name, sub, opts)
}

// put asks virt-api for subresource sub of the object of resource (kind,
// for messages) namespace/name, with opts.
func (d *Driver) put(ctx context.Context, resource, kind, namespace, name, sub string, opts any) error {
	body, err := json.Marshal(opts)
	if err != nil {
		return errors.Wrapf(err, "cannot encode the options of %s", sub)
	}
	err = d.subresources.Put().Namespace(namespace).Resource(resource).Name(name).SubResource(sub).Body(body).Do(ctx).Error()
	if kerrors.IsNotFound(err) && kerrors.HasStatusCause(err, metav1.CauseTypeUnexpectedServerResponse) {
		// Not virt-api's answer, a Status naming the object, but the API
		// server's plain 404 for a path it serves no API at.
		return errors.Wrapf(err, "cannot %s %s %s/%s: the cluster serves no %s/%s API (KubeVirt's virt-api serves it)", sub, kind, namespace, name, kubevirtv1.SubresourceGroupName, kubevirtv1.ApiLatestVersion)
	}
	return errors.Wrapf(err, "cannot %s %s %s/%s", sub, kind, namespace, name)
}

// restartTarget is the VMI to delete to restart the guest, if any: on a new
// restart or reset nonce for a guest that was already running (the nonces
// it starts with count as handled), or to finish a restart the annotations
// record but whose delete was lost. hard is set for a reset alone.
func (d *Driver) restartTarget(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, m driver.Machine, wasRunning bool) (target *kubevirtv1.VirtualMachineInstance, hard bool) {
	if vmi == nil || vmi.DeletionTimestamp != nil || !m.Running || !wasRunning {
		return nil, false
	}
	a := vm.Annotations
	if string(vmi.UID) == a[AnnotationRestartVMI] {
		return vmi, false
	}
	if m.RestartNonce != "" && m.RestartNonce != a[AnnotationRestartNonce] {
		return vmi, false
	}
	if m.ResetNonce != "" && m.ResetNonce != a[AnnotationResetNonce] {
		return vmi, true
	}
	return nil, false
}

// create makes the guest's PVCs and DataVolumes and its VM. A VM that
// exists already (another Ensure won the race) is read and ensured on the
// next call.
func (d *Driver) create(ctx context.Context, c client.Client, m driver.Machine, vm *kubevirtv1.VirtualMachine) (driver.Observation, error) {
	if progress, err := d.ensureVolumes(ctx, c, m); err != nil || progress != "" {
		return driver.Observation{UID: m.UID, Phase: driver.PhaseProvisioning, Message: progress}, err
	}
	vm.Annotations[AnnotationRestartNonce] = m.RestartNonce
	if m.ResetNonce != "" {
		vm.Annotations[AnnotationResetNonce] = m.ResetNonce
	}
	vm.Annotations[AnnotationRestarts] = "0"
	if err := d.ensureInstancetype(ctx, c, vm); err != nil {
		return driver.Observation{}, err
	}
	if err := c.Create(ctx, vm); err != nil {
		switch {
		case kerrors.IsAlreadyExists(err):
			return driver.Observation{}, errors.New("the KubeVirt VirtualMachine was created concurrently; ensuring it again")
		case missingInstancetype(err):
			return driver.Observation{}, errors.Wrap(err, "the instance type went while the VM was being created; ensuring it again")
		}
		if kerrors.IsInvalid(err) || kerrors.IsBadRequest(err) {
			return driver.Observation{}, driver.Terminal(errors.Wrap(err, "KubeVirt rejected the VirtualMachine"))
		}
		return driver.Observation{}, errors.Wrap(err, "cannot create the KubeVirt VirtualMachine")
	}
	return observe(vm, nil, d.now()), nil
}

// ensureVolumes creates the guest's disks that are missing: a DataVolume
// for one from an image (ensureDataVolume), else an empty PVC of the
// disk's size; existing ones are left as they are. It returns the
// progress of the source checks that hold a DataVolume back.
func (d *Driver) ensureVolumes(ctx context.Context, c client.Client, m driver.Machine) (string, error) {
	var waiting []string
	for _, disk := range m.Disks {
		if disk.Image != nil {
			progress, err := d.ensureDataVolume(ctx, c, disk)
			if err != nil {
				return "", err
			}
			if progress != "" {
				waiting = append(waiting, progress)
			}
			continue
		}
		if disk.SizeBytes <= 0 {
			continue // must exist already: nothing to make it with
		}
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: d.namespace, Name: ObjectName(disk.Name), Labels: map[string]string{labelManagedBy: managedBy}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{d.accessMode},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(disk.SizeBytes, resource.BinarySI)}},
			},
		}
		if disk.Pool != "" {
			pvc.Spec.StorageClassName = ptr(disk.Pool)
		}
		err := c.Create(ctx, pvc)
		switch {
		case err == nil, kerrors.IsAlreadyExists(err):
		case kerrors.IsInvalid(err):
			return "", driver.Terminal(errors.Wrapf(err, "the KubeVirt cluster rejected PVC %s", pvc.Name))
		default:
			return "", errors.Wrapf(err, "cannot create PVC %s", pvc.Name)
		}
	}
	return strings.Join(waiting, "; "), nil
}

// The label on the PVCs and DataVolumes the driver creates (and so on the
// PVCs CDI makes for those DataVolumes); it deletes only those.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "virtfleet"
)

func merged(into, from map[string]string) map[string]string {
	if into == nil {
		into = map[string]string{}
	}
	for k, v := range from {
		into[k] = v
	}
	return into
}

func equalVM(a, b *kubevirtv1.VirtualMachine) bool {
	return reflect.DeepEqual(a.Spec.RunStrategy, b.Spec.RunStrategy) && reflect.DeepEqual(a.Spec.Running, b.Spec.Running) && //nolint:staticcheck // an imported VM may use it
		reflect.DeepEqual(a.Spec.Instancetype, b.Spec.Instancetype) &&
		maps(a.Annotations, b.Annotations) && shape(a.Spec.Template) == shape(b.Spec.Template) &&
		slices.Equal(dataClaims(a.Spec.Template), dataClaims(b.Spec.Template)) && sameSize(a.Spec.Template, b.Spec.Template)
}

// reshapedFor is whether vm's template is of another shape than want, the
// template for m: its shape hash is neither want's nor the one an agent
// from before live resize gave m (legacyShape), which an imported VM
// (whose shape is its own) never is.
func reshapedFor(m driver.Machine, vm, want *kubevirtv1.VirtualMachine) (bool, error) {
	have := shape(vm.Spec.Template)
	if have == shape(want.Spec.Template) || imported(vm) {
		return false, nil
	}
	legacy, err := legacyShape(m, want.Spec.Template)
	return have != legacy, err
}

// resize gives template next the vCPUs (sockets) and guest memory of
// want.
func resize(next, want *kubevirtv1.VirtualMachineInstanceTemplateSpec) {
	// A template naming an instance type has neither: that type's are
	// the ones to change (rename).
	if next.Spec.Domain.CPU == nil || next.Spec.Domain.Memory == nil || want.Spec.Domain.CPU == nil || want.Spec.Domain.Memory == nil {
		return
	}
	next.Spec.Domain.CPU.Sockets = want.Spec.Domain.CPU.Sockets
	next.Spec.Domain.Memory.Guest = want.Spec.Domain.Memory.Guest
}

// rename makes next name the instance type want names, keeping the
// revision KubeVirt recorded while it is the same type; another type
// (another revision of virtfleet's) is recorded anew, and under
// LiveUpdate hot-plugged into a running guest.
func rename(next, want *kubevirtv1.VirtualMachine) {
	w := want.Spec.Instancetype
	if w == nil || next.Spec.Instancetype == nil || sameInstancetype(next, want) {
		return
	}
	next.Spec.Instancetype = w.DeepCopy()
}

// sameInstancetype is whether a and b name the same instance type, or
// both none.
func sameInstancetype(a, b *kubevirtv1.VirtualMachine) bool {
	x, y := a.Spec.Instancetype, b.Spec.Instancetype
	if x == nil || y == nil {
		return x == y
	}
	return x.Name == y.Name && strings.EqualFold(x.Kind, y.Kind)
}

// sameSize is whether two templates give the same vCPUs and memory.
func sameSize(a, b *kubevirtv1.VirtualMachineInstanceTemplateSpec) bool {
	if a == nil || b == nil {
		return a == b
	}
	av, am := size(&a.Spec)
	bv, bm := size(&b.Spec)
	return av == bv && am == bm
}

// shape is the shape hash a template was made with; empty for none.
func shape(t *kubevirtv1.VirtualMachineInstanceTemplateSpec) string {
	if t == nil {
		return ""
	}
	return t.ObjectMeta.Annotations[AnnotationShape]
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
