package nova_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

// actions counts the server actions the cloud answered, os-migrateLive
// among them.
func actions(c *cloud) int {
	return c.CountRequests(http.MethodPost, openstacktest.ComputePath+"/servers/*/action")
}

// migrateHost calls MigrateHost as the reconciler does until the
// migration's status is final.
func migrateHost(t *testing.T, d *nova.Driver, m driver.Machine, id, host string) driver.MigrationStatus {
	t.Helper()
	var st driver.MigrationStatus
	require.Eventually(t, func() bool {
		var err error
		st, err = d.MigrateHost(context.Background(), m, id, host)
		require.NoError(t, err)
		require.Equal(t, id, st.ID)
		return st.Phase != driver.MigrationRunning
	}, waitFor, tick, "migration %s never ended", id)
	return st
}

// TestMigrateHost pins Nova's live migration through the driver: where the
// server goes, what the driver reports while it moves and after, and what
// it refuses.
func TestMigrateHost(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		// host is MigrateHost's host; "other" is the host the server is
		// not on.
		host string
		// prepare readies the cloud and the guest before the first call.
		prepare func(t *testing.T, c *cloud, d *nova.Driver, m *driver.Machine)
		// wantErr checks the first call's error, when it fails.
		wantErr func(error) bool
		// wantPhase is the final phase.
		wantPhase driver.MigrationPhase
		// wantMessage is in the final status' message or the error.
		wantMessage string
		// wantMoved is whether the server ends on the other host.
		wantMoved bool
	}{
		"SucceedsToTheHostAsked": {
			host: "other", wantPhase: driver.MigrationSucceeded, wantMoved: true,
		},
		"SucceedsToTheHostTheSchedulerChooses": {
			wantPhase: driver.MigrationSucceeded, wantMoved: true,
		},
		"SucceedsWhereNovaHidesItsMigrationRecords": {
			// Nova's default policy shows os-migrations and a server's
			// migrations to admins only: the server's host tells.
			prepare: func(_ *testing.T, c *cloud, _ *nova.Driver, _ *driver.Machine) {
				c.FailNext(http.MethodGet, openstacktest.ComputePath+"/os-migrations", 1000, http.StatusForbidden, 0)
				c.FailNext(http.MethodGet, openstacktest.ComputePath+"/servers/*/migrations", 1000, http.StatusForbidden, 0)
			},
			host: "other", wantPhase: driver.MigrationSucceeded, wantMoved: true,
		},
		"FailsWhereNovaHidesItsMigrationRecords": {
			// Back on the host it left: the reason from the instance
			// action, which Nova shows the server's owner.
			prepare: func(_ *testing.T, c *cloud, _ *nova.Driver, _ *driver.Machine) {
				c.FailNext(http.MethodGet, openstacktest.ComputePath+"/os-migrations", 1000, http.StatusForbidden, 0)
				c.FailNext(http.MethodGet, openstacktest.ComputePath+"/servers/*/migrations", 1000, http.StatusForbidden, 0)
				c.FailNextLiveMigration("Live migration of instance failed: the target host is gone")
			},
			host: "other", wantPhase: driver.MigrationFailed, wantMessage: "Nova left the server on host compute-a: Live migration of instance failed: the target host is gone",
		},
		"FailsWithNovasReasonAndTheServerStays": {
			prepare: func(_ *testing.T, c *cloud, _ *nova.Driver, _ *driver.Machine) {
				c.FailNextLiveMigration("Live migration of instance failed: the target host refused the memory copy")
			},
			host: "other", wantPhase: driver.MigrationFailed, wantMessage: "the target host refused the memory copy",
		},
		"AServerThatIsNotActiveIsTerminal": {
			prepare: func(t *testing.T, _ *cloud, d *nova.Driver, m *driver.Machine) {
				m.Running = false
				ensure(t, d, *m, driver.PhaseStopped)
			},
			host: "other", wantErr: driver.IsTerminal, wantMessage: "SHUTOFF",
		},
		"AHostNovaDoesNotKnowIsTerminal": {
			host: "compute-z", wantErr: driver.IsTerminal, wantMessage: "Compute host compute-z could not be found",
		},
		"TheHostTheServerIsOnIsTerminal": {
			host: "same", wantErr: driver.IsTerminal, wantMessage: "already runs on host",
		},
		"AGuestWithNoServerIsNotFound": {
			prepare: func(t *testing.T, _ *cloud, d *nova.Driver, m *driver.Machine) {
				require.NoError(t, d.Delete(context.Background(), m.UID))
			},
			host: "other", wantErr: driver.IsNotFound,
		},
		"APolicyThatForbidsLiveMigrationIsTerminal": {
			prepare: func(_ *testing.T, c *cloud, _ *nova.Driver, _ *driver.Machine) {
				c.FailNext(http.MethodPost, openstacktest.ComputePath+"/servers/*/action", 1, http.StatusForbidden, 0)
			},
			host: "other", wantErr: driver.IsTerminal, wantMessage: "HTTP 403",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Long enough that the guest is still where it was when the
			// test looks right after asking, on a loaded machine too.
			c := newCloudWith(t, openstacktest.Options{TransitionDelay: 500 * time.Millisecond}, func(*openstacktest.Server, *cloudYAML) {}, password)
			d := c.open(t)
			m := machine("moving")
			ensure(t, d, m, driver.PhaseRunning)
			source := c.server(t, m.UID).Host
			other := map[string]string{"compute-a": "compute-b", "compute-b": "compute-a"}[source]
			host := map[string]string{"other": other, "same": source}[tc.host]
			if host == "" {
				host = tc.host
			}
			if tc.prepare != nil {
				tc.prepare(t, c, d, &m)
			}
			before := actions(c)

			st, err := d.MigrateHost(context.Background(), m, "mig-1", host)
			if tc.wantErr != nil {
				require.Error(t, err)
				assert.True(t, tc.wantErr(err), "unexpected kind of error: %v", err)
				assert.Contains(t, err.Error(), tc.wantMessage)
				assert.Empty(t, c.LiveMigrations(), "Nova migrates nothing")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, driver.MigrationRunning, st.Phase, "the first call only asks Nova")
			assert.False(t, st.StartedAt.IsZero())
			o, err := d.Observe(context.Background(), m.UID)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase, "the guest runs on while it moves")
			assert.Equal(t, source, o.Node, "on its host until Nova moved it")

			st = migrateHost(t, d, m, "mig-1", host)
			assert.Equal(t, tc.wantPhase, st.Phase, "message: %s", st.Message)
			assert.Contains(t, st.Message, tc.wantMessage)
			assert.False(t, st.FinishedAt.IsZero())
			assert.Zero(t, st.Downtime, "Nova does not tell the downtime")
			assert.Equal(t, before+1, actions(c), "Nova is asked once")

			s := c.server(t, m.UID)
			assert.Equal(t, openstacktest.StatusActive, s.Status)
			want := source
			if tc.wantMoved {
				want = other
				require.Len(t, c.LiveMigrations(), 1)
				assert.Equal(t, other, c.LiveMigrations()[0].Dest)
			}
			assert.Equal(t, want, s.Host)
			o, err = d.Observe(context.Background(), m.UID)
			require.NoError(t, err)
			assert.Equal(t, want, o.Node, "Observe follows the server")
			assert.Equal(t, driver.PhaseRunning, o.Phase)

			again, err := d.MigrateHost(context.Background(), m, "mig-1", host)
			require.NoError(t, err)
			assert.Equal(t, st, again, "the final status is kept")
			assert.Equal(t, before+1, actions(c), "and Nova is not asked again")
		})
	}
}

