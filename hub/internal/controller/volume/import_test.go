package volume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// importing is Volume team/data importing external on node, created at age.
func importing(name, uid, external, node string, age time.Duration) *v1alpha1.Volume {
	v := boundVolume(node)
	v.Name, v.UID = name, types.UID(uid)
	v.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-age))
	if external != "" {
		meta.SetExternalName(v, external)
	}
	return v
}

func TestObserveImport(t *testing.T) {
	present := wire.VolumeIntent{UID: "vol-uid", Namespace: "team", Name: "data", Disk: "legacy.qcow2", ExternalName: "legacy.qcow2", ProtocolVersion: wire.ProtocolVersion}
	report := func(r wire.VolumeReport) func(*bus.Fake) {
		return func(b *bus.Fake) {
			r.UID = "vol-uid"
			bus.SetValue(b, wire.VolumeReports, testNode, "vol-uid", r)
		}
	}
	cases := map[string]struct {
		volume *v1alpha1.Volume
		// others are further Volumes.
		others []client.Object
		play   []func(*bus.Fake)

		wantPhase    v1alpha1.Phase
		wantReady    corev1.ConditionStatus
		wantMessage  string
		wantCapacity *resource.Quantity
		wantID       string
		wantIntent   *wire.VolumeIntent
	}{
		"AVolumeOfItsOwnIsNotImported": {
			volume:    importing("data", "vol-uid", "", testNode, 0),
			wantPhase: v1alpha1.PhaseRunning,
			wantReady: corev1.ConditionTrue,
		},
		"AnImportNeedsItsNode": {
			volume:      importing("data", "vol-uid", "legacy.qcow2", "", 0),
			wantPhase:   v1alpha1.PhaseFailed,
			wantReady:   corev1.ConditionFalse,
			wantMessage: `the Volume imports volume "legacy.qcow2": set the annotation compute.virtfleet.io/node to the node that has it`,
		},
		"AnImportAsksTheNodeAndWaitsForItsReport": {
			volume:      importing("data", "vol-uid", "legacy.qcow2", testNode, 0),
			wantPhase:   v1alpha1.PhasePending,
			wantReady:   corev1.ConditionFalse,
			wantMessage: "waiting for node node1 to report volume legacy.qcow2",
			wantIntent:  &present,
		},
		"AnImportShowsTheVolumesRealSize": {
			volume:       importing("data", "vol-uid", "legacy.qcow2", testNode, 0),
			play:         []func(*bus.Fake){report(wire.VolumeReport{Imported: true, SizeBytes: 3 << 30, ID: "/pool/legacy.qcow2"})},
			wantPhase:    v1alpha1.PhaseRunning,
			wantReady:    corev1.ConditionTrue,
			wantCapacity: resource.NewQuantity(3<<30, resource.BinarySI),
			wantID:       "/pool/legacy.qcow2",
			wantIntent:   &present,
		},
		"AReportOfTheVolumeBeingDeletedIsNoImport": {
			volume:      importing("data", "vol-uid", "legacy.qcow2", testNode, 0),
			play:        []func(*bus.Fake){report(wire.VolumeReport{Message: "in use"})},
			wantPhase:   v1alpha1.PhasePending,
			wantReady:   corev1.ConditionFalse,
			wantMessage: "waiting for node node1 to report volume legacy.qcow2",
			wantIntent:  &present,
		},
		"AMissingVolumeFails": {
			volume:      importing("data", "vol-uid", "legacy.qcow2", testNode, 0),
			play:        []func(*bus.Fake){report(wire.VolumeReport{Imported: true, Message: "no volume legacy.qcow2 in storage pool default on node node1"})},
			wantPhase:   v1alpha1.PhaseFailed,
			wantReady:   corev1.ConditionFalse,
			wantMessage: "no volume legacy.qcow2 in storage pool default on node node1",
			wantIntent:  &present,
		},
		"AVolumeAnOlderVolumeImportedFailsNamingIt": {
			volume:      importing("data", "vol-uid", "legacy.qcow2", testNode, 0),
			others:      []client.Object{importing("first", "first-uid", "legacy.qcow2", testNode, time.Hour)},
			wantPhase:   v1alpha1.PhaseFailed,
			wantReady:   corev1.ConditionFalse,
			wantMessage: "volume legacy.qcow2 on node node1 is already managed by Volume first; a volume has one Volume",
		},
		"AnImportOfANamespaceWithoutTheGrantIsRefusedAndAsksNothingOfTheNode": {
			volume:      inNamespace("tenant-a", importing("data", "vol-uid", "legacy.qcow2", testNode, 0)),
			wantPhase:   v1alpha1.PhaseFailed,
			wantReady:   corev1.ConditionFalse,
			wantMessage: `refused: the Volume imports "legacy.qcow2" by crossplane.io/external-name, which virtfleet did not make for it; namespace tenant-a may not reach what it does not own unless a cluster administrator grants it in a ClusterProviderConfig's spec.grants (import: true)`,
		},
		"AVolumeAnotherNamespaceImportedFirstIsNotNamed": {
			volume:      importing("data", "vol-uid", "legacy.qcow2", testNode, 0),
			others:      []client.Object{inNamespace("other", importing("first", "first-uid", "legacy.qcow2", testNode, time.Hour))},
			wantPhase:   v1alpha1.PhaseFailed,
			wantReady:   corev1.ConditionFalse,
			wantMessage: "volume legacy.qcow2 on node node1 is already managed by a Volume of another namespace; a volume has one Volume",
		},
		"AVolumeNamingAnotherVolumesOwnVolumeFailsNamingIt": {
			volume:      importing("data", "vol-uid", "team_first", testNode, 0),
			others:      []client.Object{importing("first", "first-uid", "", testNode, time.Hour)},
			wantPhase:   v1alpha1.PhaseFailed,
			wantReady:   corev1.ConditionFalse,
			wantMessage: "volume team_first on node node1 is already managed by Volume first; a volume has one Volume",
		},
		"AYoungerVolumeOrOneOfAnotherNodeIsNoOwner": {
			volume: importing("data", "vol-uid", "legacy.qcow2", testNode, time.Hour),
			others: []client.Object{
				importing("second", "second-uid", "legacy.qcow2", testNode, 0),
				importing("elsewhere", "elsewhere-uid", "legacy.qcow2", "node2", 2*time.Hour),
			},
			wantPhase:   v1alpha1.PhasePending,
			wantReady:   corev1.ConditionFalse,
			wantMessage: "waiting for node node1 to report volume legacy.qcow2",
			wantIntent:  &present,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b, f := played(t, tc.play...)
			r, _, _, kube := testReleaser(t, f, append(tc.others, tc.volume)...)

			ready, err := r.Observe(context.Background(), kube, tc.volume, nil)

			require.NoError(t, err)
			at := tc.volume.Status.AtProvider
			assert.Equal(t, tc.wantPhase, at.Phase)
			assert.Equal(t, tc.wantReady, ready.Status)
			assert.Equal(t, tc.wantMessage, ready.Message)
			assert.Equal(t, tc.wantCapacity, at.Capacity)
			assert.Equal(t, tc.wantID, at.ID)
			in, ok := bus.Stored(b, wire.VolumeIntents, testNode, "vol-uid")
			if tc.wantIntent == nil {
				assert.False(t, ok, "no intent: %+v", in)
			} else {
				assert.Equal(t, *tc.wantIntent, in)
			}
		})
	}
}

