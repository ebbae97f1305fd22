package openstack

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/schedulerstats"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"
	"golang.org/x/sync/errgroup"
)

//go:embed python
var pythonFiles embed.FS

// writePython puts the harness's drivers on the services' PYTHONPATH:
// vfbind with the dist-info that makes it an entry point Neutron's ML2
// finds by name, vffile, which Cinder imports by its path
// (vffile.FileDriver), and vflauncher, which service patches in.
func (c *Cloud) writePython() error {
	dir := filepath.Join(c.Dir, "python")
	info := filepath.Join(dir, "vfbind-1.0.dist-info")
	if err := os.MkdirAll(info, 0o700); err != nil {
		return errors.Wrap(err, "cannot create the drivers' directory")
	}
	for name, dest := range map[string]string{
		"python/vfbind.py":        filepath.Join(dir, "vfbind.py"),
		"python/METADATA":         filepath.Join(info, "METADATA"),
		"python/entry_points.txt": filepath.Join(info, "entry_points.txt"),
		"python/vffile.py":        filepath.Join(dir, "vffile.py"),
		"python/vflauncher.py":    filepath.Join(dir, "vflauncher.py"),
	} {
		b, err := pythonFiles.ReadFile(name)
		if err != nil {
			return errors.Wrapf(err, "cannot read the embedded %s", name)
		}
		if err := os.WriteFile(dest, b, 0o600); err != nil {
			return errors.Wrapf(err, "cannot write %s", dest)
		}
	}
	return nil
}

// databases are the cloud's MariaDB databases.
var databases = []string{"keystone", "placement", "nova_api", "nova", "nova_cell0", "glance", "cinder", "neutron"}

// startMariaDB initialises a datadir whose root has no password (it listens
// on a unix socket in the cloud's directory only, no TCP), starts mariadbd
// and creates the databases.
//
// Each cloud's MariaDB keeps its temporary tables in a directory of its
// own: a MariaDB server that starts removes every #sql file of its tmpdir
// (mysql_rm_tmp_tables), so with the shared /tmp one cloud's start, or
// another's bootstrap, deleted the temporary tables a bootstrap was using
// and it failed ("Could not remove temporary table").
func (c *Cloud) startMariaDB(ctx context.Context) error {
	data, tmp := filepath.Join(c.Dir, "mysql"), filepath.Join(c.Dir, "mysql-tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return errors.Wrap(err, "cannot make MariaDB's tmpdir")
	}
	if err := c.run(ctx, "mariadb-install-db", "mariadb-install-db", "--no-defaults", "--datadir="+data, "--tmpdir="+tmp, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db"); err != nil {
		return err
	}
	p, err := c.start("mariadb", nil, "/usr/sbin/mariadbd", "--no-defaults", "--datadir="+data, "--tmpdir="+tmp, "--socket="+c.mysqlSocket(),
		"--skip-networking", "--user=root", "--pid-file="+filepath.Join(c.Dir, "mysql.pid"), "--skip-log-bin",
		"--innodb-buffer-pool-size=64M", "--performance-schema=OFF", "--max-connections=1000",
		"--character-set-server=utf8mb3", "--collation-server=utf8mb3_general_ci")
	if err != nil {
		return err
	}
	mysql := exec.Command("mariadb", "--no-defaults", "--socket="+c.mysqlSocket(), "-uroot", "-e", "SELECT 1")
	return c.waitFor(ctx, "MariaDB", p, dbTimeout, func(context.Context) bool { return mysql.Run() == nil || retry(&mysql) })
}

// sql runs statements as MariaDB's root.
func (c *Cloud) sql(ctx context.Context, name, statements string) error {
	return c.run(ctx, name, "mariadb", "--no-defaults", "--socket="+c.mysqlSocket(), "-uroot", "-e", statements)
}

// migrate creates the databases and runs every service's migrations side
// by side; Nova's cells are mapped to this cloud's databases and RabbitMQ.
func (c *Cloud) migrate(ctx context.Context) error {
	sql := ""
	for _, db := range databases {
		sql += "CREATE DATABASE " + db + ";"
	}
	if err := c.sql(ctx, "create-databases", sql); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return c.run(gctx, "keystone-db-sync", "keystone-manage", "--config-file", c.conf("keystone.conf"), "db_sync")
	})
	g.Go(func() error {
		return c.run(gctx, "placement-db-sync", "placement-manage", "--config-file", c.conf("placement.conf"), "db", "sync")
	})
	g.Go(func() error { return c.syncNova(gctx) })
	g.Go(func() error {
		return c.run(gctx, "glance-db-sync", "glance-manage", "--config-file", c.conf("glance-api.conf"), "db_sync")
	})
	g.Go(func() error {
		return c.run(gctx, "cinder-db-sync", "cinder-manage", "--config-file", c.conf("cinder.conf"), "db", "sync")
	})
	g.Go(func() error {
		return c.run(gctx, "neutron-db-sync", "neutron-db-manage", "--config-file", c.conf("neutron.conf"), "upgrade", "heads")
	})
	return g.Wait()
}

