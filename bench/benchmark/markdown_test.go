package benchmark

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTargetsJudgeIssue40sGoals pins how a result is judged: the burst of
// 1000 against the whole flow's limit measured after it (rate and machine
// CPU per VM), the same over simulated nodes, and the largest burst over
// simulated nodes by its time,
// the hub's memory, duplicate addresses and the hub's CPU per VM against
// the smallest's.
func TestTargetsJudgeIssue40sGoals(t *testing.T) {
	burst := Scenario{
		Name: "burst-1000", VMs: 1000, Running: 1000, VMsPerSecond: 40, RatioToWholeFlow: 0.8,
		CPU:       CPUShare{MachineSeconds: 50},
		WholeFlow: &Limit{VMs: 1000, VMsPerSecond: 50, CPU: &CPUShare{MachineSeconds: 42}},
	}
	small := Scenario{
		Name: "simulated-1000", VMs: 1000, Running: 1000, HubCPUSecondsPer1000VM: 10, AddressedVMs: 1000,
		VMsPerSecond: 45, RatioToWholeFlow: 0.9, CPU: CPUShare{MachineSeconds: 40},
		WholeFlow: &Limit{VMs: 1000, VMsPerSecond: 50, CPU: &CPUShare{MachineSeconds: 42}},
	}
	big := Scenario{Name: "simulated-10000", VMs: 10000, Nodes: 100, Running: 10000, WallSeconds: 300, HubPeakRSSBytes: 400 << 20, HubCPUSecondsPer1000VM: 11.5, AddressedVMs: 10000}

	cases := map[string]struct {
		change func(r *Result)
		want   map[string]bool
	}{
		"AllMet": {change: func(*Result) {}, want: map[string]bool{
			"burst of 1000: rate vs whole-flow limit":                                      true,
			"burst of 1000: machine CPU per VM vs whole-flow limit's":                      true,
			"10000 VMs over 100 simulated nodes: all Running":                              true,
			"10000 VMs over simulated nodes: hub peak RSS":                                 true,
			"10000 VMs over simulated nodes: addresses shown twice on a network":           true,
			"hub CPU per VM at 10000 vs at 1000 VMs (simulated nodes)":                     true,
			"burst of 1000 over simulated nodes: rate vs whole-flow limit":                 true,
			"burst of 1000 over simulated nodes: machine CPU per VM vs whole-flow limit's": true,
		}},
		"SlowAndCostly": {change: func(r *Result) {
			r.Bursts[0].RatioToWholeFlow, r.Bursts[0].CPU.MachineSeconds = 0.55, 76.5
			r.Scale[1].WallSeconds, r.Scale[1].HubPeakRSSBytes, r.Scale[1].HubCPUSecondsPer1000VM = 361, 501<<20, 12.1
			r.Scale[1].DuplicateAddresses = 1
			r.Scale[0].RatioToWholeFlow, r.Scale[0].CPU.MachineSeconds = 0.7, 53
		}, want: map[string]bool{
			"burst of 1000: rate vs whole-flow limit":                                      false,
			"burst of 1000: machine CPU per VM vs whole-flow limit's":                      false,
			"10000 VMs over 100 simulated nodes: all Running":                              false,
			"10000 VMs over simulated nodes: hub peak RSS":                                 false,
			"10000 VMs over simulated nodes: addresses shown twice on a network":           false,
			"hub CPU per VM at 10000 vs at 1000 VMs (simulated nodes)":                     false,
			"burst of 1000 over simulated nodes: rate vs whole-flow limit":                 false,
			"burst of 1000 over simulated nodes: machine CPU per VM vs whole-flow limit's": false,
		}},
		"NotAllRunning": {change: func(r *Result) { r.Scale[1].Running = 9999 }, want: map[string]bool{
			"10000 VMs over 100 simulated nodes: all Running": false,
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			wf := *burst.WholeFlow
			cpu := *wf.CPU
			wf.CPU = &cpu
			b := burst
			b.WholeFlow = &wf
			r := &Result{Bursts: []Scenario{b}, Scale: []Scenario{small, big}}
			tc.change(r)
			got := map[string]bool{}
			for _, tg := range Targets(r) {
				got[tg.Name] = tg.Met
			}
			for target, met := range tc.want {
				require.Contains(t, got, target)
				assert.Equal(t, met, got[target], target)
			}
		})
	}
}

// TestNoScaleNoScaleTargets pins that a run without bursts over simulated
// nodes is not judged on them.
func TestNoScaleNoScaleTargets(t *testing.T) {
	assert.Empty(t, scaleTargets(nil))
}
