package nova_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

const (
	password  = "pw-3f1c9e-never-print-me"
	cloudName = "test"
	waitFor   = 30 * time.Second
	tick      = 10 * time.Millisecond
)

// Real keys: Nova refuses anything it cannot fingerprint.
var (
	publicKey = openstacktest.PublicKey("alice@example")
	otherKey  = openstacktest.PublicKey("bob@example")
)

// cloud is a test server and the clouds.yaml pointing at it.
type cloud struct {
	*openstacktest.Server
	clouds string
}

type cloudsYAML struct {
	Clouds map[string]cloudYAML `json:"clouds"`
}

type cloudYAML struct {
	Auth       map[string]string `json:"auth"`
	RegionName string            `json:"region_name"`
	CACert     string            `json:"cacert,omitempty"`
	Verify     *bool             `json:"verify,omitempty"`
}

// newCloud starts a test server with two compute hosts of 32 vCPUs and
// 64 GiB; the clouds.yaml says pw.
func newCloud(t *testing.T, pw string) *cloud {
	t.Helper()
	return newCloudWith(t, openstacktest.Options{}, func(*openstacktest.Server, *cloudYAML) {}, pw)
}

func newCloudWith(t *testing.T, o openstacktest.Options, entry func(*openstacktest.Server, *cloudYAML), pw string) *cloud {
	t.Helper()
	if o.TransitionDelay == 0 {
		o.TransitionDelay = 20 * time.Millisecond
	}
	o.Password, o.Hosts, o.HostVCPUs, o.HostMemoryMB = password, []string{"compute-a", "compute-b"}, 32, 65536
	s, err := openstacktest.Start(o)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	o = s.Options()
	e := cloudYAML{
		Auth: map[string]string{
			"auth_url": s.AuthURL(), "username": o.Username, "password": pw, "project_name": o.Project,
			"user_domain_name": o.Domain, "project_domain_name": o.Domain,
		},
		RegionName: o.Region,
	}
	entry(s, &e)
	y, err := yaml.Marshal(cloudsYAML{Clouds: map[string]cloudYAML{cloudName: e}})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "clouds.yaml")
	require.NoError(t, os.WriteFile(path, y, 0o600))
	return &cloud{Server: s, clouds: path}
}

func (c *cloud) config(node string, poll time.Duration) nova.Config {
	return nova.Config{Node: node, CloudsFile: c.clouds, Cloud: cloudName, PollInterval: poll}
}

func (c *cloud) open(t *testing.T) *nova.Driver {
	t.Helper()
	return c.openPolling(t, 50*time.Millisecond)
}

