package volume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

const (
	testNode    = "node1"
	testFencing = 10 * time.Second
)

// oneFleet is a Fleets with one Fleet over a fake bus, whatever the target.
type oneFleet struct{ f *fleet.Fleet }

func (o oneFleet) Get(context.Context, fleet.Target) (*fleet.Fleet, error) { return o.f, nil }

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	return s
}

func boundVolume(node string) *v1alpha1.Volume {
	v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "data", UID: "vol-uid"}}
	v.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: apisv1alpha1.ClusterProviderConfigKind, Name: "default"}
	if node != "" {
		v.Annotations = map[string]string{v1alpha1.AnnotationNode: node}
	}
	return v
}

// played is a Fleet over a fake bus on which play was played.
func played(t *testing.T, play ...func(*bus.Fake)) (*bus.Fake, *fleet.Fleet) {
	t.Helper()
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	for _, p := range play {
		p(b)
	}
	return b, f
}

// testReleaser is a Releaser reaching f, with a kube holding the default
// ClusterProviderConfig and objs.
func testReleaser(t *testing.T, f *fleet.Fleet, objs ...client.Object) (*Releaser, *fleettest.Recorder, *wake.Notifier, client.Client) {
	t.Helper()
	kube := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(append(objs, &apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: apisv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{
			NATSURL:     "nats://nats.example:4222",
			Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone},
		},
			// Namespace team may import; any other may not.
			Grants: []apisv1alpha1.TenantGrant{{Namespaces: []string{"team"}, Import: true}},
		},
	})...).Build()
	memory := perobject.NewOwner(nil)
	notifier := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.Volume{} })
	rec := &fleettest.Recorder{}
	return NewReleaser(kube, oneFleet{f}, testFencing, notifier, rec, memory), rec, notifier, kube
}

// A Volume in a shared pool is asked of its node in that pool.
func TestTheVolumeIntentNamesTheSharedPool(t *testing.T) {
	v := boundVolume(testNode)
	assert.Empty(t, intentOf(v).Pool, "the node's own storage")
	v.Spec.ForProvider.StoragePool = "ceph"
	assert.Equal(t, "ceph", intentOf(v).Pool)
	assert.Equal(t, "team_data", intentOf(v).Disk, "its name in the pool is the one it has on a node")
}

func TestRelease(t *testing.T) {
	absent := wire.VolumeIntent{UID: "vol-uid", Namespace: "team", Name: "data", Disk: "team_data", Absent: true, ProtocolVersion: wire.ProtocolVersion}
	alive := bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt"}}
	lost := bus.NodeEvent{Node: testNode, Lost: true}

	cases := map[string]struct {
		node string
		// play plays the node before Release.
		play []func(*bus.Fake)
		// sinceLost is how long the node has been lost when Release runs.
		sinceLost time.Duration

		wantReleased bool
		wantErr      string
		// wantIntent is whether the VolumeIntent{Absent} is stored after.
		wantIntent bool
		wantEvent  event.Reason
		wantWakeUp bool
	}{
		"AnUnboundVolumeIsReleasedAtOnce": {
			node:         "",
			wantReleased: true,
		},
		"ABoundVolumeAsksItsNodeToDeleteTheVolumeAndWaits": {
			node:       testNode,
			play:       []func(*bus.Fake){func(b *bus.Fake) { b.SetNode(alive) }},
			wantIntent: true,
		},
		"ABoundVolumeWaitsWithTheNodesReasonWhileTheNodeCannotDelete": {
			node: testNode,
			play: []func(*bus.Fake){
				func(b *bus.Fake) { b.SetNode(alive) },
				func(b *bus.Fake) {
					bus.SetValue(b, wire.VolumeReports, testNode, "vol-uid", wire.VolumeReport{UID: "vol-uid", Message: "volume team_data is still used by guest g"})
				},
			},
			wantErr:    "node node1 cannot delete the volume yet: volume team_data is still used by guest g",
			wantIntent: true,
		},
		"ABoundVolumeIsReleasedOnceItsNodeReportsItGoneAndItsIntentIsDeleted": {
			node: testNode,
			play: []func(*bus.Fake){
				func(b *bus.Fake) { b.SetNode(alive) },
				func(b *bus.Fake) {
					_, _ = bus.Put(context.Background(), b, wire.VolumeIntents, testNode, absent.UID, absent)
				},
				func(b *bus.Fake) {
					bus.SetValue(b, wire.VolumeReports, testNode, "vol-uid", wire.VolumeReport{UID: "vol-uid", Gone: true})
				},
			},
			wantReleased: true,
		},
		"AGoneReportFromAnotherNodeDoesNotRelease": {
			node: testNode,
			play: []func(*bus.Fake){
				func(b *bus.Fake) { b.SetNode(alive) },
				func(b *bus.Fake) {
					bus.SetValue(b, wire.VolumeReports, "node2", "vol-uid", wire.VolumeReport{UID: "vol-uid", Gone: true})
				},
			},
			wantIntent: true,
		},
		"ANodeLostForLessThanTheFencingTimeoutHoldsTheVolumeAndSchedulesAWakeUp": {
			node:       testNode,
			play:       []func(*bus.Fake){func(b *bus.Fake) { b.SetNode(alive) }, func(b *bus.Fake) { b.SetNode(lost) }},
			sinceLost:  testFencing - 300*time.Millisecond,
			wantIntent: true,
			wantWakeUp: true,
		},
		"ANodeLostForLongerThanTheFencingTimeoutReleasesWithAWarningAndLeavesTheIntent": {
			node:         testNode,
			play:         []func(*bus.Fake){func(b *bus.Fake) { b.SetNode(alive) }, func(b *bus.Fake) { b.SetNode(lost) }},
			sinceLost:    testFencing + time.Second,
			wantReleased: true,
			wantIntent:   true,
			wantEvent:    ReasonNodeLost,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b, f := played(t, tc.play...)
			r, rec, notifier, _ := testReleaser(t, f)
			wakeUps := fleettest.WakeUps(t, notifier)
			if tc.sinceLost != 0 {
				r.now = func() time.Time { return f.Node(testNode).LostSince.Add(tc.sinceLost) }
			}

			released, err := r.Release(context.Background(), boundVolume(tc.node))

			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantReleased, released, "released")
			in, ok := bus.Stored(b, wire.VolumeIntents, testNode, "vol-uid")
			require.Equal(t, tc.wantIntent, ok, "a volume intent is stored: %+v", in)
			if ok {
				assert.Equal(t, absent, in, "the intent asks the node to delete the Volume's volume")
			}
			if events := rec.AssertWarning(t, tc.wantEvent); tc.wantEvent != "" {
				assert.Contains(t, events[0].Message, "fencing timeout")
			}
			fleettest.AssertWakeUp(t, wakeUps, tc.wantWakeUp, types.NamespacedName{Namespace: "team", Name: "data"})
		})
	}
}
