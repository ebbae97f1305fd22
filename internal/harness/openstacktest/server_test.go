package openstacktest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

const password = "test-password"

type session struct {
	s       *openstacktest.Server
	compute *gophercloud.ServiceClient
	volume  *gophercloud.ServiceClient
	network *gophercloud.ServiceClient
}

func start(t *testing.T) *session {
	t.Helper()
	return startWith(t, 20*time.Millisecond)
}

func startWith(t *testing.T, delay time.Duration) *session {
	t.Helper()
	s, err := openstacktest.Start(openstacktest.Options{Password: password, TransitionDelay: delay, Hosts: []string{"h1", "h2"}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	pc, err := openstack.AuthenticatedClient(context.Background(), authOptions(s, password))
	require.NoError(t, err)
	eo := gophercloud.EndpointOpts{Region: openstacktest.DefaultRegion}
	c := &session{s: s}
	c.compute, err = openstack.NewComputeV2(pc, eo)
	require.NoError(t, err)
	c.volume, err = openstack.NewBlockStorageV3(pc, eo)
	require.NoError(t, err)
	c.network, err = openstack.NewNetworkV2(pc, eo)
	require.NoError(t, err)
	return c
}

func authOptions(s *openstacktest.Server, pw string) gophercloud.AuthOptions {
	return gophercloud.AuthOptions{
		IdentityEndpoint: s.AuthURL(), Username: openstacktest.DefaultUsername, Password: pw, DomainName: openstacktest.DefaultDomain,
		Scope: &gophercloud.AuthScope{ProjectName: openstacktest.DefaultProject, DomainName: openstacktest.DefaultDomain}, AllowReauth: true,
	}
}

// bootable makes an available volume and a network with a subnet.
func (c *session) bootable(t *testing.T) (volumeID, networkID string) {
	t.Helper()
	ctx := context.Background()
	v, err := volumes.Create(ctx, c.volume, volumes.CreateOpts{Name: "root", Size: 1}, nil).Extract()
	require.NoError(t, err)
	assert.Equal(t, "creating", v.Status)
	require.Eventually(t, func() bool {
		got, err := volumes.Get(ctx, c.volume, v.ID).Extract()
		return err == nil && got.Status == "available"
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, volumes.SetBootable(ctx, c.volume, v.ID, volumes.BootableOpts{Bootable: true}).ExtractErr())
	n, err := networks.Create(ctx, c.network, networks.CreateOpts{Name: "net"}).Extract()
	require.NoError(t, err)
	_, err = subnets.Create(ctx, c.network, subnets.CreateOpts{NetworkID: n.ID, CIDR: "10.0.0.0/24", IPVersion: 4}).Extract()
	require.NoError(t, err)
	return v.ID, n.ID
}

func (c *session) boot(t *testing.T, volumeID, networkID string) string {
	t.Helper()
	s, err := servers.Create(context.Background(), c.compute, servers.CreateOpts{
		Name: "vm", FlavorRef: "1", Networks: []servers.Network{{UUID: networkID}}, Metadata: map[string]string{"k": "v"},
		BlockDevice: []servers.BlockDevice{{SourceType: servers.SourceVolume, DestinationType: servers.DestinationVolume, UUID: volumeID}},
	}, nil).Extract()
	require.NoError(t, err)
	return s.ID
}

func (c *session) waitStatus(t *testing.T, id, status string) *servers.Server {
	t.Helper()
	var s *servers.Server
	require.Eventually(t, func() bool {
		var err error
		s, err = servers.Get(context.Background(), c.compute, id).Extract()
		return err == nil && s.Status == status && s.TaskState == ""
	}, 5*time.Second, 10*time.Millisecond, "server never %s", status)
	return s
}

func TestIdentity(t *testing.T) {
	t.Parallel()
	s, err := openstacktest.Start(openstacktest.Options{Password: password})
	require.NoError(t, err)
	defer s.Close()
	cases := []struct {
		name     string
		password string
		ok       bool
	}{
		{name: "TheRightPasswordGetsATokenAndTheCatalog", password: password, ok: true},
		{name: "AWrongPasswordIsRefused", password: "nope"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := openstack.AuthenticatedClient(context.Background(), authOptions(s, tc.password))
			if !tc.ok {
				require.Error(t, err)
				assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusUnauthorized), "%v", err)
				return
			}
			require.NoError(t, err)
			assert.NotEmpty(t, pc.TokenID)
			for _, newClient := range []func(*gophercloud.ProviderClient, gophercloud.EndpointOpts) (*gophercloud.ServiceClient, error){
				openstack.NewComputeV2, openstack.NewBlockStorageV3, openstack.NewNetworkV2,
			} {
				sc, err := newClient(pc, gophercloud.EndpointOpts{Region: openstacktest.DefaultRegion})
				require.NoError(t, err)
				assert.Contains(t, sc.Endpoint, s.URL())
			}
			_, err = openstack.NewComputeV2(pc, gophercloud.EndpointOpts{Region: "Elsewhere"})
			assert.Error(t, err, "endpoints are in one region")
		})
	}
	t.Run("AnExpiredTokenIsRefusedAndRenewed", func(t *testing.T) {
		opts := authOptions(s, password)
		opts.AllowReauth = false
		pc, err := openstack.AuthenticatedClient(context.Background(), opts)
		require.NoError(t, err)
		compute, err := openstack.NewComputeV2(pc, gophercloud.EndpointOpts{})
		require.NoError(t, err)
		s.ExpireTokens()
		_, err = flavors.ListDetail(compute, nil).AllPages(context.Background())
		assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusUnauthorized), "%v", err)

		reauth, err := openstack.AuthenticatedClient(context.Background(), authOptions(s, password))
		require.NoError(t, err)
		compute, err = openstack.NewComputeV2(reauth, gophercloud.EndpointOpts{})
		require.NoError(t, err)
		s.ExpireTokens()
		issued := s.TokensIssued()
		_, err = flavors.ListDetail(compute, nil).AllPages(context.Background())
		require.NoError(t, err)
		assert.Equal(t, issued+1, s.TokensIssued())
	})
}

