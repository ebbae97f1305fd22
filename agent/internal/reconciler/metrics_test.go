package reconciler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/fake"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// metered runs a reconciler over the fake driver observing into metrics of
// its own, so counts are this test's alone.
func metered(t *testing.T, log logging.Logger) (*harness, *metrics.AgentMetrics) {
	t.Helper()
	m := metrics.NewAgentMetrics()
	h := startLogged(t, log, func(f *fake.Driver) driver.Driver { return f }, func(o *Options) { o.Metrics = m })
	return h, m
}

// observations is how many observations a histogram's series holds.
func observations(t *testing.T, h prometheus.Observer) uint64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, h.(prometheus.Metric).Write(&out))
	return out.GetHistogram().GetSampleCount()
}

// observedSum is the sum of a histogram series' observations.
func observedSum(t *testing.T, h prometheus.Observer) float64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, h.(prometheus.Metric).Write(&out))
	return out.GetHistogram().GetSampleSum()
}

func TestDriverCallsAreObservedByOperationAndResult(t *testing.T) {
	cases := map[string]struct {
		run            func(t *testing.T, h *harness)
		op, result     string
		untouchedOther string
	}{
		"ACreatedGuestIsASuccessfulEnsure": {
			run: func(t *testing.T, h *harness) {
				h.put(intent("a"))
				h.eventually("a", phase(wire.PhaseRunning), "the guest runs")
			},
			op: OpEnsure, result: metrics.ResultSuccess,
		},
		"AnEnsureThatFailsIsAFailure": {
			run: func(t *testing.T, h *harness) {
				h.fake.Fail("Ensure", "a", errors.New("libvirtd went away"))
				h.put(intent("a"))
				require.Eventually(t, func() bool { return h.calls("Ensure", "a") > 0 }, 5*time.Second, 5*time.Millisecond)
			},
			op: OpEnsure, result: metrics.ResultFailure,
		},
		"AResyncLists": {
			run: func(t *testing.T, h *harness) { h.synced() },
			op:  OpList, result: metrics.ResultSuccess,
		},
		"ARemovedGuestIsADelete": {
			run: func(t *testing.T, h *harness) {
				h.synced()
				h.put(intent("a"))
				h.eventually("a", phase(wire.PhaseRunning), "the guest runs")
				h.del("a")
				require.Eventually(t, func() bool { return h.calls("Delete", "a") > 0 }, 5*time.Second, 5*time.Millisecond)
			},
			op: OpDelete, result: metrics.ResultSuccess,
		},
		"TheImageLoopReadsImages": {
			run: func(t *testing.T, h *harness) {
				n := h.fake.ImagesCalls()
				require.Eventually(t, func() bool { return h.fake.ImagesCalls() > n }, 5*time.Second, 5*time.Millisecond)
			},
			op: OpImages, result: metrics.ResultSuccess,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h, m := metered(t, logging.NewNopLogger())
			tc.run(t, h)
			require.Eventually(t, func() bool {
				return observations(t, m.DriverCalls.WithLabelValues(tc.op, tc.result)) > 0
			}, 5*time.Second, 5*time.Millisecond, "a %s call observed as %s", tc.op, tc.result)
			other := metrics.ResultFailure
			if tc.result == metrics.ResultFailure {
				other = metrics.ResultSuccess
			}
			assert.Zero(t, observations(t, m.DriverCalls.WithLabelValues(tc.op, other)), "no %s call observed as %s", tc.op, other)
		})
	}
}

func TestOnlyAFullResyncIsObserved(t *testing.T) {
	h, m := metered(t, logging.NewNopLogger())
	resyncs := m.ResyncDuration.WithLabelValues()
	h.put(intent("a"))
	h.rec.resync(context.Background())
	assert.Zero(t, observations(t, resyncs), "before the intents are synced a resync only queues the intents")

	h.synced()
	assert.Equal(t, uint64(1), observations(t, resyncs), "the pass the synced intents start")
	h.rec.resync(context.Background())
	assert.Equal(t, uint64(2), observations(t, resyncs), "and each one after it")
	assert.Positive(t, observedSum(t, resyncs))
}

