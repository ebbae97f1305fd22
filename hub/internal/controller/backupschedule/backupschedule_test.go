package backupschedule_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/backuplocation"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backup"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupgc"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupschedule"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

const (
	nodeA    = "node-a"
	location = "scheduled"
	granted  = "granted"
	within   = 30 * time.Second
)

// start is the time the tests' clock starts at: half a minute past an
// hour a day ahead of the wall clock, so that everything the store holds
// is older, by its own clock, than a collection's cut-off.
func start() time.Time {
	return time.Now().UTC().Truncate(time.Hour).Add(24*time.Hour + 30*time.Second)
}

// startHub runs the backup, schedule and garbage collection controllers,
// as the hub does, on a fake clock, against a real API server, a fleet
// over a real nats-server and a location on a real S3 store.
func startHub(t *testing.T) (*controllertest.Env, *backupstore.Store, *clocktesting.FakeClock) {
	t.Helper()
	s3 := s3test.New(t)
	clock := clocktesting.NewFakeClock(start())
	e := controllertest.Start(t, []string{nodeA}, func(mgr ctrl.Manager, o controller.Options, e *controllertest.Env) error {
		memory := perobject.NewOwner(nil)
		backups := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineBackup{} })
		e.Fleet.Backups.Subscribe(backups.Notify)
		collections := backuplocation.NewCollections()
		if err := backup.Setup(mgr, o, backup.Options{Pool: e.Pool, Notifier: backups, Memory: memory, Collections: collections}); err != nil {
			return err
		}
		if err := backupschedule.Setup(mgr, o, backupschedule.Options{Clock: clock, Memory: memory}); err != nil {
			return err
		}
		return backupgc.Setup(mgr, o, backupgc.Options{Clock: clock, Memory: memory, Collections: collections})
	})
	e.Fleet.Agent(nodeA).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Backups: true, Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	return e, e.BackupLocation(t, s3, location, granted), clock
}

func newSchedule(t *testing.T, e *controllertest.Env, name, vm, cron string, edit ...func(*v1alpha1.VirtualMachineBackupSchedule)) *v1alpha1.VirtualMachineBackupSchedule {
	t.Helper()
	s := &v1alpha1.VirtualMachineBackupSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: granted, Name: name}}
	s.Spec.VMName, s.Spec.Location, s.Spec.Schedule = v1alpha1.LocalName(vm), location, cron
	for _, fn := range edit {
		fn(s)
	}
	require.NoError(t, e.Kube.Create(e.Ctx, s))
	return s
}

// backupsOf lists the backups schedule s made, by name.
func backupsOf(t *testing.T, e *controllertest.Env, s *v1alpha1.VirtualMachineBackupSchedule) map[string]v1alpha1.VirtualMachineBackup {
	t.Helper()
	l := &v1alpha1.VirtualMachineBackupList{}
	require.NoError(t, e.Kube.List(e.Ctx, l, client.InNamespace(s.Namespace), client.MatchingLabels{v1alpha1.BackupScheduleLabel: s.Name}))
	out := map[string]v1alpha1.VirtualMachineBackup{}
	for _, b := range l.Items {
		out[b.Name] = b
	}
	return out
}

// takeBackup plays the node taking backup name of vm: once the hub asked,
// it writes a disk of unique data to the store and reports the backup
// Succeeded.
func takeBackup(t *testing.T, e *controllertest.Env, store *backupstore.Store, name string, vm *v1alpha1.VirtualMachine, full bool) backupstore.Manifest {
	t.Helper()
	b := &v1alpha1.VirtualMachineBackup{}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, e.Kube.Get(e.Ctx, types.NamespacedName{Namespace: vm.Namespace, Name: name}, b))
		_, asked := controllertest.Stored(t, e.Fleet, wire.BackupIntents, nodeA, string(b.UID))
		assert.True(c, asked, "the hub asks node %s for backup %s", nodeA, name)
	}, within, 10*time.Millisecond)
	w, err := store.NewWriter(e.Ctx, backupstore.Manifest{ID: string(b.UID), Namespace: vm.Namespace, VMName: vm.Name, VMUID: string(vm.UID)}, nil)
	require.NoError(t, err)
	data := make([]byte, backupstore.ChunkSize)
	rng := rand.NewChaCha8([32]byte([]byte(name + "................................")[:32]))
	_, _ = rng.Read(data)
	require.NoError(t, w.Disk(driver.BackupDisk{Name: "root", Size: int64(len(data))}))
	require.NoError(t, w.Data(0, data))
	m, err := w.Commit(e.Ctx)
	require.NoError(t, err)
	begun, end := time.Now().Add(-time.Second), time.Now()
	controllertest.Report(t, e.Fleet.Agent(nodeA), wire.BackupReports, string(b.UID), wire.BackupReport{
		UID: string(b.UID), Node: nodeA, VM: string(vm.UID), Phase: wire.BackupPhaseSucceeded, Full: full,
		StartedAt: &begun, FinishedAt: &end, DiskBytes: int64(len(data)), ObservedAt: end,
	})
	return m
}