// openPolling opens a driver of node1 polling every poll.
func (c *cloud) openPolling(t *testing.T, poll time.Duration) *nova.Driver {
	t.Helper()
	d, err := nova.Open(context.Background(), c.config("node1", poll))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// server is the one cloud server of uid.
func (c *cloud) server(t *testing.T, uid string) openstacktest.ServerState {
	t.Helper()
	var found []openstacktest.ServerState
	for _, s := range c.Servers() {
		if s.Metadata[nova.MetaUID] == uid {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "exactly one server for uid %s", uid)
	return found[0]
}

var uids atomic.Int64

// machine is a small VM with a boot disk and one network, with a uid of its
// own.
func machine(name string) driver.Machine {
	uid := fmt.Sprintf("00000000-0000-4000-8000-%012d", uids.Add(1))
	return driver.Machine{
		UID: uid, Namespace: "ns", Name: name, Generation: 1,
		VCPU: 1, MemoryBytes: 512 << 20, PublicKey: publicKey, Running: true,
		Disks:    []driver.Disk{{Name: "ns_" + name + "-root", SizeBytes: 1 << 30}},
		Networks: []driver.Network{{Name: "ns_net-db", CIDR: "10.10.120.0/24"}},
	}
}

// ensure calls Ensure as the reconciler does until the guest reaches phase.
func ensure(t *testing.T, d driver.Driver, m driver.Machine, phase driver.Phase) driver.Observation {
	t.Helper()
	var o driver.Observation
	require.Eventually(t, func() bool {
		var err error
		o, err = d.Ensure(context.Background(), m)
		require.NoError(t, err)
		return o.Phase == phase
	}, waitFor, tick, "guest %s never reached %s", m.Name, phase)
	return o
}

func flavorNames(c *cloud) []string {
	var out []string
	for _, f := range c.Flavors() {
		out = append(out, f.Name)
	}
	return out
}

// TestAServerActiveWhenReadBackHasItsDisksAttachedAtOnce: a cloud that
// boots a server before the driver reads it back gets the extra disks
// attached by the call that reports it Running, not by a later one.
func TestAServerActiveWhenReadBackHasItsDisksAttachedAtOnce(t *testing.T) {
	t.Parallel()
	c := newCloudWith(t, openstacktest.Options{TransitionDelay: time.Nanosecond}, func(*openstacktest.Server, *cloudYAML) {}, password)
	d := c.open(t)
	m := machine("quick")
	m.Disks = append(m.Disks, driver.Disk{Name: "ns_quick-data", SizeBytes: 1 << 30})

	ensure(t, d, m, driver.PhaseRunning)
	assert.Len(t, c.server(t, m.UID).Volumes, 2)
}

// TestTheHubsAddressIsTheServersFixedIP: an interface's address from the
// hub is the fixed IP of the server's port; one another server holds is
// refused.
func TestTheHubsAddressIsTheServersFixedIP(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("addressed")
	m.Networks[0].Address = netip.MustParsePrefix("10.10.120.37/24")
	o := ensure(t, d, m, driver.PhaseRunning)
	require.Len(t, o.Interfaces, 1)
	assert.Equal(t, []string{"10.10.120.37"}, o.Interfaces[0].IPs)

	taken := machine("taken")
	taken.Networks[0].Address = m.Networks[0].Address
	var err error
	// The boot volume is made first; the server is asked for once it is.
	require.Eventually(t, func() bool { _, err = d.Ensure(context.Background(), taken); return err != nil }, waitFor, tick)
	assert.Contains(t, err.Error(), "10.10.120.37 is already in use")
}

// TestEnsureRunsAServerBootedFromItsVolume pins what a created guest is on
// the cloud and what the driver reports of it.
func TestEnsureRunsAServerBootedFromItsVolume(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("web")
	m.Disks = append(m.Disks, driver.Disk{Name: "ns_web-data", SizeBytes: 3<<30 + 1}, driver.Disk{Name: "ns_web-logs", SizeBytes: 1 << 30})
	m.UserData = "#cloud-config\nruncmd: [true]\n"

	o := ensure(t, d, m, driver.PhaseRunning)
	require.Eventually(t, func() bool { return len(c.server(t, m.UID).Volumes) == 3 }, waitFor, tick, "extra disks are attached after boot")
	s := c.server(t, m.UID)
	vols := map[string]openstacktest.VolumeState{}
	for _, v := range c.Volumes() {
		vols[v.ID] = v
	}
	assert.Equal(t, []string{"ns_web-root", "ns_web-data", "ns_web-logs"}, []string{vols[s.Volumes[0]].Name, vols[s.Volumes[1]].Name, vols[s.Volumes[2]].Name}, "the first disk is the boot volume")
	assert.Equal(t, 4, vols[s.Volumes[1]].SizeGiB, "sizes round up to whole GiB")
	assert.Equal(t, "vf-"+m.UID, s.Name)
	assert.Equal(t, "node1", s.Metadata[nova.MetaNode])
	assert.NotEmpty(t, s.UserData)

	assert.Equal(t, s.ID, o.ID, "the id is Nova's server id")
	assert.Equal(t, s.Host, o.Node, "the node is the compute host")
	assert.Contains(t, []string{"compute-a", "compute-b"}, o.Node)
	require.Len(t, o.Interfaces, 1)
	assert.Equal(t, "ns_net-db", o.Interfaces[0].Network)
	assert.Equal(t, []string{"10.10.120.2"}, o.Interfaces[0].IPs)
	assert.Equal(t, driver.AddressSourceBackend, o.Interfaces[0].Source)
	assert.NotEmpty(t, o.Interfaces[0].MAC)
	require.Len(t, c.Networks(), 1)
	assert.Equal(t, []string{"10.10.120.0/24"}, c.Networks()[0].CIDRs, "a missing network is created with its subnet")

	obs, err := d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, obs.Phase)
	list, err := d.List(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, m.UID, list[0].UID)

	err = d.DeleteVolume(context.Background(), m.Disks[1])
	assert.True(t, driver.IsInUse(err), "an attached volume stays: %v", err)
	assert.Len(t, c.Volumes(), 3)

	require.NoError(t, d.Delete(context.Background(), m.UID))
	assert.Empty(t, c.Servers())
	_, err = d.Observe(context.Background(), m.UID)
	assert.True(t, driver.IsNotFound(err), "deleted: %v", err)
	assert.Len(t, c.Volumes(), 3, "volumes are never deleted with the guest")
	for _, v := range c.Volumes() {
		assert.Equal(t, "available", v.Status)
	}
	require.NoError(t, d.Delete(context.Background(), m.UID), "deleting an absent guest succeeds")

	require.NoError(t, d.DeleteVolume(context.Background(), m.Disks[1]), "a volume no server uses is deleted")
	require.NoError(t, d.DeleteVolume(context.Background(), m.Disks[1]), "deleting it again succeeds")
	assert.Len(t, c.Volumes(), 2)
	for _, v := range c.Volumes() {
		assert.NotEqual(t, m.Disks[1].Name, v.Name)
	}
}

// TestFlavors pins which flavor a shape gets and when the driver's own
// flavors go.
func TestFlavors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		vcpu      int32
		memory    int64
		swap      int64
		flavor    string
		public    bool
		keptAfter bool
	}{
		{name: "ReusesAPublicFlavorOfExactlyTheShape", vcpu: 1, memory: 512 << 20, flavor: "m1.tiny", public: true, keptAfter: true},
		{name: "CreatesAPrivateFlavorWhenNoneMatches", vcpu: 3, memory: 3 << 30, swap: 512 << 20, flavor: "vf-c3-m3072-s512"},
		{name: "SwapMustMatchToo", vcpu: 1, memory: 512 << 20, swap: 256 << 20, flavor: "vf-c1-m512-s256"},
		{name: "RoundsMemoryUpToWholeMiB", vcpu: 2, memory: 1<<30 + 1, flavor: "vf-c2-m1025-s0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCloud(t, password)
			d := c.open(t)
			before := len(c.Flavors())
			m := machine("flavor")
			m.VCPU, m.MemoryBytes, m.SwapBytes = tc.vcpu, tc.memory, tc.swap
			ensure(t, d, m, driver.PhaseRunning)
			s := c.server(t, m.UID)
			assert.Equal(t, tc.flavor, s.FlavorName)
			if tc.public {
				assert.Len(t, c.Flavors(), before, "no flavor is created")
			} else {
				assert.Len(t, c.Flavors(), before+1)
				assert.Contains(t, c.Flavors(), openstacktest.FlavorState{ID: s.FlavorID, Name: tc.flavor, VCPUs: int(tc.vcpu), RAMMB: s.RAMMB, SwapMB: s.SwapMB, Public: false}, "the flavor is private")
			}
			require.NoError(t, d.Delete(context.Background(), m.UID))
			assert.Equal(t, tc.keptAfter, contains(flavorNames(c), tc.flavor), "a public flavor stays, the driver's own goes")
		})
	}

	t.Run("NeverDeletesAFlavorAnotherServerUses", func(t *testing.T) {
		t.Parallel()
		c := newCloud(t, password)
		d := c.open(t)
		a, b := machine("shared-a"), machine("shared-b")
		for _, m := range []*driver.Machine{&a, &b} {
			m.VCPU = 3
			ensure(t, d, *m, driver.PhaseRunning)
		}
		require.Equal(t, c.server(t, a.UID).FlavorID, c.server(t, b.UID).FlavorID, "one flavor for one shape")
		require.NoError(t, d.Delete(context.Background(), a.UID))
		assert.Contains(t, flavorNames(c), "vf-c3-m512-s0", "b still uses it")
		require.NoError(t, d.Delete(context.Background(), b.UID))
		assert.NotContains(t, flavorNames(c), "vf-c3-m512-s0", "nothing uses it any more")
	})

	t.Run("ACleanupCutShortIsMadeGoodByTheNext", func(t *testing.T) {
		t.Parallel()
		c := newCloud(t, password)
		d := c.open(t)
		a, b := machine("cut-short"), machine("next")
		a.VCPU = 3
		b.PublicKey = otherKey
		ensure(t, d, a, driver.PhaseRunning)
		ensure(t, d, b, driver.PhaseRunning)
		kp := c.server(t, a.UID).KeyName
		// The server goes, then the agent stops before its keypair and flavor do.
		c.FailNext(http.MethodDelete, openstacktest.ComputePath+"/os-keypairs/*", 1, http.StatusForbidden, 0)
		require.Error(t, d.Delete(context.Background(), a.UID))
		require.Contains(t, flavorNames(c), "vf-c3-m512-s0")
		require.Contains(t, c.Keypairs(), kp)
		restarted := c.open(t)
		require.NoError(t, restarted.Delete(context.Background(), b.UID))
		assert.NotContains(t, flavorNames(c), "vf-c3-m512-s0", "the next deletion takes what the cut-short one left")
		assert.NotContains(t, c.Keypairs(), kp)
	})

	t.Run("AFailedResizeLeavesNoFlavor", func(t *testing.T) {
		t.Parallel()
		c := newCloud(t, password)
		d := c.open(t)
		m := machine("resize-fails")
		m.Running = false
		ensure(t, d, m, driver.PhaseStopped)
		m.Running, m.VCPU = true, 3
		c.FailNext(http.MethodPost, openstacktest.ComputePath+"/servers/*/action", 1, http.StatusBadRequest, 0)
		_, err := d.Ensure(context.Background(), m)
		require.Error(t, err, "the resize is refused")
		require.Contains(t, flavorNames(c), "vf-c3-m512-s0", "made for the resize")
		assert.Equal(t, "m1.tiny", c.server(t, m.UID).FlavorName, "the server kept its flavor")
		require.NoError(t, d.Delete(context.Background(), m.UID))
		assert.NotContains(t, flavorNames(c), "vf-c3-m512-s0", "the resize's flavor goes with the server")
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestKeypairs pins that one public key is one keypair, shared by every VM
// with it, and removed with the last of them.
func TestKeypairs(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	a, b, other := machine("key-a"), machine("key-b"), machine("key-other")
	b.PublicKey = strings.Replace(publicKey, "alice@example", "alice@laptop", 1)
	other.PublicKey = otherKey
	for _, m := range []driver.Machine{a, b, other} {
		ensure(t, d, m, driver.PhaseRunning)
	}
	assert.Equal(t, c.server(t, a.UID).KeyName, c.server(t, b.UID).KeyName, "the same key with another comment reuses the keypair")
	assert.NotEqual(t, c.server(t, a.UID).KeyName, c.server(t, other.UID).KeyName)
	assert.Len(t, c.Keypairs(), 2)

	require.NoError(t, d.Delete(context.Background(), a.UID))
	assert.Contains(t, c.Keypairs(), c.server(t, b.UID).KeyName, "b still uses it")
	shared := c.server(t, b.UID).KeyName
	require.NoError(t, d.Delete(context.Background(), b.UID))
	assert.NotContains(t, c.Keypairs(), shared, "no server of ours uses it any more")
	assert.Len(t, c.Keypairs(), 1)

	t.Run("AnInvalidKeyIsTerminal", func(t *testing.T) {
		bad := machine("key-bad")
		bad.PublicKey = "not a key"
		_, err := d.Ensure(context.Background(), bad)
		assert.True(t, driver.IsTerminal(err), "%v", err)
	})
	t.Run("NoKeyNoKeypair", func(t *testing.T) {
		m := machine("key-none")
		m.PublicKey = ""
		ensure(t, d, m, driver.PhaseRunning)
		assert.Empty(t, c.server(t, m.UID).KeyName)
	})
}

// TestCreateIsIdempotent pins that a guest is one server whatever happens
// between creates: a new driver (agent restart) or a view that has not
// seen the server yet.
func TestCreateIsIdempotent(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	first := c.open(t)
	m := machine("idem")
	o := ensure(t, first, m, driver.PhaseRunning)
	require.NoError(t, first.Close())

	t.Run("AcrossAnAgentRestart", func(t *testing.T) {
		second := c.open(t)
		got, err := second.Observe(context.Background(), m.UID)
		require.NoError(t, err, "the new driver's view has the server from its first list")
		assert.Equal(t, o.ID, got.ID)
		again := ensure(t, second, m, driver.PhaseRunning)
		assert.Equal(t, o.ID, again.ID)
		c.server(t, m.UID)
	})
	t.Run("WhenTheViewHasNotSeenTheServer", func(t *testing.T) {
		stale, err := nova.Open(context.Background(), c.config("node1", time.Hour))
		require.NoError(t, err)
		defer func() { _ = stale.Close() }()
		n := machine("idem-late")
		other := c.open(t)
		created := ensure(t, other, n, driver.PhaseRunning)
		got := ensure(t, stale, n, driver.PhaseRunning)
		assert.Equal(t, created.ID, got.ID, "looked up by metadata before creating")
		c.server(t, n.UID)
	})
	t.Run("AnotherNodesServersAreNotListed", func(t *testing.T) {
		other, err := nova.Open(context.Background(), c.config("node2", time.Hour))
		require.NoError(t, err)
		defer func() { _ = other.Close() }()
		list, err := other.List(context.Background())
		require.NoError(t, err)
		assert.Empty(t, list)
	})
}

// TestStatusMapping pins the phase of every Nova server status.
func TestStatusMapping(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("status")
	ensure(t, d, m, driver.PhaseRunning)
	id := c.server(t, m.UID).ID
	cases := []struct {
		status  string
		fault   string
		phase   driver.Phase
		message string
	}{
		{status: openstacktest.StatusActive, phase: driver.PhaseRunning},
		{status: openstacktest.StatusBuild, phase: driver.PhaseProvisioning, message: "building"},
		{status: openstacktest.StatusRebuild, phase: driver.PhaseProvisioning, message: "rebuilding"},
		{status: openstacktest.StatusShutoff, phase: driver.PhaseStopped},
		{status: openstacktest.StatusReboot, phase: driver.PhaseStarting, message: "rebooting"},
		{status: openstacktest.StatusHardReboot, phase: driver.PhaseStarting, message: "rebooting"},
		{status: openstacktest.StatusPaused, phase: driver.PhasePaused},
		{status: openstacktest.StatusSuspended, phase: driver.PhaseStopped, message: "suspended"},
		{status: openstacktest.StatusRescue, phase: driver.PhaseStopped, message: "rescue"},
		{status: openstacktest.StatusResize, phase: driver.PhaseProvisioning, message: "resizing"},
		{status: openstacktest.StatusVerifyResize, phase: driver.PhaseProvisioning, message: "confirming"},
		{status: openstacktest.StatusRevertResize, phase: driver.PhaseProvisioning, message: "reverting"},
		{status: openstacktest.StatusMigrating, phase: driver.PhaseRunning, message: "migrating"},
		{status: openstacktest.StatusPassword, phase: driver.PhaseRunning, message: "password"},
		{status: openstacktest.StatusShelved, phase: driver.PhaseStopped, message: "shelved"},
		{status: openstacktest.StatusShelvedOffloaded, phase: driver.PhaseStopped, message: "shelved"},
		{status: openstacktest.StatusSoftDeleted, phase: driver.PhaseFailed, message: "soft-deleted"},
		{status: openstacktest.StatusError, fault: "No valid host was found. There are not enough hosts available.", phase: driver.PhaseFailed, message: "No valid host was found"},
		{status: openstacktest.StatusUnknown, phase: driver.PhaseFailed, message: "compute host"},
		// Last: a deleted server is gone from every list but changes-since.
		{status: openstacktest.StatusDeleted},
	}
	require.Len(t, cases, len(openstacktest.Statuses), "every status of the API reference is pinned")
	for _, tc := range cases {
		t.Run(tc.status, func(t *testing.T) {
			require.NoError(t, c.SetServerStatus(id, tc.status, tc.fault))
			// The poller's changes-since sees the change; Observe reads the view.
			var o driver.Observation
			var err error
			require.Eventually(t, func() bool {
				o, err = d.Observe(context.Background(), m.UID)
				if tc.status == openstacktest.StatusDeleted {
					return driver.IsNotFound(err)
				}
				return err == nil && o.Phase == tc.phase && strings.Contains(o.Message, tc.message)
			}, waitFor, tick, "status %s: last %+v %v", tc.status, o, err)
		})
	}
}

// TestRestartsAndShape pins restart nonces, the restart count across an
// agent restart, and a new shape applied at the next start.
func TestRestartsAndShape(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("restart")
	m.RestartNonce = "created-with"
	o := ensure(t, d, m, driver.PhaseRunning)
	assert.Zero(t, o.RestartCount, "the nonce a guest is created with counts as handled")

	m.RestartNonce = "2026-11-02T10:00:00Z"
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, int32(1), o.RestartCount)
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, int32(1), o.RestartCount, "one restart per nonce")
	assert.Equal(t, 1, c.CountRequests(http.MethodPost, openstacktest.ComputePath+"/servers/*/action"), "one reboot action")

	restarted := c.open(t)
	o, err := restarted.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, int32(1), o.RestartCount, "the count survives an agent restart")

	m.VCPU = 2
	o = ensure(t, restarted, m, driver.PhaseRunning)
	assert.True(t, o.RestartRequired, "a running server keeps its shape")
	assert.Equal(t, 1, c.server(t, m.UID).VCPUs)

	m.Running = false
	ensure(t, restarted, m, driver.PhaseStopped)
	assert.Equal(t, 1, c.server(t, m.UID).VCPUs, "nothing changes while it is off")
	m.Running = true
	o = ensure(t, restarted, m, driver.PhaseRunning)
	assert.False(t, o.RestartRequired)
	assert.Equal(t, 2, c.server(t, m.UID).VCPUs, "resized at the start")
	assert.Equal(t, openstacktest.StatusActive, c.server(t, m.UID).Status)

	m.VCPU = 4
	o = ensure(t, restarted, m, driver.PhaseRunning)
	require.True(t, o.RestartRequired)
	m.RestartNonce = "2026-11-02T11:00:00Z"
	require.Eventually(t, func() bool {
		o, err = restarted.Ensure(context.Background(), m)
		require.NoError(t, err)
		return o.Phase == driver.PhaseRunning && !o.RestartRequired
	}, waitFor, tick)
	assert.Equal(t, int32(2), o.RestartCount, "a restart with a new shape is one restart")
	assert.Equal(t, 4, c.server(t, m.UID).VCPUs)
	assert.Equal(t, 2, count(c.server(t, m.UID).Actions, "confirmResize"), "each resize confirmed once, though Nova confirms asynchronously")
	for _, r := range c.Requests() {
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/action") {
			assert.Less(t, r.Status, 300, "no action refused: a confirm under way is not confirmed again")
		}
	}
}

