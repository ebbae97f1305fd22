package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// archive is a kind of value the bus has never heard of: declared here,
// it must travel both ways without a change to the bus.
type archive struct {
	UID  string `json:"uid"`
	Node string `json:"node,omitempty"`
	Size int64  `json:"size"`
}

func archiveKind(name, bucket string, identity func(archive) (string, string)) wire.Kind[archive] {
	return wire.Kind[archive]{
		Name: name, Bucket: bucket, Token: "archive",
		Encode: func(s archive) ([]byte, error) { return json.Marshal(s) },
		Decode: func(b []byte) (archive, error) {
			var s archive
			if err := json.Unmarshal(b, &s); err != nil {
				return s, &wire.DecodeError{Kind: name, Err: err}
			}
			if s.UID == "" {
				return s, &wire.DecodeError{Kind: name, Err: errors.New("no uid")}
			}
			return s, nil
		},
		Identity: identity,
	}
}

var (
	archiveIntents = archiveKind("archive intent", wire.BucketIntents, func(s archive) (string, string) { return "", s.UID })
	archiveReports = archiveKind("archive report", wire.BucketReports, func(s archive) (string, string) { return s.Node, s.UID })
)

// TestAFourthKindNeedsNoChangeToTheBus: against a real server and the
// agent's real permissions, the hub's intent of a kind declared only here
// reaches the handler registered for it, before Synced on a fresh watch and
// as a change after; the agent writes a report of the kind and it reads
// back; a value of the kind under another uid's key is refused as a
// mismatch, and the watch carries on.
func TestAFourthKindNeedsNoChangeToTheBus(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	putArchive := func(uid string, s archive) {
		t.Helper()
		key, err := archiveIntents.Key("node1", uid)
		require.NoError(t, err)
		b, err := archiveIntents.Encode(s)
		require.NoError(t, err)
		_, err = f.intents.Put(ctx, key, b)
		require.NoError(t, err)
	}
	putArchive("snap-a", archive{UID: "snap-a", Size: 1})
	f.putIntent(t, "node1", "vm-a", 1)
	b, _, async := f.agent(t, "node1")

	e := watch(t, b, into(wire.GuestIntents), into(archiveIntents))
	initial := e.until(t, 5*time.Second, synced)
	require.Len(t, initial, 3, "the archive and the guest intent, then Synced")
	var snaps []bus.Event[archive]
	for _, ev := range initial {
		if s, ok := ev.(bus.Event[archive]); ok {
			snaps = append(snaps, s)
		}
	}
	require.Len(t, snaps, 1, "the archive intent reaches the archive handler before Synced")
	assert.Equal(t, "snap-a", snaps[0].UID)
	assert.Equal(t, archive{UID: "snap-a", Size: 1}, snaps[0].Value)
	assert.NotZero(t, snaps[0].Revision)

	putArchive("snap-a", archive{UID: "snap-a", Size: 2})
	e.until(t, 5*time.Second, func(ev any) bool { s, ok := ev.(bus.Event[archive]); return ok && s.Value.Size == 2 })

	rep := archive{UID: "snap-a", Node: "node1", Size: 2}
	rev, err := bus.PutReport(ctx, b, archiveReports, "snap-a", rep)
	require.NoError(t, err)
	stored, err := f.reports.Get(ctx, "node1.archive.snap-a")
	require.NoError(t, err, "the report is under <node>.archive.<uid>")
	assert.Equal(t, rev, stored.Revision())
	got, err := archiveReports.DecodeAt(stored.Key(), "node1", "snap-a", stored.Value())
	require.NoError(t, err)
	assert.Equal(t, rep, got)
	require.NoError(t, bus.DeleteReport(ctx, b, archiveReports, "snap-a"))
	_, err = f.reports.Get(ctx, "node1.archive.snap-a")
	assert.Error(t, err, "the report is deleted")

	before := b.Rejections().Count(natswire.ReasonMismatch)
	putArchive("snap-b", archive{UID: "snap-other", Size: 3})
	f.putIntent(t, "node1", "vm-a", 2)
	seen := e.until(t, 5*time.Second, generation("vm-a", 2))
	for _, ev := range seen {
		if s, ok := ev.(bus.Event[archive]); ok {
			t.Errorf("an archive under another uid's key was delivered: %+v", s)
		}
	}
	assert.Equal(t, before+1, b.Rejections().Count(natswire.ReasonMismatch), "it is a counted mismatch")
	assert.False(t, async.WaitForViolation(0), "a new kind needs no permission the agent lacks")
}
