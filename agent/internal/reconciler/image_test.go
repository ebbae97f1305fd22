package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// imageReport waits for the image's report to satisfy ok.
func (h *harness) imageReport(uid string, ok func(wire.ImageReport) bool, what string) wire.ImageReport {
	h.t.Helper()
	return reported(h, wire.ImageReports, uid, ok, what)
}

func (h *harness) noImageReport(uid, what string) {
	h.t.Helper()
	require.Eventually(h.t, func() bool { _, ok := h.reports.image(uid); return !ok }, 5*time.Second, 5*time.Millisecond, what)
}

func imagePhase(p wire.ImagePhase) func(wire.ImageReport) bool {
	return func(r wire.ImageReport) bool { return r.Phase == p }
}

func importing(uid, msg string) driver.ImageStatus {
	return driver.ImageStatus{UID: uid, Name: "ubuntu", Phase: driver.ImagePhaseImporting, Message: msg}
}

func ready(uid string, size int64) driver.ImageStatus {
	return driver.ImageStatus{UID: uid, Name: "ubuntu", Phase: driver.ImagePhaseReady, SizeBytes: size}
}

// provisioning reports every guest Provisioning, as the libvirt driver does
// while the guest's image is imported.
type provisioning struct{ *fake.Driver }

func (p provisioning) Ensure(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	obs, err := p.Driver.Ensure(ctx, m)
	obs.Phase, obs.Message = driver.PhaseProvisioning, "importing image ubuntu: 0 of 4 bytes"
	return obs, err
}

func withImage(in *wire.Intent) {
	in.Machine.Disks[0].Image = &wire.ImageRef{Name: "ubuntu", UID: "img-1", URL: "http://127.0.0.1/u.qcow2"}
}

