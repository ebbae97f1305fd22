package nova_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

// TestDisksHotPlugIntoARunningServer pins extra disks as attached and
// detached while the server runs, and reported as attached: a disk change
// alone never asks for a restart, and one made beside a new flavor asks
// only for the flavor's.
func TestDisksHotPlugIntoARunningServer(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("plug")
	ensure(t, d, m, driver.PhaseRunning)
	data := driver.Disk{Name: "ns_plug-data", SizeBytes: 1 << 30}
	logs := driver.Disk{Name: "ns_plug-logs", SizeBytes: 1 << 30}
	names := func() []string {
		byID := map[string]string{}
		for _, v := range c.Volumes() {
			byID[v.ID] = v.Name
		}
		var out []string
		for _, id := range c.server(t, m.UID).Volumes {
			out = append(out, byID[id])
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		disks   []driver.Disk
		vcpu    int32
		restart bool
	}{
		{name: "a disk is attached", disks: []driver.Disk{m.Disks[0], data}, vcpu: 1},
		{name: "a second is attached after it", disks: []driver.Disk{m.Disks[0], data, logs}, vcpu: 1},
		{name: "the first is detached", disks: []driver.Disk{m.Disks[0], logs}, vcpu: 1},
		{name: "beside a new flavor only the flavor waits", disks: []driver.Disk{m.Disks[0], logs, data}, vcpu: 2, restart: true},
		{name: "both are detached", disks: []driver.Disk{m.Disks[0]}, vcpu: 2, restart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m.Disks, m.VCPU = tc.disks, tc.vcpu
			want := make([]string, 0, len(tc.disks))
			for _, disk := range tc.disks {
				want = append(want, disk.Name)
			}
			var o driver.Observation
			require.Eventually(t, func() bool {
				var err error
				o, err = d.Ensure(context.Background(), m)
				if err != nil {
					require.False(t, driver.IsTerminal(err), "%v", err)
					return false
				}
				return assert.ObjectsAreEqual(want, names()) && assert.ObjectsAreEqual(want, o.Disks)
			}, waitFor, tick, "attached: %v, reported: %v", names(), o.Disks)
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.Equal(t, tc.restart, o.RestartRequired)
			assert.Zero(t, o.RestartCount, "never restarted")
			assert.Equal(t, openstacktest.StatusActive, c.server(t, m.UID).Status)
			assert.Equal(t, 1, c.server(t, m.UID).VCPUs, "the flavor waits for a restart")
			for _, v := range c.Volumes() {
				if !strings.HasSuffix(v.Name, "-root") && !contains(want, v.Name) {
					assert.Equal(t, "available", v.Status, "volume %s is released", v.Name)
				}
			}
		})
	}
}

// TestADiskTakenBackAtOnceIsDetachedOnceAttached pins the detach of a
// volume Nova is still attaching, which Cinder refuses (HTTP 400) until it
// is in-use, and of one Cinder has released while the server still lists
// it: neither is the user's error, and the disk goes once Nova is done.
func TestADiskTakenBackAtOnceIsDetachedOnceAttached(t *testing.T) {
	t.Parallel()
	// Nova attaches for a second: the detach asked at once meets it
	// unsettled, on a loaded machine too.
	c := newCloudWith(t, openstacktest.Options{TransitionDelay: time.Second}, func(*openstacktest.Server, *cloudYAML) {}, password)
	d := c.open(t)
	m := machine("fickle")
	ensure(t, d, m, driver.PhaseRunning)
	root := m.Disks[0]
	for _, tc := range []struct {
		name  string
		disks []driver.Disk
	}{
		{name: "attached and taken back", disks: []driver.Disk{root, {Name: "ns_fickle-data", SizeBytes: 1 << 30}}},
		{name: "attached again and taken back", disks: []driver.Disk{root, {Name: "ns_fickle-data", SizeBytes: 1 << 30}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m.Disks = tc.disks
			require.Eventually(t, func() bool {
				_, err := d.Ensure(context.Background(), m)
				require.False(t, driver.IsTerminal(err), "%v", err)
				return len(c.server(t, m.UID).Volumes) == 2
			}, waitFor, tick, "the attach is asked")
			m.Disks = []driver.Disk{root}
			var o driver.Observation
			var errs []string
			require.Eventually(t, func() bool {
				var err error
				o, err = d.Ensure(context.Background(), m)
				if err != nil {
					require.False(t, driver.IsTerminal(err), "%v", err)
					errs = append(errs, err.Error())
					return false
				}
				return len(c.server(t, m.UID).Volumes) == 1 && assert.ObjectsAreEqual([]string{root.Name}, o.Disks)
			}, waitFor, tick, "the disk is never detached")
			assert.Contains(t, strings.Join(errs, "\n"), "waiting to detach volumes until Cinder has them in-use", "the detach met the attach unsettled")
			assert.Zero(t, o.RestartCount)
		})
	}
}

// TestAShapeHashedWithDisksIsReadAsItsFlavor pins the upgrade from agents
// that hashed the extra disks into MetaLive: a server they left running
// with its disks as asked does not ask for a restart.
func TestAShapeHashedWithDisksIsReadAsItsFlavor(t *testing.T) {
	t.Parallel()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("upgraded")
	m.Disks = append(m.Disks, driver.Disk{Name: "ns_upgraded-data", SizeBytes: 1 << 30})
	ensure(t, d, m, driver.PhaseRunning)
	require.Eventually(t, func() bool { return len(c.server(t, m.UID).Volumes) == 2 }, waitFor, tick)

	// Hashes as the older agent wrote them: same flavor, disks included.
	id := c.server(t, m.UID).ID
	_, err := servers.UpdateMetadata(context.Background(), c.compute(t), id, servers.MetadataOpts{nova.MetaShape: "0123456789abcdef", nova.MetaLive: "fedcba9876543210"}).Extract()
	require.NoError(t, err)
	restarted := c.open(t)
	o, err := restarted.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	require.True(t, o.RestartRequired, "the older agent's hashes differ")

	o = ensure(t, restarted, m, driver.PhaseRunning)
	assert.False(t, o.RestartRequired, "the server runs the flavor asked for")
	assert.Equal(t, id, c.server(t, m.UID).ID)
	assert.Zero(t, o.RestartCount)
	assert.Equal(t, c.server(t, m.UID).Metadata[nova.MetaShape], c.server(t, m.UID).Metadata[nova.MetaLive])
}
