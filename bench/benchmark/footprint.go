package benchmark

import (
	"context"
	"io"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// Footprint is what a fleet of a burst's size costs beside the hub once
// every VM runs: the control plane's and NATS's memory, etcd's database
// and how full the wire's buckets are.
type Footprint struct {
	// Peak resident memory of kube-apiserver, etcd and the nats-server
	// process (0 when NATS runs inside the benchmark's process).
	APIServerPeakRSSBytes int64 `json:"apiServerPeakRSSBytes"`
	EtcdPeakRSSBytes      int64 `json:"etcdPeakRSSBytes"`
	NATSPeakRSSBytes      int64 `json:"natsPeakRSSBytes,omitempty"`
	// EtcdDBBytes is etcd's database size as the API server last read it
	// (apiserver_storage_size_bytes): what etcd's quota is judged against.
	EtcdDBBytes float64 `json:"etcdDBBytes"`
	// Buckets are the wire's JetStream buckets as the hub reports them.
	Buckets []BucketFill `json:"buckets,omitempty"`
}

// BucketFill is one bucket's bytes and values against its limit.
type BucketFill struct {
	Bucket   string  `json:"bucket"`
	Bytes    float64 `json:"bytes"`
	MaxBytes float64 `json:"maxBytes"`
	Values   float64 `json:"values"`
}

// Fill is the share of its limit the bucket takes; 0 without a limit.
func (b BucketFill) Fill() float64 {
	if b.MaxBytes <= 0 {
		return 0
	}
	return b.Bytes / b.MaxBytes
}

// footprint reads s's footprint: memory from /proc through the CPU
// snapshot's processes, the rest from the API server's and the hub's
// metrics.
func footprint(ctx context.Context, s *stack.Stack, procs cpuSnapshot) (*Footprint, error) {
	f := &Footprint{}
	for pid, p := range procs.procs {
		var into *int64
		switch p.command {
		case "kube-apiserver":
			into = &f.APIServerPeakRSSBytes
		case "etcd":
			into = &f.EtcdPeakRSSBytes
		case "nats-server":
			into = &f.NATSPeakRSSBytes
		default:
			continue
		}
		u, err := ReadProcessUsage(pid)
		if err != nil {
			return nil, errors.Wrapf(err, "%s", p.command)
		}
		*into = max(*into, u.PeakRSSBytes)
	}
	api, err := scrapeAPIServer(ctx, s.ControlPlane.Config, metricFamilies)
	if err != nil {
		return nil, err
	}
	for _, m := range api["apiserver_storage_size_bytes"].GetMetric() {
		f.EtcdDBBytes = max(f.EtcdDBBytes, m.GetGauge().GetValue())
	}
	hub, err := scrapeMetrics(ctx, nil, s.HubMetricsURL(), "the hub", metricFamilies)
	if err != nil {
		return nil, err
	}
	f.Buckets = bucketFills(hub)
	return f, nil
}

// bucketFills are the buckets of the hub's metrics, by name.
func bucketFills(families map[string]*dto.MetricFamily) []BucketFill {
	byName := map[string]*BucketFill{}
	fill := func(family string, set func(*BucketFill, float64)) {
		for _, m := range families[family].GetMetric() {
			name := label(m, "bucket")
			if byName[name] == nil {
				byName[name] = &BucketFill{Bucket: name}
			}
			set(byName[name], m.GetGauge().GetValue())
		}
	}
	fill("virtfleet_hub_nats_bucket_bytes", func(b *BucketFill, v float64) { b.Bytes += v })
	fill("virtfleet_hub_nats_bucket_max_bytes", func(b *BucketFill, v float64) { b.MaxBytes = max(b.MaxBytes, v) })
	fill("virtfleet_hub_nats_bucket_values", func(b *BucketFill, v float64) { b.Values += v })
	out := make([]BucketFill, 0, len(byName))
	for _, b := range byName {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b BucketFill) int { return strings.Compare(a.Bucket, b.Bucket) })
	return out
}

// label is the value of m's label name, empty when m has none.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// metricFamilies reads the Prometheus text exposition format, by family
// name.
func metricFamilies(r io.Reader) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	return families, errors.Wrap(err, "cannot parse the metrics")
}
