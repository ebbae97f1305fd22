// Package clone reconciles VirtualMachineClones: it makes the new VM out
// of kinds the hub already runs, so no node learns anything new. For each
// disk of the source it makes a Volume of the new VM's and, owned by it, a
// DiskImage cloning the source's Volume (source.volumeRef); then the new
// VM, with the source's spec.forProvider on those Volumes. Placement puts
// the new VM where its images can be made, the source's node (node-local
// disks are copied where they are), and the node copies each disk when it
// first needs it, while the source runs on. From a VirtualMachineSnapshot,
// the VM's spec is the one the snapshot kept and each DiskImage names the
// snapshot too (source.snapshotRef): the node copies the Volume as the
// snapshot holds it.
//
// It writes in an order a restarted hub picks up anywhere: Volumes, then
// their DiskImages, then the VM, each created only if missing and marked
// with the clone's uid (AnnotationClonedBy), so an object of the same name
// that another made is never taken over; then the status. A clone is over
// once the new VM runs (or is stopped, as its source was) on a node, or
// once something it cannot get past is found.
package clone

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
)

// Event reasons, on the clone and on the new VM.
const (
	ReasonStarted   event.Reason = "CloneStarted"
	ReasonSucceeded event.Reason = "CloneSucceeded"
	ReasonFailed    event.Reason = "CloneFailed"
)

// LabelClone, on what a clone made, names the clone, so `kubectl get
// vm,volume,img -l compute.virtfleet.io/clone=NAME` finds it all.
const LabelClone = v1alpha1.Group + "/clone"

// Options of the clone controller.
type Options struct {
	// Pool tells which backend the source's node runs.
	Pool providerconfig.Fleets
}

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, co Options) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, co); err != nil {
			panic(errors.Wrap(err, "cannot set up the VirtualMachineClone controller"))
		}
	}, v1alpha1.VirtualMachineCloneGroupVersionKind, v1alpha1.VirtualMachineSnapshotGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind,
		v1alpha1.VolumeGroupVersionKind, v1alpha1.DiskImageGroupVersionKind, v1alpha1.VirtualMachineBackupGroupVersionKind)
	return nil
}

// Setup adds the controller.
func Setup(mgr ctrl.Manager, o controller.Options, co Options) error {
	name := "virtualmachineclone"
	r := NewReconciler(mgr.GetClient(), co, event.NewAPIRecorder(mgr.GetEventRecorderFor(name))) //nolint:staticcheck // as the other controllers
	// A clone waits for its source's VM and Volumes, and follows the VM
	// and images it made: any of them changing wakes the clones of its
	// namespace under way, which are few.
	wake := handler.EnqueueRequestsFromMapFunc(r.clones)
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.VirtualMachineClone{}).
		Watches(&v1alpha1.VirtualMachine{}, wake).
		Watches(&v1alpha1.Volume{}, wake).
		Watches(&v1alpha1.DiskImage{}, wake).
		Watches(&v1alpha1.VirtualMachineSnapshot{}, wake).
		Watches(&v1alpha1.VirtualMachineBackup{}, wake).
		Complete(r)
}

// Reconciler reconciles VirtualMachineClones.
type Reconciler struct {
	kube     client.Client
	configs  *providerconfig.Resolver
	opts     Options
	recorder event.Recorder
}

// NewReconciler returns a Reconciler writing with kube.
func NewReconciler(kube client.Client, co Options, recorder event.Recorder) *Reconciler {
	return &Reconciler{kube: kube, configs: providerconfig.NewResolver(kube), opts: co, recorder: recorder}
}

// clones are the clones under way in o's namespace.
func (r *Reconciler) clones(ctx context.Context, o client.Object) []reconcile.Request {
	l := &v1alpha1.VirtualMachineCloneList{}
	if err := r.kube.List(ctx, l, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range l.Items {
		if !l.Items[i].Done() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
		}
	}
	return out
}

// refusal is why a clone can never go on: it fails.
type refusal struct{ why string }

func (e *refusal) Error() string { return e.why }

func refuse(format string, args ...any) error { return &refusal{why: fmt.Sprintf(format, args...)} }

// waiting is why a clone cannot go on yet: it stays Pending.
type waiting struct{ why string }

func (e *waiting) Error() string { return e.why }