func (c *Cloud) conf(name string) string { return filepath.Join(c.Dir, "etc", name) }

// writeConfigs writes every service's configuration file.
func (c *Cloud) writeConfigs() error {
	for name, cf := range map[string]conf{
		"keystone.conf":   c.keystoneConf(),
		"placement.conf":  c.placementConf(),
		"nova.conf":       c.novaConf(),
		spareComputeConf:  c.spareComputeConf(),
		"glance-api.conf": c.glanceConf(),
		"cinder.conf":     c.cinderConf(),
		"neutron.conf":    c.neutronConf(),
	} {
		if _, err := c.write(name, cf); err != nil {
			return err
		}
	}
	return nil
}

// retry makes a used *exec.Cmd runnable again, for polling with it; it
// reports false so a poll goes on.
func retry(cmd **exec.Cmd) bool {
	*cmd = exec.Command((*cmd).Args[0], (*cmd).Args[1:]...) //nolint:gosec // the harness's own command line
	return false
}

// startRabbitMQ runs epmd and a RabbitMQ node of the cloud's own, on ports
// of its own, so it meets no other Erlang node of the machine.
func (c *Cloud) startRabbitMQ(ctx context.Context) error {
	dir := filepath.Join(c.Dir, "rabbitmq")
	files := map[string]string{
		"rabbitmq.conf":     fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\ndisk_free_limit.absolute = 50MB\nvm_memory_high_watermark.relative = 0.2\n", c.ports.amqp),
		"enabled_plugins":   "[].\n",
		"rabbitmq-env.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return errors.Wrap(err, "cannot write RabbitMQ's configuration")
		}
	}
	epmd := fmt.Sprintf("ERL_EPMD_PORT=%d", c.ports.epmd)
	if _, err := c.start("epmd", nil, "epmd", "-port", fmt.Sprint(c.ports.epmd), "-address", "127.0.0.1"); err != nil {
		return err
	}
	node := fmt.Sprintf("vfos%d@localhost", c.ports.amqp)
	p, err := c.start("rabbitmq", []string{
		epmd,
		"RABBITMQ_NODENAME=" + node,
		"RABBITMQ_DIST_PORT=" + fmt.Sprint(c.ports.dist),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "rabbitmq.pid"),
		// One scheduler: the machine is shared.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=+S 1:1",
	}, "/usr/lib/rabbitmq/bin/rabbitmq-server")
	if err != nil {
		return err
	}
	return c.waitFor(ctx, "RabbitMQ", p, serviceTimeout, func(context.Context) bool { return listens(c.ports.amqp) })
}

// uwsgi serves a WSGI script on port with one process and one thread.
// Connection: close because uwsgi's --http-socket does not keep
// connections alive correctly for Python's and Go's clients.
func (c *Cloud) uwsgi(name, script string, port int, env ...string) (*process, error) {
	return c.start(name, env, "uwsgi", "--plugin", "python3", "--http-socket", fmt.Sprintf("127.0.0.1:%d", port),
		"--wsgi-file", script, "--master", "--processes", "1", "--threads", "1", "--die-on-term", "--need-app",
		"--buffer-size", "65535", "--add-header", "Connection: close", "--hook-master-start", "unix_signal:15 gracefully_kill_them_all")
}

// startKeystone makes Keystone's keys, bootstraps the admin user, project
// and roles and Keystone's own endpoint, and serves it.
func (c *Cloud) startKeystone(ctx context.Context) error {
	for _, dir := range []string{"fernet-keys", "credential-keys"} {
		if err := fernetKeys(filepath.Join(c.Dir, "state", "keystone", dir)); err != nil {
			return err
		}
	}
	if err := c.run(ctx, "keystone-bootstrap", "keystone-manage", "--config-file", c.conf("keystone.conf"), "bootstrap",
		"--bootstrap-password", c.Password,
		"--bootstrap-username", adminUser, "--bootstrap-project-name", adminProject, "--bootstrap-role-name", "admin",
		"--bootstrap-region-id", c.Region, "--bootstrap-admin-url", c.keystoneURL(),
		"--bootstrap-internal-url", c.keystoneURL(), "--bootstrap-public-url", c.keystoneURL()); err != nil {
		return err
	}
	p, err := c.uwsgi("keystone", "/usr/bin/keystone-wsgi-public", c.ports.keystone,
		"OS_KEYSTONE_CONFIG_DIR="+filepath.Join(c.Dir, "etc"), "OS_KEYSTONE_CONFIG_FILES=keystone.conf")
	if err != nil {
		return err
	}
	return c.waitFor(ctx, "Keystone", p, serviceTimeout, func(ctx context.Context) bool { return answers(ctx, c.keystoneURL()) })
}

