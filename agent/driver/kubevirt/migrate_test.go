package kubevirt

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// otherNode is the stand-in's other schedulable node.
var otherNode = map[string]string{"kv-node-a": "kv-node-b", "kv-node-b": "kv-node-a"}

// migratable is a running guest KubeVirt can migrate live: its root PVC is
// made ReadWriteMany before the driver would make it ReadWriteOnce.
func (e *env) migratable() (driver.Machine, driver.Observation) {
	e.t.Helper()
	m := e.machine()
	e.sharedRoot(m)
	return m, e.ensureUntil(m, phaseIs(driver.PhaseRunning))
}

// sharedRoot makes m's root PVC ReadWriteMany before the driver would make
// it ReadWriteOnce, so KubeVirt can migrate the guest live (and so
// hot-plug its CPUs and memory).
func (e *env) sharedRoot(m driver.Machine) {
	e.t.Helper()
	require.NoError(e.t, e.kube.Create(context.Background(), &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}))
}

// migrateUntilFinal calls MigrateHost as the reconciler would until the
// migration is over, and returns every status it got.
func (e *env) migrateUntilFinal(m driver.Machine, id, host string) []driver.MigrationStatus {
	e.t.Helper()
	var seen []driver.MigrationStatus
	var lastErr error
	require.Eventually(e.t, func() bool {
		st, err := e.d.MigrateHost(context.Background(), m, id, host)
		if lastErr = err; err != nil {
			return false
		}
		seen = append(seen, st)
		return st.Phase != driver.MigrationRunning
	}, 20*time.Second, 50*time.Millisecond, "statuses %+v, error %v", &seen, &lastErr)
	return seen
}

// workloadUpdates are the migrations KubeVirt's workload updater made in
// the test's namespace, by uid.
func (e *env) workloadUpdates() map[types.UID]kubevirtv1.VirtualMachineInstanceMigration {
	e.t.Helper()
	out := map[types.UID]kubevirtv1.VirtualMachineInstanceMigration{}
	for _, mig := range e.migrations() {
		if _, ok := mig.Annotations[kubevirtv1.WorkloadUpdateMigrationAnnotation]; ok {
			out[mig.UID] = mig
		}
	}
	return out
}

func (e *env) migrations() []kubevirtv1.VirtualMachineInstanceMigration {
	e.t.Helper()
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	require.NoError(e.t, e.kube.List(context.Background(), migs, client.InNamespace(e.ns)))
	return migs.Items
}

