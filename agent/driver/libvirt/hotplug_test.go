package libvirt

import (
	"context"
	"fmt"
	"strings"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// deviceCall names a disk device call: its volume, target and impact.
func deviceCall(x string, flags uint32) string {
	var disk libvirtxml.DomainDisk
	if err := disk.Unmarshal(x); err != nil || disk.Source == nil || disk.Source.Volume == nil || disk.Target == nil {
		return "unparsed " + x
	}
	return fmt.Sprintf("%s %s%s", disk.Source.Volume.Volume, disk.Target.Dev, impact(flags&uint32(golibvirt.DomainDeviceModifyLive) != 0, flags&uint32(golibvirt.DomainDeviceModifyConfig) != 0))
}

// disksOf are the volumes of the disks of m's domain, running (live) or
// next, with their targets, read behind the driver's back.
func disksOf(t *testing.T, l *golibvirt.Libvirt, m driver.Machine, flags golibvirt.DomainXMLFlags) []string {
	t.Helper()
	x, err := l.DomainGetXMLDesc(domainOf(t, l, m.UID), flags)
	require.NoError(t, err)
	info, err := parseDomain(x)
	require.NoError(t, err)
	var disks []string
	for _, disk := range info.disks {
		disks = append(disks, disk.name+" "+disk.dev)
	}
	return disks
}

// TestDataDiskChangesWaitForAStartOnTheTestDriver walks one running guest
// through changes of its disks on libvirt's test driver, which attaches
// and detaches no device: each change is a new definition the guest gets
// at its next start, and until then it says so, naming the disk. Each
// step pins the calls the driver makes, the disks the guest runs with and
// will start with, and whether it needs a restart.
func TestDataDiskChangesWaitForAStartOnTheTestDriver(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "hotplug")
	d := open(t, node)
	l := raw(t, node)
	calls := new([]string)
	d.intercept = func(a API) API { return shapeCalls{API: a, calls: calls} }
	m := machine("plugged")
	m.Disks = append(m.Disks, driver.Disk{Name: "plugged-data1", SizeBytes: 1 << 20})
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	root, seed, swap := "plugged-root", seedVolume(m.UID), swapVolume(m.UID)
	data := func(name string) driver.Disk { return driver.Disk{Name: name, SizeBytes: 1 << 20} }
	two := []string{root + " vda", "plugged-data1 vdb", "plugged-data2 vdc", swap + " vdd", seed + " vde"}
	three := []string{root + " vda", "plugged-data3 vdb", "plugged-data2 vdc", swap + " vdd", seed + " vde"}

	steps := []plugStep{
		{name: "a resync of a guest with its disks changes nothing", change: func(*driver.Machine) {},
			live: []string{root + " vda", "plugged-data1 vdb", swap + " vdc", seed + " vdd"}},
		{name: "a disk added is a new definition the running guest gets at its next start, named",
			change:  func(m *driver.Machine) { m.Disks = append(m.Disks, data("plugged-data2")) },
			calls:   []string{"define"},
			live:    []string{root + " vda", "plugged-data1 vdb", swap + " vdc", seed + " vdd"},
			next:    two,
			restart: true, message: "disk plugged-data2 is attached at the guest's next start: this node's libvirt attaches no disk live"},
		{name: "a restart starts the guest with it", change: func(m *driver.Machine) { m.RestartNonce = "r1" },
			live: two},
		{name: "a disk removed stays with the running guest until its next start, named",
			change:  func(m *driver.Machine) { m.Disks = append(m.Disks[:1], m.Disks[2:]...) },
			calls:   []string{"define"},
			live:    two,
			next:    []string{root + " vda", "plugged-data2 vdb", swap + " vdc", seed + " vdd"},
			restart: true, message: "disk plugged-data1 stays attached to the running guest until its next start: this node's libvirt detaches no disk live"},
		{name: "disks reordered are named too",
			change:  func(m *driver.Machine) { m.Disks = []driver.Disk{m.Disks[0], data("plugged-data3"), m.Disks[1]} },
			calls:   []string{"define"},
			live:    two,
			next:    three,
			restart: true, message: "the order of the data disks changed; the guest sees it from its next start"},
		{name: "a restart starts the guest with its disks in their new order", change: func(m *driver.Machine) { m.RestartNonce = "r2" },
			live: three},
		{name: "a new boot disk is a new definition, named",
			change:  func(m *driver.Machine) { m.Disks[0] = data("plugged-root2") },
			calls:   []string{"define"},
			live:    three,
			next:    []string{"plugged-root2 vda", "plugged-data3 vdb", "plugged-data2 vdc", swap + " vdd", seed + " vde"},
			restart: true, message: "the boot disk changes from volume plugged-root to plugged-root2 at the next start"},
		{name: "a stopped guest's disks change in its definition, and nothing waits",
			change: func(m *driver.Machine) { m.Disks[0], m.Disks, m.Running = data(root), m.Disks[:2], false },
			calls:  []string{"define"},
			live:   []string{root + " vda", "plugged-data3 vdb", swap + " vdc", seed + " vdd"}},
	}
	walkPlugSteps(ctx, t, d, l, calls, &m, steps)
}

