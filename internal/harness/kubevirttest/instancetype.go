package kubevirttest

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/api/instancetype"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Instance types as KubeVirt (pkg/instancetype) applies them to a
// VirtualMachine whose spec.instancetype names one. virt-api's VM
// admission refuses a VM whose instance type cannot be found, or whose
// template sets what the type provides (its CPU topology, guest memory,
// their maxima, CPU and memory requests and limits): each such field is a
// cause "VM field(s) <path> conflicts with selected instance type". The
// VM controller records the type, as it is when it first sees the VM, in
// a ControllerRevision the VM owns and names it in
// spec.instancetype.revisionName and status.instancetypeRef, and every
// VMI it makes takes its CPU (sockets = the type's guest vCPUs, one core
// and one thread each, maxSockets) and memory (guest, maxGuest) from that
// revision, so editing the type reshapes no VM. Under the LiveUpdate
// rollout strategy a VM that names another type is recorded anew, and
// the running VMI gets the new sockets and guest memory as a change of
// the template's would (liveupdate.go); anything else of the new type
// (its maxima) makes the VM RestartRequired. Preferences are not served.

// Labels KubeVirt puts on an instance type's ControllerRevision.
const (
	labelObjectName       = instancetype.GroupName + "/object-name"
	labelObjectKind       = instancetype.GroupName + "/object-kind"
	labelObjectUID        = instancetype.GroupName + "/object-uid"
	labelObjectGeneration = instancetype.GroupName + "/object-generation"
	labelObjectVersion    = instancetype.GroupName + "/object-version"
)

// conflictFmt is KubeVirt's message for a VM field an instance type
// provides (pkg/instancetype/conflict).
const conflictFmt = "VM field(s) %s conflicts with selected instance type"

// instancetypeKind is the kind a matcher names, as KubeVirt reads it: the
// cluster-wide one when empty, the kind or its singular or plural
// resource name otherwise; empty for one it does not know.
func instancetypeKind(m *kubevirtv1.InstancetypeMatcher) string {
	switch strings.ToLower(m.Kind) {
	case "", strings.ToLower(kindClusterInstancetype), instancetype.ClusterSingularResourceName, instancetype.ClusterPluralResourceName:
		return kindClusterInstancetype
	case strings.ToLower(kindInstancetype), instancetype.SingularResourceName, instancetype.PluralResourceName:
		return kindInstancetype
	}
	return ""
}

const (
	kindInstancetype        = "VirtualMachineInstancetype"
	kindClusterInstancetype = "VirtualMachineClusterInstancetype"
)

// recordedInstancetype is an instance type as a revision holds it: the
// object with its kind (either kind has the same spec).
type recordedInstancetype struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              instancetypev1beta1.VirtualMachineInstancetypeSpec `json:"spec"`
}

// findInstancetype is the instance type vm names as KubeVirt's Find reads
// it: from the revision spec.instancetype.revisionName names when it has
// one, else the object itself (in vm's namespace for a namespaced one).
func findInstancetype(ctx context.Context, r client.Reader, vm *kubevirtv1.VirtualMachine) (*recordedInstancetype, error) {
	m := vm.Spec.Instancetype
	if m.RevisionName != "" {
		cr := &appsv1.ControllerRevision{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: m.RevisionName}, cr); err != nil {
			return nil, err
		}
		out := &recordedInstancetype{}
		if err := json.Unmarshal(cr.Data.Raw, out); err != nil {
			return nil, errors.Wrapf(err, "cannot decode ControllerRevision %s", cr.Name)
		}
		return out, nil
	}
	var obj client.Object
	var spec *instancetypev1beta1.VirtualMachineInstancetypeSpec
	key := types.NamespacedName{Name: m.Name}
	switch kind := instancetypeKind(m); kind {
	case kindClusterInstancetype:
		it := &instancetypev1beta1.VirtualMachineClusterInstancetype{}
		obj, spec = it, &it.Spec
	case kindInstancetype:
		it := &instancetypev1beta1.VirtualMachineInstancetype{}
		obj, spec, key.Namespace = it, &it.Spec, vm.Namespace
	default:
		return nil, errors.Errorf("got unexpected kind in InstancetypeMatcher: %s", m.Kind)
	}
	if err := r.Get(ctx, key, obj); err != nil {
		return nil, err
	}
	return &recordedInstancetype{
		TypeMeta:   metav1.TypeMeta{APIVersion: instancetypev1beta1.SchemeGroupVersion.String(), Kind: instancetypeKind(m)},
		ObjectMeta: metav1.ObjectMeta{Name: obj.GetName(), Namespace: obj.GetNamespace(), UID: obj.GetUID(), Generation: obj.GetGeneration()},
		Spec:       *spec,
	}, nil
}

