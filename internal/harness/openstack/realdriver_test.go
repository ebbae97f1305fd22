package openstack_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsecurity"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/provider"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// A real guest under TCG: the image's import, Nova's build, and the
// guest's boot to sshd each take minutes on a loaded 2-core machine.
const (
	realBootTimeout = 10 * time.Minute
	realSSHTimeout  = 10 * time.Minute
)

// TestNovaDriverBootsTheGuestImageOnARealHost is what a nova node does
// with a VM booting the example Debian image, on the real compute host:
// the driver downloads the image from its URL (the test's server on
// loopback, which the image allows) and verifies its sha256, uploads it to
// Glance, makes the boot volume from it in Cinder, and boots the server
// with the VM's key; the guest gets its fixed IP from Neutron's DHCP, and
// ssh with the VM's key reaches it at the address the driver reports.
func TestNovaDriverBootsTheGuestImageOnARealHost(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a QEMU guest under Debian's OpenStack; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("the real compute host needs root (libvirtd, loop devices, network namespaces)")
	}
	imagePath, err := guestimage.Path()
	require.NoError(t, err)
	if _, err := os.Stat(imagePath); err != nil {
		t.Skipf("the guest image is not built (%s); build it with `go run ./hack/guest-image` as root", imagePath)
	}
	ctx := context.Background()
	c := openstack.ForTest(t)
	// The cloud's directory goes with it: a failure shows the real host's
	// logs here.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, name := range []string{"nova-compute-real", "libvirtd", "neutron-linuxbridge-agent", "neutron-dhcp-agent", "cinder-volume", "glance-api"} {
			b, _ := os.ReadFile(filepath.Join(c.Dir, "logs", name+".log")) //nolint:gosec // the cloud's own log
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("the end of %s.log:\n%s", name, strings.Join(lines[max(len(lines)-40, 0):], "\n"))
		}
	})
	host, err := c.StartRealCompute(ctx)
	require.NoError(t, err, "logs in %s/logs", c.Dir)
	cl, err := c.Clients(ctx)
	require.NoError(t, err)
	// Nova's scheduler may choose only the real host while the test's
	// server is placed.
	setComputeEnabled(t, cl, c.ComputeHost, false)
	t.Cleanup(func() { setComputeEnabled(t, cl, c.ComputeHost, true) })

	// The image at a URL, as a DiskImage names it.
	sum := fileSHA256(t, imagePath)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, imagePath) }))
	t.Cleanup(srv.Close)

	// The site's network, which the VirtualNetwork imports: local (a
	// bridge on the host, DHCP in its namespace), without port security,
	// so no agent writes firewall rules in the machine's namespace.
	off := false
	network, err := networks.Create(ctx, cl.Network, portsecurity.NetworkCreateOptsExt{
		CreateOptsBuilder: provider.CreateOptsExt{
			CreateOptsBuilder: networks.CreateOpts{Name: "vf-real-lan"},
			Segments:          []provider.Segment{{NetworkType: "local"}},
		},
		PortSecurityEnabled: &off,
	}).Extract()
	require.NoError(t, err)
	t.Cleanup(func() { _ = networks.Delete(ctx, cl.Network, network.ID).ExtractErr() })
	dhcp := true
	_, err = subnets.Create(ctx, cl.Network, subnets.CreateOpts{
		NetworkID: network.ID, Name: "vf-real-lan", CIDR: "10.252.0.0/24", IPVersion: gophercloud.IPv4, EnableDHCP: &dhcp,
	}).Extract()
	require.NoError(t, err)
	require.NoError(t, c.ServeDHCP(ctx, network.ID))

	key := filepath.Join(t.TempDir(), "id_ed25519")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput()
	require.NoError(t, err, "ssh-keygen: %s", out)
	pub, err := os.ReadFile(key + ".pub") //nolint:gosec // the test's own key
	require.NoError(t, err)

	d := openDriver(t, c, func(cfg *nova.Config) { cfg.Node = "node-real"; cfg.Images.Dir = t.TempDir() })
	m := driver.Machine{
		UID: uuid.NewString(), Namespace: "ns", Name: "debian", Generation: 1,
		VCPU: 1, MemoryBytes: 768 << 20, Running: true, PublicKey: strings.TrimSpace(string(pub)),
		Disks: []driver.Disk{{Name: "ns_debian-root", SizeBytes: 3 << 30, Image: &driver.Image{
			UID: uuid.NewString(), Name: "debian-12", URL: srv.URL + "/debian.qcow2", SHA256: sum,
			AllowedSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		}}},
		Networks: []driver.Network{{Name: network.Name, Imported: true}},
	}
	t.Cleanup(func() {
		assert.Eventually(t, func() bool { return d.Delete(ctx, m.UID) == nil }, realBootTimeout, time.Second)
		assert.Eventually(t, func() bool { return d.DeleteVolume(ctx, m.Disks[0]) == nil }, realBootTimeout, time.Second)
	})

	start := time.Now()
	var o driver.Observation
	awaitFor(t, c, "the VM Running with an address", realBootTimeout, func() (bool, error) {
		if o, err = d.Ensure(ctx, m); err != nil {
			return false, err
		}
		return o.Phase == driver.PhaseRunning && len(o.Interfaces) == 1 && len(o.Interfaces[0].IPs) > 0, nil
	})
	t.Logf("Running on %s %s after the first Ensure", o.Node, time.Since(start).Round(time.Millisecond))
	require.Equal(t, host, o.Node, "the guest runs on the real compute host")
	ip := o.Interfaces[0].IPs[0]

	var got []byte
	awaitFor(t, c, "ssh into the guest at "+ip, realSSHTimeout, func() (bool, error) {
		ssh := exec.Command("ip", "netns", "exec", "qdhcp-"+network.ID, "ssh", "-i", key,
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
			"-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
			guestimage.DefaultUser+"@"+ip, "ip -4 -o addr show scope global")
		got, err = ssh.CombinedOutput()
		return err == nil, nil
	})
	t.Logf("ssh into the guest %s after the first Ensure: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(got)))
	assert.Contains(t, string(got), ip+"/24", "the guest holds the address the driver reports")
}

// setComputeEnabled enables or disables host's compute service in Nova.
func setComputeEnabled(t *testing.T, cl *openstack.Clients, host string, enabled bool) {
	t.Helper()
	ctx := context.Background()
	compute := *cl.Compute
	// Services are updated by id from 2.53 on.
	compute.Microversion = "2.53"
	page, err := services.List(&compute, services.ListOpts{Binary: "nova-compute", Host: host}).AllPages(ctx)
	require.NoError(t, err)
	all, err := services.ExtractServices(page)
	require.NoError(t, err)
	require.Len(t, all, 1, "compute service %s", host)
	opts := services.UpdateOpts{Status: services.ServiceEnabled}
	if !enabled {
		opts = services.UpdateOpts{Status: services.ServiceDisabled, DisabledReason: "a test boots on the real host"}
	}
	_, err = services.Update(ctx, &compute, all[0].ID, opts).Extract()
	require.NoError(t, err)
}

// fileSHA256 is the hex SHA-256 of the file at path.
func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path) //nolint:gosec // the harness's image
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// awaitFor polls cond every second until it is done, fails, or timeout passes.
func awaitFor(t *testing.T, c *openstack.Cloud, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, err := cond()
		require.NoError(t, err, "%s; the services' logs are in %s", what, filepath.Join(c.Dir, "logs"))
		if done {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s: not after %s; the services' logs are in %s", what, timeout, filepath.Join(c.Dir, "logs"))
		time.Sleep(time.Second)
	}
}
