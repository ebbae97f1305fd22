package libvirt

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/libvirt/qcow2"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// migrationTimeout bounds one migration of the small guest below, its
// memory and disks crossing the underlay between the two hosts' namespaces.
const migrationTimeout = 3 * time.Minute

// TestLiveMigration moves a running guest between two real libvirtds
// (guesthost.StartPair), each with a driver of its own. The guest has no
// operating system (its disk is empty, so its firmware finds nothing to
// boot): a live migration needs only a running QEMU, and a small one
// crosses quickly under emulation.
func TestLiveMigration(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pair, err := guesthost.StartPair(ctx, "vfmig", os.Stderr)
	require.NoError(t, err)
	t.Cleanup(pair.Close)
	a, b := openPair(ctx, t, pair)
	ha, hb := hostOfPair{pair.A, dialHost(t, pair.A)}, hostOfPair{pair.B, dialHost(t, pair.B)}
	evA, evB := collect(a), collect(b)

	m := driver.Machine{
		UID:         "5d0c7e2a-8b41-4f63-9a1e-2c7b3d4e5f60",
		Namespace:   "team-a",
		Name:        "mover",
		Generation:  1,
		VCPU:        1,
		MemoryBytes: 256 << 20,
		SwapBytes:   64 << 20,
		Running:     true,
		Disks:       []driver.Disk{{Name: "mover-root", SizeBytes: 1 << 30}},
		Networks: []driver.Network{{
			Name: "vf-moves", CIDR: "10.79.0.0/24", Mode: driver.NetworkModeNAT,
			UID: "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d", Address: netip.MustParsePrefix("10.79.0.10/24"),
		}},
	}
	mac := macFor(m.UID, 0)
	o, err := a.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	// A reboot the driver saw and has not written into the guest's
	// metadata yet (its next Ensure would): the migration carries it.
	a.stateMu.Lock()
	a.reboots[m.UID]++
	a.stateMu.Unlock()
	o, err = a.Observe(ctx, m.UID)
	require.NoError(t, err)
	restarts := o.RestartCount
	require.EqualValues(t, 1, restarts)
	qemu := ha.qemu(t, m)
	// stayed checks what a migration that did not happen leaves: the guest
	// running on A in the same QEMU, and nothing of it on B once B gives
	// up waiting for it.
	stayed := func(t *testing.T) {
		t.Helper()
		o, err := a.Observe(ctx, m.UID)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseRunning, o.Phase, "the guest runs where it was")
		assert.Equal(t, qemu, ha.qemu(t, m), "in the same QEMU")
		require.NoError(t, b.Delete(ctx, m.UID))
		hb.assertNothingOf(t, m)
	}

	t.Run("AFailedMigrationLeavesTheGuestWhereItWas", func(t *testing.T) {
		require.NoError(t, b.PrepareIncoming(ctx, m))
		require.NoError(t, b.PrepareIncoming(ctx, m), "preparing again changes nothing")
		// No domain of the target has the guest's interface yet: the
		// network sweep must leave its network and reservation alone.
		b.sweepNetworksNow()
		assert.True(t, hb.hasVolume(t, seedVolume(m.UID)), "the seed is there before the guest")
		assert.Equal(t, "10.79.0.10", hb.reservation(t, m.Networks[0].Name, mac), "the guest's address is reserved")

		// Port 1 of the target's underlay address: nothing listens there.
		nowhere := driver.MigrationTarget{ID: "attempt-1", Node: "hv-b", URI: "qemu+tcp://" + pair.B.TunnelAddress + ":1/system"}
		st := migrateUntilOver(ctx, t, a, m, nowhere)
		assert.Equal(t, driver.MigrationFailed, st.Phase)
		assert.Contains(t, st.Message, "failed")
		assert.Contains(t, st.Message, pair.B.TunnelAddress, "libvirt's message says where it could not go")
		assert.False(t, st.FinishedAt.IsZero())

		again, err := a.Migrate(ctx, m, nowhere)
		require.NoError(t, err)
		assert.Equal(t, st, again, "the attempt's status is kept by its ID")
		stayed(t)
	})

	t.Run("ATargetFailingHalfwayKeepsNothingOfIt", func(t *testing.T) {
		require.NoError(t, b.PrepareIncoming(ctx, m))
		// The target loses the guest's network behind its driver's back:
		// its libvirt makes the disks' volumes, then cannot start the
		// guest's QEMU.
		ref, err := hb.l.NetworkLookupByName(m.Networks[0].Name)
		require.NoError(t, err)
		require.NoError(t, hb.l.NetworkDestroy(ref))
		require.NoError(t, hb.l.NetworkUndefine(ref))
		st := migrateUntilOver(ctx, t, a, m, driver.MigrationTarget{ID: "attempt-1b", Node: "hv-b", URI: pair.B.MigrationURI})
		assert.Equal(t, driver.MigrationFailed, st.Phase)
		assert.Contains(t, st.Message, "no network with matching name", "libvirt's message")
		assert.True(t, hb.hasVolume(t, m.Disks[0].Name), "the disk's volume, made on the target before libvirt started, is left there")
		stayed(t)
	})

	t.Run("ACancelledMigrationLeavesTheGuestWhereItWas", func(t *testing.T) {
		require.NoError(t, b.PrepareIncoming(ctx, m))
		// Slowed to a crawl, so that it still copies when it is cancelled.
		dom := domainOf(t, ha.l, m.UID)
		require.NoError(t, ha.l.DomainMigrateSetMaxSpeed(dom, 1, 0))
		defer func() { require.NoError(t, ha.l.DomainMigrateSetMaxSpeed(dom, unlimitedMiBps, 0)) }()
		to := driver.MigrationTarget{ID: "attempt-c", Node: "hv-b", URI: pair.B.MigrationURI}
		st, err := a.Migrate(ctx, m, to)
		require.NoError(t, err)
		require.Equal(t, driver.MigrationRunning, st.Phase)
		require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			st, err = a.Migrate(ctx, m, to)
			return st.ProcessedBytes > 0, err
		}), "the migration copies")

		cancelled := to
		cancelled.Cancel = true
		_, err = a.Migrate(ctx, m, cancelled)
		require.NoError(t, err)
		st = migrateUntilOver(ctx, t, a, m, to)
		assert.Equal(t, driver.MigrationFailed, st.Phase)
		assert.Contains(t, st.Message, "cancel", "libvirt's message says the job was cancelled")
		stayed(t)
	})

	t.Run("AGuestMovesLiveWithItsDisks", func(t *testing.T) {
		require.NoError(t, b.PrepareIncoming(ctx, m))
		to := driver.MigrationTarget{ID: "attempt-2", Node: "hv-b", URI: pair.B.MigrationURI}
		started := time.Now()
		first, err := a.Migrate(ctx, m, to)
		require.NoError(t, err)
		assert.Equal(t, driver.MigrationRunning, first.Phase, "Migrate starts it and returns")
		assert.True(t, first.FinishedAt.IsZero())
		assert.Equal(t, "moving to node hv-b", first.Message)
		o, err := a.Ensure(ctx, m)
		require.NoError(t, err, "Ensure leaves a guest being moved as it is")
		assert.Equal(t, driver.PhaseRunning, o.Phase)
		st := migrateUntilOver(ctx, t, a, m, to)
		require.Equal(t, driver.MigrationSucceeded, st.Phase, st.Message)
		t.Logf("migrated in %s: %d of %d bytes, downtime %s", time.Since(started).Round(time.Millisecond), st.ProcessedBytes, st.TotalBytes, st.Downtime)

		t.Run("TheStatusIsLibvirts", func(t *testing.T) {
			assert.Equal(t, "attempt-2", st.ID)
			assert.Positive(t, st.ProcessedBytes, "what crossed")
			assert.GreaterOrEqual(t, st.TotalBytes, st.ProcessedBytes)
			assert.Positive(t, st.Downtime, "the switch-over's pause, as libvirt measured it")
			assert.False(t, st.StartedAt.IsZero())
			assert.False(t, st.FinishedAt.Before(st.StartedAt))
			assert.Contains(t, st.Message, "hv-b")
			again, err := a.Migrate(ctx, m, to)
			require.NoError(t, err, "the guest is gone from the source, its migration's status is not")
			assert.Equal(t, st, again)
		})
		// The migration's lifecycle events have reached both drivers.
		evA.waitFor(ctx, t, driver.Event{UID: m.UID, Kind: driver.EventUndefined})
		evB.waitFor(ctx, t, driver.Event{UID: m.UID, Kind: driver.EventResumed})

		t.Run("TheGuestRunsOnTheTargetAsTheSameVM", func(t *testing.T) {
			assert.Equal(t, golibvirt.DomainRunning, hb.state(t, m), "running on the target")
			assert.True(t, hb.hasVolume(t, "mover-root"), "its disk was copied")
			assert.True(t, hb.hasVolume(t, swapVolume(m.UID)), "its swap was copied")
			assert.True(t, hb.hasVolume(t, seedVolume(m.UID)), "its seed stays")
			assert.Equal(t, "10.79.0.10", hb.reservation(t, m.Networks[0].Name, mac), "its address is reserved")
			o, err := b.Observe(ctx, m.UID)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
			assert.Equal(t, "hv-b", o.Node)
			assert.Equal(t, restarts, o.RestartCount, "a migration is no restart")
			require.Len(t, o.Interfaces, 1)
			assert.Equal(t, driver.Interface{Network: m.Networks[0].Name, MAC: mac}, o.Interfaces[0],
				"the guest, which has no operating system, never asked for its address")
		})
		t.Run("ItsDiskOnTheTargetKeepsDirtyBitmapsForBackups", func(t *testing.T) {
			p, err := hb.l.StoragePoolLookupByName(guesthost.Pool)
			require.NoError(t, err)
			v, err := hb.l.StorageVolLookupByName(p, m.Disks[0].Name)
			require.NoError(t, err)
			x, err := hb.l.StorageVolGetXMLDesc(v, 0)
			require.NoError(t, err)
			var def libvirtxml.StorageVolume
			require.NoError(t, def.Unmarshal(x))
			require.NotNil(t, def.Target, x)
			assert.Equal(t, qcow2Compat, def.Target.Compat, "qcow2 version 3, made before libvirt would make version 2: %s", x)
			assert.EqualValues(t, m.Disks[0].SizeBytes, bytesOfVolume(def.Capacity), "the size of the source's disk")

			dom := domainOf(t, hb.l, m.UID)
			qemuIO(t, hb.l, dom, "virtio-disk0", "write -P 0x3c 1M 64k")
			full := &backupRecorder{}
			res, err := b.BackUp(ctx, m.UID, driver.BackupRequest{ID: "after-move"}, full)
			require.NoError(t, err, "a backup of the moved guest on the target")
			assert.True(t, res.Full, "the first on the target: its checkpoints stayed on the source")
			assert.Equal(t, []handed{{1 << 20, 64 << 10, qcow2.Data}}, full.disk("root").ranges())
			require.NoError(t, b.CommitBackup(ctx, m.UID, "after-move"))

			qemuIO(t, hb.l, dom, "virtio-disk0", "write -P 0x3d 8M 64k")
			incr := &backupRecorder{}
			res, err = b.BackUp(ctx, m.UID, driver.BackupRequest{ID: "after-move-2", Since: "after-move"}, incr)
			require.NoError(t, err, "an incremental backup since the checkpoint the target's disk keeps")
			assert.False(t, res.Full, "only what was written since")
			assert.Equal(t, []handed{{8 << 20, 64 << 10, qcow2.Data}}, incr.disk("root").ranges())
			require.NoError(t, b.CommitBackup(ctx, m.UID, "after-move-2"))
		})
		t.Run("NothingOfItStaysOnTheSource", func(t *testing.T) {
			ha.assertNothingOf(t, m)
			_, err := a.Observe(ctx, m.UID)
			assert.True(t, driver.IsNotFound(err), "observed on the source: %v", err)
			l, err := a.List(ctx)
			require.NoError(t, err)
			assert.Empty(t, l)
			c, err := a.Capacity(ctx)
			require.NoError(t, err)
			assert.Zero(t, c.AllocatedVCPU, "the source no longer counts it")
		})
		t.Run("EnsureOnTheTargetConvergesWithoutRestarting", func(t *testing.T) {
			qemu := hb.qemu(t, m)
			o, err := b.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
			assert.False(t, o.RestartRequired, "its definition came with it")
			assert.Equal(t, restarts, o.RestartCount)
			assert.Equal(t, qemu, hb.qemu(t, m), "the same QEMU runs it")
		})
	})

	t.Run("WhatCannotMoveLive", func(t *testing.T) {
		stopped := m
		stopped.UID, stopped.Name, stopped.Running, stopped.SwapBytes = "5d0c7e2a-8b41-4f63-9a1e-2c7b3d4e5f61", "resting", false, 0
		stopped.Disks = []driver.Disk{{Name: "resting-root", SizeBytes: 1 << 30}}
		stopped.Networks = nil
		_, err := a.Ensure(ctx, stopped)
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Delete(ctx, stopped.UID); _ = a.DeleteVolume(ctx, stopped.Disks[0]) })
		imported := stopped
		imported.Disks = []driver.Disk{{Name: "site-volume", Imported: true}}
		unknown := stopped
		unknown.UID = "5d0c7e2a-8b41-4f63-9a1e-2c7b3d4e5f62"
		to := driver.MigrationTarget{ID: "attempt-3", Node: "hv-b", URI: pair.B.MigrationURI}

		for _, tc := range []struct {
			name     string
			m        driver.Machine
			t        driver.MigrationTarget
			terminal bool
			want     string
		}{
			{"AStoppedGuest", stopped, to, true, "only a running guest moves live"},
			{"AnImportedDisk", imported, to, true, "an imported volume cannot be copied"},
			{"ATargetWithoutHost", stopped, driver.MigrationTarget{ID: "attempt-4", URI: "qemu:///system"}, true, "names no host"},
			{"AnUnknownGuest", unknown, to, false, "no domain"},
			{"AGuestThatMovedAwayUnderAnotherID", m, to, false, "no domain"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := a.Migrate(ctx, tc.m, tc.t)
				require.Error(t, err)
				assert.Equal(t, tc.terminal, driver.IsTerminal(err), "terminal: %v", err)
				assert.Equal(t, !tc.terminal, driver.IsNotFound(err), "not found: %v", err)
				assert.Contains(t, err.Error(), tc.want)
			})
		}
	})
}

