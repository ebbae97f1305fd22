package kubevirt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// A Machine whose shape came from an instance type runs through a KubeVirt
// instance type, as a KubeVirt user's VM would: the driver makes a
// namespaced VirtualMachineInstancetype of the shape (its vCPUs as
// cpu.guest, its memory as memory.guest, their maxima as cpu.maxSockets
// and memory.maxGuest) and the VM names it in spec.instancetype, its
// template setting no CPU or memory of its own (KubeVirt refuses a VM
// whose template sets what its type provides). KubeVirt records the type
// in a ControllerRevision of the VM, so the object is only read when a VM
// starts to name it; each revision of the virtfleet type is an object of
// its own (instancetypeName), never edited, and a new revision is a VM
// naming another object, which KubeVirt's LiveUpdate rollout hot-plugs as
// it does a change of the template's sockets and guest memory.
//
// The shape hash of a typed VM is the one of the same Machine without a
// type (the maxima are shape, the vCPUs and memory within them are not),
// so moving to another revision of the same maxima is a live change, and
// a guest started inline before the agent knew of types is no other
// shape: it keeps running inline, and runs through its type from its
// next start on (see ensure).

// KubeVirt's kind of a namespaced instance type, as a VM names it.
const kindInstancetype = "VirtualMachineInstancetype"

// AnnotationInstancetypeShape, on a VM that names an instance type the
// driver made, is that type's CPU and memory (a
// VirtualMachineInstancetypeSpec of them), so the driver reads the VM's
// shape without reading the type.
const AnnotationInstancetypeShape = "virtfleet.io/instancetype-shape"

// instancetypeName is the KubeVirt instance type for revision it of a
// virtfleet instance type, holding spec: "vfc." (a cluster-wide type) or
// "vfn.<namespace>." (a namespaced one), the type's name, ".r" and the
// revision, and a hash of spec: the maxima KubeVirt's type holds are the
// guest's (see maxima) and may differ between VMs of one revision. A
// namespace has no dots, so no two types share a name.
func instancetypeName(m driver.Machine, spec *instancetypev1beta1.VirtualMachineInstancetypeSpec) (string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return "", errors.Wrap(err, "cannot hash the instance type")
	}
	sum := sha256.Sum256(b)
	it := m.Instancetype
	scope := "vfn." + m.Namespace
	if it.Cluster {
		scope = "vfc"
	}
	name := fmt.Sprintf("%s.%s.r%d-%s", scope, it.Name, it.Revision, hex.EncodeToString(sum[:4]))
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", driver.Terminalf("instance type %s cannot name a KubeVirt VirtualMachineInstancetype (%s): %s", it.Name, name, strings.Join(errs, "; "))
	}
	return name, nil
}

// typeShape is the instance type of spec's CPU and memory, as newVM
// made them.
func typeShape(spec *kubevirtv1.VirtualMachineInstanceSpec) *instancetypev1beta1.VirtualMachineInstancetypeSpec {
	cpu, mem := spec.Domain.CPU, spec.Domain.Memory
	out := &instancetypev1beta1.VirtualMachineInstancetypeSpec{
		CPU:    instancetypev1beta1.CPUInstancetype{Guest: cpu.Sockets, MaxSockets: ptr(cpu.MaxSockets)},
		Memory: instancetypev1beta1.MemoryInstancetype{Guest: *mem.Guest, MaxGuest: mem.MaxGuest},
	}
	return out
}

// typed makes vm, as newVM made it for m, name an instance type of its
// template's CPU and memory, which leave the template.
func typed(m driver.Machine, vm *kubevirtv1.VirtualMachine) error {
	spec := &vm.Spec.Template.Spec
	shape := typeShape(spec)
	name, err := instancetypeName(m, shape)
	if err != nil {
		return err
	}
	b, err := json.Marshal(shape)
	if err != nil {
		return errors.Wrap(err, "cannot encode the instance type")
	}
	spec.Domain.CPU, spec.Domain.Memory = nil, nil
	vm.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Kind: kindInstancetype, Name: name}
	vm.Annotations[AnnotationInstancetypeShape] = string(b)
	return nil
}

// recordedShape is the instance type vm names, as its annotation says;
// nil for a VM that names none the driver made.
func recordedShape(vm *kubevirtv1.VirtualMachine) *instancetypev1beta1.VirtualMachineInstancetypeSpec {
	raw := vm.Annotations[AnnotationInstancetypeShape]
	if vm.Spec.Instancetype == nil || raw == "" {
		return nil
	}
	out := &instancetypev1beta1.VirtualMachineInstancetypeSpec{}
	if json.Unmarshal([]byte(raw), out) != nil {
		return nil
	}
	return out
}

