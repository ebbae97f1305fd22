package reconciler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

const node = "node1"

// reports is the bus the reconciler writes to, read as the hub would.
type reports struct{ *bus.Fake }

func newReports(node string) reports { return reports{bus.NewFake(node)} }

func (r reports) get(uid string) (wire.Report, bool) {
	return bus.Written(r.Fake, wire.GuestReports, uid)
}

func (r reports) volume(uid string) (wire.VolumeReport, bool) {
	return bus.Written(r.Fake, wire.VolumeReports, uid)
}

func (r reports) image(uid string) (wire.ImageReport, bool) {
	return bus.Written(r.Fake, wire.ImageReports, uid)
}

// putCount is how many times the report of guest uid was written.
func (r reports) putCount(uid string) int { return writes(r, wire.GuestReports, uid) }

// imagePutCount is how many times the report of image uid was written.
func (r reports) imagePutCount(uid string) int { return writes(r, wire.ImageReports, uid) }

func writes[V any](r reports, k wire.Kind[V], uid string) int {
	key, err := k.Key(r.Node(), uid)
	if err != nil {
		panic(err)
	}
	return r.Writes(key)
}

type harness struct {
	t       *testing.T
	fake    *fake.Driver
	reports reports
	rec     *Reconciler
}

// start runs a reconciler over the fake driver, which can delete volumes.
func start(t *testing.T) *harness {
	return startWith(t, func(f *fake.Driver) driver.Driver { return f })
}

// startWith runs a reconciler over the fake driver as wrap exposes it, with
// the harness's options as mods change them.
func startWith(t *testing.T, wrap func(*fake.Driver) driver.Driver, mods ...func(*Options)) *harness {
	t.Helper()
	return startLogged(t, logging.NewNopLogger(), wrap, mods...)
}

// startLogged is startWith with the reconciler logging to log.
func startLogged(t *testing.T, log logging.Logger, wrap func(*fake.Driver) driver.Driver, mods ...func(*Options)) *harness {
	t.Helper()
	return startOn(t, node, log, wrap, mods...)
}

