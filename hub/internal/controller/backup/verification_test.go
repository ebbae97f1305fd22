package backup_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupverification"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

const mib = 1 << 20

// openStore opens the tests' location as the hub does.
func openStore(t *testing.T, s *s3test.Server) *backupstore.Store {
	t.Helper()
	store, err := backupstore.Open(context.Background(), backupstore.Location{Endpoint: s.Endpoint, Region: s.Region, Bucket: bucket, AccessKey: s.AccessKey, SecretKey: s.SecretKey})
	require.NoError(t, err)
	return store
}

// chunkKey is where the store keeps chunk id (backupstore's layout, under
// the location's empty prefix).
func chunkKey(id string) string { return "chunks/" + id[:4] + "/" + id }

// takeBackup plays node-a backing VM vm up as backup name: two disks of
// random data written to the store, then the node's report. It returns
// the backup once it Succeeded, and its manifest.
func takeBackup(t *testing.T, e *controllertest.Env, store *backupstore.Store, vm *v1alpha1.VirtualMachine, name string, seed uint64) (*v1alpha1.VirtualMachineBackup, backupstore.Manifest) {
	t.Helper()
	b := newBackup(t, e, vm.Namespace, name, vm.Name, func(b *v1alpha1.VirtualMachineBackup) { b.Spec.Full = true })
	intentOn(t, e, nodeA, b)
	w, err := store.NewWriter(e.Ctx, backupstore.Manifest{ID: string(b.UID), Namespace: vm.Namespace, VMName: vm.Name, VMUID: string(vm.UID)}, nil)
	require.NoError(t, err)
	rnd := rand.New(rand.NewPCG(seed, seed))
	data := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rnd.Uint32())
		}
		return p
	}
	require.NoError(t, w.Disk(driver.BackupDisk{Name: "root", Size: 4 * mib}))
	require.NoError(t, w.Data(0, data(3*mib)))
	require.NoError(t, w.Disk(driver.BackupDisk{Name: "data", Size: 2 * mib}))
	require.NoError(t, w.Data(mib, data(mib)))
	m, err := w.Commit(e.Ctx)
	require.NoError(t, err)
	succeed(t, e, nodeA, b, vm, true, "")
	return await(t, e, b, inPhase(v1alpha1.BackupSucceeded, "")), m
}

// extentAt is the extent of disk in m that starts at off.
func extentAt(t *testing.T, m backupstore.Manifest, disk string, off int64) backupstore.Extent {
	t.Helper()
	d, ok := m.Disk(disk)
	require.True(t, ok, "backup has disk %s", disk)
	for _, x := range d.Extents {
		if x.Offset == off {
			return x
		}
	}
	require.Failf(t, "no extent", "disk %s has no extent at %d: %+v", disk, off, d.Extents)
	return backupstore.Extent{}
}

// countsTo waits for counter c, counted once the outcome it counts is
// written, to read want.
func countsTo(t *testing.T, want float64, c prometheus.Collector) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Equal(ct, want, testutil.ToFloat64(c))
	}, within, 10*time.Millisecond)
}

func newVerification(t *testing.T, e *controllertest.Env, namespace, name string, spec v1alpha1.VirtualMachineBackupVerificationSpec) *v1alpha1.VirtualMachineBackupVerification {
	t.Helper()
	v := &v1alpha1.VirtualMachineBackupVerification{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: spec}
	require.NoError(t, e.Kube.Create(e.Ctx, v))
	return v
}

// awaitVerification waits until v shows phase, and returns it.
func awaitVerification(t *testing.T, e *controllertest.Env, v *v1alpha1.VirtualMachineBackupVerification, phase v1alpha1.VerificationPhase, says string) *v1alpha1.VirtualMachineBackupVerification {
	t.Helper()
	got := &v1alpha1.VirtualMachineBackupVerification{}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if !assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(v), got)) {
			return
		}
		assert.Equal(c, phase, got.Status.Phase, got.Status.Message)
		assert.Contains(c, got.Status.Message, says)
	}, within, 10*time.Millisecond)
	return got
}

