package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

func volumeIntent(uid, name string) wire.VolumeIntent {
	return wire.VolumeIntent{ProtocolVersion: wire.ProtocolVersion, UID: uid, Namespace: "default", Name: name, Disk: wire.NameOnNode("default", name), Absent: true}
}

func (h *harness) putVolume(v wire.VolumeIntent) {
	h.rec.volumeIntent(bus.Event[wire.VolumeIntent]{UID: v.UID, Value: v})
}

func (h *harness) delVolume(uid string) {
	h.rec.volumeIntent(bus.Event[wire.VolumeIntent]{UID: uid, Deleted: true})
}

// volumeReport waits for the Volume's report to satisfy ok.
func (h *harness) volumeReport(uid string, ok func(wire.VolumeReport) bool) wire.VolumeReport {
	h.t.Helper()
	return reported(h, wire.VolumeReports, uid, ok, "the volume report")
}

func gone(r wire.VolumeReport) bool { return r.Gone }

// importIntent imports the node's volume external as Volume default/name.
func importIntent(uid, name, external string) wire.VolumeIntent {
	v := volumeIntent(uid, name)
	v.Disk, v.ExternalName, v.Absent = external, external, false
	return v
}

func found(r wire.VolumeReport) bool { return r.SizeBytes > 0 }

func (h *harness) deletedVolumes() []string {
	var out []string
	for _, c := range h.fake.Calls() {
		if c.Op == "DeleteVolume" {
			out = append(out, c.Disk.Name)
		}
	}
	return out
}

