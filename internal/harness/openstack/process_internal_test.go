package openstack

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A wait for a service gives up by the CPU time the service used, and by
// wall time only at a bound of its own: one that spins fails once it used
// its budget however long that takes on a loaded machine, one that waits
// without using CPU fails at the wall bound, and one whose condition holds
// is ready.
func TestWaitForCountsTheServicesOwnCPUTime(t *testing.T) {
	const budget = 500 * time.Millisecond
	cases := map[string]struct {
		argv  []string
		ready bool
		// wantErr is part of the error; none when empty.
		wantErr string
		// wall is the wall bound; wantWall whether the wait lasted it.
		wall     time.Duration
		wantWall bool
	}{
		"ASpinningServiceFailsOnceItUsedItsBudget": {
			argv:    []string{"sh", "-c", "while :; do :; done"},
			wall:    5 * time.Minute,
			wantErr: "of its own CPU time; spinning not ready after",
		},
		"AnIdleServiceFailsAtTheWallBound": {
			argv:     []string{"sleep", "60"},
			wall:     2 * time.Second,
			wantErr:  "context deadline exceeded",
			wantWall: true,
		},
		"AServiceWhoseConditionHoldsIsReady": {
			argv:  []string{"sleep", "60"},
			wall:  time.Minute,
			ready: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := &Cloud{Dir: t.TempDir(), out: io.Discard, began: time.Now()}
			require.NoError(t, os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o700))
			what := map[bool]string{true: "idle", false: "spinning"}[tc.wantWall]
			p, err := c.start(what, nil, tc.argv...)
			require.NoError(t, err)
			t.Cleanup(p.stop)

			start := time.Now()
			err = c.waitWithin(context.Background(), what, p, budget, tc.wall, func(context.Context) bool { return tc.ready })
			took := time.Since(start)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			assert.Equal(t, tc.wantWall, took >= tc.wall, "the wait took %s", took)
			if !tc.wantWall {
				assert.GreaterOrEqual(t, p.cpu(), budget, "it used its budget before it failed")
			}
		})
	}
}