func TestMigrateHostMovesTheGuestToAnotherNode(t *testing.T) {
	e := newEnv(t)
	m, o := e.migratable()
	from := o.Node
	id := string(uuid.NewUUID())

	seen := e.migrateUntilFinal(m, id, "")
	first, final := seen[0], seen[len(seen)-1]
	assert.Equal(t, driver.MigrationRunning, first.Phase, "the first call starts the migration and does not wait")
	assert.Equal(t, id, first.ID)
	assert.False(t, first.StartedAt.IsZero())
	require.Equal(t, driver.MigrationSucceeded, final.Phase, "last %+v", final)
	assert.Equal(t, id, final.ID)
	assert.False(t, final.FinishedAt.Before(final.StartedAt))
	assert.Zero(t, final.TotalBytes, "KubeVirt does not tell")
	assert.Zero(t, final.ProcessedBytes)
	assert.Zero(t, final.Downtime)
	assert.Contains(t, final.Message, "from node "+from+" to node "+otherNode[from])

	got, err := e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, otherNode[from], got.Node, "Observe reports the new node once the migration succeeded")
	assert.Equal(t, driver.PhaseRunning, got.Phase)

	migs := e.migrations()
	require.Len(t, migs, 1)
	mig := migs[0]
	assert.Equal(t, MigrationName(id), mig.Name)
	assert.Equal(t, VMName(m.UID), mig.Spec.VMIName)
	assert.Empty(t, mig.Spec.AddedNodeSelector, "KubeVirt chooses the node")
	assert.Equal(t, m.UID, mig.Labels[LabelUID], "labelled like the driver's other objects")
	assert.Equal(t, managedBy, mig.Labels[labelManagedBy])
	assert.Equal(t, id, mig.Annotations[AnnotationMigration])
	assert.Equal(t, m.Name, mig.Annotations[AnnotationName])
	assert.Equal(t, kubevirtv1.MigrationSucceeded, mig.Status.Phase, "kept once it is over, as KubeVirt keeps it")

	again, err := e.d.MigrateHost(context.Background(), m, id, "")
	require.NoError(t, err)
	assert.Equal(t, final, again, "the same id returns the same final status")
	restarted := e.open()
	derived, err := restarted.MigrateHost(context.Background(), m, id, "")
	require.NoError(t, err)
	assert.Equal(t, driver.MigrationSucceeded, derived.Phase, "a restarted agent reads it from KubeVirt")
	assert.Equal(t, final.FinishedAt, derived.FinishedAt)
	assert.Len(t, e.migrations(), 1, "and makes no second migration")

	back := string(uuid.NewUUID())
	seen = e.migrateUntilFinal(m, back, from)
	final = seen[len(seen)-1]
	require.Equal(t, driver.MigrationSucceeded, final.Phase, "last %+v", final)
	got, err = e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, from, got.Node, "moved back to the host asked for")
	for _, mig := range e.migrations() {
		if mig.Name == MigrationName(back) {
			assert.Equal(t, map[string]string{corev1.LabelHostname: from}, mig.Spec.AddedNodeSelector)
		}
	}
}

func TestMigrateHostRefusesWhatKubeVirtCannotMove(t *testing.T) {
	e := newEnv(t)
	running, o := e.migratable()
	stopped, _ := e.migratable()
	stopped.Running = false
	e.ensureUntil(stopped, phaseIs(driver.PhaseStopped))
	pinned := e.machine() // on a ReadWriteOnce PVC, as the driver makes it
	e.ensureUntil(pinned, phaseIs(driver.PhaseRunning))

	cases := map[string]struct {
		m    driver.Machine
		host string
		want func(error) bool
		says string
	}{
		"UnknownGuest":      {m: e.machine(), want: driver.IsNotFound, says: "no KubeVirt VirtualMachine"},
		"StoppedGuest":      {m: stopped, want: driver.IsTerminal, says: "not running"},
		"NotLiveMigratable": {m: pinned, want: driver.IsTerminal, says: "DisksNotLiveMigratable: cannot migrate VMI: PVC " + ObjectName(pinned.Disks[0].Name) + " is not shared"},
		"UnknownHost":       {m: running, host: "kv-node-z", want: driver.IsTerminal, says: "host kv-node-z is no node"},
		"CordonedHost":      {m: running, host: "kv-node-cordoned", want: driver.IsTerminal, says: "cordoned or not Ready"},
		"NotReadyHost":      {m: running, host: "kv-node-notready", want: driver.IsTerminal, says: "cordoned or not Ready"},
		"TheGuestsOwnHost":  {m: running, host: o.Node, want: driver.IsTerminal, says: "already runs on host " + o.Node},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := e.d.MigrateHost(context.Background(), tc.m, string(uuid.NewUUID()), tc.host)
			require.Error(t, err)
			assert.True(t, tc.want(err), "%v", err)
			assert.Contains(t, err.Error(), tc.says)
		})
	}
	assert.Empty(t, e.migrations(), "no migration was asked of KubeVirt")
}

