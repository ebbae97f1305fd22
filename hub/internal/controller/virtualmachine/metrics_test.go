package virtualmachine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

// TestFirstStart pins which transitions to Running the create→Running
// histogram counts: only a VM's first start as created.
func TestFirstStart(t *testing.T) {
	cases := []struct {
		name       string
		generation int64
		before     v1alpha1.Phase
		restarts   int32
		want       bool
	}{
		{name: "first report is Running", generation: 1, before: "", want: true},
		{name: "from Scheduled", generation: 1, before: v1alpha1.PhaseScheduled, want: true},
		{name: "from Starting", generation: 1, before: v1alpha1.PhaseStarting, want: true},
		{name: "after a stop and start the spec changed", generation: 3, before: v1alpha1.PhaseStarting},
		{name: "a restart counted by the node", generation: 1, before: v1alpha1.PhaseStarting, restarts: 1},
		{name: "back from a lost node", generation: 1, before: v1alpha1.PhaseUnknown},
		{name: "from Stopped", generation: 1, before: v1alpha1.PhaseStopped},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Generation: tc.generation}}
			before := v1alpha1.VirtualMachineObservation{Phase: tc.before}
			after := v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseRunning, RestartCount: tc.restarts}
			assert.Equal(t, tc.want, firstStart(vm, before, after))
		})
	}
}

// TestRefusalReasons pins the bounded reasons of the placement-refusals
// metric.
func TestRefusalReasons(t *testing.T) {
	cases := []struct {
		name  string
		cause error
		want  []string
	}{
		{name: "no node fits", cause: errors.Wrap(&placement.NoFitError{Causes: map[string]placement.Cause{"a": placement.CauseVCPU, "b": placement.CauseMemory, "c": placement.CauseVCPU}}, "cannot place the VM"), want: []string{"memory", "vcpu"}},
		{name: "no nodes", cause: &placement.NoFitError{}, want: []string{"no-nodes"}},
		{name: "not granted", cause: &tenancy.RefusedError{What: "node node1", Namespace: "t", Field: "nodes"}, want: []string{"forbidden"}},
		{name: "waits for a Volume", cause: &MissingError{Volumes: []string{"disk"}}, want: []string{"waiting"}},
		{name: "waits for an instance type", cause: &MissingTemplateError{Kind: "VirtualMachineClusterInstancetype", Name: "small"}, want: []string{"waiting"}},
		{name: "waits for a holder of a cloned image", cause: &SourceWaitError{Reasons: []string{"no node holds DiskImage golden"}, Unheld: []string{"uid-golden"}}, want: []string{"waiting"}},
		{name: "anything else", cause: errors.New("cannot connect to NATS"), want: []string{"other"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, refusalReasons(tc.cause))
		})
	}
}
