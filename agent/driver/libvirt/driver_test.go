package libvirt

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// testPool is the storage pool libvirt's test driver serves.
const testPool = "default-pool"

func open(t testing.TB, n *libvirttest.Node) *Driver {
	t.Helper()
	d, err := Open(context.Background(), Config{Node: n.Name, Socket: n.Socket, URI: n.URI, Pool: testPool, ShutdownGrace: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// raw opens a plain go-libvirt connection, to look behind the driver's back.
func raw(t testing.TB, n *libvirttest.Node) *golibvirt.Libvirt {
	t.Helper()
	l, err := n.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Disconnect() })
	return l
}

var uidSeq = 0

func machine(name string) driver.Machine {
	uidSeq++
	return driver.Machine{
		UID:         fmt.Sprintf("0b5e3f1a-7c2d-4e8f-9a1b-%012d", uidSeq),
		Namespace:   "team-a",
		Name:        name,
		Generation:  1,
		VCPU:        2,
		MemoryBytes: 512 << 20,
		SwapBytes:   256 << 20,
		PublicKey:   "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample user@host",
		Running:     true,
		Disks:       []driver.Disk{{Name: name + "-root", SizeBytes: 1 << 30}},
		// Each machine its own address, as the hub's allocator gives them.
		Networks: []driver.Network{{Name: "net-db", CIDR: "10.10.120.0/24", Mode: driver.NetworkModeNAT, Address: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, 120, byte(2 + uidSeq%250)}), 24)}},
	}
}

// definition is the live definition of m's domain, read behind the
// driver's back.
func definition(t testing.TB, l *golibvirt.Libvirt, m driver.Machine) *libvirtxml.Domain {
	t.Helper()
	dom, err := l.DomainLookupByName(domainName(m))
	require.NoError(t, err)
	x, err := l.DomainGetXMLDesc(dom, 0)
	require.NoError(t, err)
	def := &libvirtxml.Domain{}
	require.NoError(t, def.Unmarshal(x))
	return def
}

func volumeExists(t testing.TB, l *golibvirt.Libvirt, name string) bool {
	t.Helper()
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	_, err = l.StorageVolLookupByName(p, name)
	return err == nil
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "life")
	d := open(t, node)
	m := machine("web")

	steps := []struct {
		name            string
		change          func(m *driver.Machine)
		phase           driver.Phase
		restarts        int32
		restartRequired bool
		liveVCPU        int // 0: not checked
	}{
		{name: "EnsureCreatesARunningGuest", change: func(*driver.Machine) {}, phase: driver.PhaseRunning},
		{name: "RunningFalseStopsIt", change: func(m *driver.Machine) { m.Running = false }, phase: driver.PhaseStopped},
		{name: "RunningTrueStartsIt", change: func(m *driver.Machine) { m.Running = true }, phase: driver.PhaseRunning},
		{name: "ANewNonceRestartsOnce", change: func(m *driver.Machine) { m.RestartNonce = "t1" }, phase: driver.PhaseRunning, restarts: 1},
		{name: "TheSameNonceDoesNothing", change: func(*driver.Machine) {}, phase: driver.PhaseRunning, restarts: 1},
		{name: "AnotherNonceRestartsAgain", change: func(m *driver.Machine) { m.RestartNonce = "t2" }, phase: driver.PhaseRunning, restarts: 2},
		{name: "ANonceWhileStoppedIsHandledWithoutRestart", change: func(m *driver.Machine) { m.Running, m.RestartNonce = false, "t3" }, phase: driver.PhaseStopped, restarts: 2},
		{name: "StartingAfterThatDoesNotRestartAgain", change: func(m *driver.Machine) { m.Running = true }, phase: driver.PhaseRunning, restarts: 2},
		{name: "ASpecChangeKeepsTheCount", change: func(m *driver.Machine) { m.SwapBytes *= 2 }, phase: driver.PhaseRunning, restarts: 2, restartRequired: true},
		{name: "ASpecChangeIsNotAppliedToTheRunningGuest", change: func(*driver.Machine) {}, phase: driver.PhaseRunning, restarts: 2, restartRequired: true},
		{name: "MorevCPUsWithinTheMaximumReachTheRunningGuestAtOnce", change: func(m *driver.Machine) { m.VCPU = 4 }, phase: driver.PhaseRunning, restarts: 2, restartRequired: true, liveVCPU: 4},
		{name: "ARestartAppliesThePendingShape", change: func(m *driver.Machine) { m.RestartNonce = "t4" }, phase: driver.PhaseRunning, restarts: 3, liveVCPU: 4},
		{name: "AStopAndStartAppliesIt", change: func(m *driver.Machine) { m.MaxVCPU = 6 }, phase: driver.PhaseRunning, restarts: 3, restartRequired: true},
		{name: "StoppedGuestsNeedNoRestart", change: func(m *driver.Machine) { m.Running = false }, phase: driver.PhaseStopped, restarts: 3},
		{name: "StartedAgainWithTheNewShape", change: func(m *driver.Machine) { m.Running = true }, phase: driver.PhaseRunning, restarts: 3},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&m)
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, s.phase, o.Phase)
			assert.Equal(t, s.restarts, o.RestartCount)
			assert.Equal(t, s.restartRequired, o.RestartRequired, "restartRequired")
			if s.liveVCPU > 0 {
				dom := domainOf(t, raw(t, node), m.UID)
				_, _, _, vcpus, _, err := raw(t, node).DomainGetInfo(dom)
				require.NoError(t, err)
				assert.Equal(t, uint16(s.liveVCPU), vcpus, "vCPUs of the running guest")
			}
			assert.Equal(t, m.UID, o.ID)
			assert.Equal(t, node.Name, o.Node)
		})
	}

	t.Run("RestartCountSurvivesANewDriver", func(t *testing.T) {
		o, err := open(t, node).Observe(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, int32(3), o.RestartCount)
	})
}

