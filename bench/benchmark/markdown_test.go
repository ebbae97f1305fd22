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
// the next smaller burst's.
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
		"WavesWritesAndAFullBucket": {change: func(r *Result) {
			r.Scale[1].Stalls = Stalls{Count: 2, LongestSeconds: 4.5, AtSeconds: 10, Waiting: 700}
			r.Scale[1].Writes = []RequestCount{{Request: "PUT virtualmachines 200", PerVM: 3}, {Request: "POST events 201", PerVM: 2.1}}
			r.Scale[1].Footprint = &Footprint{Buckets: []BucketFill{{Bucket: "nodes", Bytes: 1, MaxBytes: 10}, {Bucket: "intents", Bytes: 8, MaxBytes: 10}}}
		}, want: map[string]bool{
			"1000 VMs over simulated nodes: no waves (gaps of ≥ 2 s with no VM reaching Running while placed VMs wait)":  true,
			"10000 VMs over simulated nodes: no waves (gaps of ≥ 2 s with no VM reaching Running while placed VMs wait)": false,
			"10000 VMs over simulated nodes: API writes per VM (all of virtfleet's and events, the create included)":     false,
			"1000 VMs over simulated nodes: API writes per VM (all of virtfleet's and events, the create included)":      true,
			"10000 VMs over simulated nodes: the fullest NATS bucket's share of its limit":                               false,
		}},
		"AHundredThousandJudgedOnItsOwnGoalsAndAgainstTenThousand": {change: func(r *Result) {
			r.Scale = append(r.Scale, Scenario{
				Name: "simulated-100000", VMs: 100000, Nodes: 1000, Running: 100000, WallSeconds: 2800, HubPeakRSSBytes: 1900 << 20,
				HubCPUSecondsPer1000VM: 13, AddressedVMs: 100000,
				Footprint: &Footprint{Buckets: []BucketFill{{Bucket: "intents", Bytes: 7, MaxBytes: 10}}},
			})
		}, want: map[string]bool{
			"100000 VMs over 1000 simulated nodes: all Running":                             false,
			"100000 VMs over simulated nodes: hub peak RSS":                                 true,
			"hub CPU per VM at 100000 vs at 10000 VMs (simulated nodes)":                    true,
			"hub CPU per VM at 10000 vs at 1000 VMs (simulated nodes)":                      true,
			"10000 VMs over 100 simulated nodes: all Running":                               true,
			"100000 VMs over simulated nodes: the fullest NATS bucket's share of its limit": true,
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

// TestAQuickRunJudgesItsLargestBurstOnTheSmallestGoal pins that a run of
// no goal's size is still judged, as the smallest goal's.
func TestAQuickRunJudgesItsLargestBurstOnTheSmallestGoal(t *testing.T) {
	got := map[string]bool{}
	for _, tg := range scaleTargets([]Scenario{{VMs: 4, Nodes: 1, Running: 4, WallSeconds: 3, AddressedVMs: 4}, {VMs: 8, Nodes: 2, Running: 8, WallSeconds: 5, AddressedVMs: 8}}) {
		got[tg.Name] = tg.Met
	}
	assert.Equal(t, map[string]bool{
		"8 VMs over 2 simulated nodes: all Running":                                                              true,
		"8 VMs over simulated nodes: hub peak RSS":                                                               true,
		"8 VMs over simulated nodes: addresses shown twice on a network":                                         true,
		"4 VMs over simulated nodes: no waves (gaps of ≥ 2 s with no VM reaching Running while placed VMs wait)": true,
		"8 VMs over simulated nodes: no waves (gaps of ≥ 2 s with no VM reaching Running while placed VMs wait)": true,
		"4 VMs over simulated nodes: API writes per VM (all of virtfleet's and events, the create included)":     true,
		"8 VMs over simulated nodes: API writes per VM (all of virtfleet's and events, the create included)":     true,
	}, got, "no hub CPU growth without a CPU figure of the smaller burst")
}

// TestNoScaleNoScaleTargets pins that a run without bursts over simulated
// nodes is not judged on them.
func TestNoScaleNoScaleTargets(t *testing.T) {
	assert.Empty(t, scaleTargets(nil))
}

// TestAStoppedRunSaysWhereAndKeepsWhatRan pins that a run that failed part
// way is written with the scenarios before the failure, judged, and why
// it stopped.
func TestAStoppedRunSaysWhereAndKeepsWhatRan(t *testing.T) {
	r := &Result{Scenarios: []string{"scale (10, 100 VMs over simulated nodes)"}, Scale: []Scenario{{Name: "simulated-10", VMs: 10, Nodes: 1, Running: 10, WallSeconds: 1, AddressedVMs: 10}}}
	got, err := r.stop(assert.AnError)
	require.ErrorIs(t, err, assert.AnError)
	require.Same(t, r, got)
	assert.Equal(t, assert.AnError.Error(), got.Stopped)
	assert.NotEmpty(t, got.Targets, "the scenarios before the failure are judged")
	assert.Contains(t, Markdown(got), "**The run stopped before its end**: "+assert.AnError.Error())
	assert.NotContains(t, Markdown(&Result{Scenarios: r.Scenarios}), "stopped before its end")
}