func TestSchedules(t *testing.T) {
	e, store, clock := startHub(t)
	slot := clock.Now().Truncate(time.Hour)

	t.Run("SlotsMakeOneBackupEachNeverTwoAtOnceAndRetentionPrunesAndFrees", func(t *testing.T) {
		vm := e.VM(t, granted, "web", nodeA, true, v1alpha1.PhaseRunning)
		s := newSchedule(t, e, "web", "web", "0 * * * *", func(s *v1alpha1.VirtualMachineBackupSchedule) {
			s.Spec.Retention.Last = 2
		})
		name := func(at time.Time) string { return "web-" + at.Format("200601021504") }

		// Created a day before the clock's now: only the latest time
		// missed is made up.
		first := name(slot)
		got := controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
			assert.Equal(c, first, s.Status.Active)
		})
		assert.True(t, got.Status.LastScheduleTime.Equal(ptr.To(metav1.NewTime(slot))), "last schedule %v", got.Status.LastScheduleTime)
		assert.True(t, got.Status.NextScheduleTime.Equal(ptr.To(metav1.NewTime(slot.Add(time.Hour)))), "next schedule %v", got.Status.NextScheduleTime)
		assert.Contains(t, got.Status.Message, "only the latest is made up")
		bs := backupsOf(t, e, s)
		require.Len(t, bs, 1, "one backup for the missed times")
		b := bs[first]
		assert.Equal(t, v1alpha1.BackupDelete, b.Spec.DeletionPolicy, "pruning frees the data by default")
		assert.Equal(t, slot.Format(time.RFC3339), b.Annotations[backupschedule.ScheduledAtAnnotation])
		assert.True(t, metav1.IsControlledBy(&b, got), "the schedule owns its backups")

		// The next time comes while the first still runs: skipped.
		clock.SetTime(slot.Add(time.Hour + 30*time.Second))
		controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
			assert.EqualValues(c, 1, s.Status.Skipped)
			assert.Contains(c, s.Status.Message, "backup "+first+" still runs")
		})
		assert.Len(t, backupsOf(t, e, s), 1, "never two at once")

		kept := map[string]backupstore.Manifest{}
		takeBackup(t, e, store, first, vm, true)
		controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
			assert.Equal(c, first, s.Status.LastSuccessfulBackup)
			assert.Empty(c, s.Status.Active)
		})

		for i := 2; i <= 3; i++ {
			at := slot.Add(time.Duration(i) * time.Hour)
			clock.SetTime(at.Add(30 * time.Second))
			controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
				assert.Equal(c, name(at), s.Status.Active)
			})
			if i == 2 {
				// A hub that made the backup but lost the status saying so,
				// restarted: it finds the backup instead of making another.
				restarted := backupschedule.NewReconciler(e.Kube, backupschedule.Options{Clock: clock, Memory: perobject.NewOwner(nil)}, event.NewNopRecorder())
				cur := &v1alpha1.VirtualMachineBackupSchedule{}
				require.NoError(t, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(s), cur))
				cur.Status.LastScheduleTime = ptr.To(metav1.NewTime(slot))
				require.NoError(t, e.Kube.Status().Update(e.Ctx, cur))
				require.Eventually(t, func() bool {
					// The running hub may write the status in between.
					_, err := restarted.Reconcile(e.Ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)})
					return err == nil
				}, within, 10*time.Millisecond)
				assert.Len(t, backupsOf(t, e, s), 2, "no second backup for one time")
				controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
					assert.True(c, s.Status.LastScheduleTime.Equal(ptr.To(metav1.NewTime(at))), "last schedule %v", s.Status.LastScheduleTime)
				})
			}
			kept[name(at)] = takeBackup(t, e, store, name(at), vm, false)
			controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
				assert.Equal(c, name(at), s.Status.LastSuccessfulBackup)
				assert.Empty(c, s.Status.Active)
			})
		}

		// Last 2 keeps the two newest: the first is pruned, its data
		// deleted from the store, and its chunk freed by a collection.
		controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
			assert.EqualValues(c, 1, s.Status.Pruned)
			assert.EqualValues(c, 2, s.Status.Succeeded)
			assert.Equal(c, name(slot.Add(3*time.Hour)), s.Status.LastSuccessfulBackup)
		})
		require.Eventually(t, func() bool { _, ok := backupsOf(t, e, s)[first]; return !ok }, within, 10*time.Millisecond, "the pruned backup goes")
		_, err := store.Manifest(e.Ctx, granted, string(b.UID))
		require.ErrorIs(t, err, backupstore.ErrNotFound, "deletionPolicy Delete deletes the pruned backup's data")
		l := &v1alpha1.BackupLocation{}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			require.NoError(c, e.Kube.Get(e.Ctx, types.NamespacedName{Name: location}, l))
			gc := l.Status.LastGarbageCollection
			if assert.NotNil(c, gc) {
				assert.EqualValues(c, 1, gc.ChunksDeleted, "the pruned backup's one chunk")
				assert.EqualValues(c, 2, gc.Backups)
			}
		}, within, 10*time.Millisecond)
		assert.Positive(t, l.Status.BytesFreed)
		for n, m := range kept {
			v, err := store.Verify(e.Ctx, m, nil)
			require.NoError(t, err, n)
			assert.Empty(t, v.Bad, "backup %s the schedule keeps is whole", n)
		}
	})

	t.Run("ASuspendedScheduleSkipsItsTimes", func(t *testing.T) {
		e.VM(t, granted, "db", nodeA, true, v1alpha1.PhaseRunning)
		s := newSchedule(t, e, "db", "db", "*/5 * * * *", func(s *v1alpha1.VirtualMachineBackupSchedule) { s.Spec.Suspend = true })
		controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
			assert.Contains(c, s.Status.Message, "the schedule is suspended")
			assert.EqualValues(c, 1, s.Status.Skipped)
		})
		assert.Empty(t, backupsOf(t, e, s))
	})
}