func mustUUID(t testing.TB, uid string) golibvirt.UUID {
	t.Helper()
	u, err := parseUUID(uid)
	require.NoError(t, err)
	return u
}

// domainOf is the domain of guest uid on l, which must have it.
func domainOf(t testing.TB, l *golibvirt.Libvirt, uid string) golibvirt.Domain {
	t.Helper()
	dom, err := l.DomainLookupByUUID(mustUUID(t, uid))
	require.NoError(t, err)
	return dom
}

func TestEnsureIsIdempotent(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "idem")
	d := open(t, node)
	l := raw(t, node)
	m := machine("db")

	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	before, _, err := l.ConnectListAllDomains(1, 0)
	require.NoError(t, err)
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	after, _, err := l.ConnectListAllDomains(1, 0)
	require.NoError(t, err)

	assert.Len(t, after, len(before), "a second Ensure must not define another domain")
	u, err := parseUUID(m.UID)
	require.NoError(t, err)
	dom, err := l.DomainLookupByUUID(u)
	require.NoError(t, err, "the domain's UUID is the machine's uid")
	state, _, err := l.DomainGetState(dom, 0)
	require.NoError(t, err)
	assert.Equal(t, int32(golibvirt.DomainRunning), state)
}

func TestDelete(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "del")
	d := open(t, node)
	l := raw(t, node)
	m := machine("gone")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.True(t, volumeExists(t, l, seedVolume(m.UID)))

	require.NoError(t, d.Delete(ctx, m.UID))

	_, err = d.Observe(ctx, m.UID)
	assert.True(t, driver.IsNotFound(err), "Observe after Delete: %v", err)
	assert.False(t, volumeExists(t, l, seedVolume(m.UID)), "the seed ISO is deleted")
	assert.False(t, volumeExists(t, l, swapVolume(m.UID)), "the swap disk is deleted")
	assert.True(t, volumeExists(t, l, m.Disks[0].Name), "the user's volume is kept")
	assert.NoError(t, d.Delete(ctx, m.UID), "deleting an absent guest succeeds")
}

