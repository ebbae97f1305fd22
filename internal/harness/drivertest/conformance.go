// Package drivertest holds the driver conformance suite: one table of the
// behaviours driver.Driver's contract (and that of the optional Consoler
// and Adopter) promises, which every backend's tests run against their own
// test server. A backend that lacks a behaviour says so by naming it in
// Harness.Unsupported with the reason, which the case prints when it
// skips; the suite never asks which backend it runs.
//
// It is test support code: only _test.go files import it.
package drivertest

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Capability names a behaviour of the contract a backend may declare it
// does not have. Each case of the suite needs some; a case whose
// capability is declared unsupported is skipped with the declared reason.
type Capability string

// The capabilities the suite's cases need.
const (
	// Restart is a restart per RestartNonce, counted in RestartCount.
	Restart Capability = "restart"
	// Reset is a hard reset per ResetNonce, counted in RestartCount.
	Reset Capability = "reset"
	// RestartAndResetAreOneRestart is a restart and a reset asked for at
	// once making one restart.
	RestartAndResetAreOneRestart Capability = "restart-and-reset-are-one-restart"
	// Pause is pausing a running guest with Machine.Paused.
	Pause Capability = "pause"
	// Validate is Ensure refusing, with a Terminal error, the Machines
	// driver.Machine.Validate refuses.
	Validate Capability = "validate"
	// ForeignGuests is a backend that can hold a guest this driver did
	// not make (Backend.AddForeign), which List must leave out.
	ForeignGuests Capability = "foreign-guests"
	// VolumeInUse is DeleteVolume refusing a disk a guest has attached.
	VolumeInUse Capability = "volume-in-use"
	// CapacityAllocation is Capacity's allocation following the guests.
	CapacityAllocation Capability = "capacity-allocation"
	// Images is a driver.ImageKeeper reporting none on a node that
	// imported none.
	Images Capability = "images"
	// Events is Close closing the Events channel.
	Events Capability = "events"
	// Consoles is the driver.Consoler's refusals, where it is one.
	Consoles Capability = "consoles"
	// Release is the driver.Adopter's Release and Orphans, where it is one.
	Release Capability = "release"
	// Claim is the driver.Adopter's Claim of an orphan, where it is one.
	Claim Capability = "claim"
)

// capabilities are every Capability, so a declaration naming none of them
// (a typo) fails instead of skipping nothing.
var capabilities = []Capability{Restart, Reset, RestartAndResetAreOneRestart, Pause, Validate, ForeignGuests, VolumeInUse, CapacityAllocation, Images, Events, Consoles, Release, Claim}

// Harness is what a backend's tests give the suite.
type Harness struct {
	// Start gives one case a backend of its own: a fresh driver that sees
	// no guest of any other case, closed (with whatever it runs on) when
	// the test ends.
	Start func(t *testing.T) Backend
	// Wait bounds, and Tick paces, how long the suite calls a method again
	// and again (as the reconciler would) for the backend to get where the
	// contract says it goes: a guest to its phase, a deletion to show.
	Wait, Tick time.Duration
	// Unsupported are the capabilities the backend does not have, each
	// with the reason, printed by the cases it skips. A reason starting
	// "contract violation:" marks a bug the suite found, not a limit.
	Unsupported map[Capability]string
}

// Backend is one case's driver and what the suite needs to use it.
type Backend struct {
	Driver driver.Driver
	// Machine returns a Machine the backend can run as it is: Running, with
	// a uid of its own on each call, disks and networks the driver makes or
	// finds. Cases change only what they are about.
	Machine func() driver.Machine
	// AddForeign puts a guest on the backend that this driver did not make
	// (another tool's, another node's). Nil only where ForeignGuests is
	// declared unsupported.
	AddForeign func(t *testing.T)
}

// conformanceCase is one behaviour of the contract.
type conformanceCase struct {
	name  string
	needs []Capability
	run   func(t *testing.T, c *check)
}

