package diskimage

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

func TestPhase(t *testing.T) {
	cases := map[string]struct {
		was     v1alpha1.ImagePhase
		states  []vmState
		want    v1alpha1.ImagePhase
		message string
	}{
		"NoVMYetIsPending": {want: v1alpha1.ImagePhasePending},
		"AVMWaitingForItsImportIsImporting": {
			states:  []vmState{{phase: v1alpha1.PhaseProvisioning, message: "importing image ubuntu: 10 of 20 bytes"}},
			want:    v1alpha1.ImagePhaseImporting,
			message: "importing image ubuntu: 10 of 20 bytes",
		},
		"AVMProvisioningForAnotherImageSaysNothing": {
			states: []vmState{{phase: v1alpha1.PhaseProvisioning, message: "importing image debian: 1 of 2 bytes"}},
			want:   v1alpha1.ImagePhasePending,
		},
		"AVMPastProvisioningMakesItReady": {
			states: []vmState{{phase: v1alpha1.PhaseRunning}},
			want:   v1alpha1.ImagePhaseReady,
		},
		"AnImageFailureOnAnyVMMakesItFailedWithItsMessage": {
			states: []vmState{
				{phase: v1alpha1.PhaseRunning},
				{phase: v1alpha1.PhaseFailed, message: "image ubuntu from http://x failed its checksum: expected sha256 00, got 11; nothing was kept"},
			},
			want:    v1alpha1.ImagePhaseFailed,
			message: "image ubuntu from http://x failed its checksum: expected sha256 00, got 11; nothing was kept",
		},
		"AFailureUnrelatedToTheImageIsIgnored": {
			states: []vmState{{phase: v1alpha1.PhaseFailed, message: "guest crashed"}},
			want:   v1alpha1.ImagePhasePending,
		},
		"ReadyStaysReadyWhenItsVMsAreGone": {was: v1alpha1.ImagePhaseReady, want: v1alpha1.ImagePhaseReady},
		"AFailedImageRecoversOnceItsVMsDo": {
			was:    v1alpha1.ImagePhaseFailed,
			states: []vmState{{phase: v1alpha1.PhaseStarting}},
			want:   v1alpha1.ImagePhaseReady,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, msg := phase("ubuntu", tc.was, tc.states)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.message, msg)
		})
	}
}
