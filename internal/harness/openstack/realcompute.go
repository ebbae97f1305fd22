package openstack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/agents"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsecurity"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/provider"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// The real compute host: next to the fake ones, a nova-compute with Nova's
// libvirt driver whose servers are QEMU guests (TCG: [libvirt] virt_type
// qemu; the machines have no usable KVM), started only by the tests that
// boot one (StartRealCompute), since it costs time and memory.
//
// What it is made of, and why:
//
//   - A libvirtd of the cloud's own, with its virtlogd, in a mount
//     namespace of its own (unshare) where /run is a fresh tmpfs and
//     libvirt's state, log, cache and configuration directories are bind
//     mounts of the cloud's <dir>/libvirt, as internal/harness/guesthost
//     does, so it shares nothing with the machine's libvirt. It stays in the
//     machine's network namespace: nova-compute, which plugs the guests'
//     interfaces into bridges there, reaches the cloud's services on
//     127.0.0.1 only from there. Its configuration defines no network, so
//     it makes no bridge, address or firewall rule; QEMU runs as root
//     without a security driver, so it opens the cloud's files as they are.
//     Nova reaches it through its socket (qemu+unix:///system?socket=...).
//   - Neutron's linuxbridge agent and DHCP agent for the host. Ports of the
//     real host are bound by Neutron's linuxbridge mechanism driver as
//     bridge ports; the guests' networks are of type local: a bridge
//     (brq<network>) with the guests' taps and the DHCP agent's veth, and
//     no IPv4 address or uplink in the machine's namespace (the kernel
//     gives it an IPv6 link-local one, as any interface). The DHCP agent runs
//     dnsmasq in the network's qdhcp-<network> namespace, which holds the
//     one address on the network's subnet outside the guests, and where a
//     test reaches a guest (ip netns exec qdhcp-<network> ssh ...). Security
//     groups are off (noop firewall); a guest's network is to be made
//     without port security (port_security_enabled false, as
//     TestRealGuestBootsFromAVolume does), else the linuxbridge agent
//     writes ebtables rules against ARP spoofing in the machine's
//     namespace.
//   - A volume of the cloud is a file, and Nova's libvirt driver makes a
//     'local' volume a block disk: Cinder's vffile driver hands this host a
//     loop device over the file (vffile_block_device_hosts).
//   - Nova's config drive (ISO 9660, label config-2, made with genisoimage)
//     gives cloud-init the server's key; the guest image reads the
//     ConfigDrive datasource after NoCloud. Nova's metadata service is not
//     reachable from the guests' networks.
//   - Unlike the fake hosts, this one waits for Neutron's
//     network-vif-plugged event before it starts a guest, and fails the
//     build without it: the linuxbridge agent reports the guest's tap up
//     once it is on the bridge, the port goes ACTIVE, and Neutron tells
//     Nova.
//   - oslo.privsep's helpers run as privsep-helper without sudo: the
//     services run as root.

// DefaultRealComputeHost is the default name of the real compute host.
const DefaultRealComputeHost = "vf-compute-real"

// RealComputePackages are the Debian packages the real compute host runs
// from, beyond Packages; hack/deps.sh installs them.
var RealComputePackages = []string{
	"python3-libvirt", "libvirt-daemon-system", "libvirt-clients", "qemu-system-x86", "genisoimage",
	"neutron-linuxbridge-agent", "neutron-dhcp-agent", "dnsmasq-base",
}

// MissingRealCompute are the RealComputePackages not installed.
func MissingRealCompute() []string {
	var out []string
	for _, p := range RealComputePackages {
		st, err := exec.Command("dpkg-query", "-W", "-f=${Status}", p).Output()
		if err != nil || !strings.Contains(string(st), "install ok installed") {
			out = append(out, p)
		}
	}
	return out
}

// Configuration files of the real compute host and its agents.
const (
	realComputeConf      = "nova-compute-real.conf"
	linuxbridgeAgentConf = "neutron-linuxbridge-agent.conf"
	dhcpAgentConf        = "neutron-dhcp-agent.conf"
)

// realCompute is the running real compute host.
type realCompute struct {
	// dir holds libvirtd's directories.
	dir string
	uri string
	// networks are those given to the DHCP agent, whose namespaces and
	// bridges cleanUp removes.
	networks []string
}

func (r *realCompute) socket() string { return filepath.Join(r.dir, "run", "libvirt-sock") }

