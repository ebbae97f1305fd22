package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// TestOrphan feeds a fleet report events as its watch would and asks for the
// guest orphaned from default/web.
func TestOrphan(t *testing.T) {
	// sealed is the orphan report of a release the hub sealed for
	// sealedNode and sealedName (the fleets here have no key).
	sealed := func(node, uid, name, sealedNode, sealedName string) bus.Entry {
		return entry(wire.GuestReports, node, uid, &wire.Report{
			UID: uid, Node: node, Phase: wire.PhaseRunning,
			Released: true, Orphan: &wire.Orphan{Namespace: "default", Name: name, Seal: (&Fleet{}).OrphanSeal(uid, sealedNode, "default", sealedName)},
		})
	}
	orphanOf := func(node, uid, name string) bus.Entry { return sealed(node, uid, name, node, name) }
	unsealed := func(node, uid, name string) bus.Entry {
		return entry(wire.GuestReports, node, uid, &wire.Report{
			UID: uid, Node: node, Phase: wire.PhaseRunning,
			Released: true, Orphan: &wire.Orphan{Namespace: "default", Name: name},
		})
	}
	managedBy := func(node, uid string) bus.Entry {
		return entry(wire.GuestReports, node, uid, &wire.Report{UID: uid, Node: node, Phase: wire.PhaseRunning})
	}
	gone := func(node, uid string) bus.Entry { return entry[wire.Report](wire.GuestReports, node, uid, nil) }
	cases := map[string]struct {
		events   []bus.Entry
		lost     string
		unsynced bool
		want     *Orphan
		wantErr  error
	}{
		"NoneBeforeTheReportsAreRead": {events: []bus.Entry{orphanOf("n1", "a", "web")}, unsynced: true, wantErr: ErrReportsNotSynced},
		"TheOrphanOfThatName":         {events: []bus.Entry{orphanOf("n1", "a", "web"), orphanOf("n2", "b", "db")}, want: &Orphan{Node: "n1", UID: "a"}},
		"OfSeveralTheLowestUID":       {events: []bus.Entry{orphanOf("n2", "b", "web"), orphanOf("n1", "a", "web")}, want: &Orphan{Node: "n1", UID: "a"}},
		"NoneOnALostNode":             {events: []bus.Entry{orphanOf("n1", "a", "web")}, lost: "n1"},
		"NoneOnceItsReportIsDeleted":  {events: []bus.Entry{orphanOf("n1", "a", "web"), gone("n1", "a")}},
		"NoneOnceTheGuestIsManagedAgain": {
			events: []bus.Entry{orphanOf("n1", "a", "web"), managedBy("n1", "a")},
		},
		"AManagedGuestIsNone":                   {events: []bus.Entry{managedBy("n1", "a")}},
		"AnOrphanTheHubDidNotReleaseIsNone":     {events: []bus.Entry{unsealed("n1", "a", "web")}},
		"AnOrphanReleasedFromAnotherNameIsNone": {events: []bus.Entry{sealed("n1", "a", "web", "n1", "db")}},
		"AnOrphanReleasedOnAnotherNodeIsNone":   {events: []bus.Entry{sealed("n1", "a", "web", "n2", "web")}},
		"AForgedOrphanDoesNotHideTheRealOne": {
			events: []bus.Entry{unsealed("n1", "a", "web"), orphanOf("n2", "b", "web")}, want: &Orphan{Node: "n2", UID: "b"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := New(bus.NewFake(), logging.NewNopLogger())
			if !tc.unsynced {
				require.NoError(t, f.onReport(bus.Entry{Synced: true}))
			}
			for _, n := range []string{"n1", "n2"} {
				f.onNode(bus.NodeEvent{Node: n, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt"}})
			}
			if tc.lost != "" {
				f.onNode(bus.NodeEvent{Node: tc.lost, Lost: true})
			}
			for _, e := range tc.events {
				require.NoError(t, f.onReport(e))
			}

			got, found, err := f.Orphan("default", "web")

			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want != nil, found, "found")
			if tc.want != nil {
				assert.Equal(t, tc.want.Node, got.Node)
				assert.Equal(t, tc.want.UID, got.UID)
			}
		})
	}
}

// TestSyncedSubscribersHearEveryCatchUp: the report watch catching up with
// the server, at the start and after every reconnect, is told to
// SubscribeSynced (so VMs that waited for the reports, or for the server,
// are retried then), and Orphan answers from the first.
func TestSyncedSubscribersHearEveryCatchUp(t *testing.T) {
	f := New(bus.NewFake(), logging.NewNopLogger())
	syncs, nodes := 0, 0
	f.SubscribeSynced(func() { syncs++ })
	f.SubscribeNodes(func(string) { nodes++ })
	_, _, err := f.Orphan("default", "web")
	require.ErrorIs(t, err, ErrReportsNotSynced)

	require.NoError(t, f.onReport(bus.Entry{Synced: true}))
	require.NoError(t, f.onReport(bus.Entry{Synced: true})) // a watch resumed after a reconnect

	assert.Equal(t, 2, syncs)
	assert.Zero(t, nodes, "no node changed")
	_, _, err = f.Orphan("default", "web")
	assert.NoError(t, err)
}
