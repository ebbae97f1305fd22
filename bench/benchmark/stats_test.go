package benchmark

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	cases := map[string]struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		"EmptyIsZero":                        {nil, 50, 0},
		"OneSampleIsEveryPercentile":         {[]time.Duration{7}, 99, 7},
		"P50OfHundredIsTheFiftieth":          {hundred, 50, 50 * time.Millisecond},
		"P99OfHundredIsTheNinetyNinth":       {hundred, 99, 99 * time.Millisecond},
		"P100IsTheMax":                       {hundred, 100, 100 * time.Millisecond},
		"P99OfTenIsTheMaxNotAnInterpolation": {hundred[:10], 99, 10 * time.Millisecond},
		"P0IsTheMin":                         {hundred, 0, time.Millisecond},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, Percentile(tc.sorted, tc.p))
		})
	}
}

func TestSummariseSortsAndDoesNotReorderItsInput(t *testing.T) {
	in := []time.Duration{3 * time.Second, time.Second, 2 * time.Second}
	l := Summarise(in)
	assert.Equal(t, Latency{Count: 3, P50: 2, P95: 3, P99: 3, Max: 3, Mean: 2}, l)
	assert.Equal(t, 3*time.Second, in[0], "the caller's slice is left alone")
	assert.Equal(t, Latency{}, Summarise(nil))
}
