package v1alpha1

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func validBackupIntent() BackupIntent {
	return BackupIntent{
		UID: "b1", Namespace: "team-a", Name: "nightly", VM: "vm1", VMName: "web",
		Location: BackupLocation{
			Endpoint: "127.0.0.1:8333", Insecure: true, Bucket: "backups",
			Credentials: BackupCredentials{AccessKeyID: "AK", SecretAccessKey: "very-secret"},
		},
	}
}

func TestBackupMessagesRoundTripAndRefuseWhatCannotBeActedOn(t *testing.T) {
	at := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	intent := func(edit func(*BackupIntent)) func() ([]byte, error) {
		return func() ([]byte, error) {
			b := validBackupIntent()
			edit(&b)
			return EncodeBackupIntent(b)
		}
	}
	report := func(edit func(*BackupReport)) func() ([]byte, error) {
		return func() ([]byte, error) {
			r := BackupReport{UID: "b1", Node: "node-1", VM: "vm1", Phase: BackupPhaseSucceeded, StartedAt: &at, FinishedAt: &at, DiskBytes: 10, BytesRead: 5}
			edit(&r)
			return EncodeBackupReport(r)
		}
	}
	cases := map[string]struct {
		encode  func() ([]byte, error)
		decode  func([]byte) (any, error)
		wantErr string
	}{
		"a backup intent names its guest, namespace and location": {
			encode: intent(func(b *BackupIntent) { b.Since = "b0"; b.Location.Credentials.EncryptionKey = make([]byte, 32) }),
			decode: func(b []byte) (any, error) { return DecodeBackupIntent(b) },
		},
		"a backup intent without its guest is refused":      {encode: intent(func(b *BackupIntent) { b.VM = "" }), wantErr: "vm"},
		"a namespace that would address another key":        {encode: intent(func(b *BackupIntent) { b.Namespace = "a.>" }), wantErr: "namespace"},
		"a since that would address another key":            {encode: intent(func(b *BackupIntent) { b.Since = "x y" }), wantErr: "since"},
		"a backup intent without a bucket is refused":       {encode: intent(func(b *BackupIntent) { b.Location.Bucket = "" }), wantErr: "location.endpoint and location.bucket"},
		"a backup intent without credentials is refused":    {encode: intent(func(b *BackupIntent) { b.Location.Credentials.SecretAccessKey = "" }), wantErr: "location.credentials"},
		"an encryption key of the wrong length is refused":  {encode: intent(func(b *BackupIntent) { b.Location.Credentials.EncryptionKey = []byte("short") }), wantErr: "32 bytes"},
		"a finished backup report":                          {encode: report(func(*BackupReport) {}), decode: func(b []byte) (any, error) { return DecodeBackupReport(b) }},
		"a backup report of an unknown phase is refused":    {encode: report(func(r *BackupReport) { r.Phase = "Half" }), wantErr: "phase must be"},
		"a backup report of a negative figure is refused":   {encode: report(func(r *BackupReport) { r.ChunksReused = -1 }), wantErr: "must not be negative"},
		"a backup report from a node of no name is refused": {encode: report(func(r *BackupReport) { r.Node = "" }), wantErr: "node"},
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

// TestBackupCredentialsNeverPrint: an intent printed into a log line or an
// error keeps its location's secrets out, however it is printed.
func TestBackupCredentialsNeverPrint(t *testing.T) {
	b := validBackupIntent()
	b.Location.Credentials.EncryptionKey = []byte("0123456789abcdef0123456789abcdef")
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		out := fmt.Sprintf(verb, b)
		assert.NotContains(t, out, "very-secret", verb)
		assert.NotContains(t, out, "0123456789abcdef", verb)
		assert.NotContains(t, out, "AK", verb)
	}
}

func TestBackupReportsAreTheSameWhateverWhenObserved(t *testing.T) {
	at := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	later := at.Add(time.Minute)
	a := BackupReport{UID: "b1", Node: "n", VM: "v", Phase: BackupPhaseRunning, StartedAt: &at, BytesRead: 1, ObservedAt: at}
	b := a
	b.ObservedAt, b.StartedAt = later, ptrTo(at.In(time.FixedZone("x", 3600)))
	assert.True(t, BackupReports.Equal(a, b), "the same moment in another zone, observed later, says the same")
	b.BytesRead = 2
	assert.False(t, BackupReports.Equal(a, b), "progress is news")
}

func ptrTo[T any](v T) *T { return &v }