// StartRealCompute starts the real compute host, unless it runs, and
// returns its name once Nova knows it. Stop stops it with the cloud, its
// guests, their loop devices and the agents' namespaces included. A start
// that failed fails every later call the same way (the logs say why).
func (c *Cloud) StartRealCompute(ctx context.Context) (string, error) {
	c.realMu.Lock()
	defer c.realMu.Unlock()
	if c.real != nil {
		return c.RealComputeHost, c.realErr
	}
	host, err := c.startRealCompute(ctx)
	c.realErr = err
	return host, err
}

func (c *Cloud) startRealCompute(ctx context.Context) (string, error) {
	if missing := MissingRealCompute(); len(missing) > 0 {
		return "", errors.Errorf("the Debian packages of the real compute host are not installed: %s; run `make deps` as root (hack/deps.sh)", strings.Join(missing, " "))
	}
	start := time.Now()
	r := &realCompute{dir: filepath.Join(c.Dir, "libvirt")}
	r.uri = "qemu+unix:///system?socket=" + r.socket()
	// From here on Stop cleans up what there is.
	c.real = r
	if err := r.writeLibvirtConfig(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(c.realInstancesPath(), 0o700); err != nil {
		return "", errors.Wrap(err, "cannot create the real compute host's instances directory")
	}
	if err := os.WriteFile(c.conf(dnsmasqConf), []byte("user=root\n"), 0o600); err != nil {
		return "", errors.Wrap(err, "cannot write dnsmasq's configuration")
	}
	for name, cf := range map[string]conf{
		realComputeConf:      c.realComputeConf(r.uri),
		linuxbridgeAgentConf: c.linuxbridgeAgentConf(),
		dhcpAgentConf:        c.dhcpAgentConf(),
	} {
		if _, err := c.write(name, cf); err != nil {
			return "", err
		}
	}
	// guesthost's daemon, in a mount namespace of its own: virtlogd and
	// libvirtd in the process group Stop signals, virtlogd dying with
	// libvirtd, and libvirtd with the test binary (start's parent-death
	// signal), should the binary die before Stop.
	libvirtd, err := c.start("libvirtd", nil, "unshare", "--mount", "--propagation", "private",
		"bash", "-c", guesthost.DaemonScript, "libvirtd", r.dir)
	if err != nil {
		return "", err
	}
	lb, err := c.start("neutron-linuxbridge-agent", nil, python, "-c",
		"import sys; from neutron.cmd.eventlet.plugins.linuxbridge_neutron_agent import main; sys.exit(main())",
		"--config-file", c.conf(linuxbridgeAgentConf))
	if err != nil {
		return "", err
	}
	dhcp, err := c.start("neutron-dhcp-agent", nil, python, "-c",
		"import sys; from neutron.cmd.eventlet.agents.dhcp import main; sys.exit(main())",
		"--config-file", c.conf(dhcpAgentConf))
	if err != nil {
		return "", err
	}
	if err := c.waitFor(ctx, "libvirtd", libvirtd, serviceTimeout, func(context.Context) bool {
		conn, err := net.DialTimeout("unix", r.socket(), time.Second)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	}); err != nil {
		return "", err
	}
	compute, err := c.service("nova-compute-real", "nova.cmd.compute", realComputeConf)
	if err != nil {
		return "", err
	}
	cl, err := c.Clients(ctx)
	if err != nil {
		return "", err
	}
	for _, a := range []struct {
		typ string
		p   *process
	}{{"Linux bridge agent", lb}, {"DHCP agent", dhcp}} {
		if err := c.waitFor(ctx, "Neutron's "+a.typ, a.p, serviceTimeout, func(ctx context.Context) bool {
			_, err := c.agent(ctx, cl, a.typ)
			return err == nil
		}); err != nil {
			return "", err
		}
	}
	if err := c.waitCompute(ctx, cl, c.RealComputeHost, compute); err != nil {
		return "", err
	}
	c.progress("real compute host %s ready in %s", c.RealComputeHost, time.Since(start).Round(100*time.Millisecond))
	return c.RealComputeHost, nil
}

// agent is the live Neutron agent of type typ on the real compute host.
func (c *Cloud) agent(ctx context.Context, cl *Clients, typ string) (*agents.Agent, error) {
	page, err := agents.List(cl.Network, agents.ListOpts{AgentType: typ, Host: c.RealComputeHost}).AllPages(ctx)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list Neutron's agents")
	}
	all, err := agents.ExtractAgents(page)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read Neutron's agents")
	}
	for i := range all {
		if all[i].Alive {
			return &all[i], nil
		}
	}
	return nil, errors.Errorf("no live %s on %s", typ, c.RealComputeHost)
}