// TestResetsAndPausedServers pins a reset as Nova's hard reboot, made once
// per nonce and counted as a restart, also of a paused server, and a paused
// server left paused while the Machine says so. The test cloud serves no
// pause or unpause action, so the server is paused as an operator pausing
// it in OpenStack would leave it, and each reboot is finished by setting
// its status: the long transitions keep it in HARD_REBOOT until then.
func TestResetsAndPausedServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCloudWith(t, openstacktest.Options{TransitionDelay: time.Second}, func(*openstacktest.Server, *cloudYAML) {}, password)
	d := c.open(t)
	m := machine("reset")
	m.ResetNonce = "created-with"
	o := ensure(t, d, m, driver.PhaseRunning)
	assert.Zero(t, o.RestartCount, "the reset nonce a guest is created with counts as handled")
	id := c.server(t, m.UID).ID
	assert.Equal(t, "created-with", c.server(t, m.UID).Metadata[nova.MetaReset])
	actions := func() int { return c.CountRequests(http.MethodPost, openstacktest.ComputePath+"/servers/*/action") }
	// observed waits for the driver's view to show phase.
	observed := func(phase driver.Phase) {
		require.Eventually(t, func() bool {
			o, err := d.Observe(ctx, m.UID)
			return err == nil && o.Phase == phase
		}, waitFor, tick, "the view never showed %s", phase)
	}
	// reset asks for a reset with nonce, sees it made as a hard reboot and
	// finishes the reboot.
	reset := func(nonce string) {
		t.Helper()
		m.ResetNonce = nonce
		before := actions()
		_, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		assert.Equal(t, before+1, actions(), "one action")
		assert.Equal(t, openstacktest.StatusHardReboot, c.server(t, m.UID).Status, "a reset is a hard reboot")
		assert.Equal(t, nonce, c.server(t, m.UID).Metadata[nova.MetaReset])
		require.NoError(t, c.SetServerStatus(id, openstacktest.StatusActive, ""))
	}

	reset("r1")
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, int32(1), o.RestartCount)
	before := actions()
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, int32(1), o.RestartCount, "one reset per nonce")
	assert.Equal(t, before, actions())

	m.ResetNonce = ""
	ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, before, actions(), "no nonce asks for nothing")
	assert.Empty(t, c.server(t, m.UID).Metadata[nova.MetaReset])
	reset("r1")
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, int32(2), o.RestartCount, "the last nonce asked for again resets again")
	before = actions()

	require.NoError(t, c.SetServerStatus(id, openstacktest.StatusPaused, ""))
	observed(driver.PhasePaused)
	m.Paused = true
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhasePaused, o.Phase, "a paused server that should be stays paused")
	assert.Equal(t, before, actions(), "and nothing is asked of Nova")

	// Unpausing it too: the hard reboot does both.
	m.Paused = false
	reset("r2")
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, int32(3), o.RestartCount, "a reset of a paused server counts")

	m.Running = false
	ensure(t, d, m, driver.PhaseStopped)
	m.ResetNonce = "r3"
	ensure(t, d, m, driver.PhaseStopped)
	m.Running = true
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, int32(3), o.RestartCount, "a reset asked for while stopped is satisfied by the start")
	assert.Equal(t, "r3", c.server(t, m.UID).Metadata[nova.MetaReset])
	assert.Equal(t, 3, count(c.server(t, m.UID).Actions, "reboot"), "three resets, all reboots")

	// Pause and unpause through Nova's own actions.
	m.Paused = true
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	o = ensure(t, d, m, driver.PhasePaused)
	assert.Equal(t, driver.PhasePaused, o.Phase)
	assert.Equal(t, 1, count(c.server(t, m.UID).Actions, "pause"), "one pause")
	m.Paused = false
	o = ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, 1, count(c.server(t, m.UID).Actions, "unpause"), "one unpause")
	assert.Equal(t, int32(3), o.RestartCount, "a pause is no restart")
}

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// TestTokenExpiry pins that an expired token is renewed without the caller
// noticing.
func TestTokenExpiry(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	issued := c.TokensIssued()
	c.ExpireTokens()
	_, err := d.List(context.Background())
	require.NoError(t, err)
	assert.Equal(t, issued+1, c.TokensIssued(), "one new token")
}

