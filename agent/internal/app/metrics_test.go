package app_test

import (
	"context"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/reconciler"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/version"
)

// freeAddress is a loopback address nothing listens on right now.
func freeAddress(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// scrape reads the metrics served at addr as Prometheus does.
func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close() //nolint:errcheck // read-only body
	if resp.StatusCode != http.StatusOK {
		return nil, errors.Errorf("GET /metrics answered %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// series are the family's series whose labels include want.
func series(families map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range families[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// gauge is the value of the one series of name with the labels want, or -1.
func gauge(families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	s := series(families, name, want)
	if len(s) != 1 {
		return -1
	}
	return s[0].GetGauge().GetValue()
}

// TestMetricsEndpoint scrapes a running agent's /metrics as Prometheus
// would: the guest it runs, the driver calls that made it, a refused intent,
// and the Go runtime's and the process's own metrics.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "metrics1")
	cfg := f.config("metrics1")
	cfg.MetricsAddress = freeAddress(t)
	cfg.Metrics = metrics.NewAgentMetrics() // this agent's alone: others run in this process
	f.start(t, cfg)

	in := vm("scraped")
	f.put(t, "metrics1", in)
	f.waitReport(t, "metrics1", in.UID, "Running", running(1))
	bad, err := wire.GuestIntents.Key("metrics1", "5d1c0e6a-0000-4000-8000-00000000bad1")
	require.NoError(t, err)
	_, err = f.intents.Put(context.Background(), bad, []byte("{not an intent"))
	require.NoError(t, err)

	var families map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		if families, err = scrape(cfg.MetricsAddress); err != nil {
			return false
		}
		return gauge(families, "virtfleet_agent_guests", map[string]string{"phase": "Running"}) == 1 &&
			len(series(families, "virtfleet_agent_intents_ignored_total", map[string]string{"reason": natswire.ReasonDecode})) == 1
	}, waitFor, 50*time.Millisecond, "the running guest and the refused intent are served")

	assert.Equal(t, 1.0, gauge(families, "virtfleet_agent_guests", map[string]string{"phase": "Running"}))
	assert.Equal(t, 0.0, gauge(families, "virtfleet_agent_guests", map[string]string{"phase": "Failed"}), "every phase is served, at 0 without guests")
	ensures := series(families, "virtfleet_agent_driver_call_duration_seconds", map[string]string{"operation": reconciler.OpEnsure, "result": metrics.ResultSuccess})
	require.Len(t, ensures, 1)
	assert.Positive(t, ensures[0].GetHistogram().GetSampleCount(), "the Ensures that made the guest")
	capacity := series(families, "virtfleet_agent_driver_call_duration_seconds", map[string]string{"operation": reconciler.OpCapacity})
	require.NotEmpty(t, capacity, "the heartbeat's Capacity calls")
	ignored := series(families, "virtfleet_agent_intents_ignored_total", map[string]string{"reason": natswire.ReasonDecode})
	assert.Equal(t, 1.0, ignored[0].GetCounter().GetValue())
	assert.Contains(t, families, "go_goroutines", "the Go runtime's metrics")
	assert.Contains(t, families, "process_start_time_seconds", "the process's metrics")
	assert.Equal(t, 1.0, gauge(families, "virtfleet_agent_build_info", map[string]string{"version": version.Get(), "goversion": runtime.Version()}),
		"the agent's version, the one its heartbeat reports")
}

// TestEndpointsStopWithTheAgent pins that the agent serves its metrics
// and, when asked, Go's profiles, and that a stopped agent frees both ports.
func TestEndpointsStopWithTheAgent(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, "metrics2")
	cfg := f.config("metrics2")
	cfg.MetricsAddress, cfg.PprofAddress = freeAddress(t), freeAddress(t)
	cfg.Metrics = metrics.NewAgentMetrics()
	agent := f.start(t, cfg)
	endpoints := []struct{ addr, path string }{
		{cfg.MetricsAddress, "/metrics"},
		{cfg.PprofAddress, "/debug/pprof/cmdline"},
	}
	for _, e := range endpoints {
		require.Eventually(t, func() bool { return get(e.addr, e.path) == nil }, waitFor, 20*time.Millisecond, "the agent serves %s", e.path)
	}

	agent.stop(t)
	for _, e := range endpoints {
		// Not a listen on the port: once the agent freed it, another
		// process's connection may take it as its own port at once, and
		// did under a loaded make test.
		assert.Error(t, get(e.addr, e.path), "the stopped agent still serves %s", e.path)
	}
}

// get asks for path at addr and says why it was not served.
func get(addr, path string) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close() //nolint:errcheck // read-only body
	if resp.StatusCode != http.StatusOK {
		return errors.Errorf("GET %s answered %s", path, resp.Status)
	}
	return nil
}
