package benchmark

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestStallsAreGapsThatPlacedVMsWaitThrough(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	// vm: created, placed, Running (seconds after start; <0 for never).
	type vm struct{ created, placed, running float64 }
	cases := map[string]struct {
		vms  []vm
		want Stalls
	}{
		"SteadyRate": {
			vms:  []vm{{0, 0.5, 1}, {0, 1, 2}, {0, 2, 3.5}, {0, 3, 5}},
			want: Stalls{},
		},
		"AGapNobodyWaitsThroughIsNoStall": {
			// The third VM is placed only after the gap.
			vms:  []vm{{0, 0.5, 1}, {0, 4, 4.5}},
			want: Stalls{},
		},
		"PlacedVMsWaitingThroughAGap": {
			vms:  []vm{{0, 0.5, 1}, {0, 0.8, 4}, {0, 0.9, 4.1}, {0, 4.5, 5}, {0, 4.8, 8}},
			want: Stalls{Count: 2, LongestSeconds: 3, AtSeconds: 1, Waiting: 2},
		},
		"AVMNeverRunningWaitsThroughEveryLaterGap": {
			vms:  []vm{{0, 0.5, 1}, {0, 0.6, -1}, {0, 2, 3.5}},
			want: Stalls{Count: 1, LongestSeconds: 2.5, AtSeconds: 1, Waiting: 1},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tr := newTracker(len(tc.vms))
			for i, v := range tc.vms {
				n := fmt.Sprintf("vm-%d", i)
				tr.markCreated(n, at(v.created))
				tr.markScheduled(n, at(v.placed))
				if v.running >= 0 {
					tr.markRunning(n, at(v.running))
				}
			}
			got := tr.stalls(start, stallWindow)
			assert.Equal(t, tc.want.Count, got.Count)
			assert.InDelta(t, tc.want.LongestSeconds, got.LongestSeconds, 1e-9)
			assert.InDelta(t, tc.want.AtSeconds, got.AtSeconds, 1e-9)
			assert.Equal(t, tc.want.Waiting, got.Waiting)
		})
	}
}

func TestTimelineCountsEachStage(t *testing.T) {
	start := time.Unix(1000, 0)
	tr := newTracker(2)
	tr.markCreated("a", start.Add(100*time.Millisecond))
	tr.markCreated("b", start.Add(200*time.Millisecond))
	tr.markScheduled("a", start.Add(900*time.Millisecond))
	tr.markScheduled("b", start.Add(1500*time.Millisecond))
	tr.markRunning("a", start.Add(1200*time.Millisecond))
	tr.markRunning("b", start.Add(2500*time.Millisecond))
	assert.Equal(t, []TimelinePoint{
		{Second: 1, Created: 2, Placed: 1, Running: 0},
		{Second: 2, Created: 2, Placed: 2, Running: 1},
		{Second: 3, Created: 2, Placed: 2, Running: 2},
	}, tr.timeline(start, time.Second))
	assert.Nil(t, newTracker(1).timeline(start, time.Second), "nothing Running, no timeline")
}
