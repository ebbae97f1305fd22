package openstack_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsecurity"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/provider"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// A real guest under TCG: converting the image into the volume, Nova's
// build, and the guest's boot to sshd each take minutes on a loaded
// 2-core machine.
const (
	realVolumeTimeout = 5 * time.Minute
	realBootTimeout   = 10 * time.Minute
	realSSHTimeout    = 10 * time.Minute
)

// TestRealGuestBootsFromAVolume boots the real-guest image on the real
// compute host as a user would: the image uploaded to Glance, a bootable
// volume made from it by Cinder, a server booted from the volume with a
// keypair on a network Neutron's DHCP agent serves, and ssh into the guest
// at its fixed IP with the keypair's key, which only cloud-init, reading
// Nova's config drive, gave the guest.
func TestRealGuestBootsFromAVolume(t *testing.T) {
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
		for _, name := range []string{"nova-compute-real", "libvirtd", "neutron-linuxbridge-agent", "neutron-dhcp-agent", "cinder-volume", "neutron-server"} {
			b, _ := os.ReadFile(filepath.Join(c.Dir, "logs", name+".log")) //nolint:gosec // the cloud's own log
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("the end of %s.log:\n%s", name, strings.Join(lines[max(len(lines)-40, 0):], "\n"))
		}
	})
	start := time.Now()
	host, err := c.StartRealCompute(ctx)
	require.NoError(t, err, "logs in %s/logs", c.Dir)
	t.Logf("the real compute host %s started in %s", host, time.Since(start).Round(time.Millisecond))
	cl, err := c.Clients(ctx)
	require.NoError(t, err)

	// The guest image, in Glance, then in a bootable volume.
	start = time.Now()
	img, err := images.Create(ctx, cl.Image, images.CreateOpts{Name: "vf-real-guest", DiskFormat: "qcow2", ContainerFormat: "bare"}).Extract()
	require.NoError(t, err)
	t.Cleanup(func() { _ = images.Delete(ctx, cl.Image, img.ID).ExtractErr() })
	f, err := os.Open(imagePath) //nolint:gosec // the harness's image
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	require.NoError(t, imagedata.Upload(ctx, cl.Image, img.ID, f).ExtractErr())
	t.Logf("image uploaded in %s", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	vol, err := volumes.Create(ctx, cl.Volume, volumes.CreateOpts{Name: "vf-real-root", Size: 3, ImageID: img.ID}, nil).Extract()
	require.NoError(t, err)
	t.Cleanup(func() { _ = volumes.Delete(ctx, cl.Volume, vol.ID, volumes.DeleteOpts{Cascade: true}).ExtractErr() })
	awaitFor(t, c, "volume available", realVolumeTimeout, func() (bool, error) {
		v, err := volumes.Get(ctx, cl.Volume, vol.ID).Extract()
		if err != nil {
			return false, err
		}
		return v.Status == "available", statusError(v.Status)
	})
	t.Logf("volume made from the image in %s", time.Since(start).Round(time.Millisecond))

	// The key, the network (local: a bridge on the host, DHCP in its
	// namespace; no port security: no agent writes firewall rules), the
	// flavor.
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput()
	require.NoError(t, err, "ssh-keygen: %s", out)
	pub, err := os.ReadFile(key + ".pub") //nolint:gosec // the test's own key
	require.NoError(t, err)
	kp, err := keypairs.Create(ctx, cl.Compute, keypairs.CreateOpts{Name: "vf-real", PublicKey: string(pub)}).Extract()
	require.NoError(t, err)
	t.Cleanup(func() { _ = keypairs.Delete(ctx, cl.Compute, kp.Name, nil).ExtractErr() })
	off := false
	network, err := networks.Create(ctx, cl.Network, portsecurity.NetworkCreateOptsExt{
		CreateOptsBuilder: provider.CreateOptsExt{
			CreateOptsBuilder: networks.CreateOpts{Name: "vf-real-net"},
			Segments:          []provider.Segment{{NetworkType: "local"}},
		},
		PortSecurityEnabled: &off,
	}).Extract()
	require.NoError(t, err)
	t.Cleanup(func() { _ = networks.Delete(ctx, cl.Network, network.ID).ExtractErr() })
	dhcp := true
	_, err = subnets.Create(ctx, cl.Network, subnets.CreateOpts{
		NetworkID: network.ID, Name: "vf-real-subnet", CIDR: "10.251.0.0/24", IPVersion: gophercloud.IPv4, EnableDHCP: &dhcp,
	}).Extract()
	require.NoError(t, err)
	require.NoError(t, c.ServeDHCP(ctx, network.ID))
	disk := 0
	flavor, err := flavors.Create(ctx, cl.Compute, flavors.CreateOpts{Name: "vf-real", VCPUs: 1, RAM: 768, Disk: &disk}).Extract()
	require.NoError(t, err)
	t.Cleanup(func() { _ = flavors.Delete(ctx, cl.Compute, flavor.ID).ExtractErr() })

	start = time.Now()
	srv, err := servers.Create(ctx, cl.Compute, keypairs.CreateOptsExt{
		CreateOptsBuilder: servers.CreateOpts{
			Name: "vf-real-guest", FlavorRef: flavor.ID,
			// An admin's zone:host puts the server on the real host.
			AvailabilityZone: "nova:" + host,
			Networks:         []servers.Network{{UUID: network.ID}},
			BlockDevice: []servers.BlockDevice{{
				UUID: vol.ID, SourceType: servers.SourceVolume, DestinationType: servers.DestinationVolume, BootIndex: 0,
			}},
		},
		KeyName: kp.Name,
	}, nil).Extract()
	require.NoError(t, err)
	t.Cleanup(func() {
		if servers.Delete(ctx, cl.Compute, srv.ID).ExtractErr() != nil {
			return
		}
		// The volume is deleted once Nova let go of it.
		deadline := time.Now().Add(realBootTimeout)
		for time.Now().Before(deadline) {
			if _, err := servers.Get(ctx, cl.Compute, srv.ID).Extract(); gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
				return
			}
			time.Sleep(time.Second)
		}
	})
	var s *servers.Server
	awaitFor(t, c, "server ACTIVE", realBootTimeout, func() (bool, error) {
		if s, err = servers.Get(ctx, cl.Compute, srv.ID).Extract(); err != nil {
			return false, err
		}
		if s.Status == "ERROR" {
			return false, &serverError{s.Fault.Message}
		}
		return s.Status == "ACTIVE", nil
	})
	active := time.Since(start)
	t.Logf("server ACTIVE on %s after %s", host, active.Round(time.Millisecond))
	require.Equal(t, host, s.Host)

	ip := fixedIP(t, s, network.Name)
	var got []byte
	awaitFor(t, c, "ssh into the guest at "+ip, realSSHTimeout, func() (bool, error) {
		ssh := exec.Command("ip", "netns", "exec", "qdhcp-"+network.ID, "ssh", "-i", key,
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
			"-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
			guestimage.DefaultUser+"@"+ip, "ip -4 -o addr show scope global; cat /etc/hostname")
		got, err = ssh.CombinedOutput()
		return err == nil, nil
	})
	t.Logf("ssh into the guest after %s (%s after ACTIVE): %s", time.Since(start).Round(time.Millisecond),
		(time.Since(start) - active).Round(time.Millisecond), strings.TrimSpace(string(got)))
	require.Contains(t, string(got), ip+"/24", "the guest has its fixed IP, by DHCP")
}

type serverError struct{ fault string }

func (e *serverError) Error() string { return "server in ERROR: " + e.fault }

// fixedIP is the server's address on network.
func fixedIP(t *testing.T, s *servers.Server, network string) string {
	t.Helper()
	addrs, ok := s.Addresses[network].([]any)
	require.True(t, ok && len(addrs) > 0, "no address on %s: %v", network, s.Addresses)
	a, ok := addrs[0].(map[string]any)
	require.True(t, ok, "address %v", addrs[0])
	ip, ok := a["addr"].(string)
	require.True(t, ok, "address %v", a)
	return ip
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