// startOn is startLogged for a node of another name.
func startOn(t *testing.T, node string, log logging.Logger, wrap func(*fake.Driver) driver.Driver, mods ...func(*Options)) *harness {
	t.Helper()
	f := fake.New(node)
	rep := newReports(node)
	o := Options{Workers: 4, RetryBase: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond, PollTransitional: 10 * time.Millisecond, ImagePollEvery: 10 * time.Millisecond}
	for _, m := range mods {
		m(&o)
	}
	rec := New(node, wrap(f), rep, log, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rec.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &harness{t: t, fake: f, reports: rep, rec: rec}
}

func intent(uid string, mods ...func(*wire.Intent)) wire.Intent {
	in := wire.Intent{
		ProtocolVersion: wire.ProtocolVersion,
		UID:             uid,
		Namespace:       "default",
		Name:            "vm-" + uid,
		Generation:      1,
		Running:         true,
		Machine: wire.Machine{
			VCPU: 2, MemoryBytes: 1 << 30,
			Disks:    []wire.Disk{{Name: "root", VolumeUID: "vol-" + uid, SizeBytes: 10 << 30}},
			Networks: []wire.Network{{Name: "net-db", UID: "net-1", Mode: "nat", CIDR: "10.10.120.0/24"}},
		},
	}
	for _, m := range mods {
		m(&in)
	}
	return in
}

func (h *harness) put(in wire.Intent) {
	h.rec.guestIntent(bus.Event[wire.Intent]{UID: in.UID, Value: in})
}
func (h *harness) del(uid string) { h.rec.guestIntent(bus.Event[wire.Intent]{UID: uid, Deleted: true}) }
func (h *harness) synced()        { h.rec.intentsSynced() }

// eventually waits for the report of guest uid to satisfy ok.
func (h *harness) eventually(uid string, ok func(wire.Report) bool, what string) wire.Report {
	h.t.Helper()
	return reported(h, wire.GuestReports, uid, ok, what)
}

// reported waits for the report of kind k of uid to satisfy ok.
func reported[V any](h *harness, k wire.Kind[V], uid string, ok func(V) bool, what string) V {
	h.t.Helper()
	var last V
	require.Eventually(h.t, func() bool {
		v, found := bus.Written(h.reports.Fake, k, uid)
		last = v
		return found && ok(v)
	}, 5*time.Second, 5*time.Millisecond, "%s; last %s %+v", what, k.Name, last)
	return last
}

func phase(p wire.Phase) func(wire.Report) bool {
	return func(r wire.Report) bool { return r.Phase == p }
}

func (h *harness) lastEnsure(uid string) driver.Machine {
	var m driver.Machine
	for _, c := range h.fake.Calls() {
		if c.Op == "Ensure" && c.UID == uid {
			m = c.Machine
		}
	}
	return m
}

// reconcileAgain queues uid as a resync would and waits until it was handled.
func (h *harness) reconcileAgain(uid string) {
	h.t.Helper()
	n := h.calls("Ensure", uid)
	h.rec.resync(context.Background())
	require.Eventually(h.t, func() bool { return h.calls("Ensure", uid) > n }, time.Second, 5*time.Millisecond)
}

func (h *harness) calls(op, uid string) int {
	n := 0
	for _, c := range h.fake.Calls() {
		if c.Op == op && c.UID == uid {
			n++
		}
	}
	return n
}

func TestReconciler(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"creates a missing guest and reports it Running", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a"))
			rep := h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			assert.Equal(t, node, rep.Host, "the host the driver observed the guest on")
			assert.Equal(t, "a", rep.ID)
			assert.Equal(t, int64(1), rep.ObservedGeneration)
			assert.Equal(t, wire.ProtocolVersion, rep.ProtocolVersion)
			assert.False(t, rep.ObservedAt.IsZero())
			m := h.lastEnsure("a")
			assert.Equal(t, "default_root", m.Disks[0].Name, "volumes are namespaced on the node")
			assert.Equal(t, "default_net-db", m.Networks[0].Name, "networks are namespaced on the node")
		}},
		{"running false stops the guest, true starts it again", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.put(intent("a", func(in *wire.Intent) { in.Running = false; in.Generation = 2 }))
			rep := h.eventually("a", phase(wire.PhaseStopped), "guest should stop")
			assert.Equal(t, int64(2), rep.ObservedGeneration)
			h.put(intent("a", func(in *wire.Intent) { in.Generation = 3 }))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run again")
		}},
		{"a new restart nonce restarts once", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a", func(in *wire.Intent) { in.RestartNonce = "t0" }))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.put(intent("a", func(in *wire.Intent) { in.RestartNonce = "t1" }))
			h.eventually("a", func(r wire.Report) bool { return r.RestartCount == 1 }, "restart should be counted")
			// The same nonce again, as after an agent restart or a resync.
			h.put(intent("a", func(in *wire.Intent) { in.RestartNonce = "t1" }))
			h.reconcileAgain("a")
			rep, _ := h.reports.get("a")
			assert.Equal(t, int32(1), rep.RestartCount, "one restart per nonce")
		}},
		{"a paused intent pauses the guest and reports Paused; without it the guest runs again", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.put(intent("a", func(in *wire.Intent) { in.Paused = true }))
			rep := h.eventually("a", phase(wire.PhasePaused), "guest should be reported Paused")
			assert.True(t, h.lastEnsure("a").Paused, "the driver is asked to pause the guest")
			assert.Equal(t, int32(0), rep.RestartCount, "a pause is no restart")
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run again")
			assert.False(t, h.lastEnsure("a").Paused)
		}},
		{"a paused intent of a stopped guest leaves it stopped", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a", func(in *wire.Intent) { in.Running, in.Paused = false, true }))
			h.eventually("a", phase(wire.PhaseStopped), "running false wins")
		}},
		{"a new reset nonce resets once and counts as a restart", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a", func(in *wire.Intent) { in.ResetNonce = "r0" }))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.put(intent("a", func(in *wire.Intent) { in.ResetNonce = "r1" }))
			h.eventually("a", func(r wire.Report) bool { return r.RestartCount == 1 }, "the reset should be counted")
			assert.Equal(t, "r1", h.lastEnsure("a").ResetNonce, "the driver is given the nonce")
			h.put(intent("a", func(in *wire.Intent) { in.ResetNonce = "r1" }))
			h.reconcileAgain("a")
			rep, _ := h.reports.get("a")
			assert.Equal(t, int32(1), rep.RestartCount, "one reset per nonce")
		}},
		{"a deleted intent deletes the guest, then its report", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.del("a")
			require.Eventually(t, func() bool { _, ok := h.reports.get("a"); return !ok }, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, 1, h.calls("Delete", "a"))
			_, err := h.fake.Observe(context.Background(), "a")
			assert.True(t, driver.IsNotFound(err), "guest should be gone: %v", err)
		}},
		{"a running guest's spec change is reported as restartRequired, not applied", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.put(intent("a", func(in *wire.Intent) { in.Generation = 2; in.Machine.VCPU = 4 }))
			rep := h.eventually("a", func(r wire.Report) bool { return r.RestartRequired }, "restartRequired should be reported")
			assert.Equal(t, wire.PhaseRunning, rep.Phase, "the guest keeps running")
			assert.Equal(t, int32(0), rep.RestartCount, "the guest was not restarted")
		}},
		{"a disk removed is reported while the guest has it and dropped once it does not", func(t *testing.T, h *harness) {
			h.synced()
			withData := func(in *wire.Intent) {
				in.Machine.Disks = append(in.Machine.Disks, wire.Disk{Name: "data", VolumeUID: "vol-data", SizeBytes: 1 << 30})
			}
			h.put(intent("a", withData))
			rep := h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			assert.Equal(t, []string{"root", "data"}, rep.Disks)
			// The fake, like libvirt's test driver, detaches no disk from
			// a running guest: the guest holds it until its next start.
			h.put(intent("a", func(in *wire.Intent) { in.Generation = 2 }))
			rep = h.eventually("a", func(r wire.Report) bool { return r.ObservedGeneration == 2 }, "the removal should be observed")
			assert.Equal(t, []string{"root", "data"}, rep.Disks, "the guest still holds the disk")
			assert.True(t, rep.RestartRequired)
			obs, err := h.fake.Observe(context.Background(), "a")
			require.NoError(t, err)
			assert.Equal(t, []string{"default_root", "default_data"}, obs.Disks, "the driver has the disk, by its name on the node")
			h.put(intent("a", func(in *wire.Intent) { in.Generation = 3; in.RestartNonce = "r1" }))
			rep = h.eventually("a", func(r wire.Report) bool { return r.ObservedGeneration == 3 }, "the restart should be observed")
			assert.Equal(t, []string{"root"}, rep.Disks, "the guest let the disk go")
			assert.False(t, rep.RestartRequired)
		}},
		{"retryable errors are retried with backoff until they pass", func(t *testing.T, h *harness) {
			h.synced()
			h.fake.Fail("Ensure", "a", errors.New("libvirtd is busy"))
			h.put(intent("a"))
			time.Sleep(50 * time.Millisecond)
			_, reported := h.reports.get("a")
			assert.False(t, reported, "a retryable error is not a state to report")
			h.fake.Fail("Ensure", "a", nil)
			h.eventually("a", phase(wire.PhaseRunning), "guest should run once the error clears")
		}},
		{"terminal errors report Failed with the message and are not retried", func(t *testing.T, h *harness) {
			h.synced()
			h.fake.Fail("Ensure", "a", driver.Terminalf(`network "net-db" does not exist and has no cidr to create it from`))
			h.put(intent("a"))
			rep := h.eventually("a", phase(wire.PhaseFailed), "guest should fail")
			assert.Contains(t, rep.Message, `network "net-db" does not exist`)
			assert.Equal(t, node, rep.Node)
			n := h.fake.Calls()
			time.Sleep(100 * time.Millisecond)
			assert.Len(t, h.fake.Calls(), len(n), "no retry after a terminal error")
		}},
		{"failing errors report Failed with the message and are retried until they pass", func(t *testing.T, h *harness) {
			h.synced()
			h.fake.Fail("Ensure", "a", driver.Failingf("cannot import image ubuntu: GET http://127.0.0.1/x answered 404 Not Found"))
			h.put(intent("a"))
			rep := h.eventually("a", phase(wire.PhaseFailed), "guest should be reported Failed")
			assert.Contains(t, rep.Message, "answered 404 Not Found")
			require.Eventually(t, func() bool { return h.fake.Attempts("Ensure", "a") > 2 }, 5*time.Second, 5*time.Millisecond, "a failing guest keeps being retried")
			h.fake.Fail("Ensure", "a", nil)
			h.eventually("a", phase(wire.PhaseRunning), "guest should run once the image imports")
		}},
		{"a disk's image reaches the driver with its checksum and pruneAfter", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a", func(in *wire.Intent) {
				in.Machine.Disks[0].Image = &wire.ImageRef{Name: "ubuntu", UID: "img-1", URL: "http://127.0.0.1/u.qcow2", Checksum: "ab", Format: "raw", PruneAfterSeconds: 90}
			}))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			d := h.lastEnsure("a").Disks[0]
			assert.Equal(t, &driver.Image{UID: "img-1", Name: "ubuntu", Namespace: "default", URL: "http://127.0.0.1/u.qcow2", SHA256: "ab", Format: "raw", PruneAfter: 90 * time.Second}, d.Image)
			assert.Equal(t, "raw", d.Format, "the disk takes its image's format")
		}},
		{"an image without a url fails naming the field", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a", func(in *wire.Intent) { in.Machine.Disks[0].Image = &wire.ImageRef{Name: "ubuntu", UID: "img-1"} }))
			rep := h.eventually("a", phase(wire.PhaseFailed), "guest should fail")
			assert.Contains(t, rep.Message, "machine.disks[0].image needs a uid and one of a url")
		}},
		{"a malformed intent fails naming the field without touching the driver", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a", func(in *wire.Intent) { in.Machine.Disks = nil }))
			rep := h.eventually("a", phase(wire.PhaseFailed), "guest should fail")
			assert.Contains(t, rep.Message, "machine.disks")
			assert.Zero(t, h.calls("Ensure", "a"))
		}},
		{"one broken guest never blocks the others", func(t *testing.T, h *harness) {
			h.synced()
			h.fake.Fail("Ensure", "bad", errors.New("stuck"))
			h.put(intent("bad"))
			for i := range 20 {
				h.put(intent(fmt.Sprintf("good-%d", i)))
			}
			for i := range 20 {
				h.eventually(fmt.Sprintf("good-%d", i), phase(wire.PhaseRunning), "healthy guests run")
			}
			require.Eventually(t, func() bool { return h.fake.Attempts("Ensure", "bad") > 2 }, 5*time.Second, 5*time.Millisecond, "the broken guest keeps being retried")
		}},
		{"guests without intents are deleted only after the intents are synced", func(t *testing.T, h *harness) {
			_, err := h.fake.Ensure(context.Background(), driver.Machine{UID: "orphan", Namespace: "default", Name: "orphan", Disks: []driver.Disk{{Name: "root"}}, VCPU: 1, MemoryBytes: 1 << 20, Running: true})
			require.NoError(t, err)
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.rec.resync(context.Background())
			time.Sleep(50 * time.Millisecond)
			assert.Zero(t, h.calls("Delete", "orphan"), "an intent may still be on its way before Synced")
			h.synced()
			require.Eventually(t, func() bool { return h.calls("Delete", "orphan") == 1 }, 5*time.Second, 5*time.Millisecond)
		}},
		{"an unchanged observation writes no report", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			for range 3 {
				h.reconcileAgain("a")
			}
			assert.Equal(t, 1, h.reports.putCount("a"))
		}},
		{"driver events trigger a reconcile at once", func(t *testing.T, h *harness) {
			h.synced()
			h.put(intent("a"))
			h.eventually("a", phase(wire.PhaseRunning), "guest should run")
			h.fake.SetPhase("a", driver.PhaseStopped) // the guest crashed and stayed off
			h.fake.Emit(driver.Event{UID: "a", Kind: driver.EventStopped})
			// The intent still says running, so the event leads to a start.
			require.Eventually(t, func() bool { return h.calls("Ensure", "a") >= 2 }, time.Second, 5*time.Millisecond)
			h.eventually("a", phase(wire.PhaseRunning), "guest should be started again")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, start(t))
		})
	}
}

