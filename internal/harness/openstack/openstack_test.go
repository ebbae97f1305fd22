package openstack_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

func TestMain(m *testing.M) { os.Exit(openstack.Main(m)) }

// TestCloudStarts pins the harness's promise: every service answers its
// admin and the compute host is Nova's only hypervisor (the spare one runs
// only once a test enables it).
func TestCloudStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Debian's OpenStack services; skipped with -short")
	}
	c := openstack.ForTest(t)
	cl, err := c.Clients(context.Background())
	require.NoError(t, err)
	page, err := hypervisors.List(cl.Compute, nil).AllPages(context.Background())
	require.NoError(t, err)
	hs, err := hypervisors.ExtractHypervisors(page)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	require.Equal(t, c.ComputeHost, hs[0].Service.Host)

	// Its MariaDB's temporary tables are its own: another cloud's MariaDB
	// starting would remove them from a shared tmpdir.
	out, err := exec.Command("mariadb", "--no-defaults", "--socket="+filepath.Join(c.Dir, "mysql.sock"), "-uroot", "-N", "-e", "SELECT @@tmpdir").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, filepath.Join(c.Dir, "mysql-tmp"), strings.TrimSpace(string(out)), "MariaDB's tmpdir")
}

// Real Nova's first build on a loaded 2-core machine is slow: its services
// load most of their code at their first request.
const (
	bootTimeout    = 5 * time.Minute
	migrateTimeout = 3 * time.Minute
	poll           = time.Second
)

// TestLiveMigrationThroughTheNovaDriver moves a server the nova driver
// booted to the spare compute host and back, live, and checks that the
// driver reports each move as Nova made it, and a move Nova's scheduler
// refuses as failed, with its reason.
func TestLiveMigrationThroughTheNovaDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Debian's OpenStack services; skipped with -short")
	}
	ctx := context.Background()
	c := openstack.ForTest(t)
	d := openDriver(t, c)
	m := driver.Machine{
		UID: uuid.NewString(), Namespace: "ns", Name: "mover", Generation: 1,
		VCPU: 1, MemoryBytes: 256 << 20, Running: true,
		Disks:    []driver.Disk{{Name: "ns_mover-root", SizeBytes: 1 << 30}},
		Networks: []driver.Network{{Name: "ns_mover-net", CIDR: "10.77.0.0/24"}},
	}
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return d.Delete(ctx, m.UID) == nil }, migrateTimeout, poll, "the server is never deleted")
		require.Eventually(t, func() bool { return d.DeleteVolume(ctx, m.Disks[0]) == nil }, migrateTimeout, poll, "the volume is never deleted")
	})
	var o driver.Observation
	require.Eventually(t, func() bool {
		var err error
		o, err = d.Ensure(ctx, m)
		require.NoError(t, err)
		return o.Phase == driver.PhaseRunning
	}, bootTimeout, poll, "the server never ran: %+v", o)
	require.Equal(t, c.ComputeHost, o.Node, "the spare host is not running yet")

	t.Run("FailsWithNovasReasonWhenNoOtherHostFits", func(t *testing.T) {
		st := migrateHost(t, d, m, "nowhere", "")
		t.Log(st.Message)
		assert.Equal(t, driver.MigrationFailed, st.Phase)
		assert.Contains(t, st.Message, "No valid host was found", "Nova's reason, from its instance action")
		o, err := d.Observe(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, c.ComputeHost, o.Node, "the server stays")
		assert.Equal(t, driver.PhaseRunning, o.Phase)
	})

	start := time.Now()
	require.NoError(t, c.SetSpareHostEnabled(ctx, true))
	t.Logf("the spare compute host started in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { require.NoError(t, c.SetSpareHostEnabled(ctx, false)) })

	for _, tc := range []struct {
		name, id, host, from, to string
	}{
		{name: "ToTheHostAsked", id: "to-spare", host: c.SpareComputeHost, from: c.ComputeHost, to: c.SpareComputeHost},
		{name: "ToTheHostTheSchedulerChooses", id: "back", from: c.SpareComputeHost, to: c.ComputeHost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			st := migrateHost(t, d, m, tc.id, tc.host)
			t.Logf("migrated from %s to %s in %s: %s", tc.from, tc.to, time.Since(start).Round(time.Millisecond), st.Message)
			require.Equal(t, driver.MigrationSucceeded, st.Phase, "Nova's services' logs are in %s/logs", c.Dir)
			o, err := d.Observe(ctx, m.UID)
			require.NoError(t, err)
			assert.Equal(t, tc.to, o.Node, "Observe reports the new host")
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			list, err := d.List(ctx)
			require.NoError(t, err)
			require.Len(t, list, 1)
			assert.Equal(t, tc.to, list[0].Node, "and so does a new listing")
		})
	}
}

// migrateHost calls MigrateHost as the reconciler does until the
// migration is over, checking that the guest runs on meanwhile.
func migrateHost(t *testing.T, d *nova.Driver, m driver.Machine, id, host string) driver.MigrationStatus {
	t.Helper()
	ctx := context.Background()
	st, err := d.MigrateHost(ctx, m, id, host)
	require.NoError(t, err)
	require.Equal(t, driver.MigrationRunning, st.Phase, "the first call only asks Nova: %s", st.Message)
	require.Eventually(t, func() bool {
		st, err = d.MigrateHost(ctx, m, id, host)
		require.NoError(t, err)
		if st.Phase == driver.MigrationRunning {
			o, err := d.Observe(ctx, m.UID)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase, "the guest runs on while it moves")
		}
		return st.Phase != driver.MigrationRunning
	}, migrateTimeout, poll, "the migration never ended: %+v", st)
	return st
}

// cloudTest skips under -short, and returns the test binary's cloud, its
// clients and a nova driver of it (openDriver, configured).
func cloudTest(t *testing.T, configure ...func(*nova.Config)) (*openstack.Cloud, *openstack.Clients, *nova.Driver) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Debian's OpenStack services; skipped with -short")
	}
	c := openstack.ForTest(t)
	cl, err := c.Clients(context.Background())
	require.NoError(t, err)
	return c, cl, openDriver(t, c, configure...)
}

// openDriver opens the nova driver on c as a node's agent does, from a
// clouds.yaml.
func openDriver(t *testing.T, c *openstack.Cloud, configure ...func(*nova.Config)) *nova.Driver {
	t.Helper()
	y, err := yaml.Marshal(map[string]any{"clouds": map[string]any{"test": map[string]any{
		"auth": map[string]string{
			"auth_url": c.AuthURL(), "username": c.Username, "password": c.Password, "project_name": c.Project,
			"user_domain_name": c.Domain, "project_domain_name": c.Domain,
		},
		"region_name": c.Region,
		"interface":   "public",
	}}})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "clouds.yaml")
	require.NoError(t, os.WriteFile(path, y, 0o600))
	cfg := nova.Config{Node: "node-1", CloudsFile: path, Cloud: "test", PollInterval: 500 * time.Millisecond}
	for _, f := range configure {
		f(&cfg)
	}
	d, err := nova.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}
