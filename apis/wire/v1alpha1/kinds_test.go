package v1alpha1

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKind is what TestKindKeysAreDistinct needs of a Kind, whatever its
// value type.
type testKind struct {
	name   string
	key    func(node, uid string) (string, error)
	uidOf  func(rest string) (string, bool)
	bucket string
}

// TestKindKeysAreDistinct checks that each kind recognises its own keys and
// no other kind's, which is what lets one watch of a node's keys hand every
// key to the one kind it belongs to.
func TestKindKeysAreDistinct(t *testing.T) {
	kinds := []testKind{
		{GuestIntents.Name, GuestIntents.Key, GuestIntents.UID, GuestIntents.Bucket},
		{GuestReports.Name, GuestReports.Key, GuestReports.UID, GuestReports.Bucket},
		{VolumeIntents.Name, VolumeIntents.Key, VolumeIntents.UID, VolumeIntents.Bucket},
		{VolumeReports.Name, VolumeReports.Key, VolumeReports.UID, VolumeReports.Bucket},
		{ImageReports.Name, ImageReports.Key, ImageReports.UID, ImageReports.Bucket},
		{Fabrics.Name, Fabrics.Key, Fabrics.UID, Fabrics.Bucket},
		{SnapshotIntents.Name, SnapshotIntents.Key, SnapshotIntents.UID, SnapshotIntents.Bucket},
		{SnapshotReports.Name, SnapshotReports.Key, SnapshotReports.UID, SnapshotReports.Bucket},
		{BackupIntents.Name, BackupIntents.Key, BackupIntents.UID, BackupIntents.Bucket},
		{BackupReports.Name, BackupReports.Key, BackupReports.UID, BackupReports.Bucket},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			key, err := k.key("node-1.rack-a", "u1")
			require.NoError(t, err)
			node, rest, err := ParseKey(key)
			require.NoError(t, err)
			assert.Equal(t, "node-1.rack-a", node)
			uid, ok := k.uidOf(rest)
			require.True(t, ok, "%s does not recognise its own key %q", k.name, key)
			assert.Equal(t, "u1", uid)
			for _, other := range kinds {
				if other.name == k.name || other.bucket != k.bucket {
					continue
				}
				if _, ok := other.uidOf(rest); ok && !sameToken(other, k) {
					t.Errorf("%s takes %s's key %q", other.name, k.name, key)
				}
			}
		})
	}
	_, err := GuestIntents.Key("node1", "a.b")
	var ke *KeyError
	assert.ErrorAs(t, err, &ke, "a uid with a dot would address another key")
}

// sameToken is whether two kinds share their keys' shape (an intent and the
// report of the same kind do, in different buckets).
func sameToken(a, b testKind) bool {
	ka, _ := a.key("n", "u")
	kb, _ := b.key("n", "u")
	return ka == kb
}

func TestKindDecodeAt(t *testing.T) {
	report := func(node, uid string) []byte {
		b, err := GuestReports.Encode(Report{Node: node, UID: uid, Phase: PhaseRunning})
		require.NoError(t, err)
		return b
	}
	volume := func(uid string) []byte {
		b, err := VolumeReports.Encode(VolumeReport{UID: uid})
		require.NoError(t, err)
		return b
	}
	cases := []struct {
		name     string
		decode   func() error
		mismatch bool
	}{
		{"own report", func() error { _, err := GuestReports.DecodeAt("k", "n1", "u1", report("n1", "u1")); return err }, false},
		{"report naming another node", func() error { _, err := GuestReports.DecodeAt("k", "n1", "u1", report("n2", "u1")); return err }, true},
		{"report naming another uid", func() error { _, err := GuestReports.DecodeAt("k", "n1", "u1", report("n1", "u2")); return err }, true},
		{"own volume report", func() error { _, err := VolumeReports.DecodeAt("k", "n1", "u1", volume("u1")); return err }, false},
		{"volume report of another uid", func() error { _, err := VolumeReports.DecodeAt("k", "n1", "u1", volume("u2")); return err }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.decode()
			var me *MismatchError
			assert.Equal(t, tc.mismatch, errors.As(err, &me), "error: %v", err)
			if !tc.mismatch {
				assert.NoError(t, err)
			}
		})
	}
}

func TestKindEqualLeavesOutWhenObserved(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := Report{UID: "u", Node: "n", Phase: PhaseRunning, ObservedAt: t0, Interfaces: []Interface{{MAC: "m", LastSeen: t0}}}
	b := a
	b.ObservedAt, b.Interfaces = t0.Add(time.Minute), []Interface{{MAC: "m", LastSeen: t0.Add(time.Minute)}}
	assert.True(t, GuestReports.Equal(a, b), "only the times differ")
	b.Phase = PhaseStopped
	assert.False(t, GuestReports.Equal(a, b), "the phase differs")
	assert.True(t, Fabrics.Equal(Fabric{Peers: []string{"a"}}, Fabric{Peers: []string{"a"}}))
	assert.False(t, Fabrics.Equal(Fabric{Peers: []string{"a"}}, Fabric{Peers: []string{"b"}}))
}
