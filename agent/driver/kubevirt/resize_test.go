package kubevirt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestVCPUsAndMemoryChangeLiveWithinTheMaxima walks one running guest
// through changes of its vCPUs and memory on the stand-in's LiveUpdate
// rollout: within the maxima the VM was made with they reach the running
// VMI (the same VMI, never restarted) and the report, each through one
// migration KubeVirt's workload updater makes, which moves the guest to
// the other node; beyond, or where KubeVirt refuses them live, the guest
// runs on as it is, RestartRequired exactly while KubeVirt says so, with
// the field and its maximum named.
func TestVCPUsAndMemoryChangeLiveWithinTheMaxima(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.VCPU = 1
	e.sharedRoot(m)
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Equal(t, int32(driver.DefaultMaxRatio), o.MaxVCPU, "the maximum set when it started")
	assert.Equal(t, int64(driver.DefaultMaxRatio<<30), o.MaxMemoryBytes)
	first := e.vmi(m.UID)
	node, moved := o.Node, map[types.UID]bool{}

	steps := []struct {
		name           string
		vcpu           int32
		memory         int64
		restart        bool
		message        string
		vcpuRuns       int32
		memoryRuns     int64
		restartRequire bool
	}{
		{name: "OneVCPUMoreIsHotPlugged", vcpu: 2, memory: 1 << 30, vcpuRuns: 2, memoryRuns: 1 << 30},
		{name: "MoreMemoryIsHotPlugged", vcpu: 2, memory: 2 << 30, vcpuRuns: 2, memoryRuns: 2 << 30},
		{name: "BothAtOnce", vcpu: 4, memory: 3 << 30, vcpuRuns: 4, memoryRuns: 3 << 30},
		{
			name: "VCPUsBeyondTheMaximumWaitForARestart", vcpu: 5, memory: 3 << 30, vcpuRuns: 4, memoryRuns: 3 << 30, restartRequire: true,
			message: "vcpu 5 is more than the 4 the running guest can have (its maximum); it applies at the next start",
		},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			m.VCPU, m.MemoryBytes = s.vcpu, s.memory
			o := e.ensureUntil(m, func(o driver.Observation) bool {
				return o.RestartRequired == s.restartRequire && o.VCPU == s.vcpuRuns && o.MemoryBytes == s.memoryRuns
			})
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.Contains(t, o.Message, s.message)
			if !s.restartRequire {
				assert.Empty(t, o.Message, "the guest has all it asked for")
			}
			// Observe reads the driver's informer cache, which may not
			// hold yet the VM Ensure just wrote or read past it.
			assert.Eventually(t, func() bool {
				seen, err := e.d.Observe(context.Background(), m.UID)
				return err == nil && seen.RestartRequired == o.RestartRequired
			}, 10*time.Second, 20*time.Millisecond, "Observe says what Ensure said")
			vmi := e.vmi(m.UID)
			assert.Equal(t, first.UID, vmi.UID, "the same VMI")
			assert.Equal(t, first.CreationTimestamp, vmi.CreationTimestamp)
			assert.Zero(t, o.RestartCount, "never restarted")
			updates := e.workloadUpdates()
			if s.restartRequire {
				assert.Len(t, updates, len(moved), "no migration for what waits for a restart")
				return
			}
			require.Len(t, updates, len(moved)+1, "one migration per hot-plug")
			last, ok := updates[vmi.Status.MigrationState.MigrationUID]
			require.True(t, ok, "the shape came with a migration of the workload updater")
			assert.False(t, moved[last.UID], "a new one")
			moved[last.UID] = true
			// KubeVirt marks the migration Succeeded after the target
			// applied the shape, in a write of its own.
			assert.Eventually(t, func() bool {
				return e.workloadUpdates()[last.UID].Status.Phase == kubevirtv1.MigrationSucceeded
			}, 30*time.Second, 20*time.Millisecond, "the workload update migration succeeds")
			assert.Equal(t, vmi.Status.NodeName, o.Node, "the node it moved the guest to")
			assert.Equal(t, otherNode[node], o.Node)
			node = o.Node
		})
	}

	t.Run("TheRestartStartsTheNewShapeWithAMaximumThatHoldsIt", func(t *testing.T) {
		m.RestartNonce = "grow"
		o := e.ensureUntil(m, func(o driver.Observation) bool {
			return o.Phase == driver.PhaseRunning && !o.RestartRequired && o.RestartCount == 1
		})
		assert.Equal(t, int32(5), o.VCPU)
		assert.Equal(t, int32(5*driver.DefaultMaxRatio), o.MaxVCPU)
		assert.Equal(t, int64(driver.DefaultMaxRatio<<30), o.MaxMemoryBytes, "memory kept its maximum: it held the shape")
	})
}

