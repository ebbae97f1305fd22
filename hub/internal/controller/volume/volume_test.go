package volume

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

const (
	testNode    = "node1"
	testFencing = 10 * time.Second
)

// oneFleet is a Fleets with one Fleet over a fake bus, whatever the target.
type oneFleet struct{ f *fleet.Fleet }

func (o oneFleet) Get(context.Context, fleet.Target) (*fleet.Fleet, error) { return o.f, nil }

// recorder records events.
type recorder struct {
	mu     sync.Mutex
	events []event.Event
}

func (r *recorder) Event(_ runtime.Object, e event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) WithAnnotations(...string) event.Recorder { return r }

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	return s
}

// startFleet runs a Fleet over b until the test ends, and returns it once its
// watches deliver.
func startFleet(t *testing.T, b *bus.Fake) *fleet.Fleet {
	t.Helper()
	f := fleet.New(b, logging.NewNopLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// A lost node and a volume report of nobody's mark that both watches
	// are in place.
	b.SetNode(bus.NodeEvent{Node: "sentinel", Lost: true})
	b.SetVolumeReport(bus.VolumeReportEvent{Node: "sentinel", UID: "sentinel"})
	require.Eventually(t, func() bool {
		_, ok := f.VolumeReport("sentinel", "sentinel")
		return ok && f.Node("sentinel").Lost
	}, 5*time.Second, time.Millisecond)
	return f
}

func boundVolume(node string) *v1alpha1.Volume {
	v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "data", UID: "vol-uid"}}
	v.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: apisv1alpha1.ClusterProviderConfigKind, Name: "default"}
	if node != "" {
		v.Annotations = map[string]string{v1alpha1.AnnotationNode: node}
	}
	return v
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
					b.SetVolumeReport(bus.VolumeReportEvent{Node: testNode, UID: "vol-uid", Report: wire.VolumeReport{UID: "vol-uid", Message: "volume team_data is still used by guest g"}})
				},
			},
			wantErr:    "node node1 cannot delete the volume yet: volume team_data is still used by guest g",
			wantIntent: true,
		},
		"ABoundVolumeIsReleasedOnceItsNodeReportsItGoneAndItsIntentIsDeleted": {
			node: testNode,
			play: []func(*bus.Fake){
				func(b *bus.Fake) { b.SetNode(alive) },
				func(b *bus.Fake) { _, _ = b.PutVolumeIntent(context.Background(), testNode, absent) },
				func(b *bus.Fake) {
					b.SetVolumeReport(bus.VolumeReportEvent{Node: testNode, UID: "vol-uid", Report: wire.VolumeReport{UID: "vol-uid", Gone: true}})
				},
			},
			wantReleased: true,
		},
		"AGoneReportFromAnotherNodeDoesNotRelease": {
			node: testNode,
			play: []func(*bus.Fake){
				func(b *bus.Fake) { b.SetNode(alive) },
				func(b *bus.Fake) {
					b.SetVolumeReport(bus.VolumeReportEvent{Node: "node2", UID: "vol-uid", Report: wire.VolumeReport{UID: "vol-uid", Gone: true}})
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
			b := bus.NewFake()
			f := startFleet(t, b)
			for _, play := range tc.play {
				play(b)
			}
			kube := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(&apisv1alpha1.ClusterProviderConfig{
				ObjectMeta: metav1.ObjectMeta{Name: "default"},
				Spec: apisv1alpha1.ProviderConfigSpec{
					NATSURL:     "nats://nats.example:4222",
					Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone},
				},
			}).Build()
			notifier := virtualmachine.NewNotifierFor(func() client.Object { return &v1alpha1.Volume{} })
			wakeUps := startNotifier(t, notifier)
			rec := &recorder{}
			r := &Releaser{
				configs:  providerconfig.NewResolver(kube),
				pool:     oneFleet{f},
				notifier: notifier,
				fencing:  testFencing,
				recorder: rec,
				now:      func() time.Time { return f.Node(testNode).LostSince.Add(tc.sinceLost) },
			}
			if tc.sinceLost == 0 {
				r.now = time.Now
			}

			released, err := r.Release(context.Background(), boundVolume(tc.node))

			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantReleased, released, "released")
			in, ok := b.VolumeIntent(testNode, "vol-uid")
			require.Equal(t, tc.wantIntent, ok, "a volume intent is stored: %+v", in)
			if ok {
				assert.Equal(t, absent, in, "the intent asks the node to delete the Volume's volume")
			}
			var reasons []event.Reason
			for _, e := range rec.events {
				assert.Equal(t, event.TypeWarning, e.Type)
				reasons = append(reasons, e.Reason)
			}
			if tc.wantEvent != "" {
				assert.Equal(t, []event.Reason{tc.wantEvent}, reasons)
				assert.Contains(t, rec.events[0].Message, "fencing timeout")
			} else {
				assert.Empty(t, reasons)
			}
			select {
			case req := <-wakeUps:
				assert.True(t, tc.wantWakeUp, "unexpected wake-up %v", req)
				assert.Equal(t, types.NamespacedName{Namespace: "team", Name: "data"}, req.NamespacedName)
			case <-time.After(time.Second):
				assert.False(t, tc.wantWakeUp, "the Volume is woken when the fencing timeout is up")
			}
		})
	}
}

// startNotifier delivers the notifier's wake-ups to the returned channel.
func startNotifier(t *testing.T, n *virtualmachine.Notifier) <-chan reconcile.Request {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	require.NoError(t, n.Source().Start(ctx, q))
	out := make(chan reconcile.Request, 8)
	go func() {
		for {
			req, shutdown := q.Get()
			if shutdown {
				return
			}
			out <- req
			q.Done(req)
		}
	}()
	t.Cleanup(func() { cancel(); q.ShutDown() })
	return out
}