// openPair opens a driver on each host of the pair, as nodes hv-a and
// hv-b. Both at once: a new daemon probes its QEMU binaries when first
// asked for its capabilities, which Open does, and the probes take a
// while under emulation.
func openPair(ctx context.Context, t *testing.T, pair *guesthost.Pair) (*Driver, *Driver) {
	t.Helper()
	var drivers [2]*Driver
	var errs [2]error
	var wg sync.WaitGroup
	for i, h := range pair.Hosts() {
		wg.Go(func() {
			drivers[i], errs[i] = Open(ctx, Config{
				Node: "hv-" + string(rune('a'+i)), Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType,
				ShutdownGrace: time.Second, TunnelAddress: netip.MustParseAddr(h.TunnelAddress), Netns: h.NetnsPath,
			})
		})
	}
	wg.Wait()
	for i, d := range drivers {
		if d != nil {
			t.Cleanup(func() { _ = d.Close() })
		}
		require.NoError(t, errs[i])
	}
	return drivers[0], drivers[1]
}

func dialHost(t *testing.T, h *guesthost.Host) *golibvirt.Libvirt {
	t.Helper()
	l, err := h.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Disconnect() })
	return l
}

// migrateUntilOver calls Migrate until the migration is over, as the
// agent does, and returns its final status.
// unlimitedMiBps is the migration speed QEMU starts with: no limit.
const unlimitedMiBps = 8796093022207