func TestMigrateHostReportsKubeVirtsFailure(t *testing.T) {
	e := newEnv(t)
	m, o := e.migratable()
	cluster.Controller.FailNextMigration(types.NamespacedName{Namespace: e.ns, Name: VMName(m.UID)}, "Live migration failed: injected by the test")
	id := string(uuid.NewUUID())

	seen := e.migrateUntilFinal(m, id, "")
	final := seen[len(seen)-1]
	require.Equal(t, driver.MigrationFailed, final.Phase, "last %+v", final)
	assert.Equal(t, "KubeVirt: Live migration failed: injected by the test", final.Message)
	assert.False(t, final.FinishedAt.IsZero())

	got, err := e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, got.Phase, "the guest runs on")
	assert.Equal(t, o.Node, got.Node, "where it was")
	again, err := e.d.MigrateHost(context.Background(), m, id, "")
	require.NoError(t, err)
	assert.Equal(t, final, again)

	seen = e.migrateUntilFinal(m, string(uuid.NewUUID()), "")
	assert.Equal(t, driver.MigrationSucceeded, seen[len(seen)-1].Phase, "a new attempt may succeed")
}

func TestMigrateHostWaitsForAMigrationInFlight(t *testing.T) {
	e := newEnv(t)
	m, o := e.migratable()
	// A KubeVirt user's own migration, which cannot be scheduled and so
	// runs until deleted.
	theirs := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "by-hand"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: VMName(m.UID), AddedNodeSelector: map[string]string{corev1.LabelHostname: "kv-node-cordoned"}},
	}
	require.NoError(t, e.kube.Create(context.Background(), theirs))
	id := string(uuid.NewUUID())
	_, err := e.d.MigrateHost(context.Background(), m, id, "")
	require.Error(t, err)
	assert.False(t, driver.IsTerminal(err) || driver.IsNotFound(err), "retried: %v", err)
	assert.Contains(t, err.Error(), "by-hand")

	require.NoError(t, e.kube.Delete(context.Background(), theirs))
	seen := e.migrateUntilFinal(m, id, "")
	assert.Equal(t, driver.MigrationSucceeded, seen[len(seen)-1].Phase)
	got, err := e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, otherNode[o.Node], got.Node)
}

func TestMigrateHostOfADeletedMigrationFails(t *testing.T) {
	e := newEnv(t)
	m, o := e.migratable()
	id := string(uuid.NewUUID())
	st, err := e.d.MigrateHost(context.Background(), m, id, "")
	require.NoError(t, err)
	require.Equal(t, driver.MigrationRunning, st.Phase)
	// Deleting a migration is how a KubeVirt user cancels it.
	require.NoError(t, e.kube.Delete(context.Background(), &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: MigrationName(id)}}))

	seen := e.migrateUntilFinal(m, id, "")
	final := seen[len(seen)-1]
	assert.Equal(t, driver.MigrationFailed, final.Phase)
	assert.Contains(t, final.Message, "deleted")
	got, err := e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, o.Node, got.Node)
	assert.Equal(t, driver.PhaseRunning, got.Phase)
}

func TestWarningsAreTheMigrationsOwnOldestFirst(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// KubeVirt refuses a migration of a VMI that does not exist, saying so
	// in a warning event on it.
	mig := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "of-nothing"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "absent"},
	}
	require.NoError(t, e.kube.Create(ctx, mig))
	require.Eventually(t, func() bool {
		return e.kube.Get(ctx, client.ObjectKeyFromObject(mig), mig) == nil && mig.IsFinal()
	}, 10*time.Second, 20*time.Millisecond)
	event := func(name string, uid types.UID, kind, message string, at time.Time) {
		require.NoError(t, e.kube.Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: e.ns, Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "VirtualMachineInstanceMigration", Namespace: e.ns, Name: mig.Name, UID: uid},
			Type:           kind, Reason: "Test", Message: message,
			FirstTimestamp: metav1.NewTime(at), LastTimestamp: metav1.NewTime(at),
		}))
	}
	later := time.Now().Add(time.Hour)
	event("later", mig.UID, corev1.EventTypeWarning, "a later warning", later)
	event("again", mig.UID, corev1.EventTypeWarning, "a later warning", later)
	event("normal", mig.UID, corev1.EventTypeNormal, "not a warning", later)
	event("another", "another-uid", corev1.EventTypeWarning, "another object's", later)

	got, err := e.d.warnings(ctx, mig)
	require.NoError(t, err)
	assert.Equal(t, []string{`the VMI "` + e.ns + `/absent" does not exist`, "a later warning"}, got)
}

