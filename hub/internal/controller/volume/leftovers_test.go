package volume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
)

func TestLeftoversClean(t *testing.T) {
	const uid = "vol-uid"
	existing := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "data", UID: uid}}
	gone := wire.VolumeReport{UID: uid, Gone: true}
	cannot := wire.VolumeReport{UID: uid, Message: "in use"}
	imported := wire.VolumeReport{UID: uid, Imported: true, SizeBytes: 1 << 30}

	cases := map[string]struct {
		report *wire.VolumeReport
		// cached and api are the Volumes the cache and the API server hold.
		cached, api []client.Object
		// deleted is whether the cache saw the cached Volumes deleted
		// since.
		deleted bool

		wantCleaned bool
	}{
		"AGoneReportOfADeletedVolumeIsCleanedUp": {
			report:      &gone,
			wantCleaned: true,
		},
		"AnExistingVolumesIntentIsLeftToItsRelease": {
			report: &gone,
			cached: []client.Object{existing},
			api:    []client.Object{existing},
		},
		"AVolumeTheCacheSawDeletedIsCleanedUp": {
			report:      &gone,
			cached:      []client.Object{existing},
			deleted:     true,
			wantCleaned: true,
		},
		"AVolumeTheCacheHasNotSeenYetIsNotTakenForGone": {
			report: &gone,
			api:    []client.Object{existing},
		},
		"AVolumeNotYetGoneOnItsNodeKeepsItsIntent": {
			report: &cannot,
		},
		"WithoutAReportNothingIsDeleted": {},
		"AnImportOfAVolumeDeletedWithoutDeleteIsCleanedUp": {
			report:      &imported,
			wantCleaned: true,
		},
		"AnExistingVolumesImportIsKept": {
			report: &imported,
			cached: []client.Object{existing},
			api:    []client.Object{existing},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			_, err := bus.Put(context.Background(), b, wire.VolumeIntents, testNode, uid, wire.VolumeIntent{UID: uid, Namespace: "team", Name: "data", Disk: "team_data", Absent: true})
			require.NoError(t, err)
			f := fleettest.Start(t, b)
			if tc.report != nil {
				bus.SetValue(b, wire.VolumeReports, testNode, uid, *tc.report)
			}
			l := newTestLeftovers(t, tc.cached, tc.api)
			if tc.deleted {
				for _, o := range tc.cached {
					l.Deleted(o.GetUID())
				}
			}

			require.NoError(t, l.Clean(context.Background(), f, uid))

			_, intent := bus.Stored(b, wire.VolumeIntents, testNode, uid)
			_, report := f.Volumes.Report(testNode, uid)
			assert.Equal(t, !tc.wantCleaned, intent, "the volume intent is kept")
			assert.Equal(t, !tc.wantCleaned && tc.report != nil, report, "the volume report is kept")
		})
	}
}

// TestLeftoversSweep pins that leftovers already in the buckets when the hub
// starts are cleaned, and ones left later as their nodes report.
func TestLeftoversSweep(t *testing.T) {
	ctx := context.Background()
	b := bus.NewFake()
	for _, uid := range []string{"old-1", "old-2", "late", "alive"} {
		_, err := bus.Put(ctx, b, wire.VolumeIntents, testNode, uid, wire.VolumeIntent{UID: uid, Namespace: "team", Name: uid, Disk: "team_" + uid, Absent: true})
		require.NoError(t, err)
	}
	for _, uid := range []string{"old-1", "old-2", "alive"} {
		bus.SetValue(b, wire.VolumeReports, testNode, uid, wire.VolumeReport{UID: uid, Gone: true})
	}
	alive := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "alive", UID: "alive"}}
	l := newTestLeftovers(t, []client.Object{alive}, []client.Object{alive})
	f := fleet.New(b, logging.NewNopLogger())
	l.Watch(f)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go f.Run(runCtx)
	go func() { _ = l.Start(runCtx) }()

	intent := func(uid string) func() bool {
		return func() bool { _, ok := bus.Stored(b, wire.VolumeIntents, testNode, uid); return ok }
	}
	for _, uid := range []string{"old-1", "old-2"} {
		require.Eventually(t, func() bool { return !intent(uid)() }, 5*time.Second, 5*time.Millisecond, "leftover %s is swept at start", uid)
		require.Eventually(t, func() bool { _, ok := f.Volumes.Report(testNode, uid); return !ok }, 5*time.Second, 5*time.Millisecond, "report %s is deleted", uid)
	}

	bus.SetValue(b, wire.VolumeReports, testNode, "late", wire.VolumeReport{UID: "late", Gone: true})
	require.Eventually(t, func() bool { return !intent("late")() }, 5*time.Second, 5*time.Millisecond, "a leftover reported later is cleaned")

	assert.True(t, intent("alive")(), "an existing Volume's intent stays")
	_, ok := f.Volumes.Report(testNode, "alive")
	assert.True(t, ok, "an existing Volume's report stays")
}

func newTestLeftovers(t *testing.T, cached, api []client.Object) *Leftovers {
	t.Helper()
	server := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(api...).Build()
	l := NewLeftovers(server, logging.NewNopLogger())
	for _, o := range cached {
		l.Cached(o.GetUID())
	}
	return l
}
