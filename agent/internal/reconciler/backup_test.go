package reconciler

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

// noBackuper hides the fake's Backuper methods, as a backend without them.
type noBackuper struct{ driver.Driver }

func backupIntent(s *s3test.Server, bucket, uid, vm string, mods ...func(*wire.BackupIntent)) wire.BackupIntent {
	b := wire.BackupIntent{
		ProtocolVersion: wire.ProtocolVersion, UID: uid, Namespace: "default", Name: "bk-" + uid, VM: vm, VMName: "vm-" + vm,
		Location: wire.BackupLocation{
			Endpoint: s.Endpoint, Insecure: true, Region: s.Region, Bucket: bucket,
			Credentials: wire.BackupCredentials{AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey},
		},
		Spec: []byte(`{"vcpu":2}`),
	}
	for _, m := range mods {
		m(&b)
	}
	return b
}

func (h *harness) putBackup(b wire.BackupIntent) {
	h.rec.backupIntent(bus.Event[wire.BackupIntent]{UID: b.UID, Value: b})
}

// backup waits for the backup's report to reach phase p. A store's first
// write can take seconds (SeaweedFS grows its volumes then), so it waits
// longer than the reports of the fake's own acts.
func (h *harness) backup(uid string, p wire.BackupPhase, what string) wire.BackupReport {
	h.t.Helper()
	var last wire.BackupReport
	require.Eventually(h.t, func() bool {
		v, found := bus.Written(h.reports.Fake, wire.BackupReports, uid)
		last = v
		return found && v.Phase == p
	}, time.Minute, 10*time.Millisecond, "%s; last backup report %+v", what, last)
	return last
}

// backupIsDisk reads backup id of guest vm back from st and asserts its
// root disk is the guest's disk as it is now; it returns the manifest.
func (h *harness) backupIsDisk(st *backupstore.Store, id, vm, what string) backupstore.Manifest {
	h.t.Helper()
	m, err := st.Manifest(h.t.Context(), "default", id)
	require.NoError(h.t, err)
	src, err := st.Source(m, "root")
	require.NoError(h.t, err)
	want, err := h.fake.DiskDigest(vm)
	require.NoError(h.t, err)
	got, err := fake.DigestOf(h.t.Context(), src)
	require.NoError(h.t, err)
	assert.Equal(h.t, want, got, "%s, read back from the store, is the disk as it is now", what)
	return m
}

