package virtualmachine

import (
	"cmp"
	"context"
	"fmt"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// The shape of a VM that names an instance type (or a preference) is
// recorded in its status, as KubeVirt records a ControllerRevision and
// refers to it from the VM's status: the type's spec as it was then, with
// the type's generation as its revision. Placement, the intent and a
// live migration's target all read the record (VirtualMachine.Shape), never
// the type, so editing the type reshapes no VM behind its back. The record
// is made before the VM is placed, and made again only when the VM names
// another type or asks for the current one
// (AnnotationInstancetypeUpdateRequestedAt); the intent then changes, and
// a running guest shows RestartRequired until its next start.
//
// The record lives in the VM's status rather than in a ControllerRevision
// of its own: that is one object fewer per VM (etcd space and watch-cache
// memory at fleet scale), one grant fewer for the hub, and no write of the
// user's spec that a GitOps tool would see as drift, while the status is
// the hub's alone to write. It is not in status.atProvider, which is
// rebuilt from every report.

// ReasonShapeKept is the event of a placed VM whose instance type or
// preference cannot be recorded again: it keeps the shape it has.
const ReasonShapeKept event.Reason = "ShapeKept"

// MissingTemplateError is a VM naming an instance type or preference that
// does not exist. A namespaced one is looked up in the VM's own namespace
// only, so a VM never reaches another namespace's. A VM not placed yet
// waits for it; a placed one keeps the shape it has.
type MissingTemplateError struct {
	Kind, Name string
	// Namespace is set for a namespaced kind.
	Namespace string
}

func (e *MissingTemplateError) Error() string {
	where := ""
	if e.Namespace != "" {
		where = " in namespace " + e.Namespace
	}
	return fmt.Sprintf("waiting for %s %s%s: create it and the VM goes on by itself", e.Kind, e.Name, where)
}

// getTemplate reads the instance type or preference obj named name of kind
// (in namespace ns, empty for a cluster-wide kind) from kube.
func getTemplate(ctx context.Context, kube client.Reader, kind, ns, name string, obj client.Object) error {
	err := kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj)
	switch {
	case kerrors.IsNotFound(err) || (err == nil && obj.GetDeletionTimestamp() != nil):
		return &MissingTemplateError{Kind: kind, Name: name, Namespace: ns}
	case err != nil:
		return errors.Wrapf(err, "cannot get %s %s", kind, name)
	}
	return nil
}

// instancetypeRevision is vm's instance type as it is now.
func instancetypeRevision(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine) (*v1alpha1.InstancetypeRevision, error) {
	ref := vm.Spec.ForProvider.Instancetype
	r := &v1alpha1.InstancetypeRevision{Kind: instancetypeKind(ref), Name: ref.Name}
	if r.Kind == v1alpha1.VirtualMachineInstancetypeKind {
		it := &v1alpha1.VirtualMachineInstancetype{}
		if err := getTemplate(ctx, kube, string(r.Kind), vm.Namespace, ref.Name, it); err != nil {
			return nil, err
		}
		r.Revision, r.Spec = it.Generation, it.Spec
		return r, nil
	}
	it := &v1alpha1.VirtualMachineClusterInstancetype{}
	if err := getTemplate(ctx, kube, string(r.Kind), "", ref.Name, it); err != nil {
		return nil, err
	}
	r.Revision, r.Spec = it.Generation, it.Spec
	return r, nil
}

// preferenceRevision is vm's preference as it is now.
func preferenceRevision(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine) (*v1alpha1.PreferenceRevision, error) {
	ref := vm.Spec.ForProvider.Preference
	r := &v1alpha1.PreferenceRevision{Kind: preferenceKind(ref), Name: ref.Name}
	if r.Kind == v1alpha1.VirtualMachinePreferenceKind {
		p := &v1alpha1.VirtualMachinePreference{}
		if err := getTemplate(ctx, kube, string(r.Kind), vm.Namespace, ref.Name, p); err != nil {
			return nil, err
		}
		r.Revision, r.Spec = p.Generation, p.Spec
		return r, nil
	}
	p := &v1alpha1.VirtualMachineClusterPreference{}
	if err := getTemplate(ctx, kube, string(r.Kind), "", ref.Name, p); err != nil {
		return nil, err
	}
	r.Revision, r.Spec = p.Generation, p.Spec
	return r, nil
}

