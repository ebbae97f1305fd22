package fake

import (
	"context"
	"net/netip"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

const uid = "6f1c1f43-5c1e-4d43-9b4e-1f1a2b3c4d5e"

func TestDriver(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	running := driver.Machine{UID: uid, Namespace: "team-a", Name: "web-1", Disks: []driver.Disk{{Name: "root"}}, VCPU: 2, MemoryBytes: 1 << 30, Running: true}

	cases := map[string]struct {
		run  func(d *Driver) error
		want func(t *testing.T, d *Driver, err error)
	}{
		"NextEnsureErrFailsOneCallThenClears": {
			run: func(d *Driver) error {
				d.NextEnsureErr = boom
				_, err := d.Ensure(ctx, running)
				if _, err2 := d.Ensure(ctx, running); err2 != nil {
					return err2
				}
				return err
			},
			want: func(t *testing.T, d *Driver, err error) {
				require.ErrorIs(t, err, boom)
				assert.Len(t, d.Calls(), 2, "a failed call is still recorded")
			},
		},
		"FailFailsEveryCallOfTheOpForTheGuestUntilCleared": {
			run: func(d *Driver) error {
				d.Fail("Ensure", uid, boom)
				for range 3 {
					if _, err := d.Ensure(ctx, running); !errors.Is(err, boom) {
						return errors.Errorf("want boom while failing, got %v", err)
					}
				}
				other := running
				other.UID = "other"
				if _, err := d.Ensure(ctx, other); err != nil {
					return errors.Wrap(err, "another guest must not fail")
				}
				if _, err := d.Observe(ctx, other.UID); err != nil {
					return errors.Wrap(err, "another op must not fail")
				}
				d.Fail("Ensure", uid, nil)
				_, err := d.Ensure(ctx, running)
				return err
			},
			want: func(t *testing.T, d *Driver, err error) {
				require.NoError(t, err, "cleared")
				assert.Equal(t, 4, d.Attempts("Ensure", uid), "failed attempts count")
				assert.Equal(t, 1, d.Attempts("Ensure", "other"))
				assert.Zero(t, d.Attempts("Delete", uid))
			},
		},
		"ANextErrHookTakesPrecedenceOverFailOnce": {
			run: func(d *Driver) error {
				d.Fail("Delete", uid, boom)
				d.NextDeleteErr = driver.NotFoundf("gone")
				if err := d.Delete(ctx, uid); !driver.IsNotFound(err) {
					return errors.Errorf("want the hook's error first, got %v", err)
				}
				return d.Delete(ctx, uid)
			},
			want: func(t *testing.T, d *Driver, err error) {
				require.ErrorIs(t, err, boom, "then the persistent one")
				assert.Equal(t, 2, d.Attempts("Delete", uid))
			},
		},
		"EnsureStopsAndDeleteRemoves": {
			run: func(d *Driver) error {
				stopped := running
				stopped.Running = false
				o, err := d.Ensure(ctx, stopped)
				if err != nil || o.Phase != driver.PhaseStopped {
					return errors.Errorf("want Stopped, got %q (%v)", o.Phase, err)
				}
				return d.Delete(ctx, uid)
			},
			want: func(t *testing.T, d *Driver, err error) {
				require.NoError(t, err)
				l, err := d.List(ctx)
				require.NoError(t, err)
				assert.Empty(t, l)
				assert.Equal(t, []string{"Ensure", "Delete", "List"}, ops(d.Calls()))
			},
		},
		"DeleteVolumeRefusesAnAttachedDiskUntilTheGuestGoes": {
			run: func(d *Driver) error {
				m := running
				m.Disks = []driver.Disk{{Name: "ns_root", SizeBytes: 1 << 30}}
				if _, err := d.Ensure(ctx, m); err != nil {
					return err
				}
				if err := d.DeleteVolume(ctx, driver.Disk{Name: "ns_root"}); !driver.IsInUse(err) {
					return errors.Errorf("want an in-use error, got %v", err)
				}
				if err := d.Delete(ctx, uid); err != nil {
					return err
				}
				return d.DeleteVolume(ctx, driver.Disk{Name: "ns_root"})
			},
			want: func(t *testing.T, d *Driver, err error) {
				require.NoError(t, err)
				assert.Equal(t, []string{"Ensure", "DeleteVolume", "Delete", "DeleteVolume"}, ops(d.Calls()))
				assert.Equal(t, "ns_root", d.Calls()[3].Disk.Name)
			},
		},
		"NextDeleteVolumeErrFailsOneCall": {
			run: func(d *Driver) error {
				d.NextDeleteVolumeErr = boom
				err := d.DeleteVolume(ctx, driver.Disk{Name: "ns_a"})
				if err2 := d.DeleteVolume(ctx, driver.Disk{Name: "ns_a"}); err2 != nil {
					return err2
				}
				return err
			},
			want: func(t *testing.T, _ *Driver, err error) {
				require.ErrorIs(t, err, boom)
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := New("node-a")
			tc.want(t, d, tc.run(d))
		})
	}
}

func ops(calls []Call) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Op
	}
	return out
}

