package kubevirttest

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// resize changes the VM's template as a client would.
func (m *migrations) resize(name string, change func(*kubevirtv1.DomainSpec)) {
	m.t.Helper()
	require.NoError(m.t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vm := &kubevirtv1.VirtualMachine{}
		if err := m.kube.Get(context.Background(), types.NamespacedName{Namespace: DefaultNamespace, Name: name}, vm); err != nil {
			return err
		}
		change(&vm.Spec.Template.Spec.Domain)
		return m.kube.Update(context.Background(), vm)
	}))
}

// workloadUpdates are the workload updater's migrations of the VMI, oldest
// first.
func (m *migrations) workloadUpdates(vmi string) []kubevirtv1.VirtualMachineInstanceMigration {
	m.t.Helper()
	migs := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	require.NoError(m.t, m.kube.List(context.Background(), migs, client.InNamespace(DefaultNamespace)))
	var out []kubevirtv1.VirtualMachineInstanceMigration
	for _, mig := range migs.Items {
		if _, ok := mig.Annotations[kubevirtv1.WorkloadUpdateMigrationAnnotation]; ok && mig.Spec.VMIName == vmi {
			out = append(out, mig)
		}
	}
	// Made one after another, maybe in the same second: the one still
	// running is the newer.
	slices.SortFunc(out, func(a, b kubevirtv1.VirtualMachineInstanceMigration) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), compareFinal(b, a))
	})
	return out
}

// hotpluggableVM creates a VM of one socket and 1Gi that KubeVirt can
// hot-plug into, on a root PVC of mode, and waits until its VMI runs.
func (m *migrations) hotpluggableVM(name string, mode corev1.PersistentVolumeAccessMode) *kubevirtv1.VirtualMachineInstance {
	m.t.Helper()
	ctx := context.Background()
	vm := testVM(name)
	vm.Spec.Template.Spec.Domain.CPU = &kubevirtv1.CPU{Sockets: 1, Cores: 1, Threads: 1}
	vm.Spec.Template.Spec.Domain.Resources = kubevirtv1.ResourceRequirements{}
	require.NoError(m.t, m.kube.Create(ctx, claim(name+"-root", mode)))
	require.NoError(m.t, m.kube.Create(ctx, vm))
	return m.vmiRunning(name)
}

// vmiEvents are the messages of the VMI's events of reason.
func (m *migrations) vmiEvents(vmi *kubevirtv1.VirtualMachineInstance, reason string) []string {
	m.t.Helper()
	events := &corev1.EventList{}
	require.NoError(m.t, m.kube.List(context.Background(), events, client.InNamespace(vmi.Namespace)))
	var out []string
	for _, e := range events.Items {
		if e.InvolvedObject.UID == vmi.UID && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// shapeOf is the CPU sockets and guest memory the VMI's guest has, as its
// status says.
func shapeOf(vmi *kubevirtv1.VirtualMachineInstance) (uint32, string) {
	return vmi.Status.CurrentCPUTopology.Sockets, vmi.Status.Memory.GuestCurrent.String()
}

// TestAHotPlugCompletesThroughAWorkloadUpdateMigration pins how KubeVirt
// completes a CPU or memory hot-plug of a LiveMigratable VMI: its workload
// updater makes exactly one migration, and the VMI's status takes the new
// shape (and loses the condition) only as that migration moves it to its
// target, never before.
func TestAHotPlugCompletesThroughAWorkloadUpdateMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	m := &migrations{t: t, c: c, kube: c.Client}
	cases := map[string]struct {
		change     func(*kubevirtv1.DomainSpec)
		conditions []kubevirtv1.VirtualMachineInstanceConditionType
		sockets    uint32
		memory     string
	}{
		"Sockets": {
			change:     func(d *kubevirtv1.DomainSpec) { d.CPU.Sockets = 2 },
			conditions: []kubevirtv1.VirtualMachineInstanceConditionType{kubevirtv1.VirtualMachineInstanceVCPUChange},
			sockets:    2, memory: "1Gi",
		},
		"GuestMemory": {
			change:     func(d *kubevirtv1.DomainSpec) { d.Memory.Guest = ptr(resource.MustParse("2Gi")) },
			conditions: []kubevirtv1.VirtualMachineInstanceConditionType{kubevirtv1.VirtualMachineInstanceMemoryChange},
			sockets:    1, memory: "2Gi",
		},
		"Both": {
			change: func(d *kubevirtv1.DomainSpec) { d.CPU.Sockets, d.Memory.Guest = 3, ptr(resource.MustParse("3Gi")) },
			conditions: []kubevirtv1.VirtualMachineInstanceConditionType{
				kubevirtv1.VirtualMachineInstanceVCPUChange, kubevirtv1.VirtualMachineInstanceMemoryChange,
			},
			sockets: 3, memory: "3Gi",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vm := strings.ToLower("hp-" + name)
			first := m.hotpluggableVM(vm, corev1.ReadWriteMany)
			sockets0, memory0 := shapeOf(first)
			m.resize(vm, tc.change)

			// The VMI keeps its shape until it takes the whole new one,
			// which the checks below show came with the migration.
			vmi := first
			require.Eventually(t, func() bool {
				vmi = m.vmi(vm)
				sockets, memory := shapeOf(vmi)
				if sockets == tc.sockets && memory == tc.memory {
					return true
				}
				assert.Equal(t, []any{sockets0, memory0}, []any{sockets, memory}, "a shape between the two")
				return false
			}, 10*time.Second, 5*time.Millisecond)
			updates := m.workloadUpdates(vm)
			require.Len(t, updates, 1, "exactly one workload update migration")
			mig := updates[0]
			s := vmi.Status.MigrationState
			require.NotNil(t, s, "the shape came with a migration")
			assert.Equal(t, mig.UID, s.MigrationUID, "the workload updater's")
			assert.True(t, s.Completed && !s.Failed && s.TargetNodeDomainReadyTimestamp != nil, "%+v", s)
			assert.Equal(t, s.TargetNode, vmi.Status.NodeName, "the VMI runs on the target, in a pod of the new shape")
			assert.NotEqual(t, first.Status.NodeName, vmi.Status.NodeName)
			for _, cond := range tc.conditions {
				assert.Empty(t, vmiCondition(vmi, cond), "%s cleared with the shape", cond)
			}
			assert.Equal(t, first.UID, vmi.UID, "the same VMI, moved")

			assert.True(t, strings.HasPrefix(mig.Name, WorkloadUpdatePrefix), mig.Name)
			assert.Equal(t, kubevirtv1.MigrationSucceeded, m.final(mig.Name).Status.Phase)
			assert.Equal(t, []string{"Created Migration " + mig.Name + " for automated workload update"}, m.vmiEvents(vmi, ReasonSuccessfulCreate))
			assert.Never(t, func() bool { return len(m.workloadUpdates(vm)) != 1 }, 10*c.Controller.step, 10*time.Millisecond, "no second migration")
		})
	}
}