// instancetypeConflicts are the fields of template that the instance type
// provides, each a cause as virt-api's VM admission gives it.
func instancetypeConflicts(spec *kubevirtv1.VirtualMachineInstanceSpec, it *instancetypev1beta1.VirtualMachineInstancetypeSpec) []metav1.StatusCause {
	dom := field.NewPath("spec", "template", "spec", "domain")
	var paths []*field.Path
	if cpu := spec.Domain.CPU; cpu != nil {
		for _, f := range []struct {
			name string
			set  bool
		}{{"sockets", cpu.Sockets != 0}, {"cores", cpu.Cores != 0}, {"threads", cpu.Threads != 0}, {"maxSockets", cpu.MaxSockets != 0 && it.CPU.MaxSockets != nil}} {
			if f.set {
				paths = append(paths, dom.Child("cpu", f.name))
			}
		}
	}
	if mem := spec.Domain.Memory; mem != nil {
		if mem.Guest != nil {
			paths = append(paths, dom.Child("memory", "guest"))
		}
		if mem.MaxGuest != nil && it.Memory.MaxGuest != nil {
			paths = append(paths, dom.Child("memory", "maxGuest"))
		}
	}
	for _, r := range []struct {
		name string
		list corev1.ResourceList
	}{{"requests", spec.Domain.Resources.Requests}, {"limits", spec.Domain.Resources.Limits}} {
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := r.list[res]; ok {
				paths = append(paths, dom.Child("resources", r.name, string(res)))
			}
		}
	}
	causes := make([]metav1.StatusCause, 0, len(paths))
	for _, p := range paths {
		causes = append(causes, metav1.StatusCause{Type: metav1.CauseTypeFieldValueInvalid, Message: fmt.Sprintf(conflictFmt, p), Field: p.String()})
	}
	return causes
}

// admitInstancetype is what virt-api's VM admission says of vm's instance
// type: no causes when it names none or one it can apply.
func admitInstancetype(ctx context.Context, r client.Reader, vm *kubevirtv1.VirtualMachine) []metav1.StatusCause {
	if vm.Spec.Instancetype == nil || vm.Spec.Template == nil {
		return nil
	}
	it, err := findInstancetype(ctx, r, vm)
	if err != nil {
		return []metav1.StatusCause{{
			Type:    metav1.CauseTypeFieldValueNotFound,
			Message: fmt.Sprintf("Failure to find instancetype: %v", err),
			Field:   field.NewPath("spec", "instancetype").String(),
		}}
	}
	return instancetypeConflicts(&vm.Spec.Template.Spec, &it.Spec)
}

