package benchmark

import (
	"slices"
	"time"
)

// stallWindow is the longest a burst may go with no VM reaching Running
// while VMs wait past placement: issue 57's "no waves".
const stallWindow = 2 * time.Second

// Stalls are the gaps in a burst between one VM reaching Running and the
// next of at least stallWindow while some VM the hub had placed before
// the gap began was still not Running at its end: the burst advancing in
// waves rather than at a steady rate.
type Stalls struct {
	// Count is how many such gaps there were.
	Count int `json:"count"`
	// LongestSeconds is the longest, AtSeconds when it began (from the
	// first create), and Waiting how many placed VMs waited through it.
	LongestSeconds float64 `json:"longestSeconds"`
	AtSeconds      float64 `json:"atSeconds"`
	Waiting        int     `json:"waiting"`
}

// TimelinePoint is how many VMs of a burst were created, placed and
// Running by Second seconds after the first create.
type TimelinePoint struct {
	Second  int `json:"second"`
	Created int `json:"created"`
	Placed  int `json:"placed"`
	Running int `json:"running"`
}

// stalls finds t's gaps of at least window between VMs reaching Running
// through which a placed VM waited.
func (t *tracker) stalls(start time.Time, window time.Duration) Stalls {
	t.mu.Lock()
	defer t.mu.Unlock()
	running := sortedTimes(t.running)
	var s Stalls
	for i := 1; i < len(running); i++ {
		from, to := running[i-1], running[i]
		if to.Sub(from) < window {
			continue
		}
		waiting := 0
		for name, placed := range t.scheduled {
			if r, ok := t.running[name]; placed.Before(from) && (!ok || !r.Before(to)) {
				waiting++
			}
		}
		if waiting == 0 {
			continue
		}
		s.Count++
		if gap := to.Sub(from).Seconds(); gap > s.LongestSeconds {
			s.LongestSeconds, s.AtSeconds, s.Waiting = gap, from.Sub(start).Seconds(), waiting
		}
	}
	return s
}

// timeline is t's counts at every step after start until the last VM
// reached Running.
func (t *tracker) timeline(start time.Time, step time.Duration) []TimelinePoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	created, placed, running := sortedTimes(t.created), sortedTimes(t.scheduled), sortedTimes(t.running)
	if len(running) == 0 {
		return nil
	}
	var out []TimelinePoint
	for at := start.Add(step); ; at = at.Add(step) {
		out = append(out, TimelinePoint{
			Second:  int(at.Sub(start) / time.Second),
			Created: countUntil(created, at), Placed: countUntil(placed, at), Running: countUntil(running, at),
		})
		if at.After(running[len(running)-1]) {
			return out
		}
	}
}

func sortedTimes(m map[string]time.Time) []time.Time {
	out := make([]time.Time, 0, len(m))
	for _, at := range m {
		out = append(out, at)
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// countUntil is how many of the sorted times are not after at.
func countUntil(sorted []time.Time, at time.Time) int {
	n, _ := slices.BinarySearchFunc(sorted, at, func(e, at time.Time) int {
		if e.After(at) {
			return 1
		}
		return -1
	})
	return n
}
