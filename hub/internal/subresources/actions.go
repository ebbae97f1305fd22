package subresources

import (
	"fmt"
	"net/http"
	"path"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
)

// ReasonRequested is the reason of the event an action leaves on its VM,
// naming the user who asked.
const ReasonRequested event.Reason = "ActionRequested"

// act carries out a PUT of an action subresource: it changes the VM as the
// action says (a field or an annotation the hub and the node act on, so the
// action survives restarts of either) and answers 202 Accepted.
func (s *Server) act(w http.ResponseWriter, r *http.Request, u user) {
	ctx := r.Context()
	action := path.Base(r.URL.Path)
	nn := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	vm := &v1alpha1.VirtualMachine{}
	if err := s.kube.Get(ctx, nn, vm); err != nil {
		writeStatus(w, apiError(err, nn.Name))
		return
	}
	if action == "migrate" {
		s.migrate(w, r, u, vm)
		return
	}
	change, err := plan(action, vm, time.Now())
	if err != nil {
		writeStatus(w, err)
		return
	}
	before := vm.DeepCopy()
	change(vm)
	if err := s.kube.Patch(ctx, vm, client.MergeFrom(before)); err != nil {
		writeStatus(w, apiError(err, nn.Name))
		return
	}
	msg := fmt.Sprintf("%s requested by %s", action, u.Name)
	s.recorder.Event(vm, event.Normal(ReasonRequested, msg))
	writeJSON(w, http.StatusAccepted, success(msg))
}

// plan returns what action changes on vm, or the API error saying why it
// cannot be done now. It only reads vm.
func plan(action string, vm *v1alpha1.VirtualMachine, now time.Time) (func(*v1alpha1.VirtualMachine), error) {
	if virtualmachine.ObserveOnly(vm) {
		return nil, conflict(vm, "is observe-only (managementPolicies): virtfleet does not change its guest")
	}
	running := ptr.Deref(vm.Spec.ForProvider.Running, true)
	paused := vm.GetAnnotations()[v1alpha1.AnnotationPaused] == "true"
	phase := vm.Status.AtProvider.Phase
	stamp := now.UTC().Format(time.RFC3339Nano)
	switch action {
	case "start":
		if running {
			return nil, conflict(vm, "is already running (spec.forProvider.running is true)")
		}
		return func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr.To(true) }, nil
	case "stop":
		if !running {
			return nil, conflict(vm, "is already stopped (spec.forProvider.running is false)")
		}
		// A stopped guest is not paused: the next start runs it.
		return func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.ForProvider.Running = ptr.To(false)
			unannotate(vm, v1alpha1.AnnotationPaused)
		}, nil
	case "restart", "reset":
		switch {
		case !running:
			return nil, conflict(vm, "is not running (spec.forProvider.running is false): start it")
		case paused:
			return nil, conflict(vm, "is paused: unpause it first")
		}
		key := v1alpha1.AnnotationRestartRequestedAt
		if action == "reset" {
			key = v1alpha1.AnnotationResetRequestedAt
		}
		return func(vm *v1alpha1.VirtualMachine) { annotate(vm, key, stamp) }, nil
	case "pause":
		switch {
		case paused:
			return nil, conflict(vm, "is already paused")
		case !running || phase != v1alpha1.PhaseRunning:
			return nil, conflict(vm, fmt.Sprintf("is not running (phase %s): only a running guest can be paused", phaseOrNone(phase)))
		}
		return func(vm *v1alpha1.VirtualMachine) { annotate(vm, v1alpha1.AnnotationPaused, "true") }, nil
	case "unpause":
		if !paused {
			return nil, conflict(vm, "is not paused")
		}
		return func(vm *v1alpha1.VirtualMachine) { unannotate(vm, v1alpha1.AnnotationPaused) }, nil
	}
	return nil, kerrors.NewNotFound(vmResource, vm.Name+"/"+action)
}

// migrate creates a VirtualMachineMigration of vm; the migration
// controller takes it from there, with the namespace's limits.
func (s *Server) migrate(w http.ResponseWriter, r *http.Request, u user, vm *v1alpha1.VirtualMachine) {
	if p := vm.Status.AtProvider.Phase; p != v1alpha1.PhaseRunning {
		writeStatus(w, conflict(vm, fmt.Sprintf("is not running (phase %s): only a running guest migrates", phaseOrNone(p))))
		return
	}
	mig := &v1alpha1.VirtualMachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, GenerateName: vm.Name + "-"},
		Spec:       v1alpha1.VirtualMachineMigrationSpec{VMName: v1alpha1.LocalName(vm.Name)},
	}
	if err := s.kube.Create(r.Context(), mig); err != nil {
		writeStatus(w, apiError(err, vm.Name))
		return
	}
	msg := fmt.Sprintf("migrate requested by %s: VirtualMachineMigration %s", u.Name, mig.Name)
	s.recorder.Event(vm, event.Normal(ReasonRequested, msg))
	writeJSON(w, http.StatusAccepted, success(msg))
}

func annotate(vm *v1alpha1.VirtualMachine, key, value string) {
	a := vm.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	vm.SetAnnotations(a)
}

func unannotate(vm *v1alpha1.VirtualMachine, key string) {
	a := vm.GetAnnotations()
	delete(a, key)
	vm.SetAnnotations(a)
}

func phaseOrNone(p v1alpha1.Phase) string {
	if p == "" {
		return "none yet"
	}
	return string(p)
}

func conflict(vm *v1alpha1.VirtualMachine, why string) error {
	return kerrors.NewConflict(vmResource, vm.Name, fmt.Errorf("VirtualMachine %s %s", vm.Name, why))
}

// apiError is err as the user should see it: a VM that does not exist is
// NotFound by its name; the API server's own errors pass as they are.
func apiError(err error, name string) error {
	if kerrors.IsNotFound(err) {
		return kerrors.NewNotFound(vmResource, name)
	}
	if _, ok := err.(kerrors.APIStatus); ok { //nolint:errorlint // client errors are not wrapped
		return err
	}
	return kerrors.NewInternalError(err)
}

func success(msg string) *metav1.Status {
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Code: http.StatusAccepted, Message: msg}
}