func TestVolumeIntents(t *testing.T) {
	cases := map[string]struct {
		start func(*testing.T) *harness
		run   func(t *testing.T, h *harness)
	}{
		"DeletesTheVolumeAndReportsGone": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.putVolume(volumeIntent("vol-a", "data"))
				r := h.volumeReport("vol-a", gone)
				assert.Empty(t, r.Message)
				assert.Equal(t, []string{"default_data"}, h.deletedVolumes())
			},
		},
		"RefusesWhileAGuestHasTheDiskThenDeletesItOnceTheGuestIsGone": {
			run: func(t *testing.T, h *harness) {
				h.put(intent("a")) // its boot disk is Volume root
				h.synced()
				h.putVolume(volumeIntent("vol-root", "root"))
				r := h.volumeReport("vol-root", func(r wire.VolumeReport) bool { return r.Message != "" })
				assert.False(t, r.Gone)
				assert.Contains(t, r.Message, "volume default_root is still used by guest a")
				assert.Empty(t, h.deletedVolumes(), "the driver is not asked while an intent names the disk")

				h.del("a")
				r = h.volumeReport("vol-root", gone)
				assert.Empty(t, r.Message, "the refusal is cleared once the volume is gone")
				// The driver may refuse once more while the guest's removal
				// is still under way; then the retry deletes it.
				assert.Subset(t, []string{"default_root"}, h.deletedVolumes())
				assert.NotEmpty(t, h.deletedVolumes())
			},
		},
		"RetriesWhenTheDriverRefusesAnAttachedVolume": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.fake.NextDeleteVolumeErr = driver.InUsef("volume default_data is attached to guest x")
				h.putVolume(volumeIntent("vol-a", "data"))
				h.volumeReport("vol-a", gone)
				assert.Equal(t, []string{"default_data", "default_data"}, h.deletedVolumes(), "refused once, retried with backoff")
			},
		},
		"ATerminalRefusalIsReportedAndNotRetried": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.fake.NextDeleteVolumeErr = driver.Terminalf("volume default_data is one the node keeps for itself")
				h.putVolume(volumeIntent("vol-a", "data"))
				r := h.volumeReport("vol-a", func(r wire.VolumeReport) bool { return r.Message != "" })
				assert.Equal(t, "volume default_data is one the node keeps for itself", r.Message)
				assert.Never(t, func() bool { return len(h.deletedVolumes()) > 1 }, 300*time.Millisecond, 10*time.Millisecond,
					"no backoff retry of what no retry mends")
			},
		},
		"DeletesTheReportWhenTheHubDeletesTheIntent": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.putVolume(volumeIntent("vol-a", "data"))
				h.volumeReport("vol-a", gone)
				h.delVolume("vol-a")
				require.Eventually(t, func() bool { _, ok := h.reports.volume("vol-a"); return !ok }, 5*time.Second, 5*time.Millisecond)
			},
		},
		"AnImportReportsTheVolumeAndNeverChangesIt": {
			run: func(t *testing.T, h *harness) {
				h.fake.AddVolume("legacy.qcow2", driver.VolumeObservation{ID: "/pool/legacy.qcow2", SizeBytes: 3 << 30})
				h.synced()
				h.putVolume(importIntent("vol-a", "data", "legacy.qcow2"))
				r := h.volumeReport("vol-a", found)
				assert.Equal(t, wire.VolumeReport{ProtocolVersion: wire.ProtocolVersion, UID: "vol-a", Imported: true, SizeBytes: 3 << 30, ID: "/pool/legacy.qcow2", ObservedAt: r.ObservedAt}, r)
				assert.Empty(t, h.deletedVolumes())
			},
		},
		"AnImportOfAMissingVolumeSaysSoAndLooksAgain": {
			start: func(t *testing.T) *harness {
				return startWith(t, func(f *fake.Driver) driver.Driver { return f }, func(o *Options) { o.ObserveEvery = 10 * time.Millisecond })
			},
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.putVolume(importIntent("vol-a", "data", "legacy.qcow2"))
				r := h.volumeReport("vol-a", func(r wire.VolumeReport) bool { return r.Message != "" })
				assert.Contains(t, r.Message, "no volume legacy.qcow2")
				assert.True(t, r.Imported)
				h.fake.AddVolume("legacy.qcow2", driver.VolumeObservation{SizeBytes: 1 << 30})
				r = h.volumeReport("vol-a", found)
				assert.Empty(t, r.Message)
			},
		},
		"AnAbsentImportDeletesTheImportedVolume": {
			run: func(t *testing.T, h *harness) {
				h.fake.AddVolume("legacy.qcow2", driver.VolumeObservation{SizeBytes: 1 << 30})
				h.synced()
				v := importIntent("vol-a", "data", "legacy.qcow2")
				h.putVolume(v)
				h.volumeReport("vol-a", found)
				v.Absent = true
				h.putVolume(v)
				h.volumeReport("vol-a", gone)
				assert.Equal(t, []string{"legacy.qcow2"}, h.deletedVolumes())
			},
		},
		"ABackendThatCannotImportSaysSo": {
			start: func(t *testing.T) *harness {
				return startWith(t, func(f *fake.Driver) driver.Driver { return noAdopter{f} })
			},
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.putVolume(importIntent("vol-a", "data", "legacy.qcow2"))
				r := h.volumeReport("vol-a", func(r wire.VolumeReport) bool { return r.Message != "" })
				assert.Equal(t, "the backend of node "+node+" cannot import volumes", r.Message)
			},
		},
		"RefusesADiskThatIsNotTheVolumes": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				v := volumeIntent("vol-a", "data")
				v.Disk = "image_6f1c"
				h.putVolume(v)
				r := h.volumeReport("vol-a", func(r wire.VolumeReport) bool { return r.Message != "" })
				assert.Contains(t, r.Message, `malformed volume intent: disk "image_6f1c"`)
				assert.False(t, r.Gone)
				assert.Empty(t, h.deletedVolumes())
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if tc.start == nil {
				tc.start = start
			}
			tc.run(t, tc.start(t))
		})
	}
}

// TestVolumeIntentConvergesAfterRestart plays an agent that stopped after the
// hub asked for a Volume's deletion: the restarted agent's watch replays the
// intent, and it deletes the volume and reports it gone.
func TestVolumeIntentConvergesAfterRestart(t *testing.T) {
	b := bus.NewFake(node)
	require.NoError(t, bus.SetIntent(b, wire.VolumeIntents, "vol-a", volumeIntent("vol-a", "data")))
	f := fake.New(node)
	rec := New(node, f, b, logging.NewNopLogger(), Options{Workers: 1, RetryBase: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { rec.Run(ctx); done <- struct{}{} }()
	go func() { _ = b.WatchIntents(ctx, rec.Handlers()); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })

	require.Eventually(t, func() bool { r, ok := bus.Written(b, wire.VolumeReports, "vol-a"); return ok && r.Gone }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, bus.DeleteIntent(b, wire.VolumeIntents, "vol-a"))
	require.Eventually(t, func() bool { _, ok := bus.Written(b, wire.VolumeReports, "vol-a"); return !ok }, 5*time.Second, 5*time.Millisecond,
		"the report goes with the intent")
}