// TestAnAddressTakenLaterIsReportedWithoutAHint: no backend announces that a
// running guest took an address; the reconciler looks again, sooner than
// the resync (an hour here), while an interface has none.
func TestAnAddressTakenLaterIsReportedWithoutAHint(t *testing.T) {
	h := startWith(t, func(f *fake.Driver) driver.Driver { return f }, func(o *Options) { o.ResyncEvery = time.Hour })
	h.synced()
	in := intent("d1")
	h.put(in)
	h.eventually(in.UID, phase(wire.PhaseRunning), "the guest runs")
	h.fake.SetInterfaces(in.UID, []driver.Interface{{Network: "net-db", MAC: "52:54:00:00:00:01"}})
	h.reconcileAgain(in.UID)
	h.eventually(in.UID, func(r wire.Report) bool { return len(r.Interfaces) == 1 && len(r.Interfaces[0].IPs) == 0 }, "the interface is reported without an address")

	h.fake.SetInterfaces(in.UID, []driver.Interface{{Network: "net-db", MAC: "52:54:00:00:00:01", IPs: []string{"10.10.120.7"}}})
	rep := h.eventually(in.UID, func(r wire.Report) bool { return len(r.Interfaces) == 1 && len(r.Interfaces[0].IPs) == 1 }, "the address taken later is reported")
	assert.Equal(t, []string{"10.10.120.7"}, rep.Interfaces[0].IPs)

	n := h.calls("Ensure", in.UID)
	require.Never(t, func() bool { return h.calls("Ensure", in.UID) > n+1 }, 200*time.Millisecond, 10*time.Millisecond, "a guest with its addresses is not looked at again and again")
}