func TestListAndCapacityIgnoreForeignDomains(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "list")
	d := open(t, node)
	l := raw(t, node)

	// The test driver's own "test" domain is foreign; so is this one, which
	// even carries metadata of another tool.
	x, err := (&libvirtxml.Domain{
		Type: "test", Name: "hand-made",
		Metadata: &libvirtxml.DomainMetadata{XML: `<other:vm xmlns:other="https://example.com/other"><other:uid>x</other:uid></other:vm>`},
		Memory:   &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: 8},
		OS:       &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
	}).Marshal()
	require.NoError(t, err)
	_, err = l.DomainDefineXMLFlags(x, 0)
	require.NoError(t, err)

	a, b := machine("a"), machine("b")
	b.Running = false
	for _, m := range []driver.Machine{a, b} {
		_, err := d.Ensure(ctx, m)
		require.NoError(t, err)
	}

	obs, err := d.List(ctx)
	require.NoError(t, err)
	got := map[string]driver.Phase{}
	for _, o := range obs {
		got[o.UID] = o.Phase
	}
	assert.Equal(t, map[string]driver.Phase{a.UID: driver.PhaseRunning, b.UID: driver.PhaseStopped}, got)

	c, err := d.Capacity(ctx)
	require.NoError(t, err)
	assert.Equal(t, driver.Capacity{VCPU: 16, MemoryBytes: 3 << 30, Hypervisor: "test", AllocatedVCPU: 4, AllocatedMemoryBytes: 1 << 30}, c)
}

func TestObserveReportsAddressesWithTheirSource(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "ips")
	d := open(t, node)
	m := machine("ips")
	m.Networks = append(m.Networks, driver.Network{Name: "net-backend", CIDR: "10.10.150.0/24", Address: netip.MustParsePrefix("10.10.150.7/24")})

	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Len(t, o.Interfaces, 2)
	for i, want := range []string{"10.10.120.0/24", "10.10.150.0/24"} {
		ifc := o.Interfaces[i]
		assert.Equal(t, m.Networks[i].Name, ifc.Network)
		assert.Equal(t, macFor(m.UID, i), ifc.MAC)
		assert.Equal(t, driver.AddressSourceLease, ifc.Source)
		assert.False(t, ifc.LastSeen.IsZero())
		require.Len(t, ifc.IPs, 1)
		assert.True(t, netip.MustParsePrefix(want).Contains(netip.MustParseAddr(ifc.IPs[0])), "%s in %s", ifc.IPs[0], want)
		assert.Equal(t, m.Networks[i].Address.Addr().String(), ifc.IPs[0], "the address its reservation gives it")
	}

	m.Running = false
	o, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	for _, ifc := range o.Interfaces {
		assert.Empty(t, ifc.IPs, "a stopped guest holds no addresses")
	}
}