func migrateUntilOver(ctx context.Context, t *testing.T, d *Driver, m driver.Machine, to driver.MigrationTarget) driver.MigrationStatus {
	t.Helper()
	var st driver.MigrationStatus
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, migrationTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		st, err = d.Migrate(ctx, m, to)
		return st.Phase != driver.MigrationRunning, err
	}), "migration %s: %+v", to.ID, st)
	return st
}

// hostOfPair is a host of the pair with a connection to look behind
// its driver's back.
type hostOfPair struct {
	*guesthost.Host
	l *golibvirt.Libvirt
}

func (h hostOfPair) hasVolume(t *testing.T, name string) bool {
	t.Helper()
	p, err := h.l.StoragePoolLookupByName(guesthost.Pool)
	require.NoError(t, err)
	_, err = h.l.StorageVolLookupByName(p, name)
	if isCode(err, golibvirt.ErrNoStorageVol) {
		return false
	}
	require.NoError(t, err)
	return true
}

// reservation is the address network's DHCP reserves for mac, "" for none.
func (h hostOfPair) reservation(t *testing.T, network, mac string) string {
	t.Helper()
	ref, err := h.l.NetworkLookupByName(network)
	require.NoError(t, err)
	nw, err := readNetwork(h.l, ref)
	require.NoError(t, err)
	for _, ip := range nw.def.IPs {
		for _, r := range dhcpHosts(ip) {
			if strings.EqualFold(r.MAC, mac) {
				return r.IP
			}
		}
	}
	return ""
}