func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	c := start(t)
	ctx := context.Background()
	vol, net := c.bootable(t)
	before := time.Now().Add(-time.Second)
	id := c.boot(t, vol, net)

	got, err := servers.Get(ctx, c.compute, id).Extract()
	require.NoError(t, err)
	assert.Equal(t, openstacktest.StatusBuild, got.Status)
	s := c.waitStatus(t, id, openstacktest.StatusActive)
	assert.Contains(t, []string{"h1", "h2"}, s.Host)
	assert.Contains(t, s.Addresses, "net")
	assert.Equal(t, "1", s.Flavor["id"], "2.1 shows the flavor's id")
	require.Len(t, s.AttachedVolumes, 1)
	assert.Equal(t, vol, s.AttachedVolumes[0].ID)
	v, err := volumes.Get(ctx, c.volume, vol).Extract()
	require.NoError(t, err)
	assert.Equal(t, "in-use", v.Status)

	c.compute.Microversion = "2.60"
	s, err = servers.Get(ctx, c.compute, id).Extract()
	require.NoError(t, err)
	assert.EqualValues(t, 512, s.Flavor["ram"], "2.47 and later embed the flavor")

	steps := []struct {
		name   string
		act    func() error
		status string
		code   int
	}{
		{name: "StartingARunningServerConflicts", act: func() error { return servers.Start(ctx, c.compute, id).ExtractErr() }, code: http.StatusConflict},
		{name: "Stop", act: func() error { return servers.Stop(ctx, c.compute, id).ExtractErr() }, status: openstacktest.StatusShutoff},
		{name: "ResizeWhileStopped", act: func() error {
			return servers.Resize(ctx, c.compute, id, servers.ResizeOpts{FlavorRef: "3"}).ExtractErr()
		}, status: openstacktest.StatusVerifyResize},
		{name: "ConfirmResizeReturnsToStopped", act: func() error { return servers.ConfirmResize(ctx, c.compute, id).ExtractErr() }, status: openstacktest.StatusShutoff},
		{name: "Start", act: func() error { return servers.Start(ctx, c.compute, id).ExtractErr() }, status: openstacktest.StatusActive},
		{name: "Reboot", act: func() error {
			return servers.Reboot(ctx, c.compute, id, servers.RebootOpts{Type: servers.SoftReboot}).ExtractErr()
		}, status: openstacktest.StatusActive},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			err := st.act()
			if st.code != 0 {
				assert.True(t, gophercloud.ResponseCodeIs(err, st.code), "%v", err)
				return
			}
			require.NoError(t, err)
			c.waitStatus(t, id, st.status)
		})
	}
	assert.EqualValues(t, 2, c.s.Servers()[0].VCPUs, "the resize took")

	require.NoError(t, servers.Delete(ctx, c.compute, id).ExtractErr())
	_, err = servers.Get(ctx, c.compute, id).Extract()
	assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusNotFound))
	all, err := servers.List(c.compute, servers.ListOpts{}).AllPages(ctx)
	require.NoError(t, err)
	list, err := servers.ExtractServers(all)
	require.NoError(t, err)
	assert.Empty(t, list, "a deleted server leaves plain lists")
	all, err = servers.List(c.compute, servers.ListOpts{ChangesSince: before.UTC().Format(time.RFC3339)}).AllPages(ctx)
	require.NoError(t, err)
	list, err = servers.ExtractServers(all)
	require.NoError(t, err)
	require.Len(t, list, 1, "changes-since shows it")
	assert.Equal(t, openstacktest.StatusDeleted, list[0].Status)
	all, err = servers.List(c.compute, servers.ListOpts{ChangesSince: time.Now().Add(time.Minute).UTC().Format(time.RFC3339)}).AllPages(ctx)
	require.NoError(t, err)
	list, err = servers.ExtractServers(all)
	require.NoError(t, err)
	assert.Empty(t, list, "nothing changed after then")
}