func wait(format string, args ...any) error { return &waiting{why: fmt.Sprintf(format, args...)} }

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	c := &v1alpha1.VirtualMachineClone{}
	if err := r.kube.Get(ctx, req.NamespacedName, c); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if c.Done() || meta.WasDeleted(c) {
		return reconcile.Result{}, nil
	}
	err := r.clone(ctx, c)
	var no *refusal
	var later *waiting
	switch {
	case errors.As(err, &no):
		return reconcile.Result{}, r.fail(ctx, c, no.why)
	case errors.As(err, &later):
		st := c.Status
		st.Phase, st.Message = v1alpha1.ClonePending, later.why
		return reconcile.Result{}, r.setStatus(ctx, c, st)
	}
	return reconcile.Result{}, err
}

// clone makes the new VM, or follows it once made. What the clone made is
// followed without its source: the source may go once copied.
func (r *Reconciler) clone(ctx context.Context, c *v1alpha1.VirtualMachineClone) error {
	target := &v1alpha1.VirtualMachine{}
	err := r.kube.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: string(c.Spec.Target.Name)}, target)
	switch {
	case err == nil:
		if err := r.own(c, target); err != nil {
			return err
		}
		return r.follow(ctx, c, target)
	case !kerrors.IsNotFound(err):
		return errors.Wrap(err, "cannot get the target VM")
	}
	src, err := r.source(ctx, c)
	if err != nil {
		return err
	}
	// The status names the disks before the VM exists: a hub restarted
	// after the VM was made follows it with them.
	makeDisks := r.onNode
	if c.Spec.BackupLocation != "" {
		makeDisks = r.throughBackup
	}
	st, started, err := makeDisks(ctx, c, src)
	if err != nil {
		return err
	}
	st.Phase, st.SourceUID = v1alpha1.CloneInProgress, string(src.VM.UID)
	st.Indications = src.indications()
	if err := r.setStatus(ctx, c, st); err != nil {
		return err
	}
	vm := newVM(c, src.VM, st.Disks)
	if err := r.create(ctx, c, vm); err != nil {
		return err
	}
	st = c.Status
	st.TargetUID = string(vm.UID)
	st.CreationTime = ptr.To(vm.CreationTimestamp)
	if err := r.setStatus(ctx, c, st); err != nil {
		return err
	}
	r.recorder.Event(c, event.Normal(ReasonStarted, started))
	return nil
}

// onNode makes the new VM's disks of src's on the node that holds them,
// and returns the clone's status and its start's event message.
func (r *Reconciler) onNode(ctx context.Context, c *v1alpha1.VirtualMachineClone, src *source) (v1alpha1.VirtualMachineCloneStatus, string, error) {
	st := c.Status
	node, disks, err := r.disks(ctx, c, src)
	if err != nil {
		return st, "", err
	}
	if err := r.copiesVolumes(ctx, src, node); err != nil {
		return st, "", err
	}
	for i, d := range disks {
		img := v1alpha1.DiskImageSource{VolumeRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(d.Source)}}
		if s := src.snapshotName(); s != "" {
			img.SnapshotRef = &v1alpha1.LocalReference{Name: v1alpha1.LocalName(s)}
		}
		if err := r.makeDisk(ctx, c, d, src.Volumes[i], img, nil); err != nil {
			return st, "", err
		}
	}
	st.Node, st.Disks = node, disks
	st.Message = fmt.Sprintf("node %s copies the disks of %s: a clone is made on the node that holds its source's disks", node, src)
	return st, fmt.Sprintf("Cloning %s into VM %s on node %s, where its disks are", src, c.Spec.Target.Name, node), nil
}

// source is the VM a clone copies, with its Volumes in the order of its
// disks; or, from a snapshot, the VM as the snapshot kept it.
type source struct {
	VM      *v1alpha1.VirtualMachine
	Volumes []*v1alpha1.Volume
	// Snapshot, when set, holds the disks as they are copied.
	Snapshot *v1alpha1.VirtualMachineSnapshot
}

// String names the source in messages.
func (s *source) String() string {
	if s.Snapshot != nil {
		return fmt.Sprintf("VirtualMachineSnapshot %s of VirtualMachine %s", s.Snapshot.Name, s.VM.Name)
	}
	return "VirtualMachine " + s.VM.Name
}

