package libvirt

import (
	"context"
	"fmt"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// shapeCalls records the definitions and the vCPU, memory and disk
// changes the driver asks of libvirt, which it passes on to libvirt.
type shapeCalls struct {
	API
	calls *[]string
}

func (c shapeCalls) DomainDefineXMLFlags(x string, flags golibvirt.DomainDefineFlags) (golibvirt.Domain, error) {
	*c.calls = append(*c.calls, "define")
	return c.API.DomainDefineXMLFlags(x, flags)
}

func (c shapeCalls) DomainSetVcpusFlags(dom golibvirt.Domain, n uint32, flags uint32) error {
	*c.calls = append(*c.calls, fmt.Sprintf("vcpus %d%s", n, impact(flags&uint32(golibvirt.DomainVCPULive) != 0, flags&uint32(golibvirt.DomainVCPUConfig) != 0)))
	return c.API.DomainSetVcpusFlags(dom, n, flags)
}

func (c shapeCalls) DomainSetMemoryFlags(dom golibvirt.Domain, kib uint64, flags uint32) error {
	*c.calls = append(*c.calls, fmt.Sprintf("memory %dMiB%s", kib>>10, impact(flags&uint32(golibvirt.DomainMemLive) != 0, flags&uint32(golibvirt.DomainMemConfig) != 0)))
	return c.API.DomainSetMemoryFlags(dom, kib, flags)
}

func (c shapeCalls) DomainAttachDeviceFlags(dom golibvirt.Domain, x string, flags uint32) error {
	*c.calls = append(*c.calls, "attach "+deviceCall(x, flags))
	return c.API.DomainAttachDeviceFlags(dom, x, flags)
}

func (c shapeCalls) DomainDetachDeviceFlags(dom golibvirt.Domain, x string, flags uint32) error {
	*c.calls = append(*c.calls, "detach "+deviceCall(x, flags))
	return c.API.DomainDetachDeviceFlags(dom, x, flags)
}

func impact(live, config bool) string {
	s := ""
	if live {
		s += " live"
	}
	if config {
		s += " config"
	}
	return s
}

// TestVCPUsAndMemoryChangeLiveWithinTheMaximum walks one running guest
// through changes of its vCPUs and memory on libvirt's test driver: each
// step pins the calls the driver makes, the shape the guest runs with
// afterwards, and whether it needs a restart.
func TestVCPUsAndMemoryChangeLiveWithinTheMaximum(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "resize")
	d := open(t, node)
	calls := new([]string)
	d.intercept = func(a API) API { return shapeCalls{API: a, calls: calls} }
	m := machine("resized")
	m.VCPU, m.MaxVCPU, m.MemoryBytes, m.MaxMemoryBytes = 2, 4, 512<<20, 1<<30
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	steps := []struct {
		name    string
		change  func(m *driver.Machine)
		calls   []string
		phase   driver.Phase
		vcpu    int32
		memory  int64
		max     int32
		restart bool
		message string
	}{
		{name: "a resync of a guest of the asked shape changes nothing", change: func(*driver.Machine) {},
			phase: driver.PhaseRunning, vcpu: 2, memory: 512 << 20, max: 4},
		{name: "more vCPUs and memory within the maximum are given to the running guest and its next start",
			change: func(m *driver.Machine) { m.VCPU, m.MemoryBytes = 4, 1<<30 },
			calls:  []string{"vcpus 4 live config", "memory 1024MiB config", "memory 1024MiB live"},
			phase:  driver.PhaseRunning, vcpu: 4, memory: 1 << 30, max: 4},
		{name: "fewer vCPUs and less memory are taken from the running guest",
			change: func(m *driver.Machine) { m.VCPU, m.MemoryBytes = 1, 256<<20 },
			calls:  []string{"vcpus 1 live config", "memory 256MiB config", "memory 256MiB live"},
			phase:  driver.PhaseRunning, vcpu: 1, memory: 256 << 20, max: 4},
		{name: "a larger maximum is a new definition the running guest gets at its next start; vcpu beyond its maximum waits for it, named",
			change: func(m *driver.Machine) { m.MaxVCPU, m.VCPU = 8, 6 },
			calls:  []string{"define"},
			phase:  driver.PhaseRunning, vcpu: 1, memory: 256 << 20, max: 4, restart: true,
			message: "vcpu 6 is more than the 4 the running guest can have (its maximum); it applies at the next start"},
		{name: "memory within the maximum is still given live meanwhile",
			change: func(m *driver.Machine) { m.MemoryBytes = 768 << 20 },
			calls:  []string{"memory 768MiB config", "memory 768MiB live"},
			phase:  driver.PhaseRunning, vcpu: 1, memory: 768 << 20, max: 4, restart: true,
			message: "vcpu 6 is more than the 4"},
		{name: "a restart starts the guest with the new maximum and shape",
			change: func(m *driver.Machine) { m.RestartNonce = "r1" },
			phase:  driver.PhaseRunning, vcpu: 6, memory: 768 << 20, max: 8},
		{name: "a stopped guest's next start gets the new shape, and nothing runs",
			change: func(m *driver.Machine) { m.Running, m.VCPU = false, 3 },
			calls:  []string{"vcpus 3 config"},
			phase:  driver.PhaseStopped, vcpu: 3, memory: 768 << 20, max: 8},
		{name: "and it starts with it",
			change: func(m *driver.Machine) { m.Running = true },
			phase:  driver.PhaseRunning, vcpu: 3, memory: 768 << 20, max: 8},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&m)
			*calls = nil
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, s.calls, *calls)
			assert.Equal(t, s.phase, o.Phase)
			assert.Equal(t, s.vcpu, o.VCPU, "running vCPUs")
			assert.Equal(t, s.memory, o.MemoryBytes, "running memory")
			assert.Equal(t, s.max, o.MaxVCPU)
			assertRestartRequired(ctx, t, d, m.UID, o, s.restart, s.message)
		})
	}
}

