package e2e

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// metrics are the series of one scrape.
type metrics map[string]*dto.MetricFamily

type sample struct {
	labels map[string]string
	value  float64
}

func scrape(t *testing.T, url string) metrics {
	t.Helper()
	require.NotEmpty(t, url)
	resp, err := http.Get(url) //nolint:noctx // a test's loopback read
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// series are the samples of a gauge or counter.
func (m metrics) series(name string) []sample {
	var out []sample
	for _, x := range m[name].GetMetric() {
		s := sample{labels: map[string]string{}}
		for _, l := range x.GetLabel() {
			s.labels[l.GetName()] = l.GetValue()
		}
		s.value = x.GetGauge().GetValue() + x.GetCounter().GetValue()
		out = append(out, s)
	}
	return out
}

// value sums the samples of name whose labels include the given pairs.
func (m metrics) value(name string, pairs ...string) float64 {
	var sum float64
	for _, s := range m.series(name) {
		match := true
		for i := 0; i+1 < len(pairs); i += 2 {
			match = match && s.labels[pairs[i]] == pairs[i+1]
		}
		if match {
			sum += s.value
		}
	}
	return sum
}

// histogramCount sums the observations of a histogram over its labels.
func (m metrics) histogramCount(name string) uint64 {
	var n uint64
	for _, x := range m[name].GetMetric() {
		n += x.GetHistogram().GetSampleCount()
	}
	return n
}
