package kubevirt

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestDataDisksArePluggedIntoTheRunningGuest adds a disk to a running
// guest and takes it away again: each goes through KubeVirt's addvolume
// and removevolume, the guest keeps its VMI (no restart), and the disks
// reported are those virt-handler has attached.
func TestDataDisksArePluggedIntoTheRunningGuest(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	root := m.Disks[0].Name
	started := e.vmi(m.UID).UID

	plugged := m
	data := driver.Disk{Name: m.Namespace + "_" + m.Name + "-data", SizeBytes: 1 << 30}
	plugged.Disks = append(slices.Clone(m.Disks), data)
	o := e.ensureUntil(plugged, func(o driver.Observation) bool { return slices.Equal(o.Disks, []string{root, data.Name}) })
	assert.False(t, o.RestartRequired, "a data disk is no restart")
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.Zero(t, o.RestartCount)
	vmi := e.vmi(m.UID)
	assert.Equal(t, started, vmi.UID, "the same VMI: the guest was not restarted")
	name := dataDiskName(ObjectName(data.Name))
	var hotplug *kubevirtv1.VolumeStatus
	for i, s := range vmi.Status.VolumeStatus {
		if s.Name == name {
			hotplug = &vmi.Status.VolumeStatus[i]
		}
	}
	require.NotNil(t, hotplug, "virt-handler reports the volume: %+v", vmi.Status.VolumeStatus)
	assert.NotNil(t, hotplug.HotplugVolume, "attached as a hotplug volume")
	i := slices.IndexFunc(vmi.Spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return d.Name == name })
	require.GreaterOrEqual(t, i, 0)
	disk := vmi.Spec.Domain.Devices.Disks[i]
	assert.Equal(t, driver.DiskSerial(data.Name), disk.Serial, "the guest finds it by the serial it has on every backend")
	assert.Equal(t, kubevirtv1.DiskBusSCSI, disk.Disk.Bus, "the bus KubeVirt hot-plugs on")
	assert.Equal(t, []string{ObjectName(root), ObjectName(data.Name)}, claimsOf(e.vm(m.UID).Spec.Template.Spec.Volumes),
		"KubeVirt keeps the disk in the template: it stays across restarts")
	assert.Empty(t, e.vm(m.UID).Status.VolumeRequests, "every request was carried out")

	o = e.ensureUntil(m, func(o driver.Observation) bool { return slices.Equal(o.Disks, []string{root}) })
	assert.False(t, o.RestartRequired, "nor is its removal")
	assert.Equal(t, started, e.vmi(m.UID).UID, "still the same VMI")
	assert.Eventually(t, func() bool {
		return slices.Equal([]string{ObjectName(root)}, claimsOf(e.vm(m.UID).Spec.Template.Spec.Volumes))
	}, 10*time.Second, 20*time.Millisecond, "gone from the template too")

	o, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Empty(t, e.vm(m.UID).Status.VolumeRequests, "nothing more is asked for a disk already gone")
	assert.False(t, o.RestartRequired)
}

// TestADataDiskOfAStoppedGuestIsInItsNextStart adds a disk while the guest
// is off: the template gets it, and the guest starts with it.
func TestADataDiskOfAStoppedGuestIsInItsNextStart(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.Running = false
	e.ensureUntil(m, phaseIs(driver.PhaseStopped))
	data := driver.Disk{Name: m.Namespace + "_" + m.Name + "-data", SizeBytes: 1 << 30}
	m.Disks = append(m.Disks, data)
	o := e.ensureUntil(m, phaseIs(driver.PhaseStopped))
	assert.Equal(t, []string{m.Disks[0].Name, data.Name}, o.Disks, "the template's disks")

	m.Running = true
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.Phase == driver.PhaseRunning && len(o.Disks) == 2 })
	assert.False(t, o.RestartRequired)
	assert.Empty(t, e.vm(m.UID).Status.VolumeRequests, "no hot-plug was asked for")
}
