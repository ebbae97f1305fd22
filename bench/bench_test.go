package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/virtfleet/virtfleet/bench/benchmark"
)

// TestQuick runs the harness at its quick sizes on the real stack and checks
// the result files: every scenario's VMs reached Running, the numbers are
// sane, and both files say the same. It tests the harness, not virtfleet's
// speed: targets are reported, never asserted.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack twice; skipped with -short")
	}
	ctrl.SetLogger(logr.Discard())
	o := benchmark.Quick()
	o.Dir = t.TempDir()
	r, err := benchmark.Run(context.Background(), o)
	require.NoError(t, err)
	out := t.TempDir()
	md, js, err := benchmark.Write(r, out)
	require.NoError(t, err)

	got, err := benchmark.Read(js)
	require.NoError(t, err)
	assert.True(t, got.Quick)
	assert.NotEmpty(t, got.Commit)
	assert.Positive(t, got.Machine.CPUs)
	assert.Positive(t, got.Machine.MemoryBytes)

	require.NotNil(t, got.Density)
	scenarios := append(append([]benchmark.Scenario{*got.Density}, got.Bursts...), got.Scale...)
	require.Len(t, got.Bursts, len(o.Sizes))
	require.Len(t, got.Scale, len(o.Scale))
	for _, s := range got.Scale {
		assert.Equal(t, s.VMs, s.AddressedVMs, "%s: every VM over simulated nodes shows the address the hub allocated", s.Name)
		assert.Zero(t, s.DuplicateAddresses, s.Name)
		require.NotNil(t, s.WholeFlow, "%s: the whole-flow limit after a small burst over simulated nodes", s.Name)
		if assert.NotNil(t, s.HubRestart, "%s: the hub killed and restarted", s.Name) {
			assert.Empty(t, s.HubRestart.Error, "%s: the restart was measured", s.Name)
			assert.False(t, s.HubRestart.TimedOut, "%s: the restarted hub observes every VM", s.Name)
			assert.GreaterOrEqual(t, s.HubRestart.Observes, float64(s.HubRestart.VMs), s.Name)
		}
		assert.Nil(t, s.RawLibvirt, "%s: no libvirt under simulated nodes", s.Name)
		assert.InDelta(t, s.VMsPerSecond/s.WholeFlow.VMsPerSecond, s.RatioToWholeFlow, 1e-9)
	}
	for _, s := range scenarios {
		t.Run(s.Name, func(t *testing.T) {
			assert.Equal(t, s.VMs, s.Running, "every VM reached Running; notes: %v", s.Notes)
			assert.Equal(t, s.VMs, s.Latency.Count)
			assert.Positive(t, s.Latency.P50)
			assert.LessOrEqual(t, s.Latency.P50, s.Latency.P95)
			assert.LessOrEqual(t, s.Latency.P95, s.Latency.P99)
			assert.LessOrEqual(t, s.Latency.P99, s.Latency.Max)
			assert.LessOrEqual(t, s.Latency.Max, s.WallSeconds+0.001, "no VM took longer than the whole run")
			assert.Positive(t, s.VMsPerSecond)
			assert.GreaterOrEqual(t, s.VMWritesPerVM, 1.0, "at least the Create itself")
			assert.Positive(t, s.HubPeakRSSBytes)
			assert.Positive(t, s.AgentPeakRSSBytes)
			assert.GreaterOrEqual(t, s.AgentMaxPeakRSSBytes, s.AgentPeakRSSBytes)
			total := 0
			for _, n := range s.PerNode {
				total += n
			}
			assert.Equal(t, s.VMs, total, "every VM is on a node")
			assert.NotContains(t, s.PerNode, "", "no VM without a node")
		})
	}
	for _, s := range got.Bursts {
		require.NotNil(t, s.RawLibvirt, "%s: raw libvirt limit", s.Name)
		require.NotNil(t, s.ControlPlane, "%s: control-plane limit", s.Name)
		assert.Equal(t, s.VMs, s.RawLibvirt.VMs)
		assert.Positive(t, s.RawLibvirt.VMsPerSecond)
		assert.Positive(t, s.ControlPlane.VMsPerSecond)
		assert.InDelta(t, s.VMsPerSecond/s.ControlPlane.VMsPerSecond, s.RatioToControlPlane, 1e-9)
		require.NotNil(t, s.WholeFlow, "%s: whole-flow limit", s.Name)
		assert.Equal(t, s.VMs, s.WholeFlow.VMs)
		assert.Equal(t, 6, s.WholeFlow.WritesPerVM, "VM create, binding and status; Volume patch and status; NetworkAddress")
		assert.NotNil(t, s.WholeFlow.CPU, "%s: the whole flow's CPU", s.Name)
		assert.InDelta(t, s.VMsPerSecond/s.WholeFlow.VMsPerSecond, s.RatioToWholeFlow, 1e-9)
	}
	assert.NotEmpty(t, got.Targets)

	b, err := os.ReadFile(md)
	require.NoError(t, err)
	text := string(b)
	assert.Equal(t, filepath.Dir(md), out)
	assert.Equal(t, strings.TrimSuffix(md, ".md"), strings.TrimSuffix(js, ".json"), "the two files share a name")
	for _, want := range []string{"## Targets", "## Density", "## Burst", "## Scale", "## API writes by request", got.Commit, "create→Running p99"} {
		assert.Contains(t, text, want)
	}
}