// Run runs every case of the suite against h, each as a subtest on a
// backend of its own.
func Run(t *testing.T, h Harness) {
	require.NotNil(t, h.Start, "Harness.Start is required")
	require.Positive(t, h.Wait, "Harness.Wait is required")
	require.Positive(t, h.Tick, "Harness.Tick is required")
	for c := range h.Unsupported {
		require.Contains(t, capabilities, c, "Harness.Unsupported names a capability the suite does not know")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, need := range tc.needs {
				if reason, ok := h.Unsupported[need]; ok {
					t.Skipf("%s unsupported: %s", need, reason)
				}
			}
			b := h.Start(t)
			require.NotNil(t, b.Driver, "Backend.Driver")
			require.NotNil(t, b.Machine, "Backend.Machine")
			tc.run(t, &check{t: t, h: h, b: b, d: b.Driver, ctx: context.Background()})
		})
	}
}

// check is one case's state and the calls cases share.
type check struct {
	t   *testing.T
	h   Harness
	b   Backend
	d   driver.Driver
	ctx context.Context
}

// ensureUntil calls Ensure as the reconciler does, until the guest reports
// phase; transient errors are retried, as the reconciler retries them.
func (c *check) ensureUntil(m driver.Machine, phase driver.Phase) driver.Observation {
	c.t.Helper()
	var o driver.Observation
	require.EventuallyWithT(c.t, func(ct *assert.CollectT) {
		var err error
		o, err = c.d.Ensure(c.ctx, m)
		require.NoError(ct, err)
		assert.Equal(ct, phase, o.Phase, "phase of %s (message %q)", m.UID, o.Message)
	}, c.h.Wait, c.h.Tick, "Ensure never brought guest %s to %s", m.UID, phase)
	return o
}

// running creates a guest from the backend's Machine and waits until it runs.
func (c *check) running() (driver.Machine, driver.Observation) {
	c.t.Helper()
	m := c.b.Machine()
	return m, c.ensureUntil(m, driver.PhaseRunning)
}

// observe is Observe that must succeed.
func (c *check) observe(uid string) driver.Observation {
	c.t.Helper()
	o, err := c.d.Observe(c.ctx, uid)
	require.NoError(c.t, err)
	return o
}

// listed waits until List reports exactly the guests want, in any order.
// A backend may list from a cache a watch or a poll keeps (informers,
// Nova's changes-since), so List may lag behind what Ensure did; a guest
// listed twice, or one not the driver's, never goes away and fails it.
func (c *check) listed(why string, want ...string) {
	c.t.Helper()
	want = append([]string{}, want...)
	sort.Strings(want)
	require.EventuallyWithT(c.t, func(ct *assert.CollectT) {
		obs, err := c.d.List(c.ctx)
		require.NoError(ct, err)
		got := make([]string, 0, len(obs))
		for _, o := range obs {
			got = append(got, o.UID)
		}
		sort.Strings(got)
		assert.Equal(ct, want, got, "uids List reports")
	}, c.h.Wait, c.h.Tick, "List: %s", why)
}

// deleted deletes the guest uid as the reconciler does, calling Delete
// until it succeeds and the guest is gone from Observe and List.
func (c *check) deleted(uid string) {
	c.t.Helper()
	require.EventuallyWithT(c.t, func(ct *assert.CollectT) {
		require.NoError(ct, c.d.Delete(c.ctx, uid))
		_, err := c.d.Observe(c.ctx, uid)
		assert.True(ct, driver.IsNotFound(err), "Observe after Delete: want NotFound, got %v", err)
		obs, err := c.d.List(c.ctx)
		require.NoError(ct, err)
		for _, o := range obs {
			assert.NotEqual(ct, uid, o.UID, "List after Delete")
		}
	}, c.h.Wait, c.h.Tick, "guest %s never went", uid)
}

// restartsAfter asks for a restart or reset of the running guest m with
// change, waits until it runs again, and returns its restart count once
// Ensure is called again: a nonce already handled must not count twice.
func (c *check) restartsAfter(m *driver.Machine, change func(m *driver.Machine)) int32 {
	c.t.Helper()
	change(m)
	first := c.ensureUntil(*m, driver.PhaseRunning)
	again := c.ensureUntil(*m, driver.PhaseRunning)
	assert.Equal(c.t, first.RestartCount, again.RestartCount, "Ensure again with the same nonce restarts nothing")
	assert.Equal(c.t, again.RestartCount, c.observe(m.UID).RestartCount, "Observe tells the count Ensure told")
	return again.RestartCount
}