// instancetypeKind is ref's kind with the schema's default.
func instancetypeKind(ref *v1alpha1.InstancetypeRef) v1alpha1.InstancetypeKind {
	return cmp.Or(ref.Kind, v1alpha1.VirtualMachineClusterInstancetypeKind)
}

// preferenceKind is ref's kind with the schema's default.
func preferenceKind(ref *v1alpha1.PreferenceRef) v1alpha1.PreferenceKind {
	return cmp.Or(ref.Kind, v1alpha1.VirtualMachineClusterPreferenceKind)
}

// stale is whether a record of kind and name that answered the update
// request answered must be made again for a VM naming wantKind and
// wantName whose update request is asked: it names another template, or a
// new update was asked for. Removing the annotation asks for nothing.
func stale[K comparable](kind, wantKind K, name, wantName, answered, asked string) bool {
	return kind != wantKind || name != wantName || (asked != "" && asked != answered)
}

// recordShape brings vm's status.instancetypeRef and preferenceRef up to
// date with its spec (see the top of this file), reading the templates
// from kube; it reports whether it changed them. A template that cannot be
// read leaves its record as it was, and the first such is the error.
func recordShape(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine) (bool, error) {
	fp, st := &vm.Spec.ForProvider, &vm.Status
	asked := vm.GetAnnotations()[v1alpha1.AnnotationInstancetypeUpdateRequestedAt]
	changed := false
	var first error
	switch it := st.InstancetypeRef; {
	case fp.Instancetype == nil:
		changed = changed || it != nil
		st.InstancetypeRef = nil
	case it == nil || stale(it.Kind, instancetypeKind(fp.Instancetype), it.Name, fp.Instancetype.Name, it.UpdateRequestedAt, asked):
		r, err := instancetypeRevision(ctx, kube, vm)
		if err != nil {
			first = err
			break
		}
		r.UpdateRequestedAt = asked
		st.InstancetypeRef, changed = r, true
	}
	switch p := st.PreferenceRef; {
	case fp.Preference == nil:
		changed = changed || p != nil
		st.PreferenceRef = nil
	case p == nil || stale(p.Kind, preferenceKind(fp.Preference), p.Name, fp.Preference.Name, p.UpdateRequestedAt, asked):
		r, err := preferenceRevision(ctx, kube, vm)
		if err != nil {
			first = cmp.Or(first, err)
			break
		}
		r.UpdateRequestedAt = asked
		st.PreferenceRef, changed = r, true
	}
	return changed, first
}

// recordShape records the shape of a placed VM again when it names another
// instance type or preference, or asks for their current revisions; true
// when it wrote the record. A VM the placement loop bound has a record
// already; one it did not (an import, an adopted orphan) gets its first
// here, before its intent is published. A template that cannot be read
// leaves a VM that has a shape with it, saying why in an event; one with
// none waits for it.
func (c *connector) recordShape(ctx context.Context, vm *v1alpha1.VirtualMachine) (bool, error) {
	if meta.WasDeleted(vm) || vm.GetAnnotations()[v1alpha1.AnnotationNode] == "" {
		return false, nil
	}
	changed, err := recordShape(ctx, c.kube, vm)
	if err != nil {
		if _, _, ok := vm.Shape(); !ok {
			return false, err
		}
		c.recorder.Event(vm, event.Warning(ReasonShapeKept, errors.Wrap(err, "the VM keeps the shape it has")))
	}
	if !changed {
		return false, nil
	}
	err = c.kube.Status().Update(ctx, vm)
	if kerrors.IsConflict(err) {
		return true, nil // read again when requeued
	}
	return err == nil, errors.Wrap(err, "cannot record the VM's shape")
}