// TestRetries pins what each fault does to a call.
func TestRetries(t *testing.T) {
	t.Parallel()
	servers := openstacktest.ComputePath + "/servers"
	cases := []struct {
		name string
		// arrange injects the fault once the guest m runs (or not, when
		// create is set) and returns the call to make.
		method, pattern string
		n, status       int
		retryAfter      time.Duration
		create          bool
		call            func(d *nova.Driver, m driver.Machine) error
		check           func(t *testing.T, err error)
		minDuration     time.Duration
		attempts        int
	}{
		{
			name: "ConflictOnAnActionIsRetried", method: http.MethodPost, pattern: servers + "/*/action", n: 2, status: http.StatusConflict,
			call: stop, check: noError, attempts: 3,
		},
		{
			name: "OverLimitWithRetryAfterIsWaitedOut", method: http.MethodPost, pattern: servers, n: 1, status: http.StatusRequestEntityTooLarge, retryAfter: time.Second,
			create: true, call: create, check: noError, minDuration: time.Second, attempts: 2,
		},
		{
			name: "OverLimitWithoutRetryAfterIsAQuotaTheUserSees", method: http.MethodPost, pattern: servers, n: 1, status: http.StatusRequestEntityTooLarge,
			create: true, call: create, check: func(t *testing.T, err error) { assert.True(t, driver.IsFailing(err), "%v", err) }, attempts: 1,
		},
		{
			name: "ServerErrorOnAListIsRetried", method: http.MethodGet, pattern: servers + "/detail", n: 2, status: http.StatusInternalServerError,
			call: list, check: noError, attempts: 3,
		},
		{
			name: "ServerErrorThatLastsIsTransient", method: http.MethodGet, pattern: servers + "/detail", n: 100, status: http.StatusInternalServerError,
			call: list, check: transient, attempts: 5,
		},
		{
			name: "ServerErrorOnACreateIsNotRetriedBlindly", method: http.MethodPost, pattern: servers, n: 1, status: http.StatusInternalServerError,
			create: true, call: create, check: transient, attempts: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCloud(t, password)
			// No poller: its list calls would take the injected faults.
			d := c.openPolling(t, time.Hour)
			m := machine("retry")
			if !tc.create {
				ensure(t, d, m, driver.PhaseRunning)
			}
			before := c.CountRequests(tc.method, tc.pattern)
			c.FailNext(tc.method, tc.pattern, tc.n, tc.status, tc.retryAfter)
			start := time.Now()
			err := tc.call(d, m)
			tc.check(t, err)
			assert.GreaterOrEqual(t, time.Since(start), tc.minDuration)
			assert.Equal(t, tc.attempts, c.CountRequests(tc.method, tc.pattern)-before, "requests made")
			if tc.create {
				// Whatever the first create did, the guest ends as one server.
				ensure(t, d, m, driver.PhaseRunning)
				c.server(t, m.UID)
			}
		})
	}
}

