package benchmark

import (
	"math"
	"slices"
	"time"
)

// Latency summarises create→Running latencies in seconds, the unit the
// targets are written in.
type Latency struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50Seconds"`
	P95   float64 `json:"p95Seconds"`
	P99   float64 `json:"p99Seconds"`
	Max   float64 `json:"maxSeconds"`
	Mean  float64 `json:"meanSeconds"`
}

// Summarise computes the percentiles of ds; an empty input gives zeros.
func Summarise(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Latency{
		Count: len(s),
		P50:   Percentile(s, 50).Seconds(),
		P95:   Percentile(s, 95).Seconds(),
		P99:   Percentile(s, 99).Seconds(),
		Max:   s[len(s)-1].Seconds(),
		Mean:  (sum / time.Duration(len(s))).Seconds(),
	}
}

// Percentile is the nearest-rank percentile of sorted: the smallest value
// with at least p% of the samples at or below it. Nearest rank never
// interpolates, so a reported p99 is a latency some VM really had; with 100
// samples p99 is the 99th, not a blend of the 99th and the 100th.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}
