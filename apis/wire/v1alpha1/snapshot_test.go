package v1alpha1

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSnapshotMessagesRoundTripAndRefuseWhatCannotBeActedOn(t *testing.T) {
	at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		encode  func() ([]byte, error)
		decode  func([]byte) (any, error)
		wantErr string
	}{
		"a snapshot intent names its guest": {
			encode: func() ([]byte, error) {
				return EncodeSnapshotIntent(SnapshotIntent{UID: "s1", Namespace: "ns", Name: "snap", VM: "vm1", Memory: true})
			},
			decode: func(b []byte) (any, error) { return DecodeSnapshotIntent(b) },
		},
		"a snapshot intent without its guest is refused": {
			encode:  func() ([]byte, error) { return EncodeSnapshotIntent(SnapshotIntent{UID: "s1"}) },
			wantErr: "vm",
		},
		"a snapshot intent whose guest would address another key is refused": {
			encode:  func() ([]byte, error) { return EncodeSnapshotIntent(SnapshotIntent{UID: "s1", VM: "a.>"}) },
			wantErr: "vm",
		},
		"a ready snapshot report": {
			encode: func() ([]byte, error) {
				return EncodeSnapshotReport(SnapshotReport{UID: "s1", Node: "node-1", VM: "vm1", Phase: SnapshotPhaseReady, CreatedAt: &at, SizeBytes: 10, Memory: true, Online: true})
			},
			decode: func(b []byte) (any, error) { return DecodeSnapshotReport(b) },
		},
		"a snapshot report of an unknown phase is refused": {
			encode: func() ([]byte, error) {
				return EncodeSnapshotReport(SnapshotReport{UID: "s1", Node: "node-1", VM: "vm1", Phase: "Half"})
			},
			wantErr: "phase must be",
		},
		"a snapshot report of a negative size is refused": {
			encode: func() ([]byte, error) {
				return EncodeSnapshotReport(SnapshotReport{UID: "s1", Node: "node-1", VM: "vm1", Phase: SnapshotPhaseReady, SizeBytes: -1})
			},
			wantErr: "must not be negative",
		},
		"an intent's restore names its snapshot": {
			encode: func() ([]byte, error) {
				return EncodeIntent(Intent{UID: "vm1", Restore: &Restore{ID: "r1"}})
			},
			wantErr: "restore.snapshot",
		},
		"a report's restore of an unknown phase is refused": {
			encode: func() ([]byte, error) {
				return EncodeReport(Report{UID: "vm1", Node: "node-1", Restore: &RestoreReport{ID: "r1", Phase: "Maybe"}})
			},
			wantErr: "restore.phase",
		},
		"a report with a finished restore": {
			encode: func() ([]byte, error) {
				return EncodeReport(Report{UID: "vm1", Node: "node-1", Restore: &RestoreReport{ID: "r1", Phase: RestoreSucceeded, StartedAt: &at, FinishedAt: &at}})
			},
			decode: func(b []byte) (any, error) { return DecodeReport(b) },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := tc.encode()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			_, err = tc.decode(b)
			require.NoError(t, err)
		})
	}
}

func TestSnapshotReportsAreTheSameWhateverWhenObserved(t *testing.T) {
	at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	same := at.In(time.FixedZone("x", 3600))
	a := SnapshotReport{UID: "s1", Node: "n", VM: "v", Phase: SnapshotPhaseReady, CreatedAt: &at, ObservedAt: at}
	b := a
	b.CreatedAt, b.ObservedAt = &same, at.Add(time.Minute)
	assert.True(t, SnapshotReports.Equal(a, b), "the same moment in another zone, observed later, says the same")
	b.Frozen = true
	assert.False(t, SnapshotReports.Equal(a, b))
	b = a
	b.CreatedAt = nil
	assert.False(t, SnapshotReports.Equal(a, b))
}