func TestAddressPoll(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC)
	noAddress := driver.Observation{Phase: driver.PhaseRunning, Interfaces: []driver.Interface{{MAC: "a"}, {MAC: "b", IPs: []string{"10.0.0.2"}}}}
	addressed := driver.Observation{Phase: driver.PhaseRunning, Interfaces: []driver.Interface{{MAC: "a", IPs: []string{"10.0.0.1"}}}}
	stopped := driver.Observation{Phase: driver.PhaseStopped, Interfaces: []driver.Interface{{MAC: "a"}}}
	cases := map[string]struct {
		looks []driver.Observation
		after []time.Duration // since the first look
		want  []time.Duration
	}{
		"WaitsShortlyAtFirst": {
			looks: []driver.Observation{noAddress, noAddress},
			after: []time.Duration{0, 2 * time.Second},
			want:  []time.Duration{time.Second, time.Second},
		},
		"WaitsLongerTheLongerItWaited": {
			looks: []driver.Observation{noAddress, noAddress, noAddress},
			after: []time.Duration{0, 40 * time.Second, time.Hour},
			want:  []time.Duration{time.Second, 10 * time.Second, time.Minute},
		},
		"AGuestWithItsAddressesIsNotPolled": {
			looks: []driver.Observation{addressed, noInterfaces()},
			after: []time.Duration{0, 0},
			want:  []time.Duration{0, 0},
		},
		"AStoppedGuestIsNotPolled": {
			looks: []driver.Observation{stopped},
			after: []time.Duration{0},
			want:  []time.Duration{0},
		},
		"AnAddressEndsTheWaitAndANewOneStartsAfresh": {
			looks: []driver.Observation{noAddress, addressed, noAddress},
			after: []time.Duration{0, 40 * time.Second, 80 * time.Second},
			want:  []time.Duration{time.Second, 0, time.Second},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			now := t0
			r := New(node, fake.New(node), newReports(node), logging.NewNopLogger(), Options{PollTransitional: time.Second, ResyncEvery: time.Minute, Now: func() time.Time { return now }})
			for i, obs := range tc.looks {
				now = t0.Add(tc.after[i])
				assert.Equal(t, tc.want[i], r.addressPoll("u", obs), "look %d", i)
			}
		})
	}
}

func noInterfaces() driver.Observation { return driver.Observation{Phase: driver.PhaseRunning} }

// TestAReportAnEarlierAgentLeftIsLookedAt: an agent starting afresh (its
// node's hypervisor lost every guest too) finds the reports its node wrote
// before; one whose guest has neither intent nor guest any more goes, so
// its VM's deletion is not held for good, and one whose VM is still wanted
// is made true again.
func TestAReportAnEarlierAgentLeftIsLookedAt(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	for _, uid := range []string{"deleted-meanwhile", "still-wanted"} {
		_, err := bus.PutReport(ctx, h.reports, wire.GuestReports, uid, wire.Report{UID: uid, Node: node, Phase: wire.PhaseRunning})
		require.NoError(t, err)
	}
	h.put(intent("still-wanted"))
	h.synced()

	require.Eventually(t, func() bool { _, ok := h.reports.get("deleted-meanwhile"); return !ok }, 5*time.Second, 10*time.Millisecond,
		"the report of a guest that went while no agent ran is deleted")
	h.eventually("still-wanted", phase(wire.PhaseRunning), "the wanted guest is made again")
}