func TestMigrationNameIsOneValidNamePerID(t *testing.T) {
	cases := map[string]struct {
		id   string
		want string
	}{
		"AUIDAsItIs":        {id: "2b5e6f0c-9a41-4c1b-8d7e-3f0a1b2c3d4e", want: "vf-2b5e6f0c-9a41-4c1b-8d7e-3f0a1b2c3d4e"},
		"UpperCaseIsHashed": {id: "Drain-Node-A"},
		"TooLongIsHashed":   {id: strings.Repeat("x", 80)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := MigrationName(tc.id)
			assert.Empty(t, validation.IsDNS1123Label(got))
			assert.Equal(t, got, MigrationName(tc.id), "the same every time")
			if tc.want != "" {
				assert.Equal(t, tc.want, got)
			} else {
				assert.NotEqual(t, MigrationName(tc.id+"x"), got)
			}
		})
	}
}

func TestMigrationStatusMapsKubeVirt(t *testing.T) {
	created := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	started, ended, now := created.Add(2*time.Second), created.Add(9*time.Second), created.Add(time.Minute)
	const uid = "mig-uid"
	state := func(f func(*kubevirtv1.VirtualMachineInstanceMigrationState)) *kubevirtv1.VirtualMachineInstanceMigrationState {
		s := &kubevirtv1.VirtualMachineInstanceMigrationState{MigrationUID: uid, SourceNode: "node-1", TargetNode: "node-2"}
		if f != nil {
			f(s)
		}
		return s
	}
	mig := func(phase kubevirtv1.VirtualMachineInstanceMigrationPhase, s *kubevirtv1.VirtualMachineInstanceMigrationState) *kubevirtv1.VirtualMachineInstanceMigration {
		return &kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{UID: uid, CreationTimestamp: metav1.NewTime(created)},
			Status:     kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: phase, MigrationState: s},
		}
	}
	onVMI := func(s *kubevirtv1.VirtualMachineInstanceMigrationState) *kubevirtv1.VirtualMachineInstance {
		return &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{MigrationState: s}}
	}
	running := func(s *kubevirtv1.VirtualMachineInstanceMigrationState) {
		s.StartTimestamp = &metav1.Time{Time: started}
	}
	done := func(s *kubevirtv1.VirtualMachineInstanceMigrationState) {
		running(s)
		s.EndTimestamp, s.Completed = &metav1.Time{Time: ended}, true
	}
	aborted := mig(kubevirtv1.MigrationFailed, nil)
	aborted.Status.Conditions = []kubevirtv1.VirtualMachineInstanceMigrationCondition{{Type: kubevirtv1.VirtualMachineInstanceMigrationAbortRequested, Status: corev1.ConditionTrue}}
	failedAt := mig(kubevirtv1.MigrationFailed, nil)
	failedAt.Status.PhaseTransitionTimestamps = []kubevirtv1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{
		{Phase: kubevirtv1.MigrationPending, PhaseTransitionTimestamp: metav1.NewTime(created)},
		{Phase: kubevirtv1.MigrationFailed, PhaseTransitionTimestamp: metav1.NewTime(ended)},
	}

	cases := map[string]struct {
		mig      *kubevirtv1.VirtualMachineInstanceMigration
		vmi      *kubevirtv1.VirtualMachineInstance
		warnings []string
		want     driver.MigrationStatus
	}{
		"NotYetAccepted": {mig: mig("", nil),
			want: driver.MigrationStatus{Phase: driver.MigrationRunning, StartedAt: created, Message: "waiting for KubeVirt to accept the migration"}},
		"Scheduling": {mig: mig(kubevirtv1.MigrationScheduling, nil),
			want: driver.MigrationStatus{Phase: driver.MigrationRunning, StartedAt: created, Message: "KubeVirt is scheduling the migration's target pod"}},
		"PreparingTheTargetTheVMINames": {mig: mig(kubevirtv1.MigrationPreparingTarget, nil), vmi: onVMI(state(nil)),
			want: driver.MigrationStatus{Phase: driver.MigrationRunning, StartedAt: created, Message: "KubeVirt is preparing node node-2 for the guest"}},
		"TransferStartedOnTheVMI": {mig: mig(kubevirtv1.MigrationRunning, nil), vmi: onVMI(state(running)),
			want: driver.MigrationStatus{Phase: driver.MigrationRunning, StartedAt: started, Message: "KubeVirt is moving the guest from node node-1 to node node-2"}},
		"AnotherMigrationsStateOnTheVMIIsNotThis": {mig: mig(kubevirtv1.MigrationPending, nil), vmi: onVMI(state(func(s *kubevirtv1.VirtualMachineInstanceMigrationState) { done(s); s.MigrationUID = "older" })),
			want: driver.MigrationStatus{Phase: driver.MigrationRunning, StartedAt: created, Message: "KubeVirt accepted the migration"}},
		"Succeeded": {mig: mig(kubevirtv1.MigrationSucceeded, state(done)),
			want: driver.MigrationStatus{Phase: driver.MigrationSucceeded, StartedAt: started, FinishedAt: ended,
				Message: "KubeVirt moved the guest from node node-1 to node node-2; it reports neither the bytes moved nor the downtime"}},
		"FailedWithVirtHandlersReason": {mig: mig(kubevirtv1.MigrationFailed, nil), vmi: onVMI(state(func(s *kubevirtv1.VirtualMachineInstanceMigrationState) {
			done(s)
			s.Failed, s.FailureReason = true, "Live migration failed: connection reset"
		})), warnings: []string{"source node reported migration failed"},
			want: driver.MigrationStatus{Phase: driver.MigrationFailed, StartedAt: started, FinishedAt: ended, Message: "KubeVirt: Live migration failed: connection reset"}},
		"FailedBeforeTheTransferWithWarnings": {mig: failedAt, warnings: []string{"Migration target pod for VMI [ns/vm] is currently unschedulable.", "Migration target pod was removed during active migration."},
			want: driver.MigrationStatus{Phase: driver.MigrationFailed, StartedAt: created, FinishedAt: ended,
				Message: "KubeVirt: Migration target pod for VMI [ns/vm] is currently unschedulable.; Migration target pod was removed during active migration."}},
		"Cancelled": {mig: aborted,
			want: driver.MigrationStatus{Phase: driver.MigrationFailed, StartedAt: created, FinishedAt: now, Message: "KubeVirt: the migration was cancelled: its VirtualMachineInstanceMigration was deleted"}},
		"FailedWithoutAReason": {mig: mig(kubevirtv1.MigrationFailed, nil),
			want: driver.MigrationStatus{Phase: driver.MigrationFailed, StartedAt: created, FinishedAt: now, Message: "KubeVirt: the migration failed, and KubeVirt gives no reason"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.want.ID = "id-1"
			assert.Equal(t, tc.want, migrationStatus("id-1", tc.mig, tc.vmi, tc.warnings, now))
		})
	}
}