func TestEnsureTerminalErrors(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "bad")
	d := open(t, node)

	cases := map[string]struct {
		change func(m *driver.Machine)
		want   string
	}{
		"UnknownNetworkWithoutCIDR": {
			change: func(m *driver.Machine) { m.Networks = []driver.Network{{Name: "nowhere"}} },
			want:   `network "nowhere" does not exist on this node and has no cidr to create it from`,
		},
		"VolumeBiggerThanThePool": {
			change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 200 << 30 },
			want:   `volume "huge-root" needs 214748364800 bytes but storage pool "default-pool" has`,
		},
		"UnknownPool": {
			change: func(m *driver.Machine) { m.Disks[0].Pool = "tape" },
			want:   `storage pool "tape" does not exist on this node`,
		},
		"MoreVCPUsThanTheHost": {
			change: func(m *driver.Machine) { m.VCPU = 64 },
			want:   "vcpu 64 is more than the 16 CPUs of node bad",
		},
		"UIDIsNotAUUID": {
			change: func(m *driver.Machine) { m.UID = "not-a-uuid" },
			want:   `uid "not-a-uuid" is not a UUID`,
		},
		"NoMemory": {
			change: func(m *driver.Machine) { m.MemoryBytes = 0 },
			want:   "memory must be greater than 0",
		},
		"NoDisk": {
			change: func(m *driver.Machine) { m.Disks = nil },
			want:   "at least one disk is required",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := machine("huge")
			tc.change(&m)
			_, err := d.Ensure(ctx, m)
			require.Error(t, err)
			assert.True(t, driver.IsTerminal(err), "want a terminal error, got %v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestDriverSurvivesLibvirtdRestart(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "crash")
	d := open(t, node)
	m := machine("phoenix")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	require.NoError(t, node.Restart(ctx))

	// Domains die with the test driver's state; the agent re-creates them.
	require.Eventually(t, func() bool {
		_, err := d.Observe(ctx, m.UID)
		return driver.IsNotFound(err)
	}, 5*time.Second, 20*time.Millisecond, "the driver reconnects and sees the fresh daemon")
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.True(t, receive(t, d, driver.Event{Kind: driver.EventResync}), "a reconnect asks for a resync")
}

// TestEventsNameTheGuest: a change made behind the driver's back comes as a
// hint naming the guest. The driver's own define and start come as none:
// Ensure observed their result already (see echoes).
func TestEventsNameTheGuest(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "events")
	d := open(t, node)
	l := raw(t, node)
	m := machine("loud")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	dom := domainOf(t, l, m.UID)
	require.NoError(t, l.DomainDestroy(dom))
	assert.Equal(t, driver.Event{UID: m.UID, Kind: driver.EventStopped}, next(t, d), "the first hint is the stop made outside, not Ensure's define or start")
	require.NoError(t, l.DomainCreate(dom))
	assert.Equal(t, driver.Event{UID: m.UID, Kind: driver.EventStarted}, next(t, d))
	m.Running = false
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.True(t, receive(t, d, driver.Event{UID: m.UID, Kind: driver.EventStopped}))
}

// next waits up to 5 s for the next event.
func next(t *testing.T, d *Driver) driver.Event {
	t.Helper()
	select {
	case e := <-d.Events():
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5 s")
		return driver.Event{}
	}
}

// receive waits up to 5 s for an event.
func receive(t *testing.T, d *Driver, want driver.Event) bool {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-d.Events():
			if e == want {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

func TestNodesAreIsolated(t *testing.T) {
	ctx := context.Background()
	a := open(t, libvirttest.Start(t, "iso-a"))
	b := open(t, libvirttest.Start(t, "iso-b"))
	m := machine("solo")
	_, err := a.Ensure(ctx, m)
	require.NoError(t, err)

	_, err = b.Observe(ctx, m.UID)
	assert.True(t, driver.IsNotFound(err), "a guest on node a is not on node b: %v", err)
	l, err := b.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, l)
}

// refuseDefine makes libvirt refuse every domain definition, as a host
// without KVM refuses a kvm domain.
type refuseDefine struct{ API }

func (refuseDefine) DomainDefineXMLFlags(string, golibvirt.DomainDefineFlags) (golibvirt.Domain, error) {
	return golibvirt.Domain{}, golibvirt.Error{Code: uint32(golibvirt.ErrInvalidArg), Message: "invalid argument: could not get preferred machine for /usr/bin/qemu-system-x86_64 type=kvm"}
}

// A definition libvirt refuses for good fails the guest with libvirt's
// message at once, and takes back every volume made for it; a disk that
// was there before (a Volume's) stays.
func TestRefusedDefinitionIsTerminalAndLeavesNothingBehind(t *testing.T) {
	node := libvirttest.Start(t, "refuse")
	d := open(t, node)
	d.intercept = func(a API) API { return refuseDefine{a} }
	l := raw(t, node)

	m := machine("refused")
	m.Disks = append(m.Disks, driver.Disk{Name: "refused-data", SizeBytes: 1 << 30})
	made, err := ensureVolume(l, testPool, "refused-data", 1<<30, "qcow2")
	require.NoError(t, err)
	require.True(t, made)

	_, err = d.Ensure(context.Background(), m)
	require.Error(t, err)
	assert.True(t, driver.IsTerminal(err), "no retry mends it: %v", err)
	assert.Contains(t, err.Error(), "could not get preferred machine", "libvirt's own message")
	for _, v := range []string{"refused-root", seedVolume(m.UID), swapVolume(m.UID)} {
		assert.False(t, volumeExists(t, l, v), "%s was made for the refused guest and is removed", v)
	}
	assert.True(t, volumeExists(t, l, "refused-data"), "a disk that was there before stays")
}

// The resets of one reboot count once; a later reboot counts again.
func TestRebootEventsOfOneRebootCountOnce(t *testing.T) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	d := &Driver{now: func() time.Time { return now }, reboots: map[string]int32{}, startedAt: map[string]time.Time{}, events: make(chan driver.Event, 16)}
	const uid = "0b5e3f1a-7c2d-4e8f-9a1b-000000000999"
	d.started(uid, now.Add(-time.Minute))
	for range 3 {
		d.rebooted(uid)
		now = now.Add(300 * time.Millisecond)
	}
	assert.EqualValues(t, 1, d.pendingReboots(uid), "three resets within a second are one reboot")
	now = now.Add(time.Minute)
	d.rebooted(uid)
	assert.EqualValues(t, 2, d.pendingReboots(uid), "a reboot a minute later is another")
}