// TestBackupIntents takes backups of the fake's guests into a real S3
// store (SeaweedFS), one bucket per case.
func TestBackupIntents(t *testing.T) {
	s := s3test.New(t)
	store := func(t *testing.T, bucket string) *backupstore.Store {
		st, err := backupstore.Open(t.Context(), backupstore.Location{Endpoint: s.Endpoint, Region: s.Region, Bucket: bucket, AccessKey: s.AccessKey, SecretKey: s.SecretKey})
		require.NoError(t, err)
		return st
	}
	cases := map[string]struct {
		wrap func(*fake.Driver) driver.Driver
		run  func(t *testing.T, h *harness, bucket string)
	}{
		"AFullBackupThenOneOfOnlyWhatChanged": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b1", "a"))
				first := h.backup("b1", wire.BackupPhaseSucceeded, "the first backup is whole in the store")
				assert.True(t, first.Full)
				assert.True(t, first.Frozen)
				assert.Equal(t, int64(10<<30), first.DiskBytes)
				assert.Positive(t, first.BytesWritten)
				require.NotNil(t, first.FinishedAt)

				require.NoError(t, h.fake.WriteDisk("a", 64<<20, bytes.Repeat([]byte{0x5a}, fake.BlockSize)))
				h.putBackup(backupIntent(s, bucket, "b2", "a", func(b *wire.BackupIntent) { b.Since = "b1" }))
				second := h.backup("b2", wire.BackupPhaseSucceeded, "the second backup is whole in the store")
				assert.False(t, second.Full)
				assert.Equal(t, "b1", second.Parent)
				assert.Equal(t, int64(fake.BlockSize), second.BytesRead, "only the block written since")
				assert.Equal(t, []string{"b2"}, h.fake.Checkpoints("a"), "b1's checkpoint is forgotten once b2 is safe")

				m := h.backupIsDisk(store(t, bucket), "b2", "a", "the incremental backup")
				assert.JSONEq(t, `{"vcpu":2}`, string(m.Spec), "the VM's spec is kept with its disks")
			},
		},
		"ABackupAnEarlierAgentWasTakingIsFailedNeverComplete": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				_, err := bus.PutReport(t.Context(), h.reports.Fake, wire.BackupReports, "b1", wire.BackupReport{UID: "b1", Node: node, VM: "a", Phase: wire.BackupPhaseRunning})
				require.NoError(t, err)
				// As the bus gives a starting agent the intents that
				// exist, before it says they are synced.
				h.putBackup(backupIntent(s, bucket, "b1", "a"))
				h.synced()
				r := h.backup("b1", wire.BackupPhaseFailed, "the backup cut short is failed")
				assert.Contains(t, r.Message, "stopped while it took the backup")
				assert.Zero(t, h.calls("BackUp", "a"), "not taken again under the same name")
				_, err = store(t, bucket).Manifest(t.Context(), "default", "b1")
				assert.ErrorIs(t, err, backupstore.ErrNotFound)
			},
		},
		"WrongCredentialsFailTheBackupAndTheGuestRunsOn": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b1", "a", func(b *wire.BackupIntent) { b.Location.Credentials.SecretAccessKey = "wrong" }))
				r := h.backup("b1", wire.BackupPhaseFailed, "the store refused the credentials")
				assert.Contains(t, r.Message, backupstore.ErrAccessDenied.Error())
				assert.Equal(t, wire.PhaseRunning, h.eventually("a", phase(wire.PhaseRunning), "the guest runs").Phase)
			},
		},
		"AnUnreachableStoreFailsTheBackupSayingWhy": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b1", "a", func(b *wire.BackupIntent) { b.Location.Endpoint = closedEndpoint(t) }))
				r := h.backup("b1", wire.BackupPhaseFailed, "nothing answers at the endpoint")
				assert.Contains(t, r.Message, "connection refused")
				assert.Equal(t, wire.PhaseRunning, h.eventually("a", phase(wire.PhaseRunning), "the guest runs").Phase)
			},
		},
		"ABucketGoneFailsTheBackupAndTheNextStillReadsOnlyWhatChanged": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b1", "a"))
				h.backup("b1", wire.BackupPhaseSucceeded, "the first backup")
				require.NoError(t, h.fake.WriteDisk("a", 0, bytes.Repeat([]byte{0x6b}, fake.BlockSize)))
				// An administrator deletes the location's bucket and makes
				// another: the backup in between fails.
				gone := bucket + "-gone"
				require.NoError(t, s.MakeBucket(t.Context(), gone))
				c, err := s.Client()
				require.NoError(t, err)
				require.NoError(t, c.RemoveBucket(t.Context(), gone))
				h.putBackup(backupIntent(s, bucket, "b2", "a", func(b *wire.BackupIntent) { b.Since, b.Location.Bucket = "b1", gone }))
				r := h.backup("b2", wire.BackupPhaseFailed, "the bucket is gone")
				assert.Contains(t, r.Message, backupstore.ErrNoBucket.Error())
				assert.Equal(t, []string{"b1"}, h.fake.Checkpoints("a"), "what changed since b1 is not forgotten before it is safe in the store")

				h.putBackup(backupIntent(s, bucket, "b3", "a", func(b *wire.BackupIntent) { b.Since = "b1" }))
				third := h.backup("b3", wire.BackupPhaseSucceeded, "the next backup, into the bucket that is there")
				assert.False(t, third.Full)
				assert.Equal(t, int64(fake.BlockSize), third.BytesRead, "the block written before the failed backup")
				h.backupIsDisk(store(t, bucket), "b3", "a", "the backup after the failed one")
			},
		},
		"AParentGoneFromTheStoreMakesAFullBackup": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b2", "a", func(b *wire.BackupIntent) { b.Since = "b1" }))
				r := h.backup("b2", wire.BackupPhaseSucceeded, "the backup is taken whole")
				assert.True(t, r.Full)
				assert.Empty(t, r.Parent)
			},
		},
		"AParentUnderAnotherKeyMakesAFullBackup": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b1", "a"))
				h.backup("b1", wire.BackupPhaseSucceeded, "the first backup, unencrypted")
				h.putBackup(backupIntent(s, bucket, "b2", "a", func(b *wire.BackupIntent) {
					b.Since, b.Location.Credentials.EncryptionKey = "b1", bytes.Repeat([]byte{7}, backupstore.KeySize)
				}))
				r := h.backup("b2", wire.BackupPhaseSucceeded, "the backup under a new key is taken whole")
				assert.True(t, r.Full)
			},
		},
		"ABackendWithoutBackupsFailsItSayingSo": {
			wrap: func(f *fake.Driver) driver.Driver { return noBackuper{f} },
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b1", "a"))
				r := h.backup("b1", wire.BackupPhaseFailed, "the backup fails")
				assert.Contains(t, r.Message, "takes no backups")
			},
		},
		"TheReportGoesWithTheIntent": {
			run: func(t *testing.T, h *harness, bucket string) {
				h.running("a")
				h.synced()
				h.putBackup(backupIntent(s, bucket, "b1", "a"))
				h.backup("b1", wire.BackupPhaseSucceeded, "the backup is taken")
				h.rec.backupIntent(bus.Event[wire.BackupIntent]{UID: "b1", Deleted: true})
				require.Eventually(t, func() bool {
					_, found := bus.Written(h.reports.Fake, wire.BackupReports, "b1")
					return !found
				}, 5*time.Second, 5*time.Millisecond, "the report is deleted")
			},
		},
	}
	i := 0
	for name, tc := range cases {
		i++
		bucket := "case-" + string(rune('a'+i))
		t.Run(name, func(t *testing.T) {
			require.NoError(t, s.MakeBucket(context.Background(), bucket))
			wrap := tc.wrap
			if wrap == nil {
				wrap = func(f *fake.Driver) driver.Driver { return f }
			}
			tc.run(t, startWith(t, wrap), bucket)
		})
	}
}

// closedEndpoint is a host:port on which nothing listens any more.
func closedEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