// template is vm's template with the CPU and memory of the instance type
// it names applied, as KubeVirt applies them to each VMI: the shape the
// VM asks for. It is vm's own template for a VM that names none, and
// never written back.
func template(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachineInstanceTemplateSpec {
	it := recordedShape(vm)
	if it == nil || vm.Spec.Template == nil {
		return vm.Spec.Template
	}
	out := vm.Spec.Template.DeepCopy()
	out.Spec.Domain.CPU = &kubevirtv1.CPU{Sockets: it.CPU.Guest, Cores: 1, Threads: 1}
	if it.CPU.MaxSockets != nil {
		out.Spec.Domain.CPU.MaxSockets = *it.CPU.MaxSockets
	}
	out.Spec.Domain.Memory = &kubevirtv1.Memory{Guest: ptr(it.Memory.Guest.DeepCopy()), MaxGuest: it.Memory.MaxGuest}
	return out
}

// ensureInstancetype makes the instance type vm names, if the driver
// made vm's; one that exists is the same by its name.
func (d *Driver) ensureInstancetype(ctx context.Context, c client.Client, vm *kubevirtv1.VirtualMachine) error {
	shape := recordedShape(vm)
	if shape == nil {
		return nil
	}
	it := &instancetypev1beta1.VirtualMachineInstancetype{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Spec.Instancetype.Name, Labels: map[string]string{labelManagedBy: managedBy}},
		Spec:       *shape,
	}
	err := c.Create(ctx, it)
	switch {
	case err == nil, kerrors.IsAlreadyExists(err):
		return nil
	case meta.IsNoMatchError(err):
		return driver.Terminal(errors.Wrap(err, "the KubeVirt cluster serves no instancetype.kubevirt.io/v1beta1 VirtualMachineInstancetype (KubeVirt 1.0 or later does)"))
	case kerrors.IsInvalid(err):
		return driver.Terminal(errors.Wrapf(err, "the KubeVirt cluster rejected VirtualMachineInstancetype %s", it.Name))
	}
	return errors.Wrapf(err, "cannot create VirtualMachineInstancetype %s", it.Name)
}

// missingInstancetype is whether KubeVirt refused a VM because the
// instance type it names is not there: one another Ensure's
// pruneInstancetypes took between its ensureInstancetype and the write,
// which the next Ensure makes again.
func missingInstancetype(err error) bool {
	status, ok := err.(kerrors.APIStatus) //nolint:errorlint // the API's own error, unwrapped
	if !ok || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Type == metav1.CauseTypeFieldValueNotFound && c.Field == "spec.instancetype" {
			return true
		}
	}
	return false
}

// pruneInstancetypes deletes the instance types the driver made that no
// VM of its namespace names: a VM deleted, or moved on to another
// revision, leaves its old one behind. The types are listed before the
// VMs, so one made for a VM not written yet is not among them or is
// named by then; a write that loses that race is retried (see
// missingInstancetype).
func (d *Driver) pruneInstancetypes(ctx context.Context, c client.Client) error {
	its := &instancetypev1beta1.VirtualMachineInstancetypeList{}
	err := d.live.List(ctx, its, client.InNamespace(d.namespace), client.MatchingLabels{labelManagedBy: managedBy})
	switch {
	case meta.IsNoMatchError(err):
		return nil
	case err != nil:
		return errors.Wrap(err, "cannot list VirtualMachineInstancetypes")
	case len(its.Items) == 0:
		return nil
	}
	vms := &kubevirtv1.VirtualMachineList{}
	if err := d.live.List(ctx, vms, client.InNamespace(d.namespace)); err != nil {
		return errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
	}
	named := map[string]bool{}
	for _, vm := range vms.Items {
		if m := vm.Spec.Instancetype; m != nil && strings.EqualFold(m.Kind, kindInstancetype) {
			named[m.Name] = true
		}
	}
	for _, it := range its.Items {
		if named[it.Name] {
			continue
		}
		if err := c.Delete(ctx, &it, client.Preconditions{UID: &it.UID}); client.IgnoreNotFound(err) != nil {
			return errors.Wrapf(err, "cannot delete VirtualMachineInstancetype %s", it.Name)
		}
	}
	return nil
}