// TestImportedNetworks attaches guests to networks made outside virtfleet
// (libvirt's own "default" on the test driver: nat, 192.168.122.0/24): used
// as they are when they are what the VirtualNetwork says, never defined or
// started; a mismatch is Terminal, a missing or stopped network is not (its
// owner may make or start it).
func TestImportedNetworks(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "imports")
	d := open(t, node)
	l := raw(t, node)
	stopped, err := (&libvirtxml.Network{Name: "stopped", Forward: &libvirtxml.NetworkForward{Mode: "nat"}, IPs: []libvirtxml.NetworkIP{{Address: "10.9.0.1", Prefix: 24}}}).Marshal()
	require.NoError(t, err)
	_, err = l.NetworkDefineXML(stopped)
	require.NoError(t, err)
	networks := func() []string {
		nets, _, err := l.ConnectListAllNetworks(1, 0)
		require.NoError(t, err)
		var names []string
		for _, n := range nets {
			names = append(names, n.Name)
		}
		return names
	}
	before := networks()

	cases := map[string]struct {
		net          driver.Network
		wantErr      string
		wantTerminal bool
	}{
		"WhatItSaysIsUsedAsItIs":  {net: driver.Network{Name: "default", Imported: true, Mode: driver.NetworkModeNAT, CIDR: "192.168.122.0/24"}},
		"NoSubnetSaidIsAnySubnet": {net: driver.Network{Name: "default", Imported: true}},
		"Missing": {
			net:     driver.Network{Name: "nowhere", Imported: true, CIDR: "10.10.0.0/24"},
			wantErr: `network "nowhere", which the VirtualNetwork imports, does not exist on this node`,
		},
		"Stopped": {
			net:     driver.Network{Name: "stopped", Imported: true, CIDR: "10.9.0.0/24"},
			wantErr: `network "stopped", which the VirtualNetwork imports, is not active`,
		},
		"AnotherSubnet": {
			net:     driver.Network{Name: "default", Imported: true, CIDR: "10.0.0.0/24"},
			wantErr: `network "default" serves [192.168.122.0/24], the VirtualNetwork that imports it says 10.0.0.0/24`, wantTerminal: true,
		},
		"AnotherMode": {
			net:     driver.Network{Name: "default", Imported: true, Mode: driver.NetworkModeIsolated, CIDR: "192.168.122.0/24"},
			wantErr: `network "default" forwards in mode "nat", the VirtualNetwork that imports it says "isolated"`, wantTerminal: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := machine("importer")
			m.Networks = []driver.Network{tc.net}
			_, err := d.Ensure(ctx, m)
			assert.Equal(t, before, networks(), "no network defined or removed")
			if tc.wantErr == "" {
				require.NoError(t, err)
				def := definition(t, l, m)
				require.Len(t, def.Devices.Interfaces, 1)
				assert.Equal(t, tc.net.Name, def.Devices.Interfaces[0].Source.Network.Network)
				require.NoError(t, d.Delete(ctx, m.UID))
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Equal(t, tc.wantTerminal, driver.IsTerminal(err), "terminal: %v", err)
		})
	}
	stoppedNet, err := l.NetworkLookupByName("stopped")
	require.NoError(t, err)
	active, err := l.NetworkIsActive(stoppedNet)
	require.NoError(t, err)
	assert.Zero(t, active, "an imported network is never started")
}

