package subresources

import (
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

func TestPlan(t *testing.T) {
	now := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	stamp := now.Format(time.RFC3339Nano)
	type vmState struct {
		running *bool
		paused  bool
		phase   v1alpha1.Phase
		observe bool
	}
	runningVM := vmState{phase: v1alpha1.PhaseRunning}
	cases := map[string]struct {
		action   string
		vm       vmState
		conflict string
		// want checks the VM after the change.
		want func(t *testing.T, vm *v1alpha1.VirtualMachine)
	}{
		"StartSetsRunning": {action: "start", vm: vmState{running: ptr.To(false), phase: v1alpha1.PhaseStopped}, want: func(t *testing.T, vm *v1alpha1.VirtualMachine) {
			assert.True(t, *vm.Spec.ForProvider.Running)
		}},
		"StartOfARunningVMConflicts": {action: "start", vm: runningVM, conflict: "already running"},
		"RunningDefaultsToTrue":      {action: "start", vm: vmState{phase: v1alpha1.PhaseStarting}, conflict: "already running"},
		"StopOfAStoppedVMConflicts":  {action: "stop", vm: vmState{running: ptr.To(false)}, conflict: "already stopped"},
		"StopClearsThePause": {action: "stop", vm: vmState{paused: true, phase: v1alpha1.PhasePaused}, want: func(t *testing.T, vm *v1alpha1.VirtualMachine) {
			assert.False(t, *vm.Spec.ForProvider.Running)
			assert.NotContains(t, vm.GetAnnotations(), v1alpha1.AnnotationPaused)
		}},
		"RestartStampsItsAnnotation": {action: "restart", vm: runningVM, want: func(t *testing.T, vm *v1alpha1.VirtualMachine) {
			assert.Equal(t, stamp, vm.GetAnnotations()[v1alpha1.AnnotationRestartRequestedAt])
		}},
		"ResetStampsItsOwn": {action: "reset", vm: runningVM, want: func(t *testing.T, vm *v1alpha1.VirtualMachine) {
			assert.Equal(t, stamp, vm.GetAnnotations()[v1alpha1.AnnotationResetRequestedAt])
			assert.NotContains(t, vm.GetAnnotations(), v1alpha1.AnnotationRestartRequestedAt)
		}},
		"RestartOfAStoppedVMConflicts": {action: "restart", vm: vmState{running: ptr.To(false)}, conflict: "is not running"},
		"ResetOfAPausedVMConflicts":    {action: "reset", vm: vmState{paused: true, phase: v1alpha1.PhasePaused}, conflict: "is paused"},
		"PauseAnnotates": {action: "pause", vm: runningVM, want: func(t *testing.T, vm *v1alpha1.VirtualMachine) {
			assert.Equal(t, "true", vm.GetAnnotations()[v1alpha1.AnnotationPaused])
		}},
		"PauseNeedsAGuestThatRuns": {action: "pause", vm: vmState{phase: v1alpha1.PhaseStarting}, conflict: "phase Starting"},
		"PauseOfANewVMSaysSo":      {action: "pause", vm: vmState{}, conflict: "phase none yet"},
		"PauseTwiceConflicts":      {action: "pause", vm: vmState{paused: true, phase: v1alpha1.PhasePaused}, conflict: "already paused"},
		"UnpauseRemovesIt": {action: "unpause", vm: vmState{paused: true, phase: v1alpha1.PhasePaused}, want: func(t *testing.T, vm *v1alpha1.VirtualMachine) {
			assert.NotContains(t, vm.GetAnnotations(), v1alpha1.AnnotationPaused)
		}},
		"UnpauseOfARunningVMConflicts": {action: "unpause", vm: runningVM, conflict: "is not paused"},
		"ObserveOnlyVMsAreNotChanged":  {action: "stop", vm: vmState{phase: v1alpha1.PhaseRunning, observe: true}, conflict: "observe-only"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns"}}
			vm.Spec.ForProvider.Running = tc.vm.running
			vm.Status.AtProvider.Phase = tc.vm.phase
			if tc.vm.paused {
				vm.SetAnnotations(map[string]string{v1alpha1.AnnotationPaused: "true"})
			}
			if tc.vm.observe {
				vm.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
			}
			before := vm.DeepCopy()
			change, err := plan(tc.action, vm, now)
			assert.Equal(t, before, vm, "plan only reads the VM")
			if tc.conflict != "" {
				require.Error(t, err)
				assert.True(t, kerrors.IsConflict(err), "a Conflict (409), got %v", err)
				assert.Contains(t, err.Error(), tc.conflict)
				return
			}
			require.NoError(t, err)
			change(vm)
			tc.want(t, vm)
		})
	}
}

func TestDiscoveryListsEverySubresource(t *testing.T) {
	l := resources()
	assert.Equal(t, Group+"/"+Version, l.GroupVersion)
	verbs := map[string][]string{}
	for _, r := range l.APIResources {
		assert.True(t, r.Namespaced, r.Name)
		verbs[r.Name] = r.Verbs
	}
	for _, sub := range []string{"console", "vnc"} {
		assert.Equal(t, []string{"get"}, verbs["virtualmachines/"+sub], "a stream is a GET")
	}
	for _, sub := range []string{"start", "stop", "restart", "reset", "pause", "unpause", "migrate"} {
		assert.Equal(t, []string{"update"}, verbs["virtualmachines/"+sub], "an action is a PUT")
	}
}

func TestEveryStreamOpensAConsoleTheWireKnows(t *testing.T) {
	for _, sub := range streams {
		kind, ok := streamKinds[sub]
		require.True(t, ok, sub)
		assert.Contains(t, []wire.ConsoleKind{wire.ConsoleSerial, wire.ConsoleVNC}, kind, sub)
	}
}