func TestMigrationLogIsBounded(t *testing.T) {
	var l migrationLog
	l.record("uid", "first", driver.MigrationStatus{ID: "first", Phase: driver.MigrationSucceeded})
	for i := range maxMigrations {
		l.record("uid", strconv.Itoa(i), driver.MigrationStatus{Phase: driver.MigrationRunning})
	}
	_, kept := l.final("uid", "first")
	assert.False(t, kept, "the oldest goes first")
	assert.Len(t, l.status, maxMigrations)
}

// TestMigrateHostWaitsForKubeVirtsHotPlugMigration asks for a migration
// while KubeVirt's workload updater moves the guest to apply a CPU
// hot-plug (its retry, held in KubeVirt's backoff after the first failed):
// the driver waits for it with a retryable error that says so, and then
// moves the guest itself, with the new shape.
func TestMigrateHostWaitsForKubeVirtsHotPlugMigration(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m, o := e.migratable()
	cluster.Controller.FailNextMigration(types.NamespacedName{Namespace: e.ns, Name: VMName(m.UID)}, "Live migration failed: injected by the test")
	m.VCPU++
	var held kubevirtv1.VirtualMachineInstanceMigration
	require.Eventually(t, func() bool {
		_, err := e.d.Ensure(ctx, m)
		require.NoError(t, err)
		failed := false
		held = kubevirtv1.VirtualMachineInstanceMigration{}
		for _, mig := range e.workloadUpdates() {
			switch mig.Status.Phase {
			case kubevirtv1.MigrationFailed:
				failed = true
			case kubevirtv1.MigrationPending:
				held = mig
			}
		}
		return failed && held.Name != ""
	}, 20*time.Second, 50*time.Millisecond, "KubeVirt's second attempt, held in its backoff")

	id := string(uuid.NewUUID())
	_, err := e.d.MigrateHost(ctx, m, id, "")
	require.Error(t, err)
	assert.False(t, driver.IsTerminal(err) || driver.IsNotFound(err), "retried: %v", err)
	assert.Contains(t, err.Error(), "its own migration "+held.Name+", which applies a CPU or memory hot-plug, has not finished")

	// KubeVirt's own tests skip its backoff so.
	held.Annotations[kubevirtv1.FuncTestForceIgnoreMigrationBackoffAnnotation] = ""
	require.NoError(t, e.kube.Update(ctx, &held))
	seen := e.migrateUntilFinal(m, id, "")
	require.Equal(t, driver.MigrationSucceeded, seen[len(seen)-1].Phase, "last %+v", seen[len(seen)-1])
	got, err := e.d.Observe(ctx, m.UID)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, got.Phase)
	assert.Equal(t, m.VCPU, got.VCPU, "the hot-plug done first")
	assert.Equal(t, o.Node, got.Node, "moved by KubeVirt, then back by the driver")
	assert.False(t, got.RestartRequired)
}

