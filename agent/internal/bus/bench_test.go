package bus_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/internal/bus"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

const benchKeys = 1000

// BenchmarkIntentDelivery measures how long an intent takes from the hub's
// put to the agent's watch callback, with benchKeys keys in the node's prefix.
func BenchmarkIntentDelivery(b *testing.B) {
	f := newFleet(b)
	for i := range benchKeys {
		f.putIntent(b, "node1", fmt.Sprintf("vm-%d", i), 0)
	}
	agent, _, _ := f.agent(b, "node1")
	e := watch(b, agent)
	e.until(b, 10*time.Second, synced)

	var latencies []time.Duration
	b.ResetTimer()
	for n := range b.N {
		gen := int64(n + 1)
		sent := make(map[string]time.Time, benchKeys)
		for i := range benchKeys {
			uid := fmt.Sprintf("vm-%d", i)
			sent[uid] = time.Now()
			f.putIntent(b, "node1", uid, gen)
		}
		for range benchKeys {
			ev := e.until(b, 10*time.Second, func(ev any) bool { g, ok := guest(ev); return ok && g.Value.Generation == gen })
			last, _ := guest(ev[len(ev)-1])
			latencies = append(latencies, time.Since(sent[last.UID]))
		}
	}
	b.StopTimer()
	slices.Sort(latencies)
	ms := func(q float64) float64 {
		return float64(latencies[int(q*float64(len(latencies)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}

// BenchmarkReportWrites measures compare-and-set report writes per second
// from one agent.
func BenchmarkReportWrites(b *testing.B) {
	f := newFleet(b)
	agent, _, _ := f.agent(b, "node1")
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for n := range b.N {
		uid := fmt.Sprintf("vm-%d", n%benchKeys)
		_, err := bus.PutReport(ctx, agent, wire.GuestReports, uid, wire.Report{UID: uid, Node: "node1", Message: fmt.Sprint(n)})
		require.NoError(b, err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
}
