package backupgc_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/backuplocation"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupgc"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

const (
	location = "collected"
	granted  = "granted"
	within   = 30 * time.Second
)

// TestCollections runs the collector on a fake clock, a day ahead of the
// store's, against a real API server and a real S3 store.
func TestCollections(t *testing.T) {
	s3 := s3test.New(t)
	clock := clocktesting.NewFakeClock(time.Now().Add(24 * time.Hour))
	e := controllertest.Start(t, nil, func(mgr ctrl.Manager, o controller.Options, _ *controllertest.Env) error {
		return backupgc.Setup(mgr, o, backupgc.Options{Clock: clock, Memory: perobject.NewOwner(nil), Collections: backuplocation.NewCollections()})
	})
	// A backup being written holds the first collection off.
	require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.VirtualMachineBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "running"},
		Spec:       v1alpha1.VirtualMachineBackupSpec{VMName: "web", Location: location},
	}))
	running := &v1alpha1.VirtualMachineBackup{}
	running.Namespace, running.Name = "default", "running"
	e.Get(t, running)
	running.Status.Phase, running.Status.Node = v1alpha1.BackupInProgress, "node-a"
	require.NoError(t, e.Kube.Status().Update(e.Ctx, running))

	store := e.BackupLocation(t, s3, location, granted)
	// Garbage: a chunk no manifest references, as a deleted backup leaves.
	w, err := store.NewWriter(e.Ctx, backupstore.Manifest{ID: "gone", Namespace: granted, VMName: "web", VMUID: "u"}, nil)
	require.NoError(t, err)
	data := make([]byte, backupstore.ChunkSize)
	data[0] = 1
	require.NoError(t, w.Disk(driver.BackupDisk{Name: "root", Size: int64(len(data))}))
	require.NoError(t, w.Data(0, data))
	_, err = w.Commit(e.Ctx)
	require.NoError(t, err)
	require.NoError(t, store.Delete(e.Ctx, granted, "gone"))

	l := &v1alpha1.BackupLocation{}
	l.Name = location
	got := controllertest.Await(t, e, l, within, func(c *assert.CollectT, l *v1alpha1.BackupLocation) {
		if assert.NotNil(c, l.Status.LastGarbageCollectionAttempt) {
			assert.Equal(c, "put off: backup default/running is being written to the location", l.Status.LastGarbageCollectionAttempt.Message)
		}
	})
	assert.Nil(t, got.Status.LastGarbageCollection)

	// Once it is over, the retry a minute later collects.
	running.Status.Phase = v1alpha1.BackupSucceeded
	require.NoError(t, e.Kube.Status().Update(e.Ctx, running))
	clock.Step(time.Minute)
	got = controllertest.Await(t, e, l, within, func(c *assert.CollectT, l *v1alpha1.BackupLocation) {
		if assert.NotNil(c, l.Status.LastGarbageCollection) {
			assert.EqualValues(c, 1, l.Status.LastGarbageCollection.ChunksDeleted)
		}
	})
	assert.Nil(t, got.Status.LastGarbageCollectionAttempt)
	assert.Positive(t, got.Status.BytesFreed)
	first := got.Status.LastGarbageCollection.Time

	// The next collection comes a garbageCollectionInterval (24h) later.
	clock.Step(23 * time.Hour)
	e.Get(t, got)
	assert.True(t, first.Equal(&got.Status.LastGarbageCollection.Time), "no collection before the interval is up")
	clock.Step(time.Hour)
	controllertest.Await(t, e, l, within, func(c *assert.CollectT, l *v1alpha1.BackupLocation) {
		if assert.NotNil(c, l.Status.LastGarbageCollection) {
			assert.True(c, l.Status.LastGarbageCollection.Time.After(first.Time), "collected again")
			assert.Zero(c, l.Status.LastGarbageCollection.ChunksDeleted)
		}
	})
}