// indications are what the copy of src is: as consistent as the snapshot
// (without its memory: a clone boots), or Online when the source runs
// while its disks are copied.
func (s *source) indications() []string {
	var out []string
	switch {
	case s.Snapshot != nil:
		for _, i := range s.Snapshot.Status.Indications {
			if i != v1alpha1.IndicationMemory {
				out = append(out, i)
			}
		}
	case s.VM.Status.AtProvider.Phase == v1alpha1.PhaseRunning:
		out = []string{v1alpha1.IndicationOnline}
	}
	return out
}

// snapshotName is the name of the snapshot the disks are copied as they
// were in, if any.
func (s *source) snapshotName() string {
	if s.Snapshot == nil {
		return ""
	}
	return s.Snapshot.Name
}

// fromSnapshot reads the snapshot c copies, in c's namespace only, and
// the Volumes that hold it. The new VM gets the spec the snapshot kept,
// on copies of its disks as the snapshot holds them, which the node makes
// while the snapshot's VM runs on; the VM itself may be gone, since the
// snapshot lives in its Volumes.
func (r *Reconciler) fromSnapshot(ctx context.Context, c *v1alpha1.VirtualMachineClone) (*source, error) {
	name := string(c.Spec.Source.Name)
	s := &v1alpha1.VirtualMachineSnapshot{}
	err := r.kube.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, s)
	switch {
	case kerrors.IsNotFound(err):
		return nil, wait("VirtualMachineSnapshot %s does not exist in namespace %s", name, c.Namespace)
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the source snapshot")
	case meta.WasDeleted(s) && (!s.Serves(c) || !s.Status.ReadyToUse):
		// One not ready to use never becomes so: a deleted snapshot is
		// no longer followed.
		return nil, refuse("VirtualMachineSnapshot %s is being deleted", name)
	case s.Status.Phase == v1alpha1.SnapshotFailed:
		return nil, refuse("VirtualMachineSnapshot %s failed, and holds nothing to copy: %s", name, s.Status.Message)
	case !s.Status.ReadyToUse:
		return nil, wait("VirtualMachineSnapshot %s is not ready to use (it is %s); the clone waits for it", name, orNone(string(s.Status.Phase)))
	case s.Status.VM == nil:
		return nil, refuse("VirtualMachineSnapshot %s kept no spec of VirtualMachine %s to make the new VM from", name, s.Spec.VMName)
	}
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
		Namespace: c.Namespace, Name: string(s.Spec.VMName), UID: types.UID(s.Status.SourceUID),
		Annotations: map[string]string{v1alpha1.AnnotationNode: s.Status.Node},
	}}
	live := &v1alpha1.VirtualMachine{}
	err = r.kube.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: vm.Name}, live)
	switch {
	case err == nil && live.UID == vm.UID:
		// Its labels and what of its spec the snapshot does not keep
		// (its ProviderConfig, management policies) are the VM's now.
		vm.Labels = live.Labels
		live.Spec.DeepCopyInto(&vm.Spec)
	case err != nil && !kerrors.IsNotFound(err):
		return nil, errors.Wrap(err, "cannot get the snapshot's VM")
	}
	s.Status.VM.DeepCopyInto(&vm.Spec.ForProvider)
	out := &source{VM: vm, Snapshot: s}
	for _, d := range vm.Spec.ForProvider.DiskAttachments {
		v := &v1alpha1.Volume{}
		err := r.kube.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: string(d.Name)}, v)
		switch {
		case kerrors.IsNotFound(err):
			return nil, refuse("Volume %s is gone, and with it the disk VirtualMachineSnapshot %s kept in it", d.Name, name)
		case err != nil:
			return nil, errors.Wrapf(err, "cannot get Volume %s", d.Name)
		}
		out.Volumes = append(out.Volumes, v)
	}
	if vm.Spec.ProviderConfigReference == nil && len(out.Volumes) > 0 {
		vm.Spec.ProviderConfigReference = out.Volumes[0].Spec.ProviderConfigReference
	}
	return out, nil
}