func TestInvalidSchedulesAreRefusedNamingTheField(t *testing.T) {
	e, _, _ := startHub(t)
	cases := map[string]struct {
		schedule string
		timeZone *string
		// wantRefused is what the API server says; else wantStatus is what
		// the hub does.
		wantRefused []string
		wantStatus  []string
	}{
		"SixtyOneMinutes":       {schedule: "61 * * * *", wantStatus: []string{"spec.schedule", "61 * * * *", "end of range (61) above maximum (59)"}},
		"SixFields":             {schedule: "0 0 * * * *", wantStatus: []string{"spec.schedule", "expected exactly 5 fields"}},
		"UnknownTimeZone":       {schedule: "@daily", timeZone: ptr.To("Mars/Olympus"), wantStatus: []string{"spec.timeZone", "Mars/Olympus"}},
		"TimeZoneInTheSchedule": {schedule: "CRON_TZ=Europe/Berlin 0 3 * * *", wantRefused: []string{"spec.schedule", "set spec.timeZone instead"}},
	}
	i := 0
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			i++
			s := &v1alpha1.VirtualMachineBackupSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: granted, Name: "bad-" + string(rune('a'+i))}}
			s.Spec.VMName, s.Spec.Location, s.Spec.Schedule, s.Spec.TimeZone = "web", location, tc.schedule, tc.timeZone
			err := e.Kube.Create(e.Ctx, s)
			if tc.wantRefused != nil {
				require.True(t, kerrors.IsInvalid(err), "refused as invalid: %v", err)
				for _, w := range tc.wantRefused {
					assert.Contains(t, err.Error(), w)
				}
				return
			}
			require.NoError(t, err)
			got := controllertest.Await(t, e, s, within, func(c *assert.CollectT, s *v1alpha1.VirtualMachineBackupSchedule) {
				assert.Equal(c, corev1.ConditionFalse, s.Status.GetCondition(xpv2.TypeSynced).Status)
			})
			for _, w := range tc.wantStatus {
				assert.Contains(t, got.Status.Message, w)
				assert.Contains(t, got.Status.GetCondition(xpv2.TypeSynced).Message, w)
			}
			assert.Nil(t, got.Status.NextScheduleTime)
		})
	}
}