// fernetKeys makes a key repository as keystone-manage fernet_setup and
// credential_setup do, without a Python start each: key 0 is staged, key 1
// primary, each 32 random bytes in URL-safe base64.
func fernetKeys(dir string) error {
	for _, name := range []string{"0", "1"} {
		var key [32]byte
		_, _ = rand.Read(key[:])
		if err := os.WriteFile(filepath.Join(dir, name), []byte(base64.URLEncoding.EncodeToString(key[:])), 0o600); err != nil {
			return errors.Wrap(err, "cannot write a Keystone key")
		}
	}
	return nil
}

// waitCompute waits for the compute host to be in Nova, and maps it to
// cell1 at once rather than at the scheduler's next discovery.
func (c *Cloud) waitCompute(ctx context.Context, cl *Clients, host string, p *process) error {
	if err := c.waitFor(ctx, "compute host "+host, p, serviceTimeout, func(ctx context.Context) bool {
		page, err := hypervisors.List(cl.Compute, nil).AllPages(ctx)
		if err != nil {
			return false
		}
		hs, err := hypervisors.ExtractHypervisors(page)
		return err == nil && slices.ContainsFunc(hs, func(h hypervisors.Hypervisor) bool { return h.Service.Host == host })
	}); err != nil {
		return err
	}
	return c.run(ctx, "nova-discover-hosts-"+host, "nova-manage", "--config-file", filepath.Join(c.Dir, "etc", "nova.conf"), "cell_v2", "discover_hosts")
}

// spareComputeConf is the spare compute host's configuration file.
const spareComputeConf = "nova-compute-2.conf"

// SetSpareHostEnabled enables the spare compute host in Nova, so that its
// scheduler may put servers there (a live migration's target is scheduled
// like a new server), or disables it again. The spare host runs only from
// the first time a test enables it: a cloud that never moves a server
// does not pay for a second compute service's start, and every server
// boots on ComputeHost. While it is enabled, Nova's scheduler, which
// spreads new servers over the hosts, may boot one on either host.
func (c *Cloud) SetSpareHostEnabled(ctx context.Context, enabled bool) error {
	c.spareMu.Lock()
	defer c.spareMu.Unlock()
	if c.spare == nil {
		if !enabled {
			return nil
		}
		cl, err := c.Clients(ctx)
		if err != nil {
			return err
		}
		// A new compute service starts enabled.
		if c.spare, err = c.service("nova-compute-2", "nova.cmd.compute", spareComputeConf); err != nil {
			return err
		}
		return c.waitCompute(ctx, cl, c.SpareComputeHost, c.spare)
	}
	return c.SetHostEnabled(ctx, c.SpareComputeHost, enabled, "the test cloud's spare host, not in use")
}

// SetHostEnabled enables or disables the running compute service of host
// in Nova, with why when it disables it: Nova's scheduler places nothing
// on a disabled host, and what runs there stays.
func (c *Cloud) SetHostEnabled(ctx context.Context, host string, enabled bool, why string) error {
	cl, err := c.Clients(ctx)
	if err != nil {
		return err
	}
	compute := *cl.Compute
	// Services are updated by id from 2.53 on.
	compute.Microversion = "2.53"
	page, err := services.List(&compute, services.ListOpts{Binary: "nova-compute", Host: host}).AllPages(ctx)
	if err != nil {
		return errors.Wrap(err, "cannot list the compute services")
	}
	all, err := services.ExtractServices(page)
	if err != nil || len(all) != 1 {
		return errors.Errorf("no compute service %s in Nova (%v)", host, err)
	}
	opts := services.UpdateOpts{Status: services.ServiceEnabled}
	if !enabled {
		opts = services.UpdateOpts{Status: services.ServiceDisabled, DisabledReason: why}
	}
	if _, err := services.Update(ctx, &compute, all[0].ID, opts).Extract(); err != nil {
		return errors.Wrapf(err, "cannot set compute service %s %s", host, opts.Status)
	}
	c.progress("compute host %s %s", host, opts.Status)
	return nil
}