// TestMigrateHostReportsProgress pins the bytes Nova reports while it
// copies the guest's memory.
func TestMigrateHostReportsProgress(t *testing.T) {
	t.Parallel()
	// The copy runs for a quarter of the delay: long enough for several
	// looks on a loaded machine.
	c := newCloudWith(t, openstacktest.Options{TransitionDelay: 2 * time.Second}, func(*openstacktest.Server, *cloudYAML) {}, password)
	d := c.open(t)
	m := machine("progress")
	ensure(t, d, m, driver.PhaseRunning)
	_, err := d.MigrateHost(context.Background(), m, "mig-1", "")
	require.NoError(t, err)
	var seen []int64
	st := driver.MigrationStatus{Phase: driver.MigrationRunning}
	for st.Phase == driver.MigrationRunning {
		st, err = d.MigrateHost(context.Background(), m, "mig-1", "")
		require.NoError(t, err)
		if st.Phase == driver.MigrationRunning && st.TotalBytes > 0 {
			assert.Equal(t, int64(512<<20), st.TotalBytes, "the guest's memory, no local disk")
			seen = append(seen, st.ProcessedBytes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, driver.MigrationSucceeded, st.Phase)
	require.NotEmpty(t, seen, "progress was reported")
	assert.IsNonDecreasing(t, seen)
	assert.Equal(t, st.TotalBytes, st.ProcessedBytes, "a completed migration moved everything")
}

// TestMigrateHostAcrossAnAgentRestart pins that a restarted agent finds the
// migration it asked for in the server's metadata: it reports it, and never
// asks Nova for it a second time.
func TestMigrateHostAcrossAnAgentRestart(t *testing.T) {
	t.Parallel()
	for name, wait := range map[string]bool{"WhileItRuns": false, "AfterItEnded": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newCloudWith(t, openstacktest.Options{TransitionDelay: 200 * time.Millisecond}, func(*openstacktest.Server, *cloudYAML) {}, password)
			d := c.open(t)
			m := machine("restart")
			ensure(t, d, m, driver.PhaseRunning)
			source := c.server(t, m.UID).Host
			before := actions(c)
			_, err := d.MigrateHost(context.Background(), m, "mig-1", "")
			require.NoError(t, err)
			if wait {
				require.Eventually(t, func() bool { return c.server(t, m.UID).Host != source }, waitFor, tick)
			}
			require.NoError(t, d.Close())

			restarted := c.open(t)
			st := migrateHost(t, restarted, m, "mig-1", "")
			assert.Equal(t, driver.MigrationSucceeded, st.Phase, st.Message)
			assert.Equal(t, before+1, actions(c), "Nova is asked once")
			o, err := restarted.Observe(context.Background(), m.UID)
			require.NoError(t, err)
			assert.NotEqual(t, source, o.Node)

			// A new id is a new attempt: the guest moves back.
			st = migrateHost(t, restarted, m, "mig-2", "")
			assert.Equal(t, driver.MigrationSucceeded, st.Phase, st.Message)
			assert.Equal(t, before+2, actions(c))
			assert.Equal(t, source, c.server(t, m.UID).Host)
		})
	}
}

// TestMigrateHostAsksAgainWhenNovaNeverTookIt pins that a migration whose
// request failed is asked for again by the next call, not taken for one
// Nova ran.
func TestMigrateHostAsksAgainWhenNovaNeverTookIt(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("retry")
	ensure(t, d, m, driver.PhaseRunning)
	source := c.server(t, m.UID).Host
	// More 500s than the driver retries: a POST is never retried.
	c.FailNext(http.MethodPost, openstacktest.ComputePath+"/servers/*/action", 1, http.StatusInternalServerError, 0)
	_, err := d.MigrateHost(context.Background(), m, "mig-1", "")
	require.Error(t, err)
	assert.False(t, driver.IsTerminal(err), "a 500 is transient: %v", err)
	assert.Empty(t, c.LiveMigrations())

	st := migrateHost(t, d, m, "mig-1", "")
	assert.Equal(t, driver.MigrationSucceeded, st.Phase, st.Message)
	assert.NotEqual(t, source, c.server(t, m.UID).Host)
	assert.Len(t, c.LiveMigrations(), 1)
}