// source reads what c copies, in c's namespace only: a name in a clone
// never reaches another namespace.
func (r *Reconciler) source(ctx context.Context, c *v1alpha1.VirtualMachineClone) (*source, error) {
	name := string(c.Spec.Source.Name)
	if c.Spec.Source.Kind == v1alpha1.CloneFromVirtualMachineSnapshot {
		return r.fromSnapshot(ctx, c)
	}
	vm := &v1alpha1.VirtualMachine{}
	err := r.kube.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, vm)
	switch {
	case kerrors.IsNotFound(err):
		return nil, wait("VirtualMachine %s does not exist in namespace %s", name, c.Namespace)
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the source VM")
	case meta.WasDeleted(vm):
		return nil, refuse("VirtualMachine %s is being deleted", name)
	}
	s := &source{VM: vm}
	for _, d := range vm.Spec.ForProvider.DiskAttachments {
		v := &v1alpha1.Volume{}
		err := r.kube.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: string(d.Name)}, v)
		switch {
		case kerrors.IsNotFound(err):
			return nil, wait("Volume %s of VirtualMachine %s does not exist", d.Name, name)
		case err != nil:
			return nil, errors.Wrapf(err, "cannot get Volume %s", d.Name)
		}
		s.Volumes = append(s.Volumes, v)
	}
	return s, nil
}

// disks names what the clone makes of each of src's disks, once they are
// on a node and the clone may copy them there, and returns that node.
func (r *Reconciler) disks(ctx context.Context, c *v1alpha1.VirtualMachineClone, src *source) (string, []v1alpha1.CloneDisk, error) {
	node := src.VM.GetAnnotations()[v1alpha1.AnnotationNode]
	for _, v := range src.Volumes {
		if p := v.Spec.ForProvider.StoragePool; p != "" {
			return "", nil, refuse("Volume %s is on the shared storage pool %s, and a clone copies a node's own disks only; "+
				"clone it through a backup instead (spec.backupLocation)", v.Name, p)
		}
		at := v.GetAnnotations()[v1alpha1.AnnotationNode]
		switch {
		case at == "":
			return "", nil, wait("Volume %s of VirtualMachine %s is on no node yet; the clone waits until the VM is placed", v.Name, src.VM.Name)
		case node != "" && at != node:
			return "", nil, refuse("Volume %s is on node %s and VirtualMachine %s on node %s: a clone copies disks that are all on one node", v.Name, at, src.VM.Name, node)
		}
		node = at
	}
	disks, err := diskNames(c, src)
	return node, disks, err
}

// diskNames names what the clone c makes of each of src's disks: an image
// and a Volume, each after the new VM and the source's Volume.
func diskNames(c *v1alpha1.VirtualMachineClone, src *source) ([]v1alpha1.CloneDisk, error) {
	out := make([]v1alpha1.CloneDisk, 0, len(src.Volumes))
	for _, v := range src.Volumes {
		name := string(c.Spec.Target.Name) + "-" + v.Name
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			return nil, refuse("the new VM's copy of Volume %s would be called %s, which is not a valid name (%s): choose a shorter target name", v.Name, name, strings.Join(errs, "; "))
		}
		out = append(out, v1alpha1.CloneDisk{Source: v.Name, Image: name, Volume: name})
	}
	return out, nil
}

// copiesVolumes refuses a source whose node cannot make a Volume from a
// DiskImage copying src's disks: libvirt nodes copy a Volume as it is or
// as a snapshot holds it; nova nodes only as a snapshot holds it (Cinder
// makes a volume of the Cinder snapshot the VirtualMachineSnapshot took,
// and nova refuses an image of a Volume as it is); KubeVirt makes no
// DataVolume of either. A node not heard from yet is not refused: its
// images say what it does.
func (r *Reconciler) copiesVolumes(ctx context.Context, src *source, node string) error {
	pc, err := r.configs.Resolve(ctx, src.VM)
	if err != nil {
		return err
	}
	f, err := r.opts.Pool.Get(ctx, pc.Target)
	if err != nil {
		return err
	}
	switch b := f.Node(node).Heartbeat.Backend; {
	case b == "" || b == string(v1alpha1.BackendLibvirt):
	case b == string(v1alpha1.BackendNova) && src.Snapshot != nil:
	case b == string(v1alpha1.BackendNova):
		return refuse("VirtualMachine %s is on node %s, a nova node: only libvirt nodes copy a Volume into a DiskImage; "+
			"snapshot the VM and clone the snapshot, or back the VM up and make the new VM from the backup instead", src.VM.Name, node)
	default:
		return refuse("VirtualMachine %s is on node %s, a %s node: only libvirt nodes copy a Volume into a DiskImage, and nova nodes a snapshot of one; "+
			"back the VM up and make the new VM from the backup instead", src.VM.Name, node, b)
	}
	return nil
}

