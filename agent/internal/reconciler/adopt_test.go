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

	h.put(wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: "a", Namespace: "default", Name: "vm-a", Release: true, Seal: "hub-seal"})
	rep := h.eventually("a", func(r wire.Report) bool { return r.Released }, "the release is confirmed")
	assert.Equal(t, &wire.Orphan{Namespace: "default", Name: "vm-a", Seal: "hub-seal"}, rep.Orphan, "the orphan is reported with the release's seal")
	assert.Equal(t, wire.PhaseRunning, rep.Phase, "the released guest keeps running")

	h.del("a")
	h.rec.resync(t.Context())
	require.Never(t, func() bool { _, ok := h.reports.get("a"); return !ok }, 100*time.Millisecond, 5*time.Millisecond, "the orphan's report stays")
	assert.Zero(t, h.calls("Delete", "a"), "an orphan is never deleted")

	h.put(intent("b", func(in *wire.Intent) { in.Name = "vm-a"; in.Claim = &wire.Claim{Orphan: "a"} }))
	rep = h.eventually("b", phase(wire.PhaseRunning), "the new VM adopts the orphan")
	assert.Equal(t, "a", rep.ID, "the same guest")
	require.Eventually(t, func() bool { _, ok := h.reports.get("a"); return !ok }, 10*time.Second, 5*time.Millisecond, "the orphan's report goes")
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

// TestAnOrphanGoesOnlyToTheVMItWasReleasedFrom: whatever the hub asks, a
// guest released from one VirtualMachine is adopted only by a VM of the
// same namespace and name, and a uid that is no orphan of the node (a guest
// made by hand, say) is never taken over by adoption: the VM gets a guest
// of its own.
func TestAnOrphanGoesOnlyToTheVMItWasReleasedFrom(t *testing.T) {
	cases := map[string]struct {
		namespace, name string
		claim           string
		wantPhase       wire.Phase
		wantMessage     string
		wantAdopted     bool
	}{
		"TheSameNamespaceAndName": {namespace: "default", name: "vm-a", claim: "a", wantPhase: wire.PhaseRunning, wantAdopted: true},
		"AnotherNamespace":        {namespace: "tenant-b", name: "vm-a", claim: "a", wantPhase: wire.PhaseFailed, wantMessage: "was not orphaned from VirtualMachine tenant-b/vm-a"},
		"AnotherName":             {namespace: "default", name: "vm-z", claim: "a", wantPhase: wire.PhaseFailed, wantMessage: "was not orphaned from VirtualMachine default/vm-z"},
		"AGuestThatIsNoOrphan":    {namespace: "default", name: "vm-a", claim: "by-hand", wantPhase: wire.PhaseRunning},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := start(t)
			h.synced()
			h.fake.AddForeign("by-hand", 1, 256<<20)
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "the guest runs")
			h.put(wire.Intent{ProtocolVersion: wire.ProtocolVersion, UID: "a", Namespace: "default", Name: "vm-a", Release: true})
			h.eventually("a", func(r wire.Report) bool { return r.Released }, "the release is confirmed")
			h.del("a")

			h.put(intent("b", func(in *wire.Intent) {
				in.Namespace, in.Name, in.Claim = tc.namespace, tc.name, &wire.Claim{Orphan: tc.claim}
			}))
			rep := h.eventually("b", phase(tc.wantPhase), "the claim is answered")
			assert.Contains(t, rep.Message, tc.wantMessage)
			assert.Equal(t, tc.wantAdopted, rep.ID == "a", "adopted the orphan: report id %q", rep.ID)
			assert.NotEqual(t, "by-hand", rep.ID, "the guest made by hand is never taken")
			if tc.wantAdopted {
				// The adopter's report may land before the orphan's is
				// deleted.
				require.Eventually(t, func() bool { _, ok := h.reports.get("a"); return !ok }, 10*time.Second, 5*time.Millisecond, "the adopted orphan's report goes")
			} else {
				_, orphanReported := h.reports.get("a")
				assert.True(t, orphanReported, "the orphan stays an orphan unless adopted")
			}
		})
	}
}