func noError(t *testing.T, err error) { assert.NoError(t, err) }

func transient(t *testing.T, err error) {
	require.Error(t, err)
	assert.False(t, driver.IsTerminal(err) || driver.IsFailing(err) || driver.IsNotFound(err), "transient: %v", err)
}

func stop(d *nova.Driver, m driver.Machine) error {
	m.Running = false
	_, err := d.Ensure(context.Background(), m)
	return err
}

func create(d *nova.Driver, m driver.Machine) error {
	// Volumes and networks first, so the one call left is the create.
	for {
		o, err := d.Ensure(context.Background(), m)
		if err != nil || o.Phase != driver.PhaseProvisioning || o.ID != "" {
			return err
		}
		time.Sleep(tick)
	}
}

func list(d *nova.Driver, _ driver.Machine) error {
	_, err := d.List(context.Background())
	return err
}

// TestBadInputIsTerminal pins what the user must change.
func TestBadInputIsTerminal(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	cases := []struct {
		name    string
		change  func(m *driver.Machine)
		message string
	}{
		{name: "UnknownNetworkWithoutCIDR", change: func(m *driver.Machine) { m.Networks = []driver.Network{{Name: "ns_nowhere"}} }, message: "has no cidr to create it from"},
		{name: "BridgeNetworkMissing", change: func(m *driver.Machine) {
			m.Networks = []driver.Network{{Name: "ns_br", Mode: driver.NetworkModeBridge}}
		}, message: "provider network"},
		{name: "DiskFromAnImageWithoutGlance", change: func(m *driver.Machine) { m.Disks[0].Image = &driver.Image{UID: "i", URL: "http://x/i.qcow2"} }, message: "no image service (Glance)"},
		{name: "DiskFromABackupWithoutGlance", change: func(m *driver.Machine) {
			m.Disks[0].Image = &driver.Image{UID: "i", Name: "restored", Format: "raw", Backup: &wire.ImageBackup{Namespace: "team-a", ID: "b-1", Disk: "root"}}
		}, message: "image restored: this cloud's catalog has no image service (Glance)"},
		{name: "NoDisks", change: func(m *driver.Machine) { m.Disks = nil }, message: "at least one disk"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := machine("bad-" + tc.name)
			tc.change(&m)
			_, err := d.Ensure(context.Background(), m)
			require.True(t, driver.IsTerminal(err), "%v", err)
			assert.Contains(t, err.Error(), tc.message)
		})
	}
	assert.Empty(t, c.Servers())
}