// A guest whose Machine sets no maximum can grow to DefaultMaxRatio times
// the shape it was defined with; beyond that it is redefined with a
// maximum that holds the new shape, and runs on until its next start.
func TestTheDefaultMaximumIsSetAtDefinition(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "resize-default")
	d := open(t, node)
	calls := new([]string)
	d.intercept = func(a API) API { return shapeCalls{API: a, calls: calls} }
	m := machine("defaulted")
	m.VCPU = 1
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	m.VCPU = 4
	*calls = nil
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, []string{"vcpus 4 live config"}, *calls, "four times one vCPU")
	assert.Equal(t, int32(4), o.VCPU)
	assert.False(t, o.RestartRequired)

	m.VCPU = 5
	*calls = nil
	o, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, []string{"define"}, *calls, "a maximum that holds 5 vCPUs needs a new definition")
	assert.Equal(t, int32(4), o.VCPU, "the running guest keeps what it has")
	assert.True(t, o.RestartRequired)
	assert.Contains(t, o.Message, "vcpu 5 is more than the 4 the running guest can have")
	next := definitionOf(t, raw(t, node), m, golibvirt.DomainXMLInactive)
	assert.Equal(t, uint(16), next.VCPU.Value, "four times 5, within the host's 16")
	assert.Equal(t, uint(5), next.VCPU.Current)
}

// defineAsBefore redefines m's stopped domain as an agent of an earlier
// era wrote it: its shape is its maximum, without a balloon, and its spec
// hash is that era's.
func defineAsBefore(t testing.TB, d *Driver, l *golibvirt.Libvirt, m driver.Machine, era hashEra) {
	t.Helper()
	def := definitionOf(t, l, m, golibvirt.DomainXMLInactive)
	def.VCPU = &libvirtxml.DomainVCPU{Placement: "static", Value: uint(m.VCPU)}
	def.Memory = &libvirtxml.DomainMemory{Value: uint(m.MemoryBytes), Unit: "b"}
	def.CurrentMemory = &libvirtxml.DomainCurrentMemory{Value: uint(m.MemoryBytes), Unit: "b"}
	def.Devices.MemBalloon = nil
	x, err := def.Marshal()
	require.NoError(t, err)
	dom, err := l.DomainDefineXMLFlags(x, 0)
	require.NoError(t, err)
	info, err := parseDomain(x)
	require.NoError(t, err)
	old := *info.owner
	old.SpecHash = hashShape(m, era)
	require.NoError(t, d.setOwnership(l, dom, old, golibvirt.DomainAffectConfig))
}

// definitionOf is m's domain definition as libvirt has it (flags: running
// or next), read behind the driver's back.
func definitionOf(t testing.TB, l *golibvirt.Libvirt, m driver.Machine, flags golibvirt.DomainXMLFlags) *libvirtxml.Domain {
	t.Helper()
	x, err := l.DomainGetXMLDesc(domainOf(t, l, m.UID), flags)
	require.NoError(t, err)
	def := &libvirtxml.Domain{}
	require.NoError(t, def.Unmarshal(x))
	return def
}

// A guest an agent defined before vCPUs and memory changed live runs on
// as it is after the upgrade: not redefined, not RestartRequired. It
// shrinks live within the shape it was started with, and a shape beyond
// that is a new definition for its next start, the field named.
func TestAGuestDefinedBeforeLiveResizeIsNotRedefined(t *testing.T) {
	for name, era := range map[string]hashEra{"WithDiskSizes": hashSized, "WithoutDiskSizes": hashFixed} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			node := libvirttest.Start(t, "resize-upgrade")
			d := open(t, node)
			m := machine("upgraded")
			m.Running = false
			_, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			defineAsBefore(t, d, raw(t, node), m, era)

			calls := new([]string)
			d.intercept = func(a API) API { return shapeCalls{API: a, calls: calls} }
			m.Running = true
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Empty(t, *calls, "no definition written, nothing resized")
			assert.False(t, o.RestartRequired)
			assert.Equal(t, int32(2), o.MaxVCPU, "its shape is its maximum")

			m.VCPU = 1
			*calls = nil
			o, err = d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, []string{"vcpus 1 live config"}, *calls)
			assert.Equal(t, int32(1), o.VCPU)
			assert.False(t, o.RestartRequired)

			m.VCPU = 3
			*calls = nil
			o, err = d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, []string{"define"}, *calls)
			assert.Equal(t, int32(1), o.VCPU)
			assert.True(t, o.RestartRequired)
			assert.Contains(t, o.Message, "vcpu 3 is more than the 2 the running guest can have")
		})
	}
}

// assertRestartRequired asserts what Ensure returned, o, says whether the
// guest uid needs a restart and, unless message is empty, contains
// message; and that Observe says the same.
func assertRestartRequired(ctx context.Context, t *testing.T, d *Driver, uid string, o driver.Observation, restart bool, message string) {
	t.Helper()
	assert.Equal(t, restart, o.RestartRequired)
	if message == "" {
		assert.Empty(t, o.Message)
	} else {
		assert.Contains(t, o.Message, message)
	}
	seen, err := d.Observe(ctx, uid)
	require.NoError(t, err)
	assert.Equal(t, o.RestartRequired, seen.RestartRequired, "Observe says what Ensure said")
	assert.Equal(t, o.Message, seen.Message)
}
