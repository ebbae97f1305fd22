package benchmark

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// agentMetrics is an agent's /metrics as the idle scenario reads it, with
// series it must leave alone.
const agentMetrics = `# HELP virtfleet_agent_resync_duration_seconds How long one full resync took: {with braces}.
# TYPE virtfleet_agent_resync_duration_seconds histogram
virtfleet_agent_resync_duration_seconds_bucket{le="0.01"} 1
virtfleet_agent_resync_duration_seconds_bucket{le="0.05"} 3
virtfleet_agent_resync_duration_seconds_bucket{le="1"} 4
virtfleet_agent_resync_duration_seconds_bucket{le="+Inf"} 4
virtfleet_agent_resync_duration_seconds_sum 0.62
virtfleet_agent_resync_duration_seconds_count 4
# TYPE virtfleet_agent_driver_call_duration_seconds histogram
virtfleet_agent_driver_call_duration_seconds_bucket{operation="ensure",result="success",le="+Inf"} 200
virtfleet_agent_driver_call_duration_seconds_sum{operation="ensure",result="success"} 1.5
virtfleet_agent_driver_call_duration_seconds_count{operation="ensure",result="success"} 200
virtfleet_agent_driver_call_duration_seconds_bucket{operation="ensure",result="failure",le="+Inf"} 3
virtfleet_agent_driver_call_duration_seconds_sum{operation="ensure",result="failure"} 0.1
virtfleet_agent_driver_call_duration_seconds_count{operation="ensure",result="failure"} 3
virtfleet_agent_driver_call_duration_seconds_bucket{operation="list",result="success",le="+Inf"} 4
virtfleet_agent_driver_call_duration_seconds_sum{operation="list",result="success"} 0.2
virtfleet_agent_driver_call_duration_seconds_count{operation="list",result="success"} 4
# TYPE virtfleet_agent_guests gauge
virtfleet_agent_guests{phase="Running"} 200
`

func TestParseAgentSample(t *testing.T) {
	s, err := parseAgentSample(strings.NewReader(agentMetrics))
	require.NoError(t, err)
	assert.Equal(t, agentSample{
		resyncs:       4,
		resyncSeconds: 0.62,
		resyncBuckets: map[float64]float64{0.01: 1, 0.05: 3, 1: 4, math.Inf(1): 4},
		ensures:       203,
	}, s)
}

