package wake

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

func TestPollsSpreadWithTheNumberOfObjects(t *testing.T) {
	p := NewPolls(nil, 20)
	cases := map[string]struct {
		objects  int64
		interval time.Duration
		want     time.Duration
	}{
		"NoObjectsKeepTheInterval":                 {objects: 0, interval: time.Minute, want: time.Minute},
		"FewObjectsKeepTheInterval":                {objects: 100, interval: time.Minute, want: time.Minute},
		"AsManyAsTheBudgetCoversKeepTheInterval":   {objects: 1200, interval: time.Minute, want: time.Minute},
		"TenThousandArePolledWithinTheBudget":      {objects: 10000, interval: time.Minute, want: 500 * time.Second},
		"AShortIntervalGrowsAsSoonAsObjectsExceed": {objects: 1000, interval: 30 * time.Second, want: 50 * time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, p.spread(tc.objects, tc.interval))
		})
	}
}

// TestPollHookJitters pins that polls of objects made together do not come
// due together: each interval is moved by up to a tenth either way, and
// not by the same amount every time. A nil Polls (no budget) jitters too.
func TestPollHookJitters(t *testing.T) {
	hook := (*Polls)(nil).Hook(&v1alpha1.VirtualMachine{})
	seen := map[time.Duration]bool{}
	for range 200 {
		got := hook(nil, time.Minute)
		assert.GreaterOrEqual(t, got, 54*time.Second)
		assert.LessOrEqual(t, got, 66*time.Second)
		seen[got] = true
	}
	assert.Greater(t, len(seen), 100, "the jitter differs from poll to poll")
}