// haltAsKVMDoes reports a paused domain as QEMU's internal error leaves it
// ("KVM internal error. Suberror: 1 emulation failure" on a nested KVM):
// paused for an unknown reason, where the test driver's suspend says "user".
type haltAsKVMDoes struct{ API }

func (h haltAsKVMDoes) DomainGetState(dom golibvirt.Domain, flags uint32) (int32, int32, error) {
	s, r, err := h.API.DomainGetState(dom, flags)
	if err == nil && golibvirt.DomainState(s) == golibvirt.DomainPaused {
		r = int32(golibvirt.DomainPausedUnknown)
	}
	return s, r, err
}

// A guest paused by hand is resumed; one the hypervisor halted is Failed
// and left alone, since a resume runs into the same fault, until a restart
// or a stop starts it afresh.
func TestAGuestTheHypervisorHaltedIsFailedNotResumed(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "halt")
	d := open(t, node)
	l := raw(t, node)
	m := machine("halted")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	dom := domainOf(t, l, m.UID)
	state := func() golibvirt.DomainState {
		s, _, err := l.DomainGetState(dom, 0)
		require.NoError(t, err)
		return golibvirt.DomainState(s)
	}

	steps := []struct {
		name     string
		pause    bool
		halted   bool
		change   func(m *driver.Machine)
		phase    driver.Phase
		message  string
		state    golibvirt.DomainState
		restarts int32
	}{
		{name: "APauseByHandIsResumed", pause: true, change: func(*driver.Machine) {}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning},
		{name: "AHaltIsFailedAndNotResumed", pause: true, halted: true, change: func(*driver.Machine) {}, phase: driver.PhaseFailed, message: "KVM internal error", state: golibvirt.DomainPaused},
		{name: "NorTheNextTime", halted: true, change: func(*driver.Machine) {}, phase: driver.PhaseFailed, message: "KVM internal error", state: golibvirt.DomainPaused},
		{name: "ARestartStartsItAfresh", halted: true, change: func(m *driver.Machine) { m.RestartNonce = "r1" }, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 1},
		{name: "AStopForcesItOffAtOnce", pause: true, halted: true, change: func(m *driver.Machine) { m.Running = false }, phase: driver.PhaseStopped, state: golibvirt.DomainShutoff, restarts: 1},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.pause {
				require.NoError(t, l.DomainSuspend(dom))
			}
			d.intercept = nil
			if s.halted {
				d.intercept = func(a API) API { return haltAsKVMDoes{a} }
			}
			s.change(&m)
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, s.phase, o.Phase)
			assert.Contains(t, o.Message, s.message)
			assert.Equal(t, s.restarts, o.RestartCount)
			assert.Equal(t, s.state, state(), "the domain's state behind the driver's back")
		})
	}
}

// powerCalls records the power calls the driver makes, in order.
type powerCalls struct {
	API
	calls *[]string
}

func (p powerCalls) DomainSuspend(dom golibvirt.Domain) error {
	*p.calls = append(*p.calls, "suspend")
	return p.API.DomainSuspend(dom)
}

func (p powerCalls) DomainResume(dom golibvirt.Domain) error {
	*p.calls = append(*p.calls, "resume")
	return p.API.DomainResume(dom)
}

func (p powerCalls) DomainReset(dom golibvirt.Domain, flags uint32) error {
	*p.calls = append(*p.calls, "reset")
	return p.API.DomainReset(dom, flags)
}

func (p powerCalls) DomainReboot(dom golibvirt.Domain, flags golibvirt.DomainRebootFlagValues) error {
	*p.calls = append(*p.calls, "reboot")
	return p.API.DomainReboot(dom, flags)
}

func (p powerCalls) DomainShutdown(dom golibvirt.Domain) error {
	*p.calls = append(*p.calls, "shutdown")
	return p.API.DomainShutdown(dom)
}