func TestGuestsAreCountedByTheirLastReportedPhase(t *testing.T) {
	h, m := metered(t, logging.NewNopLogger())
	guests := func(p wire.Phase) float64 { return testutil.ToFloat64(m.Guests.WithLabelValues(string(p))) }
	require.Equal(t, len(wire.Phases), testutil.CollectAndCount(m.Guests), "every phase is exported from the start")
	for _, p := range wire.Phases {
		assert.Zero(t, guests(p), "no guest is %s yet", p)
	}

	h.synced()
	h.put(intent("a"))
	h.put(intent("b"))
	h.eventually("a", phase(wire.PhaseRunning), "a runs")
	h.eventually("b", phase(wire.PhaseRunning), "b runs")
	assert.Equal(t, 2.0, guests(wire.PhaseRunning))

	h.put(intent("b", func(in *wire.Intent) { in.Running = false; in.Generation = 2 }))
	h.eventually("b", phase(wire.PhaseStopped), "b stops")
	assert.Equal(t, 1.0, guests(wire.PhaseRunning))
	assert.Equal(t, 1.0, guests(wire.PhaseStopped))

	h.del("a")
	require.Eventually(t, func() bool { _, ok := h.reports.get("a"); return !ok }, 5*time.Second, 5*time.Millisecond, "a's report goes")
	assert.Zero(t, guests(wire.PhaseRunning), "a phase no guest has any more drops to 0")
	assert.Equal(t, 1.0, guests(wire.PhaseStopped))
	assert.Equal(t, len(wire.Phases), testutil.CollectAndCount(m.Guests), "no phase beyond the wire's")
}

func TestImageImportsAreCountedOnceEach(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	finished := func(st driver.ImageStatus, took time.Duration) driver.ImageStatus {
		st.ImportStarted, st.ImportFinished = t0, t0.Add(took)
		return st
	}
	failed := func(msg string) driver.ImageStatus {
		return driver.ImageStatus{UID: "img-1", Name: "ubuntu", Phase: driver.ImagePhaseFailed, Message: msg}
	}
	type counts struct {
		successes, failures, bytes float64
		seconds                    float64
	}
	cases := map[string]struct {
		statuses []driver.ImageStatus
		want     counts
	}{
		"ASuccessfulImportCountsItsBytesAndDuration": {
			statuses: []driver.ImageStatus{importing("img-1", "1 of 4096 bytes"), finished(ready("img-1", 4096), 3*time.Second)},
			want:     counts{successes: 1, bytes: 4096, seconds: 3},
		},
		"AFailedImportCountsNoBytes": {
			statuses: []driver.ImageStatus{finished(failed("GET answered 404"), 2*time.Second)},
			want:     counts{failures: 1, seconds: 2},
		},
		"EachFailedAttemptCountsEvenWithTheSameReason": {
			statuses: []driver.ImageStatus{finished(failed("GET answered 404"), time.Second), finished(failed("GET answered 404"), 5*time.Second)},
			want:     counts{failures: 2, seconds: 1 + 5},
		},
		"AnImageFoundOnTheNodeIsNoImport": {
			statuses: []driver.ImageStatus{ready("img-1", 4096)},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h, m := metered(t, logging.NewNopLogger())
			for _, st := range tc.statuses {
				h.fake.SetImage(st)
				// Several polls see each status: it still counts once.
				n := h.fake.ImagesCalls()
				require.Eventually(t, func() bool { return h.fake.ImagesCalls() > n+3 }, 5*time.Second, time.Millisecond)
			}
			got := counts{
				successes: testutil.ToFloat64(m.ImageImports.WithLabelValues(metrics.ResultSuccess)),
				failures:  testutil.ToFloat64(m.ImageImports.WithLabelValues(metrics.ResultFailure)),
				bytes:     testutil.ToFloat64(m.ImageImportBytes),
				seconds: observedSum(t, m.ImageImportDuration.WithLabelValues(metrics.ResultSuccess)) +
					observedSum(t, m.ImageImportDuration.WithLabelValues(metrics.ResultFailure)),
			}
			assert.Equal(t, tc.want, got)
			assert.Equal(t, uint64(tc.want.successes), observations(t, m.ImageImportDuration.WithLabelValues(metrics.ResultSuccess)))
			assert.Equal(t, uint64(tc.want.failures), observations(t, m.ImageImportDuration.WithLabelValues(metrics.ResultFailure)))
		})
	}
}

// entry is one recorded log line.
type entry struct {
	msg string
	kv  map[string]any
}

// recorder is a logging.Logger that keeps what is logged at info level.
type recorder struct {
	mu      *sync.Mutex
	entries *[]entry
	values  []any
}

func newRecorder() recorder { return recorder{mu: &sync.Mutex{}, entries: &[]entry{}} }

func (r recorder) Info(msg string, kv ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := entry{msg: msg, kv: map[string]any{}}
	all := append(append([]any(nil), r.values...), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		e.kv[fmt.Sprint(all[i])] = all[i+1]
	}
	*r.entries = append(*r.entries, e)
}

func (r recorder) Debug(string, ...any) {}

func (r recorder) WithValues(kv ...any) logging.Logger {
	r.values = append(append([]any(nil), r.values...), kv...)
	return r
}

// find returns the entries with message msg whose key has value.
func (r recorder) find(msg, key string, value any) []entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []entry
	for _, e := range *r.entries {
		if e.msg == msg && e.kv[key] == value {
			out = append(out, e)
		}
	}
	return out
}

