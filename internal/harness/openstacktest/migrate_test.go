package openstacktest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/instanceactions"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

// migrateLive posts an os-migrateLive body as is, at microversion mv.
func (c *session) migrateLive(t *testing.T, id, mv string, body map[string]any) error {
	t.Helper()
	cl := *c.compute
	cl.Microversion = mv
	_, err := cl.Post(context.Background(), cl.ServiceURL("servers", id, "action"), map[string]any{"os-migrateLive": body}, nil, &gophercloud.RequestOpts{OkCodes: []int{http.StatusAccepted}})
	return err
}

// get reads url at microversion mv into a map, as the API returns it.
func (c *session) get(t *testing.T, mv string, url ...string) map[string]any {
	t.Helper()
	cl := *c.compute
	cl.Microversion = mv
	var out map[string]any
	_, err := cl.Get(context.Background(), cl.ServiceURL(url...), &out, nil)
	require.NoError(t, err)
	return out
}

// status is a failed call's HTTP status.
func status(err error) int {
	var code gophercloud.ErrUnexpectedResponseCode
	errors.As(err, &code)
	return code.Actual
}

// TestLiveMigration pins os-migrateLive as the compute API reference has
// it: the request's validation per microversion, the server MIGRATING
// until it is ACTIVE on its new host, the in-progress migration with its
// bytes, the migration record and the instance action.
func TestLiveMigration(t *testing.T) {
	t.Parallel()
	c := startWith(t, 200*time.Millisecond)
	vol, net := c.bootable(t)
	id := c.boot(t, vol, net)
	source := c.waitStatus(t, id, openstacktest.StatusActive).Host

	for name, tc := range map[string]struct {
		mv     string
		body   map[string]any
		status int
	}{
		"HostIsRequired":                 {mv: "2.60", body: map[string]any{"block_migration": "auto"}, status: http.StatusBadRequest},
		"AutoNeeds2.25":                  {mv: "2.24", body: map[string]any{"host": nil, "block_migration": "auto", "disk_over_commit": false}, status: http.StatusBadRequest},
		"DiskOverCommitIsGoneFrom2.25":   {mv: "2.60", body: map[string]any{"host": nil, "block_migration": "auto", "disk_over_commit": false}, status: http.StatusBadRequest},
		"ForceIsGoneFrom2.68":            {mv: "2.68", body: map[string]any{"host": "h2", "block_migration": "auto", "force": false}, status: http.StatusBadRequest},
		"AnUnknownHostIsABadRequest":     {mv: "2.60", body: map[string]any{"host": "h9", "block_migration": "auto"}, status: http.StatusBadRequest},
		"BlockMigrationIsABooleanOrAuto": {mv: "2.60", body: map[string]any{"host": nil, "block_migration": "sometimes"}, status: http.StatusBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			err := c.migrateLive(t, id, tc.mv, tc.body)
			require.Error(t, err)
			assert.Equal(t, tc.status, status(err), "%v", err)
		})
	}
	require.Empty(t, c.s.LiveMigrations(), "nothing refused is recorded")

	require.NoError(t, c.migrateLive(t, id, "2.60", map[string]any{"host": nil, "block_migration": "auto"}))
	s, err := servers.Get(context.Background(), c.compute, id).Extract()
	require.NoError(t, err)
	assert.Equal(t, openstacktest.StatusMigrating, s.Status, "migrating as soon as Nova answered")
	assert.Equal(t, "migrating", s.TaskState)
	assert.Equal(t, source, s.Host)
	err = c.migrateLive(t, id, "2.60", map[string]any{"host": nil, "block_migration": "auto"})
	assert.Equal(t, http.StatusConflict, status(err), "one migration at a time")

	var running map[string]any
	require.Eventually(t, func() bool {
		list, _ := c.get(t, "2.80", "servers", id, "migrations")["migrations"].([]any)
		if len(list) == 1 && list[0].(map[string]any)["status"] == openstacktest.MigrationRunning {
			running = list[0].(map[string]any)
		}
		return running != nil
	}, 5*time.Second, 5*time.Millisecond, "the migration never showed running")
	for _, k := range []string{"created_at", "dest_compute", "dest_host", "dest_node", "disk_processed_bytes", "disk_remaining_bytes",
		"disk_total_bytes", "id", "memory_processed_bytes", "memory_remaining_bytes", "memory_total_bytes", "server_uuid",
		"source_compute", "source_node", "status", "updated_at", "uuid", "user_id", "project_id"} {
		assert.Contains(t, running, k)
	}
	assert.Equal(t, json.Number("536870912"), running["memory_total_bytes"], "m1.tiny's memory")
	assert.Equal(t, source, running["source_compute"])

	moved := c.waitStatus(t, id, openstacktest.StatusActive)
	assert.NotEqual(t, source, moved.Host, "the scheduler chose the other host")
	assert.Empty(t, c.get(t, "2.80", "servers", id, "migrations")["migrations"], "only migrations in progress are listed")

	records := c.get(t, "2.60", "os-migrations")["migrations"].([]any)
	require.Len(t, records, 1)
	r := records[0].(map[string]any)
	assert.Equal(t, map[string]any{"status": "completed", "migration_type": "live-migration", "instance_uuid": id, "source_compute": source, "dest_compute": moved.Host},
		map[string]any{"status": r["status"], "migration_type": r["migration_type"], "instance_uuid": r["instance_uuid"], "source_compute": r["source_compute"], "dest_compute": r["dest_compute"]})
	assert.Contains(t, r, "uuid", "from 2.59")
	assert.NotContains(t, r, "memory_total_bytes", "bytes are for in-progress migrations only")

	page, err := instanceactions.List(c.compute, id, nil).AllPages(context.Background())
	require.NoError(t, err)
	acts, err := instanceactions.ExtractInstanceActions(page)
	require.NoError(t, err)
	require.Len(t, acts, 2)
	assert.Equal(t, []string{"live-migration", "create"}, []string{acts[0].Action, acts[1].Action}, "newest first")
	assert.NotEmpty(t, acts[0].RequestID)
}