func (p powerCalls) DomainDestroy(dom golibvirt.Domain) error {
	*p.calls = append(*p.calls, "destroy")
	return p.API.DomainDestroy(dom)
}

func (p powerCalls) DomainCreate(dom golibvirt.Domain) error {
	*p.calls = append(*p.calls, "start")
	return p.API.DomainCreate(dom)
}

// TestPauseAndReset walks one guest through pauses and resets on the test
// driver, which suspends, resumes and resets its simulated guests (virsh
// reset works on it) and sends no reboot event for a reset. Each step
// checks the power calls the driver made and the domain's state behind its
// back; the test driver would also shut a paused guest down, which QEMU's
// guest could not, so the calls show it is resumed first.
func TestPauseAndReset(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "pause")
	d := open(t, node)
	var calls []string
	d.intercept = func(a API) API { return powerCalls{API: a, calls: &calls} }
	l := raw(t, node)
	m := machine("paused")
	m.ResetNonce = "r0"
	state := func() (golibvirt.DomainState, golibvirt.DomainPausedReason) {
		dom := domainOf(t, l, m.UID)
		s, r, err := l.DomainGetState(dom, 0)
		require.NoError(t, err)
		return golibvirt.DomainState(s), golibvirt.DomainPausedReason(r)
	}

	steps := []struct {
		name            string
		change          func(m *driver.Machine)
		calls           []string
		phase           driver.Phase
		state           golibvirt.DomainState
		restarts        int32
		restartRequired bool
	}{
		{name: "TheResetNonceANewGuestStartsWithIsHandled", change: func(*driver.Machine) {}, calls: []string{"start"}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning},
		{name: "PausedPausesIt", change: func(m *driver.Machine) { m.Paused = true }, calls: []string{"suspend"}, phase: driver.PhasePaused, state: golibvirt.DomainPaused},
		{name: "EnsureAgainDoesNotResumeIt", change: func(*driver.Machine) {}, phase: driver.PhasePaused, state: golibvirt.DomainPaused},
		{name: "ANewResetNonceResetsItOnceAndItStaysPaused", change: func(m *driver.Machine) { m.ResetNonce = "r1" }, calls: []string{"reset"}, phase: driver.PhasePaused, state: golibvirt.DomainPaused, restarts: 1},
		{name: "TheSameResetNonceDoesNothing", change: func(*driver.Machine) {}, phase: driver.PhasePaused, state: golibvirt.DomainPaused, restarts: 1},
		{name: "NotPausedResumesIt", change: func(m *driver.Machine) { m.Paused = false }, calls: []string{"resume"}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 1},
		{name: "AResetOfARunningGuestCounts", change: func(m *driver.Machine) { m.ResetNonce = "r2" }, calls: []string{"reset"}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 2},
		{name: "NoNonceAsksForNothing", change: func(m *driver.Machine) { m.ResetNonce = "" }, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 2},
		{name: "TheLastNonceAskedForAgainResetsAgain", change: func(m *driver.Machine) { m.ResetNonce = "r2" }, calls: []string{"reset"}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 3},
		{name: "AResetDoesNotApplyANewShape", change: func(m *driver.Machine) { m.SwapBytes, m.ResetNonce = 2*m.SwapBytes, "r3" }, calls: []string{"reset"}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 4, restartRequired: true},
		{name: "ARestartAndAResetAtOnceAreOneRestart", change: func(m *driver.Machine) { m.RestartNonce, m.ResetNonce = "t1", "r4" }, calls: []string{"destroy", "start"}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 5},
		{name: "ARestartOfAGuestToBePausedIsColdAndLeavesItPaused", change: func(m *driver.Machine) { m.Paused, m.RestartNonce = true, "t2" }, calls: []string{"destroy", "start", "suspend"}, phase: driver.PhasePaused, state: golibvirt.DomainPaused, restarts: 6},
		{name: "RunningFalseResumesAPausedGuestToShutItDown", change: func(m *driver.Machine) { m.Running = false }, calls: []string{"resume", "shutdown"}, phase: driver.PhaseStopped, state: golibvirt.DomainShutoff, restarts: 6},
		{name: "AResetAskedForWhileStoppedIsHandledByTheStart", change: func(m *driver.Machine) { m.ResetNonce = "r5" }, phase: driver.PhaseStopped, state: golibvirt.DomainShutoff, restarts: 6},
		{name: "AGuestStartedPausedIsPausedOnceItRuns", change: func(m *driver.Machine) { m.Running = true }, calls: []string{"start", "suspend"}, phase: driver.PhasePaused, state: golibvirt.DomainPaused, restarts: 6},
		{name: "ItIsNotResetWhenResumed", change: func(m *driver.Machine) { m.Paused = false }, calls: []string{"resume"}, phase: driver.PhaseRunning, state: golibvirt.DomainRunning, restarts: 6},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&m)
			calls = nil
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, s.calls, calls, "power calls")
			assert.Equal(t, s.phase, o.Phase)
			assert.Equal(t, s.restarts, o.RestartCount)
			assert.Equal(t, s.restartRequired, o.RestartRequired, "restartRequired")
			st, reason := state()
			assert.Equal(t, s.state, st, "the domain's state behind the driver's back")
			if st == golibvirt.DomainPaused {
				assert.Equal(t, golibvirt.DomainPausedUser, reason)
				o, err := d.Observe(ctx, m.UID)
				require.NoError(t, err)
				assert.Equal(t, driver.PhasePaused, o.Phase, "Observe tells a paused guest from a stopped one")
				assert.NotEmpty(t, o.Interfaces[0].IPs, "a paused guest keeps its address")
			}
		})
	}

	t.Run("TheCountAndTheHandledResetSurviveANewDriver", func(t *testing.T) {
		again := open(t, node)
		calls = nil
		again.intercept = d.intercept
		o, err := again.Ensure(ctx, m)
		require.NoError(t, err)
		assert.Empty(t, calls, "the last reset nonce is not acted on again")
		assert.Equal(t, int32(6), o.RestartCount)
	})
}

