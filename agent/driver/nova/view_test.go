package nova

import (
	"context"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// viewOf is a driver of node1 whose view holds s as guest uid, and whose
// clock ticks a second at every reading.
func viewOf(uid string, s servers.Server) *Driver {
	clock := time.Unix(0, 0)
	return &Driver{
		node:   "node1",
		now:    func() time.Time { clock = clock.Add(time.Second); return clock },
		events: make(chan driver.Event, 16),
		view:   map[string]servers.Server{uid: s},
		readAt: map[string]time.Time{},
	}
}

// TestAListingOlderThanADeletionDoesNotBringTheServerBack pins the view
// against listings in flight when the driver deletes or releases a server:
// a poll or a full listing that read the server before it went must not put
// it back (Observe would say a deleted guest exists until the next poll),
// and the driver forgets the deletion once no listing that began before it
// is left.
func TestAListingOlderThanADeletionDoesNotBringTheServerBack(t *testing.T) {
	const uid = "0b5bbd0e-42c4-4dc1-a1a3-6d1e29c3a9f1"
	s := servers.Server{ID: "srv-1", Status: "ACTIVE", Metadata: map[string]string{MetaUID: uid, MetaNode: "node1"}}
	type step func(d *Driver, starts map[string]time.Time)
	begin := func(name string) step {
		return func(d *Driver, starts map[string]time.Time) { starts[name] = d.beginListing() }
	}
	poll := func(name string) step { // a poll's result arrives, and it ends
		return func(d *Driver, starts map[string]time.Time) { d.see(s, starts[name]); d.endListing(starts[name]) }
	}
	full := func(name string) step { // a full listing's result arrives
		return func(d *Driver, starts map[string]time.Time) { d.replaceView([]servers.Server{s}, starts[name]) }
	}
	over := func(name string) step { // a listing that did not see the server ends
		return func(d *Driver, starts map[string]time.Time) { d.endListing(starts[name]) }
	}
	deleted := func(d *Driver, _ map[string]time.Time) { d.forget(uid) }

	for name, tc := range map[string]struct {
		steps []step
		// wantInView is whether the server is in the view after steps.
		wantInView bool
		// wantRemembered is whether the deletion is still remembered.
		wantRemembered bool
		// inFlight is how many listings are left in flight.
		inFlight int
	}{
		"APollThatReadItBeforeItsDeletion": {
			steps: []step{begin("poll"), deleted, poll("poll")},
		},
		"AFullListingThatReadItBeforeItsDeletion": {
			steps: []step{begin("list"), deleted, full("list")},
		},
		"AListingThatBeganAfterTheDeletion": {
			steps:      []step{deleted, begin("poll"), poll("poll")},
			wantInView: true,
		},
		"RememberedWhileAnOlderListingIsInFlight": {
			steps:          []step{begin("old"), deleted, begin("new"), over("new")},
			wantRemembered: true,
			inFlight:       1,
		},
		"ForgottenOnceTheOlderListingIsOver": {
			steps: []step{begin("old"), deleted, begin("new"), over("new"), poll("old")},
		},
	} {
		t.Run(name, func(t *testing.T) {
			d := viewOf(uid, s)
			starts := map[string]time.Time{}
			for _, st := range tc.steps {
				st(d, starts)
			}
			_, inView := d.view[uid]
			assert.Equal(t, tc.wantInView, inView, "in the view")
			_, remembered := d.readAt[uid]
			assert.Equal(t, tc.wantRemembered || tc.wantInView, remembered, "the deletion (or the read) remembered")
			assert.Len(t, d.listings, tc.inFlight, "listings in flight")
		})
	}
}

// TestAListingOlderThanAMigrationsReadKeepsTheNewHost pins the view against
// the poll or full listing that read a server on its old host while
// MigrateHost read it on its new one: once the driver saw the move,
// Observe never reports the old host again.
func TestAListingOlderThanAMigrationsReadKeepsTheNewHost(t *testing.T) {
	const uid = "6f0c1d8e-8f5e-4c43-9a57-1c2d3e4f5a6b"
	md := map[string]string{MetaUID: uid, MetaNode: "node1"}
	moving := servers.Server{ID: "srv-1", Status: "MIGRATING", TaskState: "migrating", Host: "compute-a", Metadata: md}
	moved := servers.Server{ID: "srv-1", Status: "ACTIVE", Host: "compute-b", Metadata: md}
	for name, arrive := range map[string]func(d *Driver, start time.Time){
		"APoll":         func(d *Driver, start time.Time) { d.see(moving, start); d.endListing(start) },
		"AFullListing":  func(d *Driver, start time.Time) { d.replaceView([]servers.Server{moving}, start) },
		"APollAndAList": func(d *Driver, start time.Time) { d.see(moving, start); d.replaceView([]servers.Server{moving}, start) },
	} {
		t.Run(name, func(t *testing.T) {
			d := viewOf(uid, moving)
			start := d.beginListing()
			d.remember(uid, moved, d.now()) // MigrateHost's read, after the listing began
			arrive(d, start)
			o, err := d.Observe(context.Background(), uid)
			require.NoError(t, err)
			assert.Equal(t, "compute-b", o.Node)
			assert.Equal(t, driver.PhaseRunning, o.Phase)

			later := d.beginListing()
			d.see(moved, later)
			d.endListing(later)
			o, err = d.Observe(context.Background(), uid)
			require.NoError(t, err)
			assert.Equal(t, "compute-b", o.Node, "a listing that began after the read agrees")
		})
	}
}