// TestImports: a network imported by name is used as it is and never
// created; a missing one, network or volume, is an error a retry may mend
// (its owner may make it), not Terminal.
func TestImports(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	ensure(t, d, machine("maker"), driver.PhaseRunning) // makes ns_net-db

	missing := machine("on-missing")
	missing.Networks = []driver.Network{{Name: "lab", Imported: true, CIDR: "10.20.0.0/24"}}
	_, err := d.Ensure(context.Background(), missing)
	require.Error(t, err)
	assert.False(t, driver.IsTerminal(err), "%v", err)
	assert.Contains(t, err.Error(), `network "lab", which the VirtualNetwork imports, does not exist in Neutron`)

	existing := machine("on-existing")
	existing.Networks = []driver.Network{{Name: "ns_net-db", Imported: true}}
	o := ensure(t, d, existing, driver.PhaseRunning)
	require.Len(t, o.Interfaces, 1)
	assert.Equal(t, "ns_net-db", o.Interfaces[0].Network)
	require.Len(t, c.Networks(), 1, "nothing created for either import")

	volumesBefore := len(c.Volumes())
	disk := machine("on-missing-volume")
	disk.Disks = append(disk.Disks, driver.Disk{Name: "legacy", SizeBytes: 1 << 30, Imported: true})
	// The boot volume is made first; the imported one is looked up next.
	require.Eventually(t, func() bool { _, err = d.Ensure(context.Background(), disk); return err != nil }, waitFor, tick)
	assert.False(t, driver.IsTerminal(err), "%v", err)
	assert.Contains(t, err.Error(), "disk legacy is an imported volume, and Cinder has no volume of that name")
	assert.Len(t, c.Volumes(), volumesBefore+1, "only the boot volume is made, never the imported one")
}