// TestWhatKubeVirtDoesNotHotPlugWaitsForARestart pins the changes that
// KubeVirt's RestartRequired, not the driver, decides need a restart.
func TestWhatKubeVirtDoesNotHotPlugWaitsForARestart(t *testing.T) {
	cases := map[string]struct {
		migratable   bool
		vcpu         int32
		memory       int64
		kubevirtSays string
	}{
		"FewerVCPUs": {migratable: true, vcpu: 1, memory: 2 << 30, kubevirtSays: "KubeVirt: Reduction of CPU socket count requires a restart"},
		"LessMemoryThanItStartedWith": {migratable: true, vcpu: 2, memory: 1 << 30,
			kubevirtSays: "KubeVirt: memory updated in template spec to a value lower than what the VM started with"},
		"MemoryOfAGuestKubeVirtCannotMigrate": {vcpu: 2, memory: 3 << 30,
			kubevirtSays: "KubeVirt: memory updated in template spec. Memory-hotplug is only available for migratable VMs"},
		// KubeVirt takes the sockets into the VMI and never moves it into
		// a pod that has them.
		"VCPUsOfAGuestKubeVirtCannotMigrate": {vcpu: 3, memory: 2 << 30,
			kubevirtSays: "KubeVirt adds vCPUs to a running guest only by migrating it live, and cannot migrate it (DisksNotLiveMigratable: "},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			m := e.machine()
			m.VCPU, m.MemoryBytes = 2, 2<<30
			if tc.migratable {
				e.sharedRoot(m)
			}
			e.ensureUntil(m, phaseIs(driver.PhaseRunning))
			first := e.vmi(m.UID)
			m.VCPU, m.MemoryBytes = tc.vcpu, tc.memory
			o := e.ensureUntil(m, func(o driver.Observation) bool { return o.RestartRequired })
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.Contains(t, o.Message, tc.kubevirtSays)
			assert.Equal(t, int32(2), o.VCPU, "the guest runs as it was")
			assert.Equal(t, int64(2<<30), o.MemoryBytes)
			assert.Equal(t, first.UID, e.vmi(m.UID).UID)

			m.RestartNonce = "apply"
			o = e.ensureUntil(m, func(o driver.Observation) bool { return o.Phase == driver.PhaseRunning && !o.RestartRequired })
			assert.Equal(t, tc.vcpu, o.VCPU, "the restart applied it")
			assert.Equal(t, tc.memory, o.MemoryBytes)
		})
	}
}

// TestAGuestMadeBeforeLiveResizeRunsOnUntouched runs the VM an agent from
// before live resize made (testdata) and ensures it with the same
// Machine: neither rewritten nor RestartRequired. Its vCPUs are cores, so
// a new vCPU count takes a restart, after which it resizes live.
func TestAGuestMadeBeforeLiveResizeRunsOnUntouched(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	old := legacyVM(t)
	old.Namespace = e.ns
	m := testMachine(old.Labels[LabelUID])
	e.sharedRoot(m)
	old.Annotations[AnnotationRestartNonce], old.Annotations[AnnotationRestarts] = "", "0"
	require.NoError(t, e.kube.Create(ctx, old))
	created := e.vm(m.UID)

	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.False(t, o.RestartRequired)
	assert.Equal(t, created.Generation, e.vm(m.UID).Generation, "its spec is not rewritten")
	assert.Equal(t, created.Spec.Template.Spec.Domain, e.vm(m.UID).Spec.Template.Spec.Domain)
	assert.Zero(t, o.MaxVCPU, "the driver cannot resize its cores live")

	m.VCPU = 3
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.RestartRequired })
	assert.Equal(t, int32(2), o.VCPU)
	m.RestartNonce = "upgrade"
	o = e.ensureUntil(m, func(o driver.Observation) bool {
		return o.Phase == driver.PhaseRunning && !o.RestartRequired && o.VCPU == 3
	})
	restarted := e.vmi(m.UID)
	assert.Equal(t, kubevirtv1.CPU{Sockets: 3, Cores: 1, Threads: 1, MaxSockets: 3 * driver.DefaultMaxRatio}, *restarted.Spec.Domain.CPU)

	m.VCPU = 4
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.VCPU == 4 })
	assert.False(t, o.RestartRequired)
	assert.Equal(t, restarted.UID, e.vmi(m.UID).UID, "live")
}