// cases are the suite, in the order of the contract's doc comments.
var cases = []conformanceCase{
	{
		name: "EnsureCreatesARunningGuestThatObserveAndListReport",
		run: func(t *testing.T, c *check) {
			m, o := c.running()
			assert.Equal(t, m.UID, o.UID)
			assert.NotEmpty(t, o.ID, "the backend's id of the guest")
			assert.Zero(t, o.RestartCount, "a new guest has not restarted")
			assert.False(t, o.RestartRequired, "a new guest runs the shape it was asked for")
			got := c.observe(m.UID)
			assert.Equal(t, driver.PhaseRunning, got.Phase)
			assert.Equal(t, o.ID, got.ID, "Observe reports the guest Ensure made")
			c.listed("it lists the new guest", m.UID)
		},
	},
	{
		name: "EnsureAgainChangesNothing",
		run: func(t *testing.T, c *check) {
			m, first := c.running()
			again, err := c.d.Ensure(c.ctx, m)
			require.NoError(t, err)
			assert.Equal(t, driver.PhaseRunning, again.Phase)
			assert.Equal(t, first.ID, again.ID, "the same guest, not another")
			assert.Zero(t, again.RestartCount)
			c.listed("one guest, not two", m.UID)
		},
	},
	{
		name: "RunningFalseStopsAndRunningTrueStartsWithoutARestart",
		run: func(t *testing.T, c *check) {
			m, first := c.running()
			m.Running = false
			stopped := c.ensureUntil(m, driver.PhaseStopped)
			assert.Equal(t, first.ID, stopped.ID, "a stopped guest is kept")
			assert.Equal(t, driver.PhaseStopped, c.observe(m.UID).Phase)
			c.listed("it lists stopped guests too", m.UID)
			m.Running = true
			started := c.ensureUntil(m, driver.PhaseRunning)
			assert.Equal(t, first.ID, started.ID)
			assert.Zero(t, started.RestartCount, "a stop and a start are not a restart")
		},
	},
	{
		name: "AStoppedGuestIsCreatedStopped",
		run: func(t *testing.T, c *check) {
			m := c.b.Machine()
			m.Running = false
			o := c.ensureUntil(m, driver.PhaseStopped)
			assert.Equal(t, m.UID, o.UID)
			c.listed("it lists a guest created stopped", m.UID)
		},
	},
	{
		name:  "TheRestartNonceANewGuestIsCreatedWithCountsAsHandled",
		needs: []Capability{Restart},
		run: func(t *testing.T, c *check) {
			m := c.b.Machine()
			m.RestartNonce = "created-with"
			c.ensureUntil(m, driver.PhaseRunning)
			assert.Zero(t, c.ensureUntil(m, driver.PhaseRunning).RestartCount, "a new guest never restarts right away")
		},
	},
	{
		name:  "ARestartNonceRestartsOnceAndCountsOnce",
		needs: []Capability{Restart},
		run: func(t *testing.T, c *check) {
			m, _ := c.running()
			assert.Equal(t, int32(1), c.restartsAfter(&m, func(m *driver.Machine) { m.RestartNonce = "t1" }))
			assert.Equal(t, int32(2), c.restartsAfter(&m, func(m *driver.Machine) { m.RestartNonce = "t2" }), "another nonce restarts again")
		},
	},
	{
		name:  "TheResetNonceANewGuestIsCreatedWithCountsAsHandled",
		needs: []Capability{Reset},
		run: func(t *testing.T, c *check) {
			m := c.b.Machine()
			m.ResetNonce = "created-with"
			c.ensureUntil(m, driver.PhaseRunning)
			assert.Zero(t, c.ensureUntil(m, driver.PhaseRunning).RestartCount, "a new guest is never reset right away")
		},
	},
	{
		name:  "AResetNonceResetsOnceAndCountsOnce",
		needs: []Capability{Reset},
		run: func(t *testing.T, c *check) {
			m, _ := c.running()
			assert.Equal(t, int32(1), c.restartsAfter(&m, func(m *driver.Machine) { m.ResetNonce = "r1" }))
			assert.Equal(t, int32(2), c.restartsAfter(&m, func(m *driver.Machine) { m.ResetNonce = "r2" }), "another nonce resets again")
		},
	},
	{
		name:  "ARestartAndAResetAskedForAtOnceAreOneRestart",
		needs: []Capability{Restart, Reset, RestartAndResetAreOneRestart},
		run: func(t *testing.T, c *check) {
			m, _ := c.running()
			assert.Equal(t, int32(1), c.restartsAfter(&m, func(m *driver.Machine) { m.RestartNonce, m.ResetNonce = "t1", "r1" }))
		},
	},
	{
		name:  "PausedPausesARunningGuestUntilItIsCleared",
		needs: []Capability{Pause},
		run: func(t *testing.T, c *check) {
			m, first := c.running()
			m.Paused = true
			c.ensureUntil(m, driver.PhasePaused)
			paused := c.ensureUntil(m, driver.PhasePaused)
			assert.Equal(t, first.ID, paused.ID, "the same guest, paused")
			assert.Equal(t, driver.PhasePaused, c.observe(m.UID).Phase, "Observe reports it paused")
			m.Paused = false
			resumed := c.ensureUntil(m, driver.PhaseRunning)
			assert.Zero(t, resumed.RestartCount, "a pause is no restart")
		},
	},
	{
		name:  "RunningFalseStopsAPausedGuest",
		needs: []Capability{Pause},
		run: func(_ *testing.T, c *check) {
			m, _ := c.running()
			m.Paused = true
			c.ensureUntil(m, driver.PhasePaused)
			m.Running = false
			c.ensureUntil(m, driver.PhaseStopped)
		},
	},
	{
		name: "ObserveOfAnUnknownUIDIsNotFound",
		run: func(t *testing.T, c *check) {
			_, err := c.d.Observe(c.ctx, c.b.Machine().UID)
			require.Error(t, err)
			assert.True(t, driver.IsNotFound(err), "want NotFound, got %v", err)
		},
	},
	{
		name: "DeleteOfAnAbsentGuestSucceeds",
		run: func(t *testing.T, c *check) {
			assert.NoError(t, c.d.Delete(c.ctx, c.b.Machine().UID))
		},
	},
	{
		name: "DeleteRemovesTheGuestFromObserveAndList",
		run: func(t *testing.T, c *check) {
			m, _ := c.running()
			kept, _ := c.running()
			c.deleted(m.UID)
			c.listed("the other guest stays", kept.UID)
			assert.NoError(t, c.d.Delete(c.ctx, m.UID), "deleting it again succeeds")
		},
	},
	{
		name:  "ListReportsOnlyTheDriversOwnGuests",
		needs: []Capability{ForeignGuests},
		run: func(t *testing.T, c *check) {
			require.NotNil(t, c.b.AddForeign, "Backend.AddForeign is nil: give one, or declare ForeignGuests unsupported")
			// The foreign guest comes first, so that a driver that sees
			// the backend late (a watch, a poll) has seen it by the time
			// it sees its own guests made after it.
			c.b.AddForeign(t)
			a, _ := c.running()
			b := c.b.Machine()
			b.Running = false
			c.ensureUntil(b, driver.PhaseStopped)
			c.listed("only its own guests, stopped ones too", a.UID, b.UID)
		},
	},
	{
		name:  "EnsureOfAMachineValidateRefusesIsTerminalAndMakesNothing",
		needs: []Capability{Validate},
		run: func(t *testing.T, c *check) {
			for name, change := range map[string]func(m *driver.Machine){
				"NoVCPU":               func(m *driver.Machine) { m.VCPU = 0 },
				"NoMemory":             func(m *driver.Machine) { m.MemoryBytes = 0 },
				"NegativeSwap":         func(m *driver.Machine) { m.SwapBytes = -1 },
				"NoDisks":              func(m *driver.Machine) { m.Disks = nil },
				"MaxVCPUBelowVCPU":     func(m *driver.Machine) { m.VCPU, m.MaxVCPU = 2, 1 },
				"MaxMemoryBelowMemory": func(m *driver.Machine) { m.MaxMemoryBytes = m.MemoryBytes - 1 },
			} {
				t.Run(name, func(t *testing.T) {
					m := c.b.Machine()
					change(&m)
					require.Error(t, m.Validate(), "the case must break a rule of Validate")
					_, err := c.d.Ensure(c.ctx, m)
					require.Error(t, err)
					assert.True(t, driver.IsTerminal(err), "want Terminal, got %v", err)
					_, err = c.d.Observe(c.ctx, m.UID)
					assert.True(t, driver.IsNotFound(err), "no guest is made: %v", err)
				})
			}
		},
	},
	{
		name:  "CapacityCountsAGuestUntilItIsDeleted",
		needs: []Capability{CapacityAllocation},
		run: func(t *testing.T, c *check) {
			before, err := c.d.Capacity(c.ctx)
			require.NoError(t, err)
			assert.Positive(t, before.VCPU, "the host's vCPUs")
			assert.Positive(t, before.MemoryBytes, "the host's memory")
			m, _ := c.running()
			c.capacityEventually(before.AllocatedVCPU+int64(m.VCPU), before.AllocatedMemoryBytes+m.MemoryBytes, "with the guest")
			c.deleted(m.UID)
			c.capacityEventually(before.AllocatedVCPU, before.AllocatedMemoryBytes, "after the guest's Delete")
		},
	},
	{
		name: "DeleteVolumeOfAnAbsentVolumeSucceeds",
		run: func(t *testing.T, c *check) {
			// The disk of a Machine never ensured: named as this backend
			// names disks, and not made yet.
			assert.NoError(t, c.d.DeleteVolume(c.ctx, c.b.Machine().Disks[0]))
		},
	},
	{
		name:  "DeleteVolumeOfAnAttachedDiskIsInUseUntilTheGuestIsGone",
		needs: []Capability{VolumeInUse},
		run: func(t *testing.T, c *check) {
			m, _ := c.running()
			err := c.d.DeleteVolume(c.ctx, m.Disks[0])
			require.Error(t, err)
			assert.True(t, driver.IsInUse(err), "want InUse, got %v", err)
			c.deleted(m.UID)
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				assert.NoError(ct, c.d.DeleteVolume(c.ctx, m.Disks[0]))
			}, c.h.Wait, c.h.Tick, "the volume of a deleted guest can go")
			assert.NoError(t, c.d.DeleteVolume(c.ctx, m.Disks[0]), "and deleting it again succeeds")
		},
	},
	{
		name:  "ImagesOfANodeThatImportedNoneAreNone",
		needs: []Capability{Images},
		run: func(t *testing.T, c *check) {
			c.running()
			keeper, ok := c.d.(driver.ImageKeeper)
			require.True(t, ok, "the backend declares images but its driver is no driver.ImageKeeper")
			images, err := keeper.Images(c.ctx)
			require.NoError(t, err)
			assert.Empty(t, images, "a guest of empty disks needs no image")
		},
	},
	{
		name:  "CloseClosesEvents",
		needs: []Capability{Events},
		run: func(t *testing.T, c *check) {
			c.running()
			events := c.d.Events()
			require.NoError(t, c.d.Close())
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				for range events {
					// Hints still queued are drained; the loop ends once
					// the channel is closed.
				}
			}()
			select {
			case <-closed:
			case <-time.After(c.h.Wait):
				t.Fatal("Events was not closed by Close")
			}
		},
	},
	{
		name:  "OpenConsoleOfAnUnknownGuestIsNotFound",
		needs: []Capability{Consoles},
		run: func(t *testing.T, c *check) {
			con := c.consoler()
			_, err := con.OpenConsole(c.ctx, c.b.Machine().UID, driver.ConsoleSerial)
			require.Error(t, err)
			assert.True(t, driver.IsNotFound(err), "want NotFound, got %v", err)
		},
	},
	{
		name:  "OpenConsoleOfAStoppedGuestIsTerminal",
		needs: []Capability{Consoles},
		run: func(t *testing.T, c *check) {
			con := c.consoler()
			m, _ := c.running()
			m.Running = false
			c.ensureUntil(m, driver.PhaseStopped)
			for _, kind := range []driver.ConsoleKind{driver.ConsoleSerial, driver.ConsoleVNC} {
				_, err := con.OpenConsole(c.ctx, m.UID, kind)
				require.Error(t, err, kind)
				assert.True(t, driver.IsTerminal(err), "%s: want Terminal, got %v", kind, err)
			}
		},
	},
	{
		name:  "ReleaseOfAnAbsentGuestSucceeds",
		needs: []Capability{Release},
		run: func(t *testing.T, c *check) {
			a := c.adopter()
			assert.NoError(t, a.Release(c.ctx, c.b.Machine().UID, "seal"))
		},
	},
	{
		name:  "ReleaseHandsTheGuestToOrphansAndDeleteLeavesItAlone",
		needs: []Capability{Release},
		run: func(t *testing.T, c *check) {
			a := c.adopter()
			m, o := c.released("seal-1")
			require.NoError(t, a.Release(c.ctx, m.UID, "seal-1"), "releasing it again succeeds")
			_, err := c.d.Observe(c.ctx, m.UID)
			assert.True(t, driver.IsNotFound(err), "Observe of a released guest: want NotFound, got %v", err)
			c.listed("it leaves a released guest out")
			require.NoError(t, c.d.Delete(c.ctx, m.UID))
			orphans, err := a.Orphans(c.ctx)
			require.NoError(t, err)
			require.Len(t, orphans, 1, "Delete leaves a released guest alone")
			assert.Equal(t, o.ID, orphans[0].ID)
		},
	},
	{
		name:  "ClaimOfAnOrphanManagesItUnderTheClaimingUID",
		needs: []Capability{Release, Claim},
		run: func(t *testing.T, c *check) {
			a := c.adopter()
			m, o := c.released("seal-1")
			// The next VM of that namespace/name claims it under its own uid.
			next := c.b.Machine()
			next.Namespace, next.Name = m.Namespace, m.Name
			require.NoError(t, a.Claim(c.ctx, next, driver.Ref{Orphan: m.UID}))
			require.NoError(t, a.Claim(c.ctx, next, driver.Ref{Orphan: m.UID}), "claiming a guest already managed as the uid succeeds")
			claimed := c.ensureUntil(next, driver.PhaseRunning)
			assert.Equal(t, o.ID, claimed.ID, "the same guest")
			assert.Zero(t, claimed.RestartCount, "claimed as it was, not restarted")
			c.listed("it lists the claimed guest under its new uid", next.UID)
			orphans, err := a.Orphans(c.ctx)
			require.NoError(t, err)
			assert.Empty(t, orphans, "no longer an orphan")
		},
	},
}