// makeDisk makes the new VM's Volume of d and the DiskImage it is made
// from, of source in format (the default when nil), unless they exist
// already from an earlier attempt of this clone. src is the source's
// Volume d copies.
func (r *Reconciler) makeDisk(ctx context.Context, c *v1alpha1.VirtualMachineClone, d v1alpha1.CloneDisk, src *v1alpha1.Volume, source v1alpha1.DiskImageSource, format *v1alpha1.DiskFormat) error {
	v := &v1alpha1.Volume{ObjectMeta: objectMeta(c, d.Volume)}
	v.Spec.ForProvider = v1alpha1.VolumeParameters{
		Size:   src.Spec.ForProvider.Size,
		Format: src.Spec.ForProvider.Format,
		Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(d.Image)}},
	}
	v.Spec.ProviderConfigReference = src.Spec.ProviderConfigReference
	if err := r.create(ctx, c, v); err != nil {
		return err
	}
	img := &v1alpha1.DiskImage{ObjectMeta: objectMeta(c, d.Image)}
	img.Spec.ForProvider.Source, img.Spec.ForProvider.Format = source, format
	img.Spec.ProviderConfigReference = src.Spec.ProviderConfigReference
	// The image goes with the Volume made from it: deleting the new VM's
	// disk leaves no copy of the source's behind. No blockOwnerDeletion:
	// nothing waits for the image.
	img.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VolumeKind,
		Name: v.Name, UID: v.UID, Controller: ptr.To(true),
	}}
	return r.create(ctx, c, img)
}

// create creates o unless this clone made it already, and reads it back
// into o then; an object of the same name made by another refuses the
// clone.
func (r *Reconciler) create(ctx context.Context, c *v1alpha1.VirtualMachineClone, o client.Object) error {
	err := r.kube.Create(ctx, o)
	if !kerrors.IsAlreadyExists(err) {
		return errors.Wrapf(err, "cannot create %s %s", kindOf(o), o.GetName())
	}
	if err := r.kube.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		return errors.Wrapf(err, "cannot get %s %s", kindOf(o), o.GetName())
	}
	return r.own(c, o)
}

// own refuses the clone unless o is what it made.
func (r *Reconciler) own(c *v1alpha1.VirtualMachineClone, o client.Object) error {
	if o.GetAnnotations()[v1alpha1.AnnotationClonedBy] == string(c.UID) {
		return nil
	}
	return refuse("%s %s exists already and is not this clone's: a clone never overwrites", kindOf(o), o.GetName())
}

func kindOf(o client.Object) string {
	switch o.(type) {
	case *v1alpha1.VirtualMachine:
		return v1alpha1.VirtualMachineKind
	case *v1alpha1.Volume:
		return v1alpha1.VolumeKind
	case *v1alpha1.VirtualMachineBackup:
		return v1alpha1.VirtualMachineBackupKind
	default:
		return v1alpha1.DiskImageKind
	}
}

// objectMeta is the metadata of an object the clone makes.
func objectMeta(c *v1alpha1.VirtualMachineClone, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace:   c.Namespace,
		Name:        name,
		Labels:      map[string]string{LabelClone: c.Name},
		Annotations: map[string]string{v1alpha1.AnnotationClonedBy: string(c.UID)},
	}
}

// newVM is the clone's new VM: the source's spec on the copied disks,
// with nothing that is the source's own. MACs, hostname and cloud-init
// instance id derive from the new object's uid and name; its addresses
// are allocated anew (a fixed address is the source's); its connection
// Secret would be the source's.
func newVM(c *v1alpha1.VirtualMachineClone, src *v1alpha1.VirtualMachine, disks []v1alpha1.CloneDisk) *v1alpha1.VirtualMachine {
	vm := &v1alpha1.VirtualMachine{ObjectMeta: objectMeta(c, string(c.Spec.Target.Name))}
	for k, v := range FilterLabels(src.Labels, c.Spec.LabelFilters) {
		vm.Labels[k] = v
	}
	vm.Labels[LabelClone] = c.Name
	src.Spec.DeepCopyInto(&vm.Spec)
	vm.Spec.WriteConnectionSecretToReference = nil
	fp := &vm.Spec.ForProvider
	fp.Addresses = nil
	fp.DiskAttachments = make([]v1alpha1.DiskAttachment, len(disks))
	for i, d := range disks {
		fp.DiskAttachments[i] = v1alpha1.DiskAttachment{Name: v1alpha1.LocalName(d.Volume)}
	}
	return vm
}

