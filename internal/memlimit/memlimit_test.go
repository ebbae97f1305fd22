package memlimit

import (
	"flag"
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/flagenv"
)

func TestApply(t *testing.T) {
	cases := map[string]struct {
		env      map[string]string
		limit    int64
		wantSoft int64
	}{
		"NineTenthsOfTheContainersLimit": {limit: 2 << 30, wantSoft: 1932735283},
		"NoLimitChangesNothing":          {},
		"AnOperatorsGOMEMLIMITWins":      {env: map[string]string{"GOMEMLIMIT": "1GiB"}, limit: 2 << 30},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := debug.SetMemoryLimit(math.MaxInt64)
			t.Cleanup(func() { debug.SetMemoryLimit(before) })

			got := Apply(tc.limit, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })

			assert.Equal(t, tc.wantSoft, got)
			want := int64(math.MaxInt64)
			if tc.wantSoft > 0 {
				want = tc.wantSoft
			}
			assert.Equal(t, want, debug.SetMemoryLimit(-1), "the runtime's limit")
		})
	}
}

// TestFlagReadsTheVariableDeploySets: cluster/deploy sets the limit in
// VIRTFLEET_MEMORY_LIMIT, in bytes, as the downward API gives it.
func TestFlagReadsTheVariableDeploySets(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	limit := Flag(fs)
	env := map[string]string{"VIRTFLEET_MEMORY_LIMIT": "536870912"}
	require.NoError(t, flagenv.Parse(fs, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil))
	assert.Equal(t, int64(512<<20), *limit)
}