// plugStep is one change of a guest's disks and what it leads to.
type plugStep struct {
	name   string
	change func(m *driver.Machine)
	// calls are the driver's calls to libvirt; live and next the disks
	// of the running guest and of its next start (next defaults to
	// live); restart and message what it reports.
	calls      []string
	live, next []string
	restart    bool
	message    string
}

// walkPlugSteps makes each step's change to m, ensures it through d and
// checks what it led to, through l, behind d's back.
func walkPlugSteps(ctx context.Context, t *testing.T, d *Driver, l *golibvirt.Libvirt, calls *[]string, m *driver.Machine, steps []plugStep) {
	t.Helper()
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(m)
			*calls = nil
			o, err := d.Ensure(ctx, *m)
			require.NoError(t, err)
			assert.Equal(t, s.calls, *calls)
			assert.Equal(t, s.live, disksOf(t, l, *m, 0), "the running guest's disks")
			next := s.next
			if next == nil {
				next = s.live
			}
			assert.Equal(t, next, disksOf(t, l, *m, golibvirt.DomainXMLInactive), "the disks of its next start")
			var attached []string
			for _, disk := range s.live {
				name, _, _ := strings.Cut(disk, " ")
				if name != seedVolume(m.UID) && name != swapVolume(m.UID) {
					attached = append(attached, name)
				}
			}
			assert.Equal(t, attached, o.Disks, "the disks reported: those the guest has")
			assertRestartRequired(ctx, t, d, m.UID, o, s.restart, s.message)
		})
	}
}

func TestPlanDisks(t *testing.T) {
	a, b, c := poolVolume{"p", "a"}, poolVolume{"p", "b"}, poolVolume{"p", "c"}
	other := poolVolume{"q", "a"}
	cases := map[string]struct {
		have, want     []poolVolume
		attach, detach []poolVolume
		live           bool
	}{
		"TheSameDisksAreNothingToDo":           {have: []poolVolume{a, b}, want: []poolVolume{a, b}, live: true},
		"ADiskAddedAtTheEndIsAttached":         {have: []poolVolume{a}, want: []poolVolume{a, b}, attach: []poolVolume{b}, live: true},
		"ADiskRemovedIsDetached":               {have: []poolVolume{a, b, c}, want: []poolVolume{a, c}, detach: []poolVolume{b}, live: true},
		"OneRemovedAndOneAddedAreBoth":         {have: []poolVolume{a, b}, want: []poolVolume{b, c}, attach: []poolVolume{c}, detach: []poolVolume{a}, live: true},
		"DisksSwappedAreANewOrder":             {have: []poolVolume{a, b}, want: []poolVolume{b, a}},
		"ADiskAddedBeforeAKeptOneIsANewOrder":  {have: []poolVolume{a}, want: []poolVolume{b, a}, attach: []poolVolume{b}},
		"TheSameNameInAnotherPoolIsAnotherOne": {have: []poolVolume{a}, want: []poolVolume{other}, attach: []poolVolume{other}, detach: []poolVolume{a}, live: true},
		"AllRemovedAreAllDetached":             {have: []poolVolume{a, b}, detach: []poolVolume{a, b}, live: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			attach, detach, live := planDisks(tc.have, tc.want)
			assert.Equal(t, tc.attach, attach, "attach")
			assert.Equal(t, tc.detach, detach, "detach")
			assert.Equal(t, tc.live, live, "live")
		})
	}
}

