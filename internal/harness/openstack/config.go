package openstack

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"gopkg.in/ini.v1"
)

// section is one INI section's keys, in the order they are written.
type section = [][2]string

// conf is an oslo.config file: sections by name.
type conf map[string]section

// write saves a configuration file under the cloud's directory.
func (c *Cloud) write(name string, cf conf) (string, error) {
	// oslo.config wants [DEFAULT] written out; ini writes the default
	// section bare unless told.
	ini.DefaultHeader = true
	f := ini.Empty()
	for _, sec := range sortedKeys(cf) {
		s, err := f.NewSection(sec)
		if err != nil {
			return "", errors.Wrapf(err, "%s: section %s", name, sec)
		}
		for _, kv := range cf[sec] {
			if _, err := s.NewKey(kv[0], kv[1]); err != nil {
				return "", errors.Wrapf(err, "%s: key %s", name, kv[0])
			}
		}
	}
	path := filepath.Join(c.Dir, "etc", name)
	return path, errors.Wrapf(f.SaveTo(path), "cannot write %s", path)
}

func sortedKeys(cf conf) []string {
	out := make([]string, 0, len(cf))
	// DEFAULT first, as the services' sample files have it; then sorted.
	if _, ok := cf["DEFAULT"]; ok {
		out = append(out, "DEFAULT")
	}
	rest := []string{}
	for k := range cf {
		if k != "DEFAULT" {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

// database is the SQLAlchemy URL of one of the cloud's databases, over the
// MariaDB socket.
func (c *Cloud) database(name string) string {
	return fmt.Sprintf("mysql+pymysql://root@localhost/%s?unix_socket=%s&charset=utf8", name, c.mysqlSocket())
}

func (c *Cloud) transportURL() string {
	return fmt.Sprintf("rabbit://guest:guest@127.0.0.1:%d/", c.ports.amqp)
}

// serviceAuth is a keystoneauth password section for a service user of
// the service project.
func (c *Cloud) serviceAuth(user string) section {
	return section{
		{"auth_type", "password"},
		{"auth_url", c.keystoneURL()},
		{"username", user},
		{"password", c.Password},
		{"project_name", serviceProject},
		{"user_domain_name", c.Domain},
		{"project_domain_name", c.Domain},
		{"region_name", c.Region},
	}
}

// authtoken is the keystonemiddleware section of a service's API. A token
// from another service must carry the service role, as Cinder requires of
// Nova's before it lets Nova detach a volume Nova attached.
func (c *Cloud) authtoken(user string) section {
	return append(section{
		{"www_authenticate_uri", c.keystoneURL()},
		{"service_token_roles", serviceRole},
		{"service_token_roles_required", "true"},
	}, c.serviceAuth(user)...)
}

// common are the DEFAULT keys every service shares.
func (c *Cloud) common(service string) section {
	return section{
		{"debug", "false"},
		{"use_stderr", "true"},
		{"state_path", filepath.Join(c.Dir, "state", service)},
		{"transport_url", c.transportURL()},
	}
}

func (c *Cloud) lockPath(service string) section {
	return section{{"lock_path", filepath.Join(c.Dir, "state", service, "lock")}}
}

func (c *Cloud) keystoneConf() conf {
	return conf{
		"DEFAULT":       {{"debug", "false"}, {"use_stderr", "true"}},
		"database":      {{"connection", c.database("keystone")}},
		"token":         {{"provider", "fernet"}},
		"fernet_tokens": {{"key_repository", filepath.Join(c.Dir, "state", "keystone", "fernet-keys")}},
		// Receipts (multi-factor auth) have a key repository of their own,
		// /etc/keystone/fernet-keys by default, which bootstrap checks: it
		// exists only where the keystone package's own setup ran (not with
		// make deps' debconf answers on a fresh machine).
		"fernet_receipts": {{"key_repository", filepath.Join(c.Dir, "state", "keystone", "fernet-keys")}},
		"credential":      {{"key_repository", filepath.Join(c.Dir, "state", "keystone", "credential-keys")}},
		// Every password authentication (each service's, each agent's,
		// each test client's) checks a bcrypt hash, at bcrypt's default
		// cost most of what Keystone spends on it. The cloud's passwords
		// are random and never leave the machine, so a hash that is hard
		// to reverse protects nothing: the cost bcrypt allows least.
		"identity": {{"password_hash_rounds", "4"}},
	}
}

func (c *Cloud) placementConf() conf {
	return conf{
		"DEFAULT":            {{"debug", "false"}, {"use_stderr", "true"}},
		"api":                {{"auth_strategy", "keystone"}},
		"placement_database": {{"connection", c.database("placement")}},
		"keystone_authtoken": c.authtoken("placement"),
		"oslo_policy":        {{"enforce_scope", "false"}, {"enforce_new_defaults", "false"}},
	}
}

// novaConf is one file for all of Nova's services but the spare compute
// host (spareComputeConf). The compute hosts run Nova's fake.FakeDriver:
// servers exist only in Nova's database, which is all the API shows; ports
// are bound by the harness's mechanism driver, so Nova waits for no
// vif-plugged event.
func (c *Cloud) novaConf() conf {
	return conf{
		"DEFAULT": append(c.common("nova"),
			[2]string{"host", c.ComputeHost},
			[2]string{"my_ip", "127.0.0.1"},
			[2]string{"compute_driver", "fake.FakeDriver"},
			[2]string{"enabled_apis", "osapi_compute"},
			[2]string{"osapi_compute_listen", "127.0.0.1"},
			[2]string{"osapi_compute_listen_port", fmt.Sprint(c.ports.nova)},
			[2]string{"osapi_compute_workers", "1"},
			[2]string{"instances_path", filepath.Join(c.Dir, "state", "nova", "instances")},
			[2]string{"vif_plugging_is_fatal", "false"},
			[2]string{"vif_plugging_timeout", "0"},
			[2]string{"allow_resize_to_same_host", "true"},
			[2]string{"heal_instance_info_cache_interval", "-1"},
		),
		"api":                {{"auth_strategy", "keystone"}},
		"api_database":       {{"connection", c.database("nova_api")}},
		"database":           {{"connection", c.database("nova")}},
		"keystone_authtoken": c.authtoken("nova"),
		"service_user":       append(section{{"send_service_user_token", "true"}}, c.serviceAuth("nova")...),
		"placement":          c.serviceAuth("placement"),
		"neutron":            c.serviceAuth("neutron"),
		"cinder":             {{"os_region_name", c.Region}, {"catalog_info", "volumev3::publicURL"}},
		// Nova's compute builds an image URL for every instance's
		// notification payload, and fails the build without an image
		// endpoint, even for a server that boots from a volume.
		"glance":    {{"api_servers", c.glanceURL()}},
		"conductor": {{"workers", "1"}},
		// The scheduler's discovery maps a new compute host to its cell:
		// until then Nova's API lists no hypervisor of it, which is what
		// waitCompute waits for.
		"scheduler":                    {{"workers", "1"}, {"discover_hosts_in_cells_interval", "2"}},
		"quota":                        {{"instances", "-1"}, {"cores", "-1"}, {"ram", "-1"}, {"key_pairs", "-1"}},
		"wsgi":                         {{"api_paste_config", "/etc/nova/api-paste.ini"}},
		"oslo_concurrency":             c.lockPath("nova"),
		"oslo_messaging_notifications": {{"driver", "noop"}},
		"oslo_policy":                  {{"enforce_scope", "false"}, {"enforce_new_defaults", "false"}},
		"vnc":                          {{"enabled", "false"}},
		"os_vif_ovs":                   {{"ovsdb_connection", ""}},
	}
}

// spareComputeConf is novaConf for the spare compute host: the same cloud
// under another host name, which is all that makes a second compute
// service (the fake driver keeps nothing on disk).
func (c *Cloud) spareComputeConf() conf {
	cf := c.novaConf()
	def := slices.Clone(cf["DEFAULT"])
	for i, kv := range def {
		if kv[0] == "host" {
			def[i][1] = c.SpareComputeHost
		}
	}
	cf["DEFAULT"] = def
	return cf
}

// volumeBackend is the name of the cloud's one volume backend and of its
// pool: the name it had when Cinder's FakeLoggingVolumeDriver served it,
// kept so that volumes' hosts (vf-cinder@fake#fake) read as they did.
const volumeBackend = "fake"

// cinderConf: one volume backend, served by the harness's vffile driver
// (python/vffile.py): every volume is a sparse raw file in the cloud's
// volumes directory (VolumePath), and a volume made from an image holds
// the image, fetched from the cloud's Glance and converted to raw.
func (c *Cloud) cinderConf() conf {
	return conf{
		"DEFAULT": append(c.common("cinder"),
			[2]string{"host", "vf-cinder"},
			[2]string{"my_ip", "127.0.0.1"},
			[2]string{"auth_strategy", "keystone"},
			[2]string{"osapi_volume_listen", "127.0.0.1"},
			[2]string{"osapi_volume_listen_port", fmt.Sprint(c.ports.cinder)},
			[2]string{"osapi_volume_workers", "1"},
			[2]string{"enabled_backends", volumeBackend},
			// Glance by its URL rather than from the catalog a user's
			// request carries: a context Cinder makes itself has none.
			[2]string{"glance_api_servers", c.glanceURL()},
			[2]string{"quota_volumes", "-1"},
			[2]string{"quota_gigabytes", "-1"},
			[2]string{"quota_snapshots", "-1"},
			[2]string{"quota_backups", "-1"},
			[2]string{"quota_backup_gigabytes", "-1"},
		),
		"database":           {{"connection", c.database("cinder")}},
		"keystone_authtoken": c.authtoken("cinder"),
		"service_user":       append(section{{"send_service_user_token", "true"}}, c.serviceAuth("cinder")...),
		"nova":               append(section{{"interface", "public"}}, c.serviceAuth("cinder")...),
		volumeBackend: {
			{"volume_driver", "vffile.FileDriver"},
			{"volume_backend_name", volumeBackend},
			{"vffile_directory", c.volumesDir()},
			// The real compute host's QEMU opens a 'local' volume as a
			// block device.
			{"vffile_block_device_hosts", c.RealComputeHost},
		},
		"oslo_concurrency":             c.lockPath("cinder"),
		"oslo_messaging_notifications": {{"driver", "noop"}},
		"oslo_policy":                  {{"enforce_scope", "false"}, {"enforce_new_defaults", "false"}},
	}
}

// glanceConf: Glance's API with its file store in the cloud's directory,
// for the formats of a virtfleet DiskImage. Images are uploaded (PUT
// .../file); of the import methods only glance-direct is on, its staging
// directory in the cloud's too (Glance empties it of strays at start, so
// the default, /tmp/staging, is no place for it). One process: workers 0
// serves from the parent.
func (c *Cloud) glanceConf() conf {
	state := filepath.Join(c.Dir, "state", "glance")
	return conf{
		"DEFAULT": {
			{"debug", "false"},
			{"use_stderr", "true"},
			{"bind_host", "127.0.0.1"},
			{"bind_port", fmt.Sprint(c.ports.glance)},
			{"workers", "0"},
			{"transport_url", c.transportURL()},
			{"enabled_import_methods", "[glance-direct]"},
			{"node_staging_uri", "file://" + filepath.Join(state, "staging") + "/"},
		},
		"database":           {{"connection", c.database("glance")}},
		"keystone_authtoken": c.authtoken("glance"),
		"paste_deploy":       {{"flavor", "keystone"}, {"config_file", "/etc/glance/glance-api-paste.ini"}},
		"glance_store": {
			{"stores", "file"},
			{"default_store", "file"},
			{"filesystem_store_datadir", filepath.Join(state, "images") + "/"},
		},
		"image_format":                 {{"disk_formats", "qcow2,raw"}, {"container_formats", "bare"}},
		"oslo_concurrency":             c.lockPath("glance"),
		"oslo_messaging_notifications": {{"driver", "noop"}},
		"oslo_policy":                  {{"enforce_scope", "false"}, {"enforce_new_defaults", "false"}},
	}
}

// neutronConf: ML2 with VXLAN tenant networks and no agents but the real
// compute host's; the harness's vfbind mechanism driver binds every other
// port, so Nova sees it bound and active. Neutron tells Nova when a port goes up or down (the events the
// real compute host waits for before it starts a guest); the fake hosts
// wait for none, and take one that comes as unexpected, which changes
// nothing. Of a port's other changes it tells Nova nothing.
//
// For the real compute host (StartRealCompute) Neutron's own linuxbridge
// mechanism driver comes first: it binds the ports of a host whose
// linuxbridge agent runs, as bridge ports, and passes on every other
// host's to vfbind. Networks of type local (a bridge on the host and
// nothing else) are for the real host's guests; no network goes to the
// DHCP agent unless asked (ServeDHCP), so the agent serves only those.
func (c *Cloud) neutronConf() conf {
	return conf{
		"DEFAULT": append(c.common("neutron"),
			[2]string{"bind_host", "127.0.0.1"},
			[2]string{"bind_port", fmt.Sprint(c.ports.neutron)},
			[2]string{"auth_strategy", "keystone"},
			[2]string{"core_plugin", "ml2"},
			[2]string{"service_plugins", ""},
			[2]string{"api_workers", "1"},
			[2]string{"rpc_workers", "0"},
			[2]string{"rpc_state_report_workers", "0"},
			[2]string{"notify_nova_on_port_status_changes", "true"},
			[2]string{"notify_nova_on_port_data_changes", "false"},
			[2]string{"network_auto_schedule", "false"},
		),
		"database":           {{"connection", c.database("neutron")}},
		"keystone_authtoken": c.authtoken("neutron"),
		"nova":               c.serviceAuth("neutron"),
		"ml2":                {{"type_drivers", "flat,vxlan,local"}, {"tenant_network_types", "vxlan"}, {"mechanism_drivers", "linuxbridge,vfbind"}, {"extension_drivers", "port_security"}},
		// Zed marks linuxbridge experimental: it refuses to load unless told.
		"experimental":                 {{"linuxbridge", "true"}},
		"ml2_type_vxlan":               {{"vni_ranges", "1:10000"}},
		"oslo_concurrency":             c.lockPath("neutron"),
		"oslo_messaging_notifications": {{"driver", "noop"}},
		"oslo_policy":                  {{"enforce_scope", "false"}, {"enforce_new_defaults", "false"}},
	}
}