func TestParseAgentSampleRefusesWhatItCannotRead(t *testing.T) {
	const histogram = "# TYPE virtfleet_agent_resync_duration_seconds histogram\n"
	for name, text := range map[string]string{
		"AValueThatIsNoNumber": histogram + "virtfleet_agent_resync_duration_seconds_count many\n",
		"ABucketWithoutABound": histogram + `virtfleet_agent_resync_duration_seconds_bucket{le="soon"} 1` + "\n",
		"AMissingValue":        `virtfleet_agent_driver_call_duration_seconds_count{operation="ensure",result="success"}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseAgentSample(strings.NewReader(text))
			assert.Error(t, err)
		})
	}
}

func TestResyncsBetween(t *testing.T) {
	before := agentSample{resyncs: 1, resyncSeconds: 0.005, resyncBuckets: map[float64]float64{0.01: 1, 0.05: 1, 1: 1, math.Inf(1): 1}}
	cases := []struct {
		name       string
		after      agentSample
		wantN      int
		wantMean   float64
		wantAtMost float64
	}{
		{
			name:  "the mean of the new ones, and the lowest bucket that holds them all",
			after: agentSample{resyncs: 3, resyncSeconds: 0.065, resyncBuckets: map[float64]float64{0.01: 1, 0.05: 3, 1: 3, math.Inf(1): 3}},
			wantN: 2, wantMean: 0.03, wantAtMost: 0.05,
		},
		{
			name:  "one slower than every bound is only under +Inf",
			after: agentSample{resyncs: 2, resyncSeconds: 90.005, resyncBuckets: map[float64]float64{0.01: 1, 0.05: 1, 1: 1, math.Inf(1): 2}},
			wantN: 1, wantMean: 90, wantAtMost: math.Inf(1),
		},
		{
			name:  "none since is nothing",
			after: before,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, mean, atMost := resyncsBetween(before, tc.after)
			assert.Equal(t, tc.wantN, n)
			assert.InDelta(t, tc.wantMean, mean, 1e-9)
			assert.Equal(t, tc.wantAtMost, atMost)
		})
	}
}

func TestIdleTargets(t *testing.T) {
	met := Idle{ObservedVMs: 200, Resyncs: 2, FullObserveSeconds: 0.02, FullObserveAtMostSeconds: 0.05, IdleVMs: 100, IdleSeconds: 300, AgentCoreShare: 0.002}
	dense := Idle{Scenario: denseLibvirtSpec.name, Driver: driverTest, ObservedVMs: 500, Resyncs: 2, FullObserveSeconds: 3, FullObserveAtMostSeconds: 5, IdleVMs: 500, IdleSeconds: 180, AgentCoreShare: 0.05}
	cases := []struct {
		name   string
		base   Idle
		change func(r *Idle)
		want   []bool
	}{
		{"both within their limits", met, func(*Idle) {}, []bool{true, true}},
		{"a mean within the limit with one resync above it", met, func(r *Idle) { r.FullObserveAtMostSeconds = 2.5 }, []bool{false, true}},
		{"no resync timed", met, func(r *Idle) { r.Resyncs = 0 }, []bool{false, true}},
		{"an agent busier than a hundredth of a core", met, func(r *Idle) { r.AgentCoreShare = 0.011 }, []bool{true, false}},
		{"no idle window", met, func(r *Idle) { r.IdleSeconds = 0 }, []bool{true, false}},
		{"a simulated node is held to the same limits", met, func(r *Idle) {
			r.Scenario, r.Driver, r.FullObserveSeconds = denseSimulatedSpec.name, driverSimulated, 1.5
		}, []bool{false, true}},
		{"the dense node on the test driver is reported, whatever its figures", dense, func(*Idle) {}, []bool{true}},
		{"the dense node on the test driver without a resync timed", dense, func(r *Idle) { r.Resyncs = 0 }, []bool{false}},
		{"the dense node on the test driver without an idle window", dense, func(r *Idle) { r.IdleSeconds = 0 }, []bool{false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.base
			tc.change(&r)
			got := idleTargets(&r)
			require.Len(t, got, len(tc.want))
			for i, w := range tc.want {
				assert.Equal(t, w, got[i].Met, got[i].Name)
			}
		})
	}
	assert.Equal(t, "500 of 500 Running; full observe 3.000 s, mean of 2, each ≤ 5 s (3.000× the 1 s limit); agent CPU idle with 500, 5.000 % of a core (5.00× the 1 % limit); peak RSS 0.0 MiB",
		idleTargets(&Idle{Scenario: denseLibvirtSpec.name, ObservedVMs: 500, Resyncs: 2, FullObserveSeconds: 3, FullObserveAtMostSeconds: 5, FullObserveRatio: 3, IdleVMs: 500, AgentCoreShare: 0.05, IdleRatio: 5})[0].Measured)
	assert.Empty(t, idleTargets(nil), "no scenario, no targets")
}

func TestIdleMarkdown(t *testing.T) {
	var b strings.Builder
	p := func(format string, args ...any) { b.WriteString(fmt.Sprintf(format, args...) + "\n") }
	idleMarkdown(p, &Idle{
		Node: "node1", ObservedVMs: 200, Resyncs: 2, FullObserveSeconds: 0.02, FullObserveAtMostSeconds: 0.05, FullObserveRatio: 0.02,
		IdleVMs: 100, IdleSeconds: 300, AgentCPUSeconds: 0.6, AgentCoreShare: 0.002, IdleRatio: 0.2,
		Notes: []string{"a note"},
	})
	md := b.String()
	assert.Contains(t, md, "## Idle node\n")
	assert.Contains(t, md, "on the test driver")
	assert.Contains(t, md, "Then 100 of the VMs are deleted")
	assert.Contains(t, md, "| full observe of 200 guests (mean of 2 resyncs; each ≤ 0.05 s) | 0.020 s | 1 s | 0.020 |")
	assert.Contains(t, md, "| agent CPU idle with 100 guests | 0.600 s in 300 s = 0.200 % of a core | 1 % | 0.200 |")
	assert.Contains(t, md, "|\n\n- a note\n", "the notes stand apart from the table")

	b.Reset()
	idleMarkdown(p, &Idle{
		Scenario: denseSimulatedSpec.name, Driver: driverSimulated, Node: "node1", ObservedVMs: 1000, Resyncs: 2,
		ResyncWindowSeconds: 120, ResyncWindowCPUSeconds: 1.2, IdleVMs: 1000, IdleSeconds: 300, AgentPeakRSSBytes: 64 << 20,
	})
	md = b.String()
	assert.Contains(t, md, "## Dense node: 1000 guests (simulated)\n")
	assert.Contains(t, md, "agent/driver/fake")
	assert.Contains(t, md, "Then the agent, with the same guests, is idle for 300 s")
	assert.Contains(t, md, "| 1.200 s in 120 s = 1.000 % of a core | | |")
	assert.Contains(t, md, "| agent peak RSS | 64.0 MiB | | |")

	b.Reset()
	idleMarkdown(p, nil)
	assert.Empty(t, b.String(), "no scenario, no section")
}