// syncNova migrates Nova's API database, maps cell0 and cell1 and
// migrates the cells' databases, in that order.
func (c *Cloud) syncNova(ctx context.Context) error {
	for _, step := range [][]string{
		{"nova-api-db-sync", "api_db", "sync"},
		{"nova-map-cell0", "cell_v2", "map_cell0", "--database_connection", c.database("nova_cell0")},
		{"nova-create-cell1", "cell_v2", "create_cell", "--name", "cell1"},
		{"nova-db-sync", "db", "sync"},
	} {
		if err := c.run(ctx, step[0], append([]string{"nova-manage", "--config-file", c.conf("nova.conf")}, step[1:]...)...); err != nil {
			return err
		}
	}
	return nil
}

// service runs an OpenStack service's main function from Debian's
// python3-<project> with the cloud's configuration file: Debian ships some
// services only as WSGI scripts for uwsgi or as init scripts, but every
// main is in the library. Their worker launchers first check their
// workers less often (python/vflauncher.py says why).
func (c *Cloud) service(name, module, conf string) (*process, error) {
	return c.start(name, nil, python, "-c", "import sys, vflauncher; vflauncher.patch(); from "+module+" import main; sys.exit(main())",
		"--config-file", filepath.Join(c.Dir, "etc", conf))
}

// startGlance starts Glance's API; startServices waits for it.
func (c *Cloud) startGlance() error {
	p, err := c.service("glance-api", "glance.cmd.api", "glance-api.conf")
	if err != nil {
		return err
	}
	c.glance = p
	return nil
}

// startServices starts Placement, then Nova's, Cinder's and Neutron's
// services, and waits for them and for Glance (started before); the
// compute host last, once the conductor it reports through runs.
func (c *Cloud) startServices(ctx context.Context) error {
	p, err := c.uwsgi("placement", "/usr/bin/placement-api", c.ports.placement,
		"OS_PLACEMENT_CONFIG_DIR="+filepath.Join(c.Dir, "etc"))
	if err != nil {
		return err
	}
	if err := c.waitFor(ctx, "Placement", p, serviceTimeout, func(ctx context.Context) bool {
		return answers(ctx, fmt.Sprintf("http://127.0.0.1:%d/", c.ports.placement))
	}); err != nil {
		return err
	}
	type svc struct{ name, module, conf string }
	var api = map[string]*process{"glance-api": c.glance}
	for _, s := range []svc{
		{"nova-api", "nova.cmd.api", "nova.conf"},
		{"nova-conductor", "nova.cmd.conductor", "nova.conf"},
		{"nova-scheduler", "nova.cmd.scheduler", "nova.conf"},
		{"cinder-api", "cinder.cmd.api", "cinder.conf"},
		{"cinder-scheduler", "cinder.cmd.scheduler", "cinder.conf"},
		{"cinder-volume", "cinder.cmd.volume", "cinder.conf"},
		{"neutron-server", "neutron.cmd.eventlet.server", "neutron.conf"},
		{"nova-compute", "nova.cmd.compute", "nova.conf"},
	} {
		p, err := c.service(s.name, s.module, s.conf)
		if err != nil {
			return err
		}
		api[s.name] = p
	}
	for name, url := range map[string]string{
		"nova-api":       fmt.Sprintf("http://127.0.0.1:%d/", c.ports.nova),
		"cinder-api":     fmt.Sprintf("http://127.0.0.1:%d/", c.ports.cinder),
		"neutron-server": fmt.Sprintf("http://127.0.0.1:%d/", c.ports.neutron),
		"glance-api":     c.glanceURL() + "/",
	} {
		if err := c.waitFor(ctx, name, api[name], serviceTimeout, func(ctx context.Context) bool { return answers(ctx, url) }); err != nil {
			return err
		}
	}
	return c.waitBackends(ctx, api["nova-compute"], api["cinder-volume"])
}

// waitBackends waits for the compute host to be in Nova (and maps it to
// cell1 at once rather than at the scheduler's next discovery) and for
// Cinder's scheduler to know the volume backend's pool.
func (c *Cloud) waitBackends(ctx context.Context, compute, volume *process) error {
	cl, err := c.Clients(ctx)
	if err != nil {
		return err
	}
	if err := c.waitCompute(ctx, cl, c.ComputeHost, compute); err != nil {
		return err
	}
	return c.waitFor(ctx, "Cinder volume backend", volume, serviceTimeout, func(ctx context.Context) bool {
		page, err := schedulerstats.List(cl.Volume, schedulerstats.ListOpts{Detail: true}).AllPages(ctx)
		if err != nil {
			return false
		}
		pools, err := schedulerstats.ExtractStoragePools(page)
		return err == nil && len(pools) > 0 && strings.Contains(pools[0].Name, volumeBackend)
	})
}