// GuestNetwork makes a network for the real host's guests, named name,
// with a DHCP subnet of cidr that the DHCP agent serves: type local, and
// without port security, so that no agent writes firewall rules in the
// machine's namespace. A test reaches its guests from the network's
// namespace, qdhcp-<id>. It returns the network's id.
func (c *Cloud) GuestNetwork(ctx context.Context, name, cidr string) (string, error) {
	cl, err := c.Clients(ctx)
	if err != nil {
		return "", err
	}
	off, dhcp := false, true
	n, err := networks.Create(ctx, cl.Network, portsecurity.NetworkCreateOptsExt{
		CreateOptsBuilder: provider.CreateOptsExt{
			CreateOptsBuilder: networks.CreateOpts{Name: name},
			Segments:          []provider.Segment{{NetworkType: "local"}},
		},
		PortSecurityEnabled: &off,
	}).Extract()
	if err != nil {
		return "", errors.Wrapf(err, "cannot create network %s", name)
	}
	if _, err := subnets.Create(ctx, cl.Network, subnets.CreateOpts{NetworkID: n.ID, Name: name, CIDR: cidr, IPVersion: gophercloud.IPv4, EnableDHCP: &dhcp}).Extract(); err != nil {
		return n.ID, errors.Wrapf(err, "cannot create the subnet of network %s", name)
	}
	return n.ID, c.ServeDHCP(ctx, n.ID)
}

// ServeDHCP gives a network to the real compute host's DHCP agent, which
// then serves its subnets' addresses from the namespace qdhcp-<network>:
// Neutron schedules no network to it by itself (network_auto_schedule is
// off), so that it serves only the real host's guests' networks.
func (c *Cloud) ServeDHCP(ctx context.Context, networkID string) error {
	c.realMu.Lock()
	defer c.realMu.Unlock()
	if c.real == nil || c.realErr != nil {
		return errors.New("the real compute host does not run; StartRealCompute first")
	}
	cl, err := c.Clients(ctx)
	if err != nil {
		return err
	}
	a, err := c.agent(ctx, cl, "DHCP agent")
	if err != nil {
		return err
	}
	c.real.networks = append(c.real.networks, networkID)
	return errors.Wrapf(agents.ScheduleDHCPNetwork(ctx, cl.Network, a.ID, agents.ScheduleDHCPNetworkOpts{NetworkID: networkID}).ExtractErr(),
		"cannot give network %s to the DHCP agent", networkID)
}

// writeLibvirtConfig makes libvirtd's directories and its configuration:
// a host UUID of its own (every daemon here would take the machine's), no
// network, QEMU as root without a security driver.
func (r *realCompute) writeLibvirtConfig() error {
	for _, sub := range []string{"run", "lib", "log", "cache", "etc"} {
		if err := os.MkdirAll(filepath.Join(r.dir, sub), 0o700); err != nil {
			return errors.Wrap(err, "cannot create libvirtd's directories")
		}
	}
	for name, content := range map[string]string{
		"libvirtd.conf": fmt.Sprintf("host_uuid = %q\n", uuid.NewString()),
		"qemu.conf":     "user = \"root\"\ngroup = \"root\"\ndynamic_ownership = 0\nremember_owner = 0\nsecurity_driver = \"none\"\n",
	} {
		if err := os.WriteFile(filepath.Join(r.dir, "etc", name), []byte(content), 0o600); err != nil {
			return errors.Wrapf(err, "cannot write libvirtd's %s", name)
		}
	}
	return nil
}

func (c *Cloud) realInstancesPath() string {
	return filepath.Join(c.Dir, "state", "nova", "instances-real")
}

// privsep has oslo.privsep start a context's helper without sudo, with the
// service's configuration file.
func (c *Cloud) privsep(cf conf, file string, sections ...string) {
	for _, s := range sections {
		cf[s] = section{{"helper_command", "privsep-helper --config-file " + c.conf(file)}}
	}
}

// setKey sets key in s, replacing it if it is there.
func setKey(s section, key, value string) section {
	s = slices.Clone(s)
	for i, kv := range s {
		if kv[0] == key {
			s[i][1] = value
			return s
		}
	}
	return append(s, [2]string{key, value})
}