func TestCreateIsValidated(t *testing.T) {
	t.Parallel()
	c := start(t)
	ctx := context.Background()
	vol, net := c.bootable(t)
	disk := 0
	private := false
	f, err := flavors.Create(ctx, c.compute, flavors.CreateOpts{Name: "private", VCPUs: 1, RAM: 64, Disk: &disk, IsPublic: &private}).Extract()
	require.NoError(t, err)
	empty, err := volumes.Create(ctx, c.volume, volumes.CreateOpts{Name: "empty", Size: 1}, nil).Extract()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := volumes.Get(ctx, c.volume, empty.ID).Extract()
		return err == nil && got.Status == "available"
	}, 5*time.Second, 10*time.Millisecond)
	cases := []struct {
		name   string
		change func(o *servers.CreateOpts)
		key    string
	}{
		{name: "UnknownVolume", change: func(o *servers.CreateOpts) { o.BlockDevice[0].UUID = "nope" }},
		{name: "UnknownNetwork", change: func(o *servers.CreateOpts) { o.Networks = []servers.Network{{UUID: "nope"}} }},
		{name: "UnknownFlavor", change: func(o *servers.CreateOpts) { o.FlavorRef = "nope" }},
		{name: "PrivateFlavorWithoutAccess", change: func(o *servers.CreateOpts) { o.FlavorRef = f.ID }},
		{name: "UnknownKeypair", change: func(*servers.CreateOpts) {}, key: "nope"},
		{name: "BootVolumeNotBootable", change: func(o *servers.CreateOpts) { o.BlockDevice[0].UUID = empty.ID }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := servers.CreateOpts{Name: "x", FlavorRef: "1", Networks: []servers.Network{{UUID: net}},
				BlockDevice: []servers.BlockDevice{{SourceType: servers.SourceVolume, DestinationType: servers.DestinationVolume, UUID: vol}}}
			tc.change(&o)
			_, err := servers.Create(ctx, c.compute, keypairs.CreateOptsExt{CreateOptsBuilder: o, KeyName: tc.key}, nil).Extract()
			assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusBadRequest), "%v", err)
		})
	}
	assert.Empty(t, c.s.Servers())
	_, err = flavors.AddAccess(ctx, c.compute, f.ID, flavors.AddAccessOpts{Tenant: c.s.ProjectID()}).Extract()
	require.NoError(t, err)
	_, err = servers.Create(ctx, c.compute, servers.CreateOpts{Name: "x", FlavorRef: f.ID,
		BlockDevice: []servers.BlockDevice{{SourceType: servers.SourceVolume, DestinationType: servers.DestinationVolume, UUID: vol}}}, nil).Extract()
	assert.NoError(t, err, "access granted")
}