// TestImportedVolumeIntents pins the intents of an imported Volume over its
// life: observed while it exists, left alone by Observe once deleted, and
// deleted by Release (called only with the Delete policy).
func TestImportedVolumeIntents(t *testing.T) {
	ctx := context.Background()
	b, f := played(t)
	v := importing("data", "vol-uid", "legacy.qcow2", testNode, 0)
	r, _, _, kube := testReleaser(t, f, v)
	b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt"}})

	_, err := r.Observe(ctx, kube, v, nil)
	require.NoError(t, err)
	in, _ := bus.Stored(b, wire.VolumeIntents, testNode, "vol-uid")
	assert.False(t, in.Absent, "observed")

	// A restart elsewhere moves a shared Volume to another node: that
	// node is asked too.
	v.Annotations[v1alpha1.AnnotationNode] = "node-b"
	_, err = r.Observe(ctx, kube, v, nil)
	require.NoError(t, err)
	moved, asked := bus.Stored(b, wire.VolumeIntents, "node-b", "vol-uid")
	require.True(t, asked, "the node the Volume moved to is asked to observe it")
	assert.Equal(t, in, moved)
	v.Annotations[v1alpha1.AnnotationNode] = testNode

	_, err = r.Release(ctx, v)
	require.NoError(t, err)
	in, _ = bus.Stored(b, wire.VolumeIntents, testNode, "vol-uid")
	want := wire.VolumeIntent{UID: "vol-uid", Namespace: "team", Name: "data", Disk: "legacy.qcow2", ExternalName: "legacy.qcow2", Absent: true, ProtocolVersion: wire.ProtocolVersion}
	assert.Equal(t, want, in, "the node deletes the imported volume")

	now := metav1.Now()
	v.DeletionTimestamp = &now
	_, err = r.Observe(ctx, kube, v, nil)
	require.NoError(t, err)
	in, _ = bus.Stored(b, wire.VolumeIntents, testNode, "vol-uid")
	assert.Equal(t, want, in, "an Observe during the deletion does not take it back")
}

// TestReleaseLeavesAVolumeAnotherVolumeImported pins that deleting, with the
// Delete policy, a Volume refused as the second importer of a volume
// deletes nothing on the node.
func TestReleaseLeavesAVolumeAnotherVolumeImported(t *testing.T) {
	ctx := context.Background()
	b, f := played(t)
	thief := importing("data", "vol-uid", "legacy.qcow2", testNode, 0)
	r, _, _, kube := testReleaser(t, f, thief, importing("first", "first-uid", "legacy.qcow2", testNode, time.Hour))
	_, err := r.Observe(ctx, kube, thief, nil)
	require.NoError(t, err)

	released, err := r.Release(ctx, thief)

	require.NoError(t, err)
	assert.True(t, released, "released at once")
	in, ok := bus.Stored(b, wire.VolumeIntents, testNode, "vol-uid")
	assert.False(t, ok, "the node is never asked anything: %+v", in)
}

// inNamespace is v moved to namespace ns.
func inNamespace(ns string, v *v1alpha1.Volume) *v1alpha1.Volume {
	v.Namespace = ns
	return v
}