// TestObserveReadsTheViewAndPollingIsOneListCall pins the cost of watching:
// one changes-since list per interval for all servers, no GET per server.
func TestObserveReadsTheViewAndPollingIsOneListCall(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	var ms []driver.Machine
	for _, name := range []string{"poll-a", "poll-bb", "poll-ccc"} {
		m := machine(name)
		ensure(t, d, m, driver.PhaseRunning)
		ms = append(ms, m)
	}
	// servers/* matches servers/detail too.
	single := func() int {
		return c.CountRequests(http.MethodGet, openstacktest.ComputePath+"/servers/*") - c.CountRequests(http.MethodGet, openstacktest.ComputePath+"/servers/detail")
	}
	gets := single()
	lists := c.CountRequests(http.MethodGet, openstacktest.ComputePath+"/servers/detail")
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		for _, m := range ms {
			_, err := d.Observe(context.Background(), m.UID)
			require.NoError(t, err)
			_, err = d.Ensure(context.Background(), m)
			require.NoError(t, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	assert.Equal(t, gets, single(), "no GET of a single server")
	polls := c.CountRequests(http.MethodGet, openstacktest.ComputePath+"/servers/detail") - lists
	// At most one list per interval, however many calls; a loaded
	// machine may tick fewer times, never more.
	assert.Positive(t, polls, "the servers are polled")
	assert.LessOrEqual(t, polls, int(elapsed/(50*time.Millisecond))+2, "one list call per poll interval")
	for _, r := range c.Requests()[len(c.Requests())-polls:] {
		if r.Path == openstacktest.ComputePath+"/servers/detail" {
			assert.Contains(t, r.Query, "changes-since=")
		}
	}

	t.Run("AChangeIsHinted", func(t *testing.T) {
		require.NoError(t, c.SetServerStatus(c.server(t, ms[0].UID).ID, openstacktest.StatusError, "disk failure"))
		deadline := time.After(waitFor)
		for {
			select {
			case e := <-d.Events():
				if e.UID != ms[0].UID {
					continue
				}
				o, err := d.Observe(context.Background(), ms[0].UID)
				require.NoError(t, err)
				if o.Phase == driver.PhaseFailed {
					assert.Contains(t, o.Message, "disk failure", "the fault message")
					return
				}
			case <-deadline:
				t.Fatal("no event for the changed server")
			}
		}
	})
}

// TestCapacity pins the heartbeat's numbers: the hypervisors' total less
// what others use, and this driver's servers' flavors.
func TestCapacity(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("cap")
	m.VCPU, m.MemoryBytes = 2, 4<<30
	ensure(t, d, m, driver.PhaseRunning)
	got, err := d.Capacity(context.Background())
	require.NoError(t, err)
	assert.Equal(t, driver.Capacity{VCPU: 64, MemoryBytes: 128 << 30, AllocatedVCPU: 2, AllocatedMemoryBytes: 4 << 30}, got)

	other, err := nova.Open(context.Background(), c.config("node2", time.Hour))
	require.NoError(t, err)
	defer func() { _ = other.Close() }()
	got, err = other.Capacity(context.Background())
	require.NoError(t, err)
	assert.Equal(t, driver.Capacity{VCPU: 62, MemoryBytes: 124 << 30}, got, "another agent's servers are used capacity")
}

// TestConfiguration pins start-up errors: they name the setting and never
// quote a secret.
func TestConfiguration(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	wrong := newCloud(t, "not-the-"+password)
	cases := []struct {
		name    string
		cfg     nova.Config
		message string
	}{
		{name: "UnknownCloud", cfg: nova.Config{CloudsFile: c.clouds, Cloud: "nope"}, message: `--openstack-cloud: no cloud "nope"`},
		{name: "MissingFile", cfg: nova.Config{CloudsFile: "/nonexistent/clouds.yaml", Cloud: cloudName}, message: "--openstack-clouds-file"},
		{name: "WrongPassword", cfg: nova.Config{CloudsFile: wrong.clouds, Cloud: cloudName}, message: "cannot authenticate"},
		{name: "UnknownRegion", cfg: nova.Config{CloudsFile: c.clouds, Cloud: cloudName, Region: "Mars"}, message: "region \"Mars\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nova.Open(context.Background(), withNode(tc.cfg, "n"))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.message)
			assert.NotContains(t, err.Error(), password)
		})
	}
}

// TestNoSecretInLogs runs the driver through authentication failures,
// token renewal and faults with all log output captured, and checks that
// neither the password nor any token shows in it or in an error.
func TestNoSecretInLogs(t *testing.T) {
	var out bytes.Buffer
	log.SetOutput(&out)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	record := func(err error) {
		if err != nil {
			fmt.Fprintln(&out, err)
		}
	}
	c := newCloud(t, password)
	wrong := newCloud(t, "wrong-"+password)
	_, err := nova.Open(context.Background(), nova.Config{Node: "n", CloudsFile: wrong.clouds, Cloud: cloudName})
	require.Error(t, err)
	record(err)

	d := c.open(t)
	m := machine("secret")
	m.UserData = "#cloud-config\npassword: " + password + "\n"
	ensure(t, d, m, driver.PhaseRunning)
	c.ExpireTokens()
	c.FailNext(http.MethodGet, openstacktest.ComputePath+"/servers/detail", 10, http.StatusInternalServerError, 0)
	_, err = d.List(context.Background())
	record(err)
	c.FailNext(http.MethodPost, openstacktest.ComputePath+"/servers/*/action", 10, http.StatusConflict, 0)
	m.Running = false
	_, err = d.Ensure(context.Background(), m)
	record(err)
	bad := machine("secret-bad")
	bad.Networks = []driver.Network{{Name: "x"}}
	_, err = d.Ensure(context.Background(), bad)
	record(err)

	require.NotEmpty(t, out.String(), "something was captured")
	tokens := c.Tokens()
	require.NotEmpty(t, tokens)
	assert.NotContains(t, out.String(), password)
	for _, tok := range tokens {
		assert.NotContains(t, out.String(), tok)
	}
}

// TestAsAProjectMember pins what changes for a user without admin rights,
// as on most public clouds: the host is hidden, flavors cannot be created,
// and capacity is the project's quota.
func TestAsAProjectMember(t *testing.T) {
	t.Parallel()
	c := newCloudWith(t, openstacktest.Options{Member: true, QuotaCores: 20, QuotaRAMMB: 10240}, func(*openstacktest.Server, *cloudYAML) {}, password)
	d := c.open(t)
	m := machine("member")
	o := ensure(t, d, m, driver.PhaseRunning)
	assert.Equal(t, "node1", o.Node, "the agent's node when Nova hides the host")
	assert.Equal(t, "m1.tiny", c.server(t, m.UID).FlavorName)

	got, err := d.Capacity(context.Background())
	require.NoError(t, err)
	assert.Equal(t, driver.Capacity{VCPU: 20, MemoryBytes: 10 << 30, AllocatedVCPU: 1, AllocatedMemoryBytes: 512 << 20}, got, "the quota")

	odd := machine("member-odd")
	odd.VCPU = 3
	require.Eventually(t, func() bool {
		_, err = d.Ensure(context.Background(), odd)
		return err != nil
	}, waitFor, tick)
	assert.True(t, driver.IsFailing(err), "a flavor only an admin can make is shown and retried: %v", err)
	assert.Contains(t, err.Error(), "cannot create flavor vf-c3-m512-s0")
}

// TestTLS pins that the clouds.yaml entry's TLS settings are used.
func TestTLS(t *testing.T) {
	t.Parallel()
	no := false
	cases := []struct {
		name  string
		entry func(c *openstacktest.Server, e *cloudYAML, dir string)
		ok    bool
	}{
		{name: "TheCloudsCACertIsTrusted", ok: true, entry: func(c *openstacktest.Server, e *cloudYAML, dir string) {
			e.CACert = filepath.Join(dir, "ca.pem")
			require.NoError(t, os.WriteFile(e.CACert, c.CACertPEM(), 0o600))
		}},
		{name: "AnUnknownCertificateIsRefused", entry: func(*openstacktest.Server, *cloudYAML, string) {}},
		{name: "VerifyFalseSkipsTheCheck", ok: true, entry: func(_ *openstacktest.Server, e *cloudYAML, _ string) { e.Verify = &no }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			c := newCloudWith(t, openstacktest.Options{TLS: true}, func(s *openstacktest.Server, e *cloudYAML) { tc.entry(s, e, dir) }, password)
			d, err := nova.Open(context.Background(), c.config("node1", time.Hour))
			if !tc.ok {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "certificate")
				return
			}
			require.NoError(t, err)
			require.NoError(t, d.Close())
		})
	}
}