func TestFaultsAndControls(t *testing.T) {
	t.Parallel()
	c := start(t)
	ctx := context.Background()
	cases := []struct {
		name       string
		status     int
		retryAfter time.Duration
	}{
		{name: "Conflict", status: http.StatusConflict},
		{name: "OverLimitWithRetryAfter", status: http.StatusRequestEntityTooLarge, retryAfter: 2 * time.Second},
		{name: "ServerError", status: http.StatusInternalServerError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c.s.FailNext(http.MethodGet, openstacktest.ComputePath+"/flavors/detail", 2, tc.status, tc.retryAfter)
			for range 2 {
				_, err := flavors.ListDetail(c.compute, nil).AllPages(ctx)
				var code gophercloud.ErrUnexpectedResponseCode
				require.ErrorAs(t, err, &code)
				assert.Equal(t, tc.status, code.Actual)
				if tc.retryAfter > 0 {
					assert.Equal(t, "2", code.ResponseHeader.Get("Retry-After"))
				}
			}
			_, err := flavors.ListDetail(c.compute, nil).AllPages(ctx)
			assert.NoError(t, err, "only the next two")
		})
	}

	t.Run("ForcedStatusWithFault", func(t *testing.T) {
		vol, net := c.bootable(t)
		id := c.boot(t, vol, net)
		require.NoError(t, c.s.SetServerStatus(id, openstacktest.StatusError, "No valid host was found."))
		s, err := servers.Get(ctx, c.compute, id).Extract()
		require.NoError(t, err)
		assert.Equal(t, openstacktest.StatusError, s.Status)
		assert.Equal(t, "No valid host was found.", s.Fault.Message)
		assert.Error(t, c.s.SetServerStatus(id, "NOT_A_STATUS", ""))
	})

	t.Run("Microversions", func(t *testing.T) {
		sc := *c.compute
		sc.Microversion = "2.200"
		_, err := flavors.ListDetail(&sc, nil).AllPages(ctx)
		assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusNotAcceptable), "%v", err)
		sc.Microversion = "2.87"
		st, err := hypervisors.GetStatistics(ctx, &sc).Extract()
		require.NoError(t, err)
		assert.Equal(t, 2, st.Count)
		assert.Equal(t, 2*openstacktest.DefaultHostVCPUs, st.VCPUs)
		sc.Microversion = "2.88"
		_, err = hypervisors.GetStatistics(ctx, &sc).Extract()
		assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusNotFound), "gone in 2.88")
	})

	t.Run("Keypairs", func(t *testing.T) {
		key := openstacktest.PublicKey("t@x")
		kp, err := keypairs.Create(ctx, c.compute, keypairs.CreateOpts{Name: "k", PublicKey: key}).Extract()
		require.NoError(t, err)
		assert.Regexp(t, `^([0-9a-f]{2}:){15}[0-9a-f]{2}$`, kp.Fingerprint)
		_, err = keypairs.Create(ctx, c.compute, keypairs.CreateOpts{Name: "k", PublicKey: key}).Extract()
		assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusConflict))
		for _, bad := range []string{"garbage", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx5ZHQgZmxlZXQgdGVzdCBrZXkgZm9yIHZpcnRmbGVldA== base64-but-no-key"} {
			_, err = keypairs.Create(ctx, c.compute, keypairs.CreateOpts{Name: "bad", PublicKey: bad}).Extract()
			assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusBadRequest), "Nova refuses %q", bad)
		}
		require.NoError(t, keypairs.Delete(ctx, c.compute, "k", nil).ExtractErr())
		assert.Empty(t, c.s.Keypairs())
	})
}

// TestConfirmIsAsynchronous pins what real Nova does with a confirmed
// resize: the compute host confirms it later, the server shows
// VERIFY_RESIZE with no task state meanwhile, and a second confirm is
// refused with 400.
func TestConfirmIsAsynchronous(t *testing.T) {
	t.Parallel()
	c := startWith(t, time.Second)
	ctx := context.Background()
	vol, net := c.bootable(t)
	id := c.boot(t, vol, net)
	c.waitStatus(t, id, openstacktest.StatusActive)
	require.NoError(t, servers.Resize(ctx, c.compute, id, servers.ResizeOpts{FlavorRef: "3"}).ExtractErr())
	c.waitStatus(t, id, openstacktest.StatusVerifyResize)
	require.NoError(t, servers.ConfirmResize(ctx, c.compute, id).ExtractErr())
	got, err := servers.Get(ctx, c.compute, id).Extract()
	require.NoError(t, err)
	assert.Equal(t, openstacktest.StatusVerifyResize, got.Status, "still VERIFY_RESIZE while confirming")
	assert.Empty(t, got.TaskState, "with no task state")
	err = servers.ConfirmResize(ctx, c.compute, id).ExtractErr()
	assert.True(t, gophercloud.ResponseCodeIs(err, http.StatusBadRequest), "a second confirm: %v", err)
	c.waitStatus(t, id, openstacktest.StatusActive)
}
