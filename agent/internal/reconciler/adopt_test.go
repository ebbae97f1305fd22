package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// noAdopter hides the fake's Adopter methods, as a backend without them.
type noAdopter struct{ driver.Driver }

func TestReleaseAndAdopt(t *testing.T) {
	h := start(t)
	h.synced()
	h.put(intent("a"))
	h.eventually("a", phase(wire.PhaseRunning), "the guest runs")

	h.put(wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: "a", Namespace: "default", Name: "vm-a", Release: true})
	rep := h.eventually("a", func(r wire.Report) bool { return r.Released }, "the release is confirmed")
	assert.Equal(t, &wire.Orphan{Namespace: "default", Name: "vm-a"}, rep.Orphan)
	assert.Equal(t, wire.PhaseRunning, rep.Phase, "the released guest keeps running")

	h.del("a")
	h.rec.resync(t.Context())
	require.Never(t, func() bool { _, ok := h.reports.get("a"); return !ok }, 100*time.Millisecond, 5*time.Millisecond, "the orphan's report stays")
	assert.Zero(t, h.calls("Delete", "a"), "an orphan is never deleted")

	h.put(intent("b", func(in *wire.Intent) { in.Name = "vm-a"; in.Claim = &wire.Claim{Orphan: "a"} }))
	rep = h.eventually("b", phase(wire.PhaseRunning), "the new VM adopts the orphan")
	assert.Equal(t, "a", rep.ID, "the same guest")
	require.Eventually(t, func() bool { _, ok := h.reports.get("a"); return !ok }, time.Second, 5*time.Millisecond, "the orphan's report goes")
	list, err := h.fake.List(t.Context())
	require.NoError(t, err)
	assert.Len(t, list, 1, "exactly one guest")
}

func TestClaimByExternalName(t *testing.T) {
	cases := map[string]struct {
		observeOnly bool
		running     bool
		wantPhase   wire.Phase
		wantEnsure  bool
	}{
		"ObserveOnlyNeverChangesTheGuest": {observeOnly: true, running: false, wantPhase: wire.PhaseRunning},
		"TheFullPolicyTakesItOver":        {running: false, wantPhase: wire.PhaseStopped, wantEnsure: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := start(t)
			h.synced()
			h.fake.AddForeign("by-hand", 1, 256<<20)
			h.put(intent("c", func(in *wire.Intent) {
				in.Running, in.Claim, in.ObserveOnly = tc.running, &wire.Claim{ExternalName: "by-hand"}, tc.observeOnly
				if tc.observeOnly {
					in.Machine = wire.Machine{}
				}
			}))
			rep := h.eventually("c", phase(tc.wantPhase), "the guest is reported")
			assert.Equal(t, "by-hand", rep.ID)
			assert.Equal(t, int32(1), rep.VCPU)
			assert.Equal(t, tc.wantEnsure, h.calls("Ensure", "c") > 0)
		})
	}
}

func TestASecondClaimFailsNamingTheFirst(t *testing.T) {
	h := start(t)
	h.synced()
	h.fake.AddForeign("by-hand", 1, 256<<20)
	h.put(intent("first", func(in *wire.Intent) { in.Claim = &wire.Claim{ExternalName: "by-hand"} }))
	h.eventually("first", phase(wire.PhaseRunning), "the first takes it")
	h.put(intent("second", func(in *wire.Intent) { in.Claim = &wire.Claim{ExternalName: "by-hand"} }))
	rep := h.eventually("second", phase(wire.PhaseFailed), "the second fails")
	assert.Contains(t, rep.Message, "VirtualMachine default/vm-first")
}

func TestABackendWithoutAdoptionRefusesARelease(t *testing.T) {
	h := startWith(t, func(f *fake.Driver) driver.Driver { return noAdopter{f} })
	h.synced()
	h.put(intent("a"))
	h.eventually("a", phase(wire.PhaseRunning), "the guest runs")
	h.put(wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: "a", Namespace: "default", Name: "vm-a", Release: true})
	rep := h.eventually("a", phase(wire.PhaseFailed), "the release is refused")
	assert.False(t, rep.Released)
	assert.Contains(t, rep.Message, "cannot keep a guest without its VM")
}