// What makes a running guest RestartRequired when its disks change: a
// definition that differs from m by data disks added at the end or
// removed is up to date (they are attached and detached live); any other
// change of its disks is not.
func TestUpToDateWithDiskChanges(t *testing.T) {
	base := machine("disks")
	base.Disks = append(base.Disks, driver.Disk{Name: "disks-data1"}, driver.Disk{Name: "disks-data2"})
	defined := func(m driver.Machine, hash string) domainInfo {
		x, err := domainXML(domainSpec{machine: m, owner: ownership{UID: m.UID, SpecHash: hash}, domainType: "test", pool: "default-pool", maxVCPU: 4, maxMemory: 1 << 30})
		require.NoError(t, err)
		info, err := parseDomain(x)
		require.NoError(t, err)
		return info
	}
	data := func(names ...string) func(m *driver.Machine) {
		return func(m *driver.Machine) {
			m.Disks = m.Disks[:1]
			for _, n := range names {
				m.Disks = append(m.Disks, driver.Disk{Name: n})
			}
		}
	}
	cases := map[string]struct {
		change func(m *driver.Machine)
		// era is the hash the definition carries: today's, or the one an
		// agent from before hot-plug wrote.
		era  hashEra
		want bool
	}{
		"Unchanged":                              {change: data("disks-data1", "disks-data2"), era: hashPlugged, want: true},
		"ADiskAddedAtTheEndIsLive":               {change: data("disks-data1", "disks-data2", "disks-data3"), era: hashPlugged, want: true},
		"ADiskRemovedIsLive":                     {change: data("disks-data2"), era: hashPlugged, want: true},
		"AllDataDisksRemovedIsLive":              {change: data(), era: hashPlugged, want: true},
		"DisksReorderedAreNot":                   {change: data("disks-data2", "disks-data1"), era: hashPlugged},
		"ADiskAddedInTheMiddleIsNot":             {change: data("disks-data1", "disks-data3", "disks-data2"), era: hashPlugged},
		"ANewBootDiskIsNot":                      {change: func(m *driver.Machine) { m.Disks[0].Name = "disks-root2" }, era: hashPlugged},
		"AnEarlierAgentsDefinitionUnchanged":     {change: data("disks-data1", "disks-data2"), era: hashLive, want: true},
		"AnEarlierAgentsDefinitionGetsNoNewDisk": {change: data("disks-data1", "disks-data2", "disks-data3"), era: hashLive},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			info := defined(base, hashShape(base, tc.era))
			m := base
			m.Disks = append([]driver.Disk(nil), base.Disks...)
			tc.change(&m)
			assert.Equal(t, tc.want, upToDate(info.owner.SpecHash, m, info, "default-pool"))
		})
	}
}

func TestVirtioDevNamesAsLibvirtDoes(t *testing.T) {
	for i, dev := range map[int]string{0: "vda", 25: "vdz", 26: "vdaa", 27: "vdab", 51: "vdaz", 52: "vdba", 701: "vdzz", 702: "vdaaa"} {
		assert.Equal(t, dev, virtioDev(i))
		assert.Equal(t, i, diskIndex(dev))
	}
	assert.Equal(t, -1, diskIndex("sda"))
	assert.Equal(t, -1, diskIndex("vd1"))
}