// TestMigrateHostSucceededThenMovedOnForAHotPlug lets KubeVirt move the
// guest on for a CPU hot-plug after the driver's migration succeeded and
// before the driver asked again: the driver's migration still reports
// Succeeded, and Observe the node the guest runs on now.
func TestMigrateHostSucceededThenMovedOnForAHotPlug(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m, o := e.migratable()
	id := string(uuid.NewUUID())
	st, err := e.d.MigrateHost(ctx, m, id, "")
	require.NoError(t, err)
	require.Equal(t, driver.MigrationRunning, st.Phase)
	mig := &kubevirtv1.VirtualMachineInstanceMigration{}
	require.Eventually(t, func() bool {
		return e.kube.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: MigrationName(id)}, mig) == nil && mig.Status.Phase == kubevirtv1.MigrationSucceeded
	}, 20*time.Second, 20*time.Millisecond)

	m.VCPU++
	resized := e.ensureUntil(m, func(o driver.Observation) bool { return o.VCPU == m.VCPU })
	assert.Equal(t, o.Node, resized.Node, "KubeVirt moved it back to apply the hot-plug")
	assert.Len(t, e.workloadUpdates(), 1)

	st, err = e.d.MigrateHost(ctx, m, id, "")
	require.NoError(t, err)
	assert.Equal(t, driver.MigrationSucceeded, st.Phase, "%+v", st)
	assert.Contains(t, st.Message, "from node "+o.Node+" to node "+otherNode[o.Node])
	got, err := e.d.Observe(ctx, m.UID)
	require.NoError(t, err)
	assert.Equal(t, o.Node, got.Node)
	assert.Equal(t, driver.PhaseRunning, got.Phase)
}
