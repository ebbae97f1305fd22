package diskimage

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
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

func imageReport(node string, p wire.ImagePhase, size int64, msg string) wire.ImageReport {
	return wire.ImageReport{ProtocolVersion: wire.ProtocolVersion, UID: "img-1", Node: node, Phase: p, SizeBytes: size, Message: msg}
}

func TestFromReports(t *testing.T) {
	cases := map[string]struct {
		reports []wire.ImageReport
		want    nodesSay
		wantOK  bool
	}{
		"NoReportsSayNothing": {},
		"ReadyOnNodesListsThemSortedWithTheSize": {
			reports: []wire.ImageReport{imageReport("node2", wire.ImagePhaseReady, 8<<20, ""), imageReport("node1", wire.ImagePhaseReady, 8<<20, "")},
			want:    nodesSay{nodes: []string{"node1", "node2"}, size: 8 << 20, phase: v1alpha1.ImagePhaseReady},
			wantOK:  true,
		},
		"AnImportIsImportingWithItsNodesProgress": {
			reports: []wire.ImageReport{imageReport("node1", wire.ImagePhaseImporting, 0, "importing image ubuntu: 1 of 4 bytes")},
			want:    nodesSay{phase: v1alpha1.ImagePhaseImporting, message: "node1: importing image ubuntu: 1 of 4 bytes"},
			wantOK:  true,
		},
		"AnImportElsewhereStillListsTheNodesThatHaveIt": {
			reports: []wire.ImageReport{imageReport("node1", wire.ImagePhaseReady, 4, ""), imageReport("node2", wire.ImagePhaseImporting, 0, "importing image ubuntu: 1 of 4 bytes")},
			want:    nodesSay{nodes: []string{"node1"}, size: 4, phase: v1alpha1.ImagePhaseImporting, message: "node2: importing image ubuntu: 1 of 4 bytes"},
			wantOK:  true,
		},
		"AFailureOnANodeIsFailedWithItsMessage": {
			reports: []wire.ImageReport{
				imageReport("node3", wire.ImagePhaseFailed, 0, "image ubuntu from http://x failed its checksum"),
				imageReport("node1", wire.ImagePhaseImporting, 0, "importing image ubuntu: 1 of 4 bytes"),
				imageReport("node2", wire.ImagePhaseReady, 4, ""),
			},
			want:   nodesSay{nodes: []string{"node2"}, size: 4, phase: v1alpha1.ImagePhaseFailed, message: "node3: image ubuntu from http://x failed its checksum"},
			wantOK: true,
		},
		"FailuresOnSeveralNodesAreAllNamed": {
			reports: []wire.ImageReport{imageReport("node2", wire.ImagePhaseFailed, 0, "404"), imageReport("node1", wire.ImagePhaseFailed, 0, "pool full")},
			want:    nodesSay{phase: v1alpha1.ImagePhaseFailed, message: "node1: pool full; node2: 404"},
			wantOK:  true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := fromReports(tc.reports)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestObserveFromReports(t *testing.T) {
	ctx := context.Background()
	img := &v1alpha1.DiskImage{}
	img.Status.AtProvider = v1alpha1.DiskImageObservation{Phase: v1alpha1.ImagePhaseImporting, Nodes: []string{"stale"}}

	// No kube reader: with reports nothing else is read.
	c, err := observe(ctx, nil, img, inuse.Users{&v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: img.Namespace, Name: "boot-a"}}}, []wire.ImageReport{imageReport("node1", wire.ImagePhaseReady, 8<<20, "")})
	require.NoError(t, err)
	o := img.Status.AtProvider
	assert.Equal(t, v1alpha1.ImagePhaseReady, o.Phase)
	assert.Equal(t, []string{"node1"}, o.Nodes)
	require.NotNil(t, o.Size)
	assert.Equal(t, "8Mi", o.Size.String())
	assert.Equal(t, int32(1), o.Users)
	assert.Equal(t, corev1.ConditionTrue, c.Status)

	t.Run("AnImportingImageIsNotReady", func(t *testing.T) {
		img := img.DeepCopy()
		c, err := observe(ctx, nil, img, nil, []wire.ImageReport{imageReport("node1", wire.ImagePhaseImporting, 0, "importing image ubuntu: 1 of 4 bytes")})
		require.NoError(t, err)
		assert.Equal(t, corev1.ConditionFalse, c.Status)
		assert.Equal(t, xpv2.ConditionReason(v1alpha1.ImagePhaseImporting), c.Reason)
		assert.Equal(t, "node1: importing image ubuntu: 1 of 4 bytes", c.Message)
		assert.Empty(t, img.Status.AtProvider.Nodes, "an image being imported is not on the node yet")
	})

	t.Run("AnImagePrunedEverywhereListsNoNodeAndKeepsItsSize", func(t *testing.T) {
		img := img.DeepCopy()
		_, err := observe(ctx, nil, img, nil, nil)
		require.NoError(t, err)
		o := img.Status.AtProvider
		assert.Empty(t, o.Nodes)
		assert.Equal(t, int32(0), o.Users)
		require.NotNil(t, o.Size, "the image's size does not change when it leaves a node")
		assert.Equal(t, "8Mi", o.Size.String())
		assert.Equal(t, v1alpha1.ImagePhaseReady, o.Phase, "it was imported once and is imported again when needed")
	})
}