// syncInstancetype records vm's instance type as the VM controller does:
// when spec.instancetype names no revision yet, or another type than its
// revision holds (the user named another under LiveUpdate), a
// ControllerRevision of the type as it is now, owned by the VM, goes in
// spec.instancetype.revisionName and status.instancetypeRef, and the
// revision it replaces goes. It reports whether it wrote the VM: the
// caller comes back to a VM that holds it.
func (c *FakeVirtController) syncInstancetype(ctx context.Context, vm *kubevirtv1.VirtualMachine) (bool, error) {
	m := vm.Spec.Instancetype
	if m == nil {
		return false, nil
	}
	old := m.RevisionName
	if r := vm.Status.InstancetypeRef; old == "" && r != nil && r.ControllerRevisionRef != nil {
		// A user naming another type clears revisionName; the status
		// still names the revision it replaces.
		old = r.ControllerRevisionRef.Name
	}
	if m.RevisionName != "" {
		cr := &appsv1.ControllerRevision{}
		err := c.live.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: m.RevisionName}, cr)
		switch {
		case err == nil && cr.Labels[labelObjectName] == m.Name && cr.Labels[labelObjectKind] == instancetypeKind(m):
			return false, c.instancetypeStatus(ctx, vm)
		case err != nil && !kerrors.IsNotFound(err):
			return false, errors.Wrap(err, "cannot get the instance type's revision")
		}
	}
	current := vm.DeepCopy()
	current.Spec.Instancetype.RevisionName = ""
	it, err := findInstancetype(ctx, c.live, current)
	if err != nil {
		return false, errors.Wrapf(err, "cannot find %s %s", instancetypeKind(m), m.Name)
	}
	raw, err := json.Marshal(it)
	if err != nil {
		return false, errors.Wrap(err, "cannot encode the instance type's revision")
	}
	cr := &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: vm.Namespace,
			// KubeVirt's revision.GenerateName.
			Name: fmt.Sprintf("%s-%s-%s-%d", vm.Name, it.Name, it.UID, it.Generation),
			Labels: map[string]string{
				labelObjectName: it.Name, labelObjectKind: it.Kind, labelObjectUID: string(it.UID),
				labelObjectGeneration: fmt.Sprint(it.Generation), labelObjectVersion: instancetypev1beta1.SchemeGroupVersion.Version,
			},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vm, kubevirtv1.VirtualMachineGroupVersionKind)},
		},
		Data: runtime.RawExtension{Raw: raw},
	}
	if err := c.client.Create(ctx, cr); err != nil && !kerrors.IsAlreadyExists(err) {
		return false, errors.Wrap(err, "cannot create the instance type's revision")
	}
	vm.Spec.Instancetype.RevisionName = cr.Name
	if err := c.client.Update(ctx, vm); err != nil {
		return false, errors.Wrap(err, "cannot record the instance type's revision in the VM")
	}
	if old != "" && old != cr.Name {
		stale := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: old}}
		if err := c.client.Delete(ctx, stale); client.IgnoreNotFound(err) != nil {
			return true, errors.Wrap(err, "cannot delete the instance type's previous revision")
		}
	}
	return true, nil
}

// instancetypeStatus sets status.instancetypeRef to what
// spec.instancetype records.
func (c *FakeVirtController) instancetypeStatus(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	m := vm.Spec.Instancetype
	want := &kubevirtv1.InstancetypeStatusRef{Name: m.Name, Kind: instancetypeKind(m), ControllerRevisionRef: &kubevirtv1.ControllerRevisionRef{Name: m.RevisionName}}
	if r := vm.Status.InstancetypeRef; r != nil && r.Name == want.Name && r.Kind == want.Kind && r.ControllerRevisionRef != nil && *r.ControllerRevisionRef == *want.ControllerRevisionRef {
		return nil
	}
	vm.Status.InstancetypeRef = want
	return errors.Wrap(c.client.Status().Update(ctx, vm), "cannot record the instance type in the VM's status")
}

