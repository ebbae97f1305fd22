package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestCheck(t *testing.T) {
	running := VM{Name: "a", UID: "u-a", WantRunning: true, Phase: "Running", Node: "n1"}
	stopped := VM{Name: "b", UID: "u-b", WantRunning: false, Phase: "Stopped", Node: "n2"}
	domA := Domain{UUID: "u-a", Name: "a", Active: true}
	domB := Domain{UUID: "u-b", Name: "b", Active: false}
	testDom := Domain{UUID: "u-test", Name: testDriverDomain, Active: true}
	want := map[string]bool{"a": true, "b": true}

	cases := map[string]struct {
		want    map[string]bool
		vms     []VM
		domains map[string][]Domain
		kinds   []Kind
	}{
		"ConvergedFleetHasNoProblems": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {domA, testDom}, "n2": {domB}},
		},
		"TheTestDriversOwnDomainIsNoOrphan": {
			want: map[string]bool{}, domains: map[string][]Domain{"n1": {testDom}, "n2": {testDom}},
		},
		"VMGoneFromTheAPIIsLost": {
			want: want, vms: []VM{running},
			domains: map[string][]Domain{"n1": {domA}, "n2": {domB}},
			kinds:   []Kind{Lost, Orphaned},
		},
		"VMBeingDeletedThatWasNotDeletedIsLost": {
			want: want, vms: []VM{running, {Name: "b", UID: "u-b", Deleting: true}},
			domains: map[string][]Domain{"n1": {domA}, "n2": {domB}},
			kinds:   []Kind{Lost},
		},
		"GuestOnTwoNodesIsDuplicated": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {domA}, "n2": {domB, domA}},
			kinds:   []Kind{Duplicated},
		},
		"DomainOfNoVMIsOrphaned": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {domA, {UUID: "u-x", Name: "x"}}, "n2": {domB}},
			kinds:   []Kind{Orphaned},
		},
		"AnIntentionallyOrphanedGuestIsOwnedByNobodyButNotLost": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {domA, {UUID: "u-x", Name: "x", Owner: "u-x", Orphaned: true}}, "n2": {domB}},
		},
		"AnAdoptedGuestBelongsToItsNewVM": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {{UUID: "u-old", Name: "a", Active: true, Owner: "u-a"}}, "n2": {domB}},
		},
		"AVMWhoseGuestIsStillAnOrphanIsNotConverged": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {{UUID: "u-old", Name: "a", Active: true, Owner: "u-old", Orphaned: true}}, "n2": {domB}},
			kinds:   []Kind{NotConverged},
		},
		"VMWithoutGuestIsNotConverged": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n2": {domB}},
			kinds:   []Kind{NotConverged},
		},
		"GuestInTheWrongPowerStateIsNotConverged": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {domA}, "n2": {{UUID: "u-b", Name: "b", Active: true}}},
			kinds:   []Kind{NotConverged},
		},
		"StatusPhaseBehindTheSpecIsNotConverged": {
			want: want, vms: []VM{running, {Name: "b", UID: "u-b", Phase: "Unknown", Node: "n2"}},
			domains: map[string][]Domain{"n1": {domA}, "n2": {domB}},
			kinds:   []Kind{NotConverged},
		},
		"GuestOnAnotherNodeThanItsStatusIsNotConverged": {
			want: want, vms: []VM{running, stopped},
			domains: map[string][]Domain{"n1": {domA, domB}},
			kinds:   []Kind{NotConverged},
		},
		"DeletedVMStillInTheAPIAndOnItsNodeIsNotConverged": {
			want: map[string]bool{"a": true, "b": false}, vms: []VM{running, {Name: "b", UID: "u-b", Deleting: true, Phase: "Deleting", Node: "n2"}},
			domains: map[string][]Domain{"n1": {domA}, "n2": {domB}},
			kinds:   []Kind{NotConverged, NotConverged},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var kinds []Kind
			for _, p := range Check(tc.want, tc.vms, tc.domains) {
				kinds = append(kinds, p.Kind)
			}
			assert.ElementsMatch(t, tc.kinds, kinds)
		})
	}
}

func TestFatalKeepsOnlyDuplicates(t *testing.T) {
	ps := []Problem{{Kind: NotConverged}, {Kind: Duplicated, Message: "x"}, {Kind: Orphaned}}
	assert.Equal(t, []Problem{{Kind: Duplicated, Message: "x"}}, Fatal(ps))
}

func TestCPURatioFitsEveryVMOnOneNodeFewer(t *testing.T) {
	// 200 VMs on 2 of 3 nodes: 120 vCPUs + margin on 16 CPUs.
	assert.Equal(t, 8.0, cpuRatio(200, 3))
	assert.Equal(t, 4.0, cpuRatio(24, 3), "never below the agent's default")
}

func TestCensus(t *testing.T) {
	vms := []VM{{Name: "a", UID: "u-a"}, {Name: "b", UID: "u-b", Deleting: true}}
	domains := map[string][]Domain{
		"n2": {{UUID: "u-b", Name: "b"}},
		"n1": {
			{UUID: "u-test", Name: testDriverDomain, Active: true},
			{UUID: "u-a", Name: "a", Active: true},
			{UUID: "u-x", Name: "x", Owner: "u-a2"},
			{UUID: "u-o", Name: "a", Owner: "u-o", Orphaned: true, Active: true},
		},
	}
	assert.Equal(t, []string{
		"n1: 3 domains (2 active): 1 of live VMs, 1 orphaned, 1 of no live VM",
		"n2: 1 domains (0 active): 0 of live VMs, 0 orphaned, 1 of no live VM",
	}, Census(vms, domains))
}

func TestPercentileCountsMissingRestartsAsNever(t *testing.T) {
	s := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Second
		}
		return out
	}
	assert.Equal(t, never, Percentile(nil, 0, 0.95), "nothing measured")
	assert.Equal(t, 2*time.Second, Percentile(s(1, 2, 3), 0, 0.5))
	assert.Equal(t, 3*time.Second, Percentile(s(1, 2, 3), 0, 0.95))
	assert.Equal(t, 19*time.Second, Percentile(s(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20), 0, 0.95))
	assert.Equal(t, never, Percentile(s(1, 2, 3), 1, 0.95), "one of four never restarted is beyond p95")
	assert.Equal(t, 2*time.Second, Percentile(s(1, 2, 3), 1, 0.5))
}