func TestBackupVerifications(t *testing.T) {
	e, s := startHub(t)
	store := openStore(t, s)
	s3, err := s.Client()
	require.NoError(t, err)
	vm := e.VM(t, granted, "web", nodeA, true, v1alpha1.PhaseRunning)

	t.Run("ABackupThatEndsIsCounted", func(t *testing.T) {
		succeeded := testutil.ToFloat64(metrics.Backups.WithLabelValues(metrics.ResultSucceeded))
		read := testutil.ToFloat64(metrics.BackupReadBytes.WithLabelValues())
		reused := testutil.ToFloat64(metrics.BackupChunks.WithLabelValues(metrics.ChunkReused))
		takeBackup(t, e, store, vm, "counted", 1)
		// Counted once the outcome is written, which the backup's status
		// can show first.
		countsTo(t, succeeded+1, metrics.Backups.WithLabelValues(metrics.ResultSucceeded))
		countsTo(t, read+4*mib, metrics.BackupReadBytes.WithLabelValues()) // what the node's final report says it read
		countsTo(t, reused+2, metrics.BackupChunks.WithLabelValues(metrics.ChunkReused))
	})

	t.Run("ACleanBackupVerifiesWithNothingCorrupt", func(t *testing.T) {
		intact := testutil.ToFloat64(metrics.BackupVerifications.WithLabelValues(metrics.ResultIntact))
		b := newBackup(t, e, granted, "clean", vm.Name)
		v := newVerification(t, e, granted, "clean", v1alpha1.VirtualMachineBackupVerificationSpec{BackupName: "clean"})
		awaitVerification(t, e, v, v1alpha1.VerificationPending, "VirtualMachineBackup clean is")
		// The backup, taken while the verification waits for it.
		intentOn(t, e, nodeA, b)
		w, err := store.NewWriter(e.Ctx, backupstore.Manifest{ID: string(b.UID), Namespace: granted, VMName: vm.Name, VMUID: string(vm.UID)}, nil)
		require.NoError(t, err)
		require.NoError(t, w.Disk(driver.BackupDisk{Name: "root", Size: 3 * mib}))
		require.NoError(t, w.Data(0, bytes.Repeat([]byte("virtfleet"), 3*mib/9)))
		m, err := w.Commit(e.Ctx)
		require.NoError(t, err)
		succeed(t, e, nodeA, b, vm, true, "")

		got := awaitVerification(t, e, v, v1alpha1.VerificationSucceeded, "read back as written")
		assert.Equal(t, int64(len(m.Chunks())), got.Status.ChunksTotal)
		assert.Equal(t, got.Status.ChunksTotal, got.Status.ChunksChecked)
		assert.Positive(t, got.Status.BytesChecked)
		assert.Zero(t, got.Status.CorruptChunks)
		assert.Empty(t, got.Status.Corrupt)
		assert.Equal(t, string(b.UID), got.Status.BackupID)
		assert.Equal(t, location, got.Status.Location)
		require.NotNil(t, got.Status.StartTime)
		require.NotNil(t, got.Status.CompletionTime)
		countsTo(t, intact+1, metrics.BackupVerifications.WithLabelValues(metrics.ResultIntact))

		shown := await(t, e, b, func(c *assert.CollectT, b *v1alpha1.VirtualMachineBackup) {
			assert.NotNil(c, b.Status.LastVerification)
		})
		assert.Equal(t, v1alpha1.BackupIntact, shown.Status.LastVerification.Result)
		assert.Equal(t, "clean", shown.Status.LastVerification.Name)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.EventMessage(t, b, corev1.EventTypeNormal, backupverification.ReasonIntact), "read back as written", "the backup says so too")
		}, within, 50*time.Millisecond)
	})

	// Each case damages one chunk of a backup of its own in the store, as
	// a failing disk or a hand would, and the verification names that
	// chunk, where in which disk it lies, and why it is bad.
	for i, tc := range []struct {
		name   string
		disk   string
		offset int64
		damage func(t *testing.T, key string)
		reason string
	}{
		{
			name: "a-chunk-overwritten", disk: "root", offset: mib,
			damage: func(t *testing.T, key string) {
				obj, err := s3.GetObject(e.Ctx, bucket, key, minio.GetObjectOptions{})
				require.NoError(t, err)
				var body bytes.Buffer
				_, err = body.ReadFrom(obj)
				require.NoError(t, err)
				p := body.Bytes()
				p[len(p)/2] ^= 0x01
				_, err = s3.PutObject(e.Ctx, bucket, key, bytes.NewReader(p), int64(len(p)), minio.PutObjectOptions{})
				require.NoError(t, err)
			},
			reason: "its content does not match its name",
		},
		{
			name: "a-chunk-deleted", disk: "data", offset: mib,
			damage: func(t *testing.T, key string) {
				require.NoError(t, s3.RemoveObject(e.Ctx, bucket, key, minio.RemoveObjectOptions{}))
			},
			reason: "missing from the store",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			corrupt := testutil.ToFloat64(metrics.BackupVerificationCorruptChunks.WithLabelValues())
			b, m := takeBackup(t, e, store, vm, tc.name, uint64(100+i))
			bad := extentAt(t, m, tc.disk, tc.offset)
			tc.damage(t, chunkKey(bad.Chunk))

			v := newVerification(t, e, granted, tc.name, v1alpha1.VirtualMachineBackupVerificationSpec{BackupName: v1alpha1.LocalName(tc.name)})
			got := awaitVerification(t, e, v, v1alpha1.VerificationFailed, "1 of 4 chunks")
			assert.Equal(t, int64(4), got.Status.ChunksChecked)
			assert.Equal(t, int64(1), got.Status.CorruptChunks)
			assert.Equal(t, int64(1), got.Status.CorruptRanges)
			assert.Equal(t, []v1alpha1.CorruptRange{{Disk: tc.disk, Offset: tc.offset, Length: bad.Length, Chunk: bad.Chunk, Reason: tc.reason}}, got.Status.Corrupt)
			countsTo(t, corrupt+1, metrics.BackupVerificationCorruptChunks.WithLabelValues())
			shown := await(t, e, b, func(c *assert.CollectT, b *v1alpha1.VirtualMachineBackup) {
				assert.NotNil(c, b.Status.LastVerification)
			})
			assert.Equal(t, v1alpha1.BackupCorrupt, shown.Status.LastVerification.Result)
			assert.Equal(t, int64(1), shown.Status.LastVerification.CorruptChunks)
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				assert.Contains(c, e.EventMessage(t, got, corev1.EventTypeWarning, backupverification.ReasonCorrupt), "1 of 4 chunks")
			}, within, 50*time.Millisecond)
		})
	}

	t.Run("ProgressIsShownWhileItReads", func(t *testing.T) {
		// A backup of many small chunks, so that reading it takes many
		// progress intervals.
		const chunks = 1500
		b := newBackup(t, e, granted, "many", vm.Name, func(b *v1alpha1.VirtualMachineBackup) { b.Spec.Full = true })
		intentOn(t, e, nodeA, b)
		w, err := store.NewWriter(e.Ctx, backupstore.Manifest{ID: string(b.UID), Namespace: granted, VMName: vm.Name, VMUID: string(vm.UID)}, nil)
		require.NoError(t, err)
		require.NoError(t, w.Disk(driver.BackupDisk{Name: "root", Size: chunks * mib}))
		for i := range int64(chunks) {
			require.NoError(t, w.Data(i*mib, []byte(fmt.Sprintf("window %d", i))))
		}
		start := time.Now()
		_, err = w.Commit(e.Ctx)
		require.NoError(t, err)
		t.Logf("wrote %d chunks in %s", chunks, time.Since(start))
		succeed(t, e, nodeA, b, vm, true, "")
		await(t, e, b, inPhase(v1alpha1.BackupSucceeded, ""))

		start = time.Now()
		v := newVerification(t, e, granted, "many", v1alpha1.VirtualMachineBackupVerificationSpec{BackupName: "many"})
		var seen []int64
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := &v1alpha1.VirtualMachineBackupVerification{}
			if !assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(v), got)) {
				return
			}
			if n := got.Status.ChunksChecked; len(seen) == 0 || seen[len(seen)-1] != n {
				seen = append(seen, n)
			}
			assert.Equal(c, v1alpha1.VerificationSucceeded, got.Status.Phase)
		}, within, 10*time.Millisecond)
		took := time.Since(start)
		t.Logf("verified %d chunks in %s, status showed %v", chunks, took, seen)
		assert.Equal(t, int64(chunks), seen[len(seen)-1])
		assert.True(t, slices.ContainsFunc(seen, func(n int64) bool { return n > 0 && n < chunks }), "the status showed the chunks checked on the way")
		// Each value seen is one write at least: the start, one per
		// interval, the end.
		assert.LessOrEqual(t, len(seen), int(took/progress)+3, "progress is written at most every %s", progress)
	})

	t.Run("AtMostTwoReadAtOnce", func(t *testing.T) {
		names := []string{"many-1", "many-2", "many-3"}
		for _, n := range names {
			newVerification(t, e, granted, n, v1alpha1.VirtualMachineBackupVerificationSpec{BackupName: "many"})
		}
		var waited bool
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			l := &v1alpha1.VirtualMachineBackupVerificationList{}
			if !assert.NoError(c, e.Kube.List(e.Ctx, l, client.InNamespace(granted))) {
				return
			}
			reading, done := 0, 0
			for _, v := range l.Items {
				if !slices.Contains(names, v.Name) {
					continue
				}
				switch {
				case v.Status.Phase == v1alpha1.VerificationInProgress:
					reading++
				case v.Status.Phase == v1alpha1.VerificationPending && strings.Contains(v.Status.Message, "2 verification slots"):
					waited = true
				case v.Status.Phase == v1alpha1.VerificationSucceeded:
					done++
				}
			}
			if !assert.LessOrEqual(t, reading, 2, "verifications reading at once") {
				return
			}
			assert.Equal(c, len(names), done)
		}, within, 10*time.Millisecond)
		assert.True(t, waited, "one verification waited for a slot")
	})

	t.Run("ABackupWhoseObjectIsGoneIsFoundByLocationAndID", func(t *testing.T) {
		b, _ := takeBackup(t, e, store, vm, "retained", 200)
		require.NoError(t, e.Kube.Delete(e.Ctx, b))
		v := newVerification(t, e, granted, "retained", v1alpha1.VirtualMachineBackupVerificationSpec{Backup: &v1alpha1.BackupInLocation{Location: location, ID: string(b.UID)}})
		got := awaitVerification(t, e, v, v1alpha1.VerificationSucceeded, "read back as written")
		assert.Equal(t, int64(4), got.Status.ChunksChecked)
	})

	t.Run("AnotherNamespacesBackupIsRefused", func(t *testing.T) {
		b, _ := takeBackup(t, e, store, vm, "theirs", 300)
		ns := e.Namespace(t)
		require.NoError(t, e.Kube.Create(e.Ctx, &apisv1alpha1.ClusterProviderConfig{
			ObjectMeta: metav1.ObjectMeta{Name: "grants-" + ns},
			Spec: apisv1alpha1.ClusterProviderConfigSpec{
				ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://nats.example:4222", Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
				Grants:             []apisv1alpha1.TenantGrant{{Namespaces: []string{ns}, BackupLocations: []string{location}}},
			},
		}))
		v := newVerification(t, e, ns, "steal", v1alpha1.VirtualMachineBackupVerificationSpec{Backup: &v1alpha1.BackupInLocation{Location: location, ID: string(b.UID)}})
		got := awaitVerification(t, e, v, v1alpha1.VerificationFailed, "namespace "+ns+" has no backup "+string(b.UID))
		assert.Zero(t, got.Status.ChunksChecked, "not one of the other namespace's chunks was read")
		e.Get(t, b)
		assert.Nil(t, b.Status.LastVerification, "the other namespace's backup shows nothing of it")

		const ungranted = "not-granted"
		require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ungranted}}))
		v = newVerification(t, e, ungranted, "nope", v1alpha1.VirtualMachineBackupVerificationSpec{Backup: &v1alpha1.BackupInLocation{Location: location, ID: string(b.UID)}})
		awaitVerification(t, e, v, v1alpha1.VerificationPending, "backupLocations: ["+location+"]")
	})

	t.Run("AFailedBackupFailsItsVerification", func(t *testing.T) {
		b := newBackup(t, e, granted, "broken", vm.Name)
		intentOn(t, e, nodeA, b)
		controllertest.Report(t, e.Fleet.Agent(nodeA), wire.BackupReports, string(b.UID), wire.BackupReport{
			UID: string(b.UID), Node: nodeA, VM: string(vm.UID), Phase: wire.BackupPhaseFailed, Message: "played", ObservedAt: time.Now(),
		})
		await(t, e, b, inPhase(v1alpha1.BackupFailed, "played"))
		v := newVerification(t, e, granted, "broken", v1alpha1.VirtualMachineBackupVerificationSpec{BackupName: "broken"})
		awaitVerification(t, e, v, v1alpha1.VerificationFailed, "VirtualMachineBackup broken failed")
	})
}