// TestLiveMigrationFailures pins how Nova's conductor and compute hosts
// fail a live migration after the API accepted it: the server stays
// ACTIVE where it was, the record says error and the instance action's
// event tells why, from microversion 2.84.
func TestLiveMigrationFailures(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		hosts   []string
		host    func(source string) any
		fail    string
		event   string
		message string
	}{
		"NoOtherHost": {
			hosts: []string{"h1"}, host: func(string) any { return nil },
			event: "conductor_live_migrate_instance", message: "No valid host was found",
		},
		"ToItsOwnHost": {
			hosts: []string{"h1", "h2"}, host: func(source string) any { return source },
			event: "conductor_live_migrate_instance", message: "Unable to migrate instance",
		},
		"TheComputeHostFails": {
			hosts: []string{"h1", "h2"}, host: func(string) any { return nil }, fail: "Live migration failed: out of memory",
			event: "compute_live_migration", message: "out of memory",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := openstacktest.Start(openstacktest.Options{Password: password, TransitionDelay: 20 * time.Millisecond, Hosts: tc.hosts})
			require.NoError(t, err)
			t.Cleanup(s.Close)
			pc, err := openstack.AuthenticatedClient(context.Background(), authOptions(s, password))
			require.NoError(t, err)
			c := &session{s: s}
			eo := gophercloud.EndpointOpts{Region: openstacktest.DefaultRegion}
			c.compute, _ = openstack.NewComputeV2(pc, eo)
			c.volume, _ = openstack.NewBlockStorageV3(pc, eo)
			c.network, _ = openstack.NewNetworkV2(pc, eo)
			vol, net := c.bootable(t)
			id := c.boot(t, vol, net)
			source := c.waitStatus(t, id, openstacktest.StatusActive).Host
			if tc.fail != "" {
				s.FailNextLiveMigration(tc.fail)
			}

			require.NoError(t, c.migrateLive(t, id, "2.60", map[string]any{"host": tc.host(source), "block_migration": "auto"}))
			require.Eventually(t, func() bool {
				m := s.LiveMigrations()
				return len(m) == 1 && m[0].Status == openstacktest.MigrationError
			}, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, source, c.waitStatus(t, id, openstacktest.StatusActive).Host, "the server stays")

			page, err := instanceactions.List(c.compute, id, nil).AllPages(context.Background())
			require.NoError(t, err)
			acts, err := instanceactions.ExtractInstanceActions(page)
			require.NoError(t, err)
			assert.Equal(t, "Error", acts[0].Message)
			action := c.get(t, "2.84", "servers", id, "os-instance-actions", acts[0].RequestID)["instanceAction"].(map[string]any)
			events := action["events"].([]any)
			require.NotEmpty(t, events)
			e := events[len(events)-1].(map[string]any)
			assert.Equal(t, tc.event, e["event"])
			assert.Equal(t, "Error", e["result"])
			assert.Contains(t, e["details"], tc.message)
			old := c.get(t, "2.83", "servers", id, "os-instance-actions", acts[0].RequestID)["instanceAction"].(map[string]any)
			assert.NotContains(t, old["events"].([]any)[0], "details", "details come with 2.84")
		})
	}
}

// TestLiveMigrationIsForAdmins pins Nova's default policy: a project
// member may not migrate, nor read migrations.
func TestLiveMigrationIsForAdmins(t *testing.T) {
	t.Parallel()
	s, err := openstacktest.Start(openstacktest.Options{Password: password, Member: true, Hosts: []string{"h1", "h2"}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	pc, err := openstack.AuthenticatedClient(context.Background(), authOptions(s, password))
	require.NoError(t, err)
	compute, err := openstack.NewComputeV2(pc, gophercloud.EndpointOpts{Region: openstacktest.DefaultRegion})
	require.NoError(t, err)
	compute.Microversion = "2.60"
	_, err = compute.Get(context.Background(), compute.ServiceURL("os-migrations"), nil, nil)
	assert.Equal(t, http.StatusForbidden, status(err))
}