// TestPauseAndReset walks one guest through the contract's pause and reset
// rules, each step from the Machine the one before left.
func TestPauseAndReset(t *testing.T) {
	ctx := context.Background()
	d := New("node-a")
	m := driver.Machine{UID: uid, Namespace: "team-a", Name: "web-1", Disks: []driver.Disk{{Name: "root", SizeBytes: 1 << 30}}, VCPU: 2, MemoryBytes: 1 << 30, Running: true, ResetNonce: "r0"}
	steps := []struct {
		name            string
		change          func(m *driver.Machine)
		phase           driver.Phase
		restarts        int32
		restartRequired bool
		// capacity is the root volume's; zero means as the step before left it.
		capacity int64
	}{
		{name: "TheNonceANewGuestStartsWithIsHandled", change: func(*driver.Machine) {}, phase: driver.PhaseRunning},
		{name: "ALargerDiskIsGrownLiveWithoutARestart", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 2 << 30 }, phase: driver.PhaseRunning, capacity: 2 << 30},
		{name: "ASmallerDiskIsNeverShrunk", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 1 << 30 }, phase: driver.PhaseRunning, capacity: 2 << 30},
		{name: "PausedPausesIt", change: func(m *driver.Machine) { m.Paused = true }, phase: driver.PhasePaused},
		{name: "ItStaysPaused", change: func(*driver.Machine) {}, phase: driver.PhasePaused},
		{name: "ANewResetNonceResetsItOnceAndItStaysPaused", change: func(m *driver.Machine) { m.ResetNonce = "r1" }, phase: driver.PhasePaused, restarts: 1},
		{name: "TheSameResetNonceDoesNothing", change: func(*driver.Machine) {}, phase: driver.PhasePaused, restarts: 1},
		{name: "NotPausedResumesIt", change: func(m *driver.Machine) { m.Paused = false }, phase: driver.PhaseRunning, restarts: 1},
		{name: "NoNonceAsksForNothing", change: func(m *driver.Machine) { m.ResetNonce = "" }, phase: driver.PhaseRunning, restarts: 1},
		{name: "TheLastNonceAskedForAgainResetsAgain", change: func(m *driver.Machine) { m.ResetNonce = "r1" }, phase: driver.PhaseRunning, restarts: 2},
		{name: "AResetDoesNotApplyANewShape", change: func(m *driver.Machine) { m.VCPU, m.ResetNonce = 4, "r2" }, phase: driver.PhaseRunning, restarts: 3, restartRequired: true},
		{name: "ARestartAndAResetAtOnceAreOneRestart", change: func(m *driver.Machine) { m.RestartNonce, m.ResetNonce = "t1", "r3" }, phase: driver.PhaseRunning, restarts: 4},
		{name: "RunningFalseWinsOverPaused", change: func(m *driver.Machine) { m.Running, m.Paused = false, true }, phase: driver.PhaseStopped, restarts: 4},
		{name: "AResetOfAStoppedGuestIsHandledByItsStart", change: func(m *driver.Machine) { m.ResetNonce = "r4" }, phase: driver.PhaseStopped, restarts: 4},
		{name: "AGuestStartedPausedIsPaused", change: func(m *driver.Machine) { m.Running = true }, phase: driver.PhasePaused, restarts: 4},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&m)
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			assert.Equal(t, s.phase, o.Phase)
			assert.Equal(t, s.restarts, o.RestartCount)
			assert.Equal(t, s.restartRequired, o.RestartRequired, "restartRequired")
			if s.capacity != 0 {
				assert.Equal(t, s.capacity, d.DiskCapacity("root"))
			}
		})
	}
}

// TestGuestsHoldTheHubsAddresses pins what a simulated node reports: a
// running guest has an interface on each network where the hub allocated
// it an address, holding that address, the same MAC on every start, and
// none while it is stopped; an Unrecorded driver keeps no calls.
func TestGuestsHoldTheHubsAddresses(t *testing.T) {
	ctx := context.Background()
	m := driver.Machine{UID: uid, Namespace: "team-a", Name: "web-1", Disks: []driver.Disk{{Name: "root"}}, VCPU: 1, MemoryBytes: 64 << 20, Running: true,
		Networks: []driver.Network{
			{Name: "lan", CIDR: "10.0.0.0/24", Address: netip.MustParsePrefix("10.0.0.7/24")},
			{Name: "site", Imported: true},
			{Name: "db", CIDR: "10.1.0.0/24", Address: netip.MustParsePrefix("10.1.0.9/24")},
		}}
	d := New("n1")
	d.Unrecorded = true

	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Len(t, o.Interfaces, 2, "no interface where the hub gave no address")
	assert.Equal(t, []string{"10.0.0.7"}, o.Interfaces[0].IPs)
	assert.Equal(t, "lan", o.Interfaces[0].Network)
	assert.Equal(t, []string{"10.1.0.9"}, o.Interfaces[1].IPs)
	assert.Equal(t, driver.AddressSourceBackend, o.Interfaces[0].Source)
	assert.NotEqual(t, o.Interfaces[0].MAC, o.Interfaces[1].MAC)
	mac := o.Interfaces[0].MAC

	m.Running = false
	o, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Empty(t, o.Interfaces, "a stopped guest holds no address")

	m.Running = true
	o, err = d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Len(t, o.Interfaces, 2)
	assert.Equal(t, mac, o.Interfaces[0].MAC, "the same MAC on every start")
	assert.Empty(t, d.Calls(), "an Unrecorded driver keeps no calls")
}
