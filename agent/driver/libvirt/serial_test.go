package libvirt

import (
	"context"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestDiskSerialsStayAcrossRestartsAndDefinitions reads, behind the
// driver's back, the serial of each of a guest's disks as it runs: the
// same after a restart, after a definition made for another disk and
// after that disk was plugged in, so the guest finds each disk at the same
// /dev/disk/by-id path throughout.
func TestDiskSerialsStayAcrossRestartsAndDefinitions(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "serials")
	d := open(t, node)
	l := raw(t, node)
	m := machine("serials")
	data := driver.Disk{Name: "team-a_serials-replica-data-volume", SizeBytes: 1 << 20}
	m.Disks = append(m.Disks, data)
	serials := func() map[string]string {
		t.Helper()
		x, err := l.DomainGetXMLDesc(domainOf(t, l, m.UID), 0)
		require.NoError(t, err)
		var def libvirtxml.Domain
		require.NoError(t, def.Unmarshal(x))
		out := map[string]string{}
		for _, disk := range def.Devices.Disks {
			out[disk.Source.Volume.Volume] = disk.Serial
		}
		return out
	}
	ensureRunning := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			return o.Phase == driver.PhaseRunning && !o.RestartRequired
		}, 30*time.Second, 10*time.Millisecond)
	}
	ensureRunning()
	first := serials()
	want := map[string]string{
		m.Disks[0].Name:   m.Disks[0].Name,
		data.Name:         driver.DiskSerial(data.Name),
		swapVolume(m.UID): swapSerial,
		seedVolume(m.UID): seedSerial,
	}
	require.Equal(t, want, first)
	assert.NotEqual(t, data.Name, first[data.Name], "too long for virtio: a serial of its own")

	m.RestartNonce = "r1"
	ensureRunning()
	assert.Equal(t, want, serials(), "a restart keeps them")

	// The test driver attaches nothing live: the disk is a new
	// definition, which the guest gets at its next start.
	extra := driver.Disk{Name: "team-a_serials-extra", SizeBytes: 1 << 20}
	m.Disks = append(m.Disks, extra)
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	m.RestartNonce = "r2"
	ensureRunning()
	want[extra.Name] = extra.Name
	assert.Equal(t, want, serials(), "a new definition keeps the others' and gives the new disk its own")
	x, err := l.DomainGetXMLDesc(domainOf(t, l, m.UID), golibvirt.DomainXMLInactive)
	require.NoError(t, err)
	assert.Contains(t, x, "<serial>"+driver.DiskSerial(data.Name)+"</serial>", "so does the definition of the next start")
}