func TestImageReports(t *testing.T) {
	cases := map[string]struct {
		start func(*testing.T) *harness
		run   func(t *testing.T, h *harness)
	}{
		"AnImportIsReportedWithItsProgressThenReadyWithItsSize": {
			run: func(t *testing.T, h *harness) {
				h.fake.SetImage(importing("img-1", "importing image ubuntu: 1 of 4 bytes"))
				r := h.imageReport("img-1", imagePhase(wire.ImagePhaseImporting), "the import is reported")
				assert.Equal(t, "importing image ubuntu: 1 of 4 bytes", r.Message)
				assert.Equal(t, node, r.Node)
				assert.Equal(t, "ubuntu", r.Name)

				h.fake.SetImage(importing("img-1", "importing image ubuntu: 3 of 4 bytes"))
				h.imageReport("img-1", func(r wire.ImageReport) bool { return r.Message == "importing image ubuntu: 3 of 4 bytes" }, "progress is reported")

				h.fake.SetImage(ready("img-1", 4))
				r = h.imageReport("img-1", imagePhase(wire.ImagePhaseReady), "the imported image is reported Ready")
				assert.Equal(t, int64(4), r.SizeBytes)
				assert.Empty(t, r.Message)
				assert.Equal(t, wire.ProtocolVersion, r.ProtocolVersion)
				assert.False(t, r.ObservedAt.IsZero())
			},
		},
		"AFailedImportIsReportedWithItsReason": {
			run: func(t *testing.T, h *harness) {
				h.fake.SetImage(driver.ImageStatus{UID: "img-1", Name: "ubuntu", Phase: driver.ImagePhaseFailed, Message: "image ubuntu from http://x failed its checksum"})
				r := h.imageReport("img-1", imagePhase(wire.ImagePhaseFailed), "the failure is reported")
				assert.Equal(t, "image ubuntu from http://x failed its checksum", r.Message)
			},
		},
		"AnUnchangedImageIsWrittenOnce": {
			run: func(t *testing.T, h *harness) {
				h.fake.SetImage(ready("img-1", 4))
				h.imageReport("img-1", imagePhase(wire.ImagePhaseReady), "the image is reported")
				polls := h.fake.ImagesCalls()
				require.Eventually(t, func() bool { return h.fake.ImagesCalls() >= polls+5 }, 5*time.Second, 5*time.Millisecond, "the loop keeps looking")
				assert.Equal(t, 1, h.reports.imagePutCount("img-1"), "no write per poll when nothing changed")
			},
		},
		"APrunedImageLosesItsReport": {
			run: func(t *testing.T, h *harness) {
				h.fake.SetImage(ready("img-1", 4))
				h.fake.SetImage(ready("img-2", 8))
				h.imageReport("img-1", imagePhase(wire.ImagePhaseReady), "the image is reported")
				h.imageReport("img-2", imagePhase(wire.ImagePhaseReady), "the image is reported")
				h.fake.RemoveImage("img-1")
				h.noImageReport("img-1", "the pruned image's report is deleted")
				_, ok := h.reports.image("img-2")
				assert.True(t, ok, "the other image stays reported")
			},
		},
		"AFailedListingDeletesNothing": {
			run: func(t *testing.T, h *harness) {
				h.fake.SetImage(ready("img-1", 4))
				h.imageReport("img-1", imagePhase(wire.ImagePhaseReady), "the image is reported")
				polls := h.fake.ImagesCalls()
				h.fake.NextImagesErr = errors.New("libvirtd is restarting")
				require.Eventually(t, func() bool { return h.fake.ImagesCalls() >= polls+3 }, 5*time.Second, 5*time.Millisecond)
				r, ok := h.reports.image("img-1")
				assert.True(t, ok, "an image the driver could not list is not gone")
				assert.Equal(t, wire.ImagePhaseReady, r.Phase)
			},
		},
		"AVolumeNamedLikeAnImageThatIsNoKeyIsSkipped": {
			run: func(t *testing.T, h *harness) {
				h.fake.SetImage(ready("not.a.uid", 4))
				h.fake.SetImage(ready("img-1", 4))
				h.imageReport("img-1", imagePhase(wire.ImagePhaseReady), "the good image is reported")
				_, ok := h.reports.image("not.a.uid")
				assert.False(t, ok)
			},
		},
		"AStaleReportOfAnImageTheIntentsNameIsDeletedOnceSynced": {
			run: func(t *testing.T, h *harness) {
				// A previous run of the agent reported img-1, which was
				// pruned while this one was starting.
				_, _ = bus.PutReport(context.Background(), h.reports, wire.ImageReports, "img-1", wire.ImageReport{UID: "img-1", Node: node, Phase: wire.ImagePhaseReady})
				_, _ = bus.PutReport(context.Background(), h.reports, wire.ImageReports, "img-other", wire.ImageReport{UID: "img-other", Node: node, Phase: wire.ImagePhaseReady})
				h.put(intent("a", withImage))
				time.Sleep(50 * time.Millisecond)
				_, ok := h.reports.image("img-1")
				assert.True(t, ok, "before the intents are synced nothing is known to be stale")
				h.synced()
				h.noImageReport("img-1", "the stale report is deleted once the intents are synced")
				_, ok = h.reports.image("img-other")
				assert.True(t, ok, "a report of an image this run knows nothing of is left alone")
			},
		},
		"AGuestWaitingForAnImportWakesTheImageLoop": {
			start: func(t *testing.T) *harness {
				return startWith(t, func(f *fake.Driver) driver.Driver { return provisioning{f} }, func(o *Options) {
					o.ImagePollEvery = time.Hour
					o.PollTransitional = time.Hour
				})
			},
			run: func(t *testing.T, h *harness) {
				require.Eventually(t, func() bool { return h.fake.ImagesCalls() == 1 }, 5*time.Second, 5*time.Millisecond, "the loop looks once at start")
				h.fake.SetImage(importing("img-1", "importing image ubuntu: 0 of 4 bytes"))
				h.synced()
				h.put(intent("a", withImage))
				h.eventually("a", phase(wire.PhaseProvisioning), "the guest waits for its image")
				r := h.imageReport("img-1", imagePhase(wire.ImagePhaseImporting), "the import is reported long before the next poll")
				assert.Equal(t, "importing image ubuntu: 0 of 4 bytes", r.Message)
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