func withNode(c nova.Config, node string) nova.Config {
	c.Node = node
	return c
}

// TestAConfirmUnderWayIsNotAnError pins the agent that restarts after
// confirming a resize: Nova still shows VERIFY_RESIZE and refuses the new
// agent's confirm with 400 "Instance has not been resized", which must
// neither fail the VM as Terminal nor stop it from starting.
func TestAConfirmUnderWayIsNotAnError(t *testing.T) {
	t.Parallel()
	// Slow enough that the new agent meets the confirm under way.
	c := newCloudWith(t, openstacktest.Options{TransitionDelay: time.Second}, func(*openstacktest.Server, *cloudYAML) {}, password)
	d := c.open(t)
	m := machine("confirm")
	m.Running = false
	ensure(t, d, m, driver.PhaseStopped)
	m.Running, m.VCPU = true, 2
	require.Eventually(t, func() bool {
		_, err := d.Ensure(context.Background(), m)
		require.NoError(t, err)
		return c.server(t, m.UID).Status != openstacktest.StatusShutoff
	}, waitFor, tick, "the resize is asked for")
	require.Eventually(t, func() bool { return c.server(t, m.UID).Status == openstacktest.StatusVerifyResize }, waitFor, tick)
	require.NoError(t, d.Close())

	// The first agent's confirm, sent just before it stopped.
	require.NoError(t, servers.ConfirmResize(context.Background(), c.compute(t), c.server(t, m.UID).ID).ExtractErr())

	restarted := c.open(t)
	o2, err := restarted.Ensure(context.Background(), m)
	require.NoError(t, err, "Nova's refusal of a second confirm is not the user's error")
	assert.NotEqual(t, driver.PhaseFailed, o2.Phase)
	assert.Equal(t, 1, c.CountRequests(http.MethodPost, openstacktest.ComputePath+"/servers/*/action")-countAccepted(c), "the new agent's confirm was refused, and that was fine")
	ensure(t, restarted, m, driver.PhaseRunning)
	assert.Equal(t, 2, c.server(t, m.UID).VCPUs)
}

// compute is a compute client of the cloud's user, acting as an operator
// in OpenStack would, beside the driver.
func (c *cloud) compute(t *testing.T) *gophercloud.ServiceClient {
	t.Helper()
	o := c.Options()
	pc, err := openstack.AuthenticatedClient(context.Background(), gophercloud.AuthOptions{
		IdentityEndpoint: c.AuthURL(), Username: o.Username, Password: password, DomainName: o.Domain, TenantName: o.Project,
	})
	require.NoError(t, err)
	compute, err := openstack.NewComputeV2(pc, gophercloud.EndpointOpts{Region: o.Region})
	require.NoError(t, err)
	return compute
}

// countAccepted counts the server actions the test server accepted.
func countAccepted(c *cloud) int {
	n := 0
	for _, s := range c.Servers() {
		n += len(s.Actions)
	}
	return n
}