func TestARepeatedGuestErrorIsLoggedOnce(t *testing.T) {
	log := newRecorder()
	h, _ := metered(t, log)
	const secret = "https://admin:hunter2@images.example:8443/u.qcow2?token=s3cr3t"
	h.fake.Fail("Ensure", "a", driver.Failing(errors.New("cannot import image ubuntu: GET "+secret+" answered 404 Not Found")))
	h.put(intent("a"))
	require.Eventually(t, func() bool { return h.fake.Attempts("Ensure", "a") >= 5 }, 5*time.Second, 5*time.Millisecond, "the reconciler retries")

	logged := log.find("Cannot converge guest", "uid", "a")
	require.Len(t, logged, 1, "five failures for one cause are one line")
	assert.Equal(t, "default", logged[0].kv["namespace"])
	assert.Equal(t, "vm-a", logged[0].kv["name"])
	assert.Equal(t, node, logged[0].kv["node"])
	assert.Equal(t, "cannot import image ubuntu: GET https://images.example:8443 answered 404 Not Found", logged[0].kv["error"], "the URL cut to its host")

	n := h.fake.Attempts("Ensure", "a")
	h.fake.Fail("Ensure", "a", errors.New("libvirtd went away"))
	require.Eventually(t, func() bool { return h.fake.Attempts("Ensure", "a") >= n+5 }, 5*time.Second, 5*time.Millisecond)
	assert.Len(t, log.find("Cannot converge guest", "uid", "a"), 2, "a new cause is logged once more")

	h.fake.Fail("Ensure", "a", nil)
	h.eventually("a", phase(wire.PhaseRunning), "the guest runs once the driver answers")
	require.Eventually(t, func() bool { return len(log.find("Guest converges again", "uid", "a")) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Len(t, log.find("Cannot converge guest", "uid", "a"), 2)
}

func TestAFailedImportIsLoggedOncePerReasonWithoutItsURLsSecrets(t *testing.T) {
	log := newRecorder()
	h, _ := metered(t, log)
	h.put(intent("a", func(in *wire.Intent) {
		in.Machine.Disks[0].Image = &wire.ImageRef{Name: "ubuntu", UID: "img-1", URL: "https://admin:hunter2@images.example/u.qcow2?token=s3cr3t"}
	}))
	fail := func(msg string) {
		h.fake.SetImage(driver.ImageStatus{UID: "img-1", Name: "ubuntu", Phase: driver.ImagePhaseFailed, Message: msg})
		n := h.fake.ImagesCalls()
		require.Eventually(t, func() bool { return h.fake.ImagesCalls() > n+3 }, 5*time.Second, time.Millisecond)
	}

	fail(`cannot import image ubuntu: Get "https://admin:***@images.example/u.qcow2?token=s3cr3t": dial tcp: connection refused`)
	logged := log.find("Cannot import image; the driver retries it with backoff unless the node refused it", "uid", "img-1")
	require.Len(t, logged, 1)
	assert.Equal(t, "ubuntu", logged[0].kv["image"])
	assert.Equal(t, "images.example", logged[0].kv["host"])
	assert.Equal(t, `cannot import image ubuntu: Get "https://images.example": dial tcp: connection refused`, logged[0].kv["error"])

	fail(`cannot import image ubuntu: Get "https://admin:***@images.example/u.qcow2?token=s3cr3t": dial tcp: connection refused`)
	assert.Len(t, log.find("Cannot import image; the driver retries it with backoff unless the node refused it", "uid", "img-1"), 1, "the same reason again is not logged again")
	fail("image ubuntu failed its checksum")
	assert.Len(t, log.find("Cannot import image; the driver retries it with backoff unless the node refused it", "uid", "img-1"), 2, "a new reason is")

	h.fake.SetImage(ready("img-1", 4096))
	require.Eventually(t, func() bool { return len(log.find("Image imported after failing", "uid", "img-1")) == 1 }, 5*time.Second, 5*time.Millisecond)
}

func TestRedactURLsKeepsOnlySchemeAndHost(t *testing.T) {
	cases := map[string]struct{ in, want string }{
		"NoURL":               {in: "volume pool full", want: "volume pool full"},
		"QueryAndPath":        {in: "GET https://h.example/a/b.qcow2?X-Amz-Signature=abc answered 403", want: "GET https://h.example answered 403"},
		"UserAndPassword":     {in: "from http://u:p@h.example:8080/x failed", want: "from http://h.example:8080 failed"},
		"QuotedByGo":          {in: `Get "https://u:***@h.example/x?t=1": EOF`, want: `Get "https://h.example": EOF`},
		"SeveralURLs":         {in: "https://a.example/?t=1 redirected to https://b.example/x#f", want: "https://a.example redirected to https://b.example"},
		"AnAtInThePathIsKept": {in: "https://h.example/@x?t=1", want: "https://h.example"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := redactURLs(tc.in)
			assert.Equal(t, tc.want, got)
			assert.False(t, strings.Contains(got, "?"), "no query survives")
		})
	}
}