func (h hostOfPair) state(t *testing.T, m driver.Machine) golibvirt.DomainState {
	t.Helper()
	dom := domainOf(t, h.l, m.UID)
	state, _, err := h.l.DomainGetState(dom, 0)
	require.NoError(t, err)
	return golibvirt.DomainState(state)
}

// qemu names the QEMU process running m's domain: its domain id and pid.
func (h hostOfPair) qemu(t *testing.T, m driver.Machine) string {
	t.Helper()
	dom := domainOf(t, h.l, m.UID)
	pid, err := os.ReadFile(filepath.Join(h.Dir, "run", "qemu", domainName(m)+".pid"))
	require.NoError(t, err)
	return "domain " + strconv.Itoa(int(dom.ID)) + ", pid " + strings.TrimSpace(string(pid))
}

// assertNothingOf checks that nothing of m is on the host: no domain, no
// disk, seed or swap, no network.
func (h hostOfPair) assertNothingOf(t *testing.T, m driver.Machine) {
	t.Helper()
	_, err := h.l.DomainLookupByUUID(mustUUID(t, m.UID))
	assert.True(t, isCode(err, golibvirt.ErrNoDomain), "no domain, not even defined: %v", err)
	for _, v := range []string{m.Disks[0].Name, seedVolume(m.UID), swapVolume(m.UID)} {
		assert.False(t, h.hasVolume(t, v), "volume %s is gone", v)
	}
	_, err = h.l.NetworkLookupByName(m.Networks[0].Name)
	assert.True(t, isCode(err, golibvirt.ErrNoNetwork), "network %s is gone: %v", m.Networks[0].Name, err)
}

// events are what a driver's Events sent, collected until it is closed.
type events struct {
	mu   sync.Mutex
	seen []driver.Event
}

func collect(d *Driver) *events {
	e := &events{}
	go func() {
		for ev := range d.Events() {
			e.mu.Lock()
			e.seen = append(e.seen, ev)
			e.mu.Unlock()
		}
	}()
	return e
}

// waitFor waits until want was sent.
func (e *events) waitFor(ctx context.Context, t *testing.T, want driver.Event) {
	t.Helper()
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return slices.Contains(e.seen, want), nil
	}), "event %+v", want)
}
