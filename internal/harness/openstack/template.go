package openstack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// The services' migrations are most of a cold start. Their result depends
// only on the installed packages, so the first start on a machine dumps the
// migrated databases into the cache directory and later starts load the
// dump instead. The few rows that name this cloud's sockets and ports
// (Nova's cell mappings) are rewritten after loading; nothing else in the
// dump is per-cloud: Keystone's users, catalog and keys are made after it.

// templateVersion changes when what the harness migrates changes.
const templateVersion = "2"

// templatePath is the dump of the migrated databases for the installed
// packages, in $VIRTFLEET_CACHE_DIR or ~/.cache/virtfleet.
func templatePath() (string, error) {
	args := append([]string{"-W", "-f=${Package} ${Version}\n"}, Packages...)
	versions, err := exec.Command("dpkg-query", args...).Output()
	if err != nil {
		return "", errors.Wrap(err, "cannot read the packages' versions")
	}
	sum := sha256.Sum256(append([]byte(templateVersion+"\n"), versions...))
	dir := os.Getenv("VIRTFLEET_CACHE_DIR")
	if dir == "" {
		if dir, err = os.UserCacheDir(); err != nil {
			return "", errors.Wrap(err, "cannot find a cache directory; set VIRTFLEET_CACHE_DIR")
		}
		dir = filepath.Join(dir, "virtfleet")
	}
	return filepath.Join(dir, "openstack", "databases-"+hex.EncodeToString(sum[:8])+".sql"), nil
}

// databases loads the template, or migrates and saves one.
func (c *Cloud) databases(ctx context.Context) error {
	path, err := templatePath()
	if err != nil {
		return err
	}
	if f, err := os.Open(path); err == nil { //nolint:gosec // the harness's own cache
		defer func() { _ = f.Close() }()
		load := exec.CommandContext(ctx, "mariadb", "--no-defaults", "--socket="+c.mysqlSocket(), "-uroot")
		load.Stdin = f
		if out, err := load.CombinedOutput(); err != nil {
			return errors.Errorf("cannot load the databases from %s (delete it to migrate again): %v\n%s", path, err, out)
		}
		c.progress("databases loaded from %s", path)
		return c.sql(ctx, "map-cells", fmt.Sprintf(
			"UPDATE nova_api.cell_mappings SET database_connection='%s' WHERE name='cell0';"+
				"UPDATE nova_api.cell_mappings SET database_connection='%s', transport_url='%s' WHERE name='cell1';",
			c.database("nova_cell0"), c.database("nova"), c.transportURL()))
	}
	if err := c.migrate(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return errors.Wrap(err, "cannot create the cache directory")
	}
	tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
	f, err := os.Create(tmp) //nolint:gosec // the harness's own cache
	if err != nil {
		return errors.Wrap(err, "cannot create the databases' template")
	}
	dump := exec.CommandContext(ctx, "mariadb-dump", append([]string{"--no-defaults", "--socket=" + c.mysqlSocket(), "-uroot", "--databases"}, databases...)...)
	dump.Stdout = f
	err = dump.Run()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return errors.Wrap(err, "cannot dump the migrated databases")
	}
	c.progress("databases saved to %s for the next start", path)
	// Atomic: a test binary starting meanwhile sees the whole dump or none.
	return errors.Wrap(os.Rename(tmp, path), "cannot save the databases' template")
}
