package backup_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backup"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupverification"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

// The nodes of the tests: a libvirt node that takes backups and a Nova
// node that takes none.
const (
	nodeA = "node-a"
	nova  = "nova-1"
	lost  = "lost-1"
)

// fencing is the fencing timeout of the tests' hub.
const fencing = time.Second

// progress is how often the tests' hub writes a verification's progress.
const progress = 50 * time.Millisecond

// within bounds every wait for the hub: long enough for three
// verifications read from the real object store one after another while
// the rest of make test, and a booting guest, share the machine.
const within = time.Minute

// The location of the tests (and its bucket), and the namespace granted
// it.
const (
	location = "offsite"
	bucket   = location
	granted  = "granted"
)

// startHub runs the backup and verification controllers against a real API server, a fleet
// over a real nats-server, and a real S3 store the location names.
func startHub(t *testing.T) (*controllertest.Env, *s3test.Server) {
	t.Helper()
	s := s3test.New(t)
	e := controllertest.Start(t, []string{nodeA, nova, lost}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		memory := perobject.NewOwner(nil)
		backups := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineBackup{} })
		e.Fleet.Backups.Subscribe(backups.Notify)
		if err := backup.Setup(mgr, o, backup.Options{Pool: e.Pool, Notifier: backups, Memory: memory, FencingTimeout: fencing}); err != nil {
			return err
		}
		verifications := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineBackupVerification{} })
		return backupverification.Setup(mgr, o, backupverification.Options{Notifier: verifications, Memory: memory, Progress: progress})
	})
	for _, n := range []string{nodeA, lost} {
		e.Fleet.Agent(n).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Backups: true, Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	}
	e.Fleet.Agent(nova).Heartbeat(wire.NodeHeartbeat{Backend: "nova", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	e.BackupLocation(t, s, location, granted)
	return e, s
}

func newBackup(t *testing.T, e *controllertest.Env, namespace, name, vm string, edit ...func(*v1alpha1.VirtualMachineBackup)) *v1alpha1.VirtualMachineBackup {
	t.Helper()
	b := &v1alpha1.VirtualMachineBackup{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	b.Spec.VMName, b.Spec.Location = v1alpha1.LocalName(vm), location
	for _, fn := range edit {
		fn(b)
	}
	require.NoError(t, e.Kube.Create(e.Ctx, b))
	return b
}

// await waits until backup b shows what check asserts.
func await(t *testing.T, e *controllertest.Env, b *v1alpha1.VirtualMachineBackup, check func(c *assert.CollectT, b *v1alpha1.VirtualMachineBackup)) *v1alpha1.VirtualMachineBackup {
	t.Helper()
	return controllertest.Await(t, e, b, within, check)
}

func inPhase(p v1alpha1.BackupPhase, says string) func(c *assert.CollectT, b *v1alpha1.VirtualMachineBackup) {
	return func(c *assert.CollectT, b *v1alpha1.VirtualMachineBackup) {
		assert.Equal(c, p, b.Status.Phase, b.Status.Message)
		assert.Contains(c, b.Status.Message, says)
	}
}

// intentOn waits for the backup's intent on node.
func intentOn(t *testing.T, e *controllertest.Env, node string, b *v1alpha1.VirtualMachineBackup) wire.BackupIntent {
	t.Helper()
	var in wire.BackupIntent
	require.Eventually(t, func() bool {
		var ok bool
		in, ok = controllertest.Stored(t, e.Fleet, wire.BackupIntents, node, string(b.UID))
		return ok
	}, within, 10*time.Millisecond, "the hub asks node %s for the backup", node)
	return in
}

// succeed plays node taking backup b of vm.
func succeed(t *testing.T, e *controllertest.Env, node string, b *v1alpha1.VirtualMachineBackup, vm *v1alpha1.VirtualMachine, full bool, parent string) {
	t.Helper()
	start := time.Now().Add(-time.Second)
	end := time.Now()
	controllertest.Report(t, e.Fleet.Agent(node), wire.BackupReports, string(b.UID), wire.BackupReport{
		UID: string(b.UID), Node: node, VM: string(vm.UID), Phase: wire.BackupPhaseSucceeded, Full: full, Parent: parent, Frozen: true,
		StartedAt: &start, FinishedAt: &end, DiskBytes: 10 << 30, BytesRead: 4 << 20, BytesWritten: 2 << 20, ChunksWritten: 2, ChunksReused: 2, ObservedAt: end,
	})
}

func TestBackups(t *testing.T) {
	e, s := startHub(t)

	t.Run("TheNodeIsAskedWithTheLocationAndTheStatusShowsItsReport", func(t *testing.T) {
		vm := e.VM(t, granted, "web", nodeA, true, v1alpha1.PhaseRunning)
		first := newBackup(t, e, granted, "first", "web")
		in := intentOn(t, e, nodeA, first)
		assert.Equal(t, string(vm.UID), in.VM)
		assert.Empty(t, in.Since, "the VM's first backup is full")
		assert.Equal(t, s.Endpoint, in.Location.Endpoint)
		assert.Equal(t, s.SecretKey, in.Location.Credentials.SecretAccessKey, "the node alone is handed the credentials")
		e.Get(t, vm)
		spec, err := json.Marshal(vm.Spec.ForProvider)
		require.NoError(t, err)
		assert.JSONEq(t, string(spec), string(in.Spec), "the VM's spec, kept with the backup")
		await(t, e, first, inPhase(v1alpha1.BackupInProgress, "node "+nodeA))

		succeed(t, e, nodeA, first, vm, true, "")
		got := await(t, e, first, inPhase(v1alpha1.BackupSucceeded, ""))
		assert.True(t, got.Status.Full)
		assert.True(t, got.Status.Frozen)
		assert.Equal(t, int64(2<<20), got.Status.BytesWritten)
		assert.Equal(t, "10Gi", got.Status.Size.String())
		assert.NotNil(t, got.Status.CompletionTime)
		require.Eventually(t, func() bool {
			_, ok := controllertest.Stored(t, e.Fleet, wire.BackupIntents, nodeA, string(first.UID))
			return !ok
		}, within, 10*time.Millisecond, "the intent goes once the report is final")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.EventMessage(t, first, corev1.EventTypeNormal, backup.ReasonTaken), "(full)")
		}, within, 50*time.Millisecond)

		second := newBackup(t, e, granted, "second", "web")
		assert.Equal(t, string(first.UID), intentOn(t, e, nodeA, second).Since, "the next reads only what changed since the last that succeeded")
		full := newBackup(t, e, granted, "again-full", "web", func(b *v1alpha1.VirtualMachineBackup) { b.Spec.Full = true })
		assert.Empty(t, intentOn(t, e, nodeA, full).Since, "full asks for every disk whole")
	})

	t.Run("AFailedReportFailsTheBackupSayingWhy", func(t *testing.T) {
		vm := e.VM(t, granted, "db", nodeA, true, v1alpha1.PhaseRunning)
		b := newBackup(t, e, granted, "db-1", "db")
		intentOn(t, e, nodeA, b)
		controllertest.Report(t, e.Fleet.Agent(nodeA), wire.BackupReports, string(b.UID), wire.BackupReport{
			UID: string(b.UID), Node: nodeA, VM: string(vm.UID), Phase: wire.BackupPhaseFailed, Message: "access denied by the backup store", ObservedAt: time.Now(),
		})
		await(t, e, b, inPhase(v1alpha1.BackupFailed, "access denied by the backup store"))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, e.EventMessage(t, vm, corev1.EventTypeWarning, backup.ReasonFailed), "access denied", "the VM says so too")
		}, within, 50*time.Millisecond)
	})

	t.Run("ANamespaceWithoutTheGrantWaitsSayingWhichGrant", func(t *testing.T) {
		ns := e.Namespace(t)
		e.VM(t, ns, "web", nodeA, true, v1alpha1.PhaseRunning)
		b := newBackup(t, e, ns, "nope", "web")
		await(t, e, b, inPhase(v1alpha1.BackupPending, "backupLocations: ["+location+"]"))
		_, ok := controllertest.Stored(t, e.Fleet, wire.BackupIntents, nodeA, string(b.UID))
		assert.False(t, ok, "no node is handed the location's credentials")
	})

	t.Run("AMissingLocationIsWaitedFor", func(t *testing.T) {
		e.VM(t, granted, "cache", nodeA, true, v1alpha1.PhaseRunning)
		b := newBackup(t, e, granted, "elsewhere", "cache", func(b *v1alpha1.VirtualMachineBackup) { b.Spec.Location = "nowhere" })
		await(t, e, b, inPhase(v1alpha1.BackupPending, "names BackupLocation \"nowhere\""))
	})

	t.Run("ABackendWithoutBackupsFailsIt", func(t *testing.T) {
		e.VM(t, granted, "on-nova", nova, true, v1alpha1.PhaseRunning)
		b := newBackup(t, e, granted, "on-nova", "on-nova")
		await(t, e, b, inPhase(v1alpha1.BackupFailed, "takes no backups"))
	})

	t.Run("ABackupWhoseNodeIsLostFailsAfterTheFencingTimeout", func(t *testing.T) {
		vm := e.VM(t, granted, "far", lost, true, v1alpha1.PhaseRunning)
		b := newBackup(t, e, granted, "far-1", "far")
		intentOn(t, e, lost, b)
		start := time.Now()
		controllertest.Report(t, e.Fleet.Agent(lost), wire.BackupReports, string(b.UID), wire.BackupReport{
			UID: string(b.UID), Node: lost, VM: string(vm.UID), Phase: wire.BackupPhaseRunning, StartedAt: &start, ObservedAt: start,
		})
		await(t, e, b, inPhase(v1alpha1.BackupInProgress, "node "+lost))
		e.Fleet.Agent(lost).Stop()
		got := await(t, e, b, inPhase(v1alpha1.BackupFailed, "was lost while it took the backup"))
		assert.Contains(t, got.Status.Message, "nothing of it can be restored")
	})

	t.Run("DeletionPolicyDeleteDeletesTheDataRetainKeepsIt", func(t *testing.T) {
		vm := e.VM(t, granted, "kept", nodeA, true, v1alpha1.PhaseRunning)
		store := openStore(t, s)
		for _, tc := range []struct {
			name   string
			policy v1alpha1.BackupDeletionPolicy
			kept   bool
		}{{"kept-retain", v1alpha1.BackupRetain, true}, {"kept-delete", v1alpha1.BackupDelete, false}} {
			b := newBackup(t, e, granted, tc.name, "kept", func(b *v1alpha1.VirtualMachineBackup) { b.Spec.DeletionPolicy = tc.policy; b.Spec.Full = true })
			intentOn(t, e, nodeA, b)
			// The node's work: a backup in the store.
			w, err := store.NewWriter(e.Ctx, backupstore.Manifest{ID: string(b.UID), Namespace: granted, VMName: vm.Name, VMUID: string(vm.UID)}, nil)
			require.NoError(t, err)
			_, err = w.Commit(e.Ctx)
			require.NoError(t, err)
			succeed(t, e, nodeA, b, vm, true, "")
			await(t, e, b, inPhase(v1alpha1.BackupSucceeded, ""))
			require.NoError(t, e.Kube.Delete(e.Ctx, b))
			require.Eventually(t, func() bool {
				return kerrors.IsNotFound(e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(b), &v1alpha1.VirtualMachineBackup{}))
			}, within, 10*time.Millisecond, "the backup object goes")
			_, err = store.Manifest(e.Ctx, granted, string(b.UID))
			if tc.kept {
				assert.NoError(t, err, "%s: Retain keeps the data", tc.name)
			} else {
				assert.ErrorIs(t, err, backupstore.ErrNotFound, "%s: Delete deletes it", tc.name)
			}
		}
	})
}