// released makes a running guest, releases it with seal and waits until
// Orphans reports it, under its uid and with the VM it was released from.
func (c *check) released(seal string) (driver.Machine, driver.Observation) {
	c.t.Helper()
	a := c.adopter()
	m, o := c.running()
	require.NoError(c.t, a.Release(c.ctx, m.UID, seal))
	require.EventuallyWithT(c.t, func(ct *assert.CollectT) {
		orphans, err := a.Orphans(c.ctx)
		require.NoError(ct, err)
		require.Len(ct, orphans, 1)
		assert.Equal(ct, m.UID, orphans[0].UID, "the uid it was released under")
		assert.Equal(ct, o.ID, orphans[0].ID)
		assert.Equal(ct, &driver.VMRef{Namespace: m.Namespace, Name: m.Name, Seal: seal}, orphans[0].OrphanOf)
	}, c.h.Wait, c.h.Tick, "Orphans reports the released guest")
	return m, o
}

// capacityEventually waits until Capacity's allocation is vcpu and memory.
func (c *check) capacityEventually(vcpu, memory int64, when string) {
	c.t.Helper()
	require.EventuallyWithT(c.t, func(ct *assert.CollectT) {
		got, err := c.d.Capacity(c.ctx)
		require.NoError(ct, err)
		assert.Equal(ct, vcpu, got.AllocatedVCPU, "allocated vCPUs %s", when)
		assert.Equal(ct, memory, got.AllocatedMemoryBytes, "allocated memory %s", when)
	}, c.h.Wait, c.h.Tick, "Capacity's allocation %s", when)
}

// consoler is the driver as a driver.Consoler; the case skips on a driver
// that is none, as that is a choice, not a limit to declare.
func (c *check) consoler() driver.Consoler {
	c.t.Helper()
	con, ok := c.d.(driver.Consoler)
	if !ok {
		c.t.Skipf("%T is no driver.Consoler", c.d)
	}
	return con
}

// adopter is the driver as a driver.Adopter, skipping as consoler does.
func (c *check) adopter() driver.Adopter {
	c.t.Helper()
	a, ok := c.d.(driver.Adopter)
	if !ok {
		c.t.Skipf("%T is no driver.Adopter", c.d)
	}
	return a
}