// TestAHotPlugWhoseMigrationFailsWaitsForTheRetry pins what follows a
// failed workload update migration: the VMI keeps its shape and its
// condition, and the workload updater makes another migration, which
// virt-controller holds in its backoff before it moves the VMI and the
// hot-plug completes.
func TestAHotPlugWhoseMigrationFailsWaitsForTheRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	m := &migrations{t: t, c: c, kube: c.Client}
	ctx := context.Background()
	first := m.hotpluggableVM("retried", corev1.ReadWriteMany)
	nn := types.NamespacedName{Namespace: DefaultNamespace, Name: "retried"}
	c.Controller.FailNextMigration(nn, "target domain did not start")
	m.resize(nn.Name, func(d *kubevirtv1.DomainSpec) { d.CPU.Sockets = 2 })

	var failed kubevirtv1.VirtualMachineInstanceMigration
	require.Eventually(t, func() bool {
		updates := m.workloadUpdates(nn.Name)
		if len(updates) == 0 || updates[0].Status.Phase != kubevirtv1.MigrationFailed {
			return false
		}
		failed = updates[0]
		return true
	}, 10*time.Second, 10*time.Millisecond)
	vmi := m.vmi(nn.Name)
	assert.Equal(t, uint32(1), vmi.Status.CurrentCPUTopology.Sockets, "not applied: the guest never left")
	assert.Equal(t, corev1.ConditionTrue, vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange), "the hot-plug still waits")
	assert.Equal(t, first.Status.NodeName, vmi.Status.NodeName)

	var retry kubevirtv1.VirtualMachineInstanceMigration
	require.Eventually(t, func() bool {
		updates := m.workloadUpdates(nn.Name)
		if len(updates) != 2 || len(m.vmiEvents(vmi, ReasonMigrationBackoff)) == 0 {
			return false
		}
		retry = updates[1]
		return true
	}, 10*time.Second, 10*time.Millisecond, "a second migration, held in backoff")
	assert.NotEqual(t, failed.UID, retry.UID)
	assert.Equal(t, []string{"backoff migrating vmi " + nn.String()}, m.vmiEvents(vmi, ReasonMigrationBackoff))
	assert.Never(t, func() bool {
		mig := &kubevirtv1.VirtualMachineInstanceMigration{}
		require.NoError(t, m.kube.Get(ctx, client.ObjectKeyFromObject(&retry), mig))
		return mig.Status.Phase != kubevirtv1.MigrationPending || m.vmi(nn.Name).Status.CurrentCPUTopology.Sockets != 1
	}, 10*c.Controller.step, 10*time.Millisecond, "held Pending for the backoff, the shape unchanged")

	// KubeVirt's own tests skip the backoff (20 s) so.
	require.NoError(t, retryUpdate(ctx, m.kube, &retry, func(mig *kubevirtv1.VirtualMachineInstanceMigration) {
		mig.Annotations[kubevirtv1.FuncTestForceIgnoreMigrationBackoffAnnotation] = ""
	}))
	assert.Equal(t, kubevirtv1.MigrationSucceeded, m.final(retry.Name).Status.Phase)
	vmi = m.vmi(nn.Name)
	assert.Equal(t, uint32(2), vmi.Status.CurrentCPUTopology.Sockets, "applied by the retry")
	assert.Empty(t, vmiCondition(vmi, kubevirtv1.VirtualMachineInstanceVCPUChange))
	assert.Equal(t, retry.UID, vmi.Status.MigrationState.MigrationUID)
}

// retryUpdate changes obj as change says and writes it, again on a
// conflict.
func retryUpdate[T client.Object](ctx context.Context, kube client.Client, obj T, change func(T)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change(obj)
		return kube.Update(ctx, obj)
	})
}