// realComputeConf is novaConf for the real compute host: the libvirt
// driver on the cloud's libvirtd, a config drive for every server,
// instances in a directory of the host's own, and Neutron's vif-plugged
// events awaited.
func (c *Cloud) realComputeConf(uri string) conf {
	cf := c.novaConf()
	def := cf["DEFAULT"]
	for _, kv := range [][2]string{
		{"host", c.RealComputeHost},
		{"compute_driver", "libvirt.LibvirtDriver"},
		{"instances_path", c.realInstancesPath()},
		{"force_config_drive", "true"},
		{"config_drive_format", "iso9660"},
		{"mkisofs_cmd", "genisoimage"},
		{"vif_plugging_is_fatal", "true"},
		{"vif_plugging_timeout", "300"},
	} {
		def = setKey(def, kv[0], kv[1])
	}
	cf["DEFAULT"] = def
	// No CPU model: QEMU's default, which TCG emulates.
	cf["libvirt"] = section{{"virt_type", "qemu"}, {"connection_uri", uri}, {"cpu_mode", "none"}}
	c.privsep(cf, realComputeConf, "nova_sys_admin", "vif_plug_linux_bridge_privileged", "vif_plug_ovs_privileged", "privsep_osbrick")
	return cf
}

// neutronPrivsep are the privsep contexts of Neutron's agents.
var neutronPrivsep = []string{"privsep", "privsep_dhcp_release", "privsep_ovs_vsctl", "privsep_namespace", "privsep_conntrack", "privsep_link"}

// agentDefaults are the DEFAULT keys of the real compute host's agents:
// the cloud's Neutron state and RabbitMQ, on the real host. An empty root
// helper runs their commands as they are: they run as root.
func (c *Cloud) agentConf(file string, def ...[2]string) conf {
	cf := conf{
		"DEFAULT":          append(append(c.common("neutron"), [2]string{"host", c.RealComputeHost}), def...),
		"agent":            {{"root_helper", ""}},
		"oslo_concurrency": c.lockPath("neutron"),
	}
	c.privsep(cf, file, neutronPrivsep...)
	return cf
}

// linuxbridgeAgentConf: no physical interface and no VXLAN (the real
// host's networks are local ones), no firewall.
func (c *Cloud) linuxbridgeAgentConf() conf {
	cf := c.agentConf(linuxbridgeAgentConf)
	cf["linux_bridge"] = section{{"physical_interface_mappings", ""}}
	cf["vxlan"] = section{{"enable_vxlan", "false"}}
	cf["securitygroup"] = section{{"firewall_driver", "noop"}, {"enable_security_group", "false"}}
	return cf
}

// dnsmasqConf is the dnsmasq configuration file the DHCP agent adds to
// its own options.
const dnsmasqConf = "dnsmasq.conf"

// dhcpAgentConf: dnsmasq behind a veth on the network's bridge, no
// metadata proxy. dnsmasq stays root: it drops to nobody otherwise, who
// cannot read the hosts file the agent rewrites in the cloud's directory
// (0700) and signals it to reload, and then answers nobody. It logs to
// the cloud's logs/dnsmasq.
func (c *Cloud) dhcpAgentConf() conf {
	return c.agentConf(dhcpAgentConf,
		[2]string{"interface_driver", "linuxbridge"},
		[2]string{"enable_isolated_metadata", "false"},
		[2]string{"force_metadata", "false"},
		[2]string{"dnsmasq_local_resolv", "false"},
		[2]string{"dnsmasq_config_file", c.conf(dnsmasqConf)},
		[2]string{"dnsmasq_base_log_dir", filepath.Join(c.Dir, "logs", "dnsmasq")},
	)
}

// destroyGuests destroys the real host's guests while libvirtd runs:
// QEMU runs in a session of its own, which stopping libvirtd's process
// group does not reach.
func (r *realCompute) destroyGuests(c *Cloud) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "virsh", "-c", r.uri, "list", "--name").Output()
	if err != nil {
		return
	}
	for _, name := range strings.Fields(string(out)) {
		if err := exec.CommandContext(ctx, "virsh", "-c", r.uri, "destroy", name).Run(); err != nil {
			c.progress("cannot destroy guest %s: %v", name, err)
		}
	}
}

// cleanUp removes what outlives the real host's processes once Stop has
// killed every process of the cloud (killCloud: QEMU and the DHCP agent's
// dnsmasq among them): the DHCP agent's namespaces, the networks' bridges,
// and the loop devices over the cloud's volumes.
func (r *realCompute) cleanUp(c *Cloud) {
	removeNetworks(c.Dir, r.networks)
	detachLoops(c.volumesDir())
	c.progress("real compute host cleaned up")
}