// TestAHubThatMayNotDeleteSaysSo runs the schedule controller as a user
// RBAC grants what Crossplane's RBAC manager grants a provider on its own
// kinds, which is no delete.
func TestAHubThatMayNotDeleteSaysSo(t *testing.T) {
	e := controllertest.Start(t, nil, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: granted}}))
	const user = "provider-without-delete"
	require.NoError(t, e.Kube.Create(e.Ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{v1alpha1.Group},
			Resources: []string{"virtualmachinebackups", "virtualmachinebackups/status", "virtualmachinebackupschedules", "virtualmachinebackupschedules/status"},
			Verbs:     []string{"get", "list", "watch", "update", "patch", "create"},
		}, {
			APIGroups: []string{v1alpha1.Group}, Resources: []string{"*/finalizers"}, Verbs: []string{"update"},
		}},
	}))
	require.NoError(t, e.Kube.Create(e.Ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}))
	require.NoError(t, e.CP.AwaitAllowed(e.Ctx, user, authorizationv1.ResourceAttributes{Namespace: granted, Verb: "create", Group: v1alpha1.Group, Resource: "virtualmachinebackups"}))
	kube, err := e.CP.UserClient(user)
	require.NoError(t, err)

	clock := clocktesting.NewFakeClock(start())
	r := backupschedule.NewReconciler(kube, backupschedule.Options{Clock: clock, Memory: perobject.NewOwner(nil)}, event.NewNopRecorder())
	s := &v1alpha1.VirtualMachineBackupSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: granted, Name: "web"}}
	s.Spec.VMName, s.Spec.Location, s.Spec.Schedule, s.Spec.Retention.Last = "web", location, "0 * * * *", 1
	require.NoError(t, e.Kube.Create(e.Ctx, s))
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)}
	// Two backups made and succeeded, one an hour after the other: Last 1
	// prunes the first.
	for i := range 2 {
		if i > 0 {
			clock.Step(time.Hour)
		}
		_, err := r.Reconcile(e.Ctx, req)
		require.NoError(t, err)
		b := &v1alpha1.VirtualMachineBackup{}
		require.NoError(t, e.Kube.Get(e.Ctx, types.NamespacedName{Namespace: granted, Name: backupschedule.BackupName(s, clock.Now().Truncate(time.Hour))}, b))
		b.Status.Phase, b.Status.CompletionTime = v1alpha1.BackupSucceeded, ptr.To(metav1.NewTime(clock.Now()))
		require.NoError(t, e.Kube.Status().Update(e.Ctx, b))
	}
	_, err = r.Reconcile(e.Ctx, req)
	require.NoError(t, err, "a refusal is said in the status, not retried")
	got := &v1alpha1.VirtualMachineBackupSchedule{}
	require.NoError(t, e.Kube.Get(e.Ctx, req.NamespacedName, got))
	synced := got.Status.GetCondition(xpv2.TypeSynced)
	assert.Equal(t, corev1.ConditionFalse, synced.Status)
	assert.Contains(t, synced.Message, "the hub may not delete VirtualMachineBackups")
	assert.Contains(t, got.Status.Message, "cannot prune backup "+backupschedule.BackupName(s, clock.Now().Truncate(time.Hour).Add(-time.Hour)))
	assert.Zero(t, got.Status.Pruned)
}