// TestAGuestTheHypervisorHaltedIsNotPaused: a halt is no pause. A guest
// the hypervisor halted is Failed whether or not it should be paused, and
// neither a pause nor its end resumes it.
func TestAGuestTheHypervisorHaltedIsNotPaused(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "halt-pause")
	d := open(t, node)
	l := raw(t, node)
	m := machine("halted")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	dom := domainOf(t, l, m.UID)
	require.NoError(t, l.DomainSuspend(dom))
	d.intercept = func(a API) API { return haltAsKVMDoes{a} }

	for _, paused := range []bool{true, false} {
		m.Paused = paused
		o, err := d.Ensure(ctx, m)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseFailed, o.Phase, "paused %v", paused)
		s, _, err := l.DomainGetState(dom, 0)
		require.NoError(t, err)
		assert.Equal(t, int32(golibvirt.DomainPaused), s, "left as the hypervisor halted it (paused %v)", paused)
	}

	// A reset in place would find the same fault: it starts the guest
	// afresh, as a restart does.
	m.ResetNonce = "r1"
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.Equal(t, int32(1), o.RestartCount)
}

// TestTheDriversOwnPauseIsNoHint: the driver's suspend and resume come
// back as no hint (Ensure observed their result), a resume by hand does.
func TestTheDriversOwnPauseIsNoHint(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "pause-events")
	d := open(t, node)
	l := raw(t, node)
	m := machine("quiet")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	m.Paused = true
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	dom := domainOf(t, l, m.UID)
	require.NoError(t, l.DomainResume(dom))
	assert.Equal(t, driver.Event{UID: m.UID, Kind: driver.EventResumed}, next(t, d), "the first hint is the resume by hand, not the driver's suspend")
	m.Paused = false
	require.NoError(t, l.DomainSuspend(dom))
	assert.Equal(t, driver.Event{UID: m.UID, Kind: driver.EventSuspended}, next(t, d))
	_, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	require.NoError(t, l.DomainDestroy(dom))
	assert.Equal(t, driver.Event{UID: m.UID, Kind: driver.EventStopped}, next(t, d), "the driver's resume was no hint")
}