// FilterLabels are the labels of l that filters select, as KubeVirt's
// labelFilters do: each filter, in order, adds the labels whose key its
// pattern matches, or with a leading "!" removes them; "*" in a pattern
// matches any characters, "/" included.
func FilterLabels(l map[string]string, filters []string) map[string]string {
	out := map[string]string{}
	for _, f := range filters {
		pattern, remove := strings.CutPrefix(f, "!")
		for k, v := range l {
			if !matches(pattern, k) {
				continue
			}
			if remove {
				delete(out, k)
			} else {
				out[k] = v
			}
		}
	}
	return out
}

// matches says whether s matches pattern, in which "*" stands for any
// run of characters.
func matches(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	rest, ok := strings.CutPrefix(s, parts[0])
	if !ok {
		return false
	}
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return len(rest) >= len(last) && strings.HasSuffix(rest, last)
}

// follow ends the clone once the new VM is Running or Stopped on a node,
// its disks made; a VM that fails fails it.
func (r *Reconciler) follow(ctx context.Context, c *v1alpha1.VirtualMachineClone, vm *v1alpha1.VirtualMachine) error {
	st := c.Status
	st.Phase, st.TargetUID = v1alpha1.CloneInProgress, string(vm.UID)
	at := vm.Status.AtProvider
	switch {
	case at.Phase == v1alpha1.PhaseFailed:
		return r.fail(ctx, c, fmt.Sprintf("VirtualMachine %s failed: %s", vm.Name, readyMessage(vm)))
	case (at.Phase == v1alpha1.PhaseRunning || at.Phase == v1alpha1.PhaseStopped) && at.Node != "":
		st.Phase, st.Node = v1alpha1.CloneSucceeded, at.Node
		st.Message = fmt.Sprintf("VirtualMachine %s is %s on node %s", vm.Name, at.Phase, at.Node)
		if err := r.setStatus(ctx, c, st); err != nil {
			return err
		}
		e := event.Normal(ReasonSucceeded, fmt.Sprintf("VM %s cloned from %s on node %s", vm.Name, c.Spec.Source.Name, at.Node))
		r.recorder.Event(c, e)
		r.recorder.Event(vm, e)
		return nil
	}
	why, err := r.imagesWaiting(ctx, c)
	if err != nil {
		return err
	}
	st.Message = fmt.Sprintf("waiting for VirtualMachine %s to run on node %s (it is %s)", vm.Name, orNone(st.Node), orNone(string(at.Phase)))
	if msg := readyMessage(vm); msg != "" {
		st.Message += ": " + msg
	}
	if why != "" {
		st.Message += "; " + why
	}
	return r.setStatus(ctx, c, st)
}

// imagesWaiting says which of the clone's images are not made yet, and
// why where they say.
func (r *Reconciler) imagesWaiting(ctx context.Context, c *v1alpha1.VirtualMachineClone) (string, error) {
	var out []string
	for _, d := range c.Status.Disks {
		img := &v1alpha1.DiskImage{}
		if err := r.kube.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: d.Image}, img); err != nil {
			return "", errors.Wrapf(client.IgnoreNotFound(err), "cannot get DiskImage %s", d.Image)
		}
		if at := img.Status.AtProvider; at.Phase == v1alpha1.ImagePhaseFailed {
			out = append(out, fmt.Sprintf("DiskImage %s: %s", img.Name, at.Message))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; "), nil
}

func readyMessage(vm *v1alpha1.VirtualMachine) string {
	return vm.GetCondition(xpv2.TypeReady).Message
}

func orNone(s string) string {
	if s == "" {
		return "none yet"
	}
	return s
}

// fail ends the clone as Failed with why.
func (r *Reconciler) fail(ctx context.Context, c *v1alpha1.VirtualMachineClone, why string) error {
	st := c.Status
	st.Phase, st.Message = v1alpha1.CloneFailed, why
	if err := r.setStatus(ctx, c, st); err != nil {
		return err
	}
	r.recorder.Event(c, event.Warning(ReasonFailed, errors.New(why)))
	return nil
}

// setStatus writes st unless it is what the clone shows.
func (r *Reconciler) setStatus(ctx context.Context, c *v1alpha1.VirtualMachineClone, st v1alpha1.VirtualMachineCloneStatus) error {
	if equality.Semantic.DeepEqual(c.Status, st) {
		return nil
	}
	c.Status = st
	return errors.Wrap(r.kube.Status().Update(ctx, c), "cannot update the clone's status")
}