// expanded is vm with the instance type its revision records applied to
// its template, as the VM controller applies it to each VMI it makes and
// compares it with the running one; vm itself when it names none. Only
// ever read: it is never written back.
func (c *FakeVirtController) expanded(ctx context.Context, vm *kubevirtv1.VirtualMachine) (*kubevirtv1.VirtualMachine, error) {
	if vm.Spec.Instancetype == nil || vm.Spec.Template == nil {
		return vm, nil
	}
	it, err := findInstancetype(ctx, c.live, vm)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the VM's instance type")
	}
	out := vm.DeepCopy()
	dom := &out.Spec.Template.Spec.Domain
	dom.CPU = &kubevirtv1.CPU{Sockets: it.Spec.CPU.Guest, Cores: 1, Threads: 1}
	if it.Spec.CPU.MaxSockets != nil {
		dom.CPU.MaxSockets = *it.Spec.CPU.MaxSockets
	}
	dom.Memory = &kubevirtv1.Memory{Guest: ptr(it.Spec.Memory.Guest.DeepCopy())}
	if it.Spec.Memory.MaxGuest != nil {
		dom.Memory.MaxGuest = ptr(it.Spec.Memory.MaxGuest.DeepCopy())
	}
	return out, nil
}

// The admission webhook virt-api registers for VMs, and its path.
const (
	webhookConfiguration = "virt-api-validator"
	vmValidator          = "virtualmachine-validator.kubevirt.io"
	vmValidatePath       = "/virtualmachines-validate"
)

// validateVM is virt-api's VM admission, as far as instance types go: a
// VM it refuses gets its causes, the first one's message (all of them,
// comma-separated) as the message, as virt-api's ToAdmissionResponse
// words it. A VM being deleted is let through: its finalizer must go even
// when its type went first.
func (v *virtAPI) validateVM(w http.ResponseWriter, r *http.Request) {
	review := &admissionv1.AdmissionReview{}
	if err := json.NewDecoder(r.Body).Decode(review); err != nil || review.Request == nil {
		http.Error(w, "malformed AdmissionReview", http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	vm := &kubevirtv1.VirtualMachine{}
	if err := json.Unmarshal(review.Request.Object.Raw, vm); err != nil {
		resp.Allowed, resp.Result = false, &metav1.Status{Status: metav1.StatusFailure, Message: err.Error(), Reason: metav1.StatusReasonBadRequest, Code: http.StatusBadRequest}
	} else if causes := admitInstancetype(r.Context(), v.client, vm); vm.DeletionTimestamp == nil && len(causes) > 0 {
		messages := make([]string, 0, len(causes))
		for _, c := range causes {
			messages = append(messages, c.Message)
		}
		resp.Allowed, resp.Result = false, &metav1.Status{
			Status: metav1.StatusFailure, Message: strings.Join(messages, ", "), Reason: metav1.StatusReasonInvalid,
			Code: http.StatusUnprocessableEntity, Details: &metav1.StatusDetails{Causes: causes},
		}
	}
	review.Request, review.Response = nil, resp
	writeJSON(w, http.StatusOK, review)
}

// registerWebhook registers validateVM for VMs that name an instance
// type, as virt-operator registers virt-api's (which sees every VM; the
// stand-in judges nothing else of them), and waits until the API server
// calls it: until a dry run of a VM naming a missing type is refused.
func (v *virtAPI) registerWebhook(ctx context.Context) error {
	url := v.server.URL + vmValidatePath
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: v.server.Certificate().Raw})
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookConfiguration},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         vmValidator,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{kubevirtv1.VirtualMachineGroupVersionKind.Group}, APIVersions: []string{"*"}, Resources: []string{"virtualmachines"}},
			}},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "names-an-instancetype", Expression: "has(object.spec.instancetype)"}},
			FailurePolicy:           ptr(admissionregistrationv1.Fail),
			SideEffects:             ptr(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := v.client.Create(ctx, cfg); err != nil {
		return errors.Wrap(err, "cannot register the VM admission webhook")
	}
	probe := HandMadeVM(VirtAPINamespace, "instancetype-probe", "none")
	probe.Spec.Template.Spec.Domain.CPU, probe.Spec.Template.Spec.Domain.Resources = nil, kubevirtv1.ResourceRequirements{}
	probe.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Name: "absent"}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, availableTimeout, true, func(ctx context.Context) (bool, error) {
		err := v.client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), vmValidator), nil
	})
	return errors.Wrapf(err, "the API server did not call the VM admission webhook within %s", availableTimeout)
}
