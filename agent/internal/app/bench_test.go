package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// batch is how many VMs each iteration asks for at once, as a burst of
// VirtualMachines applied together would.
const batch = 50

// BenchmarkIntentToRunning measures the whole agent path: intents written to
// NATS as the hub writes them, until every report says Running (watch,
// reconcile, network and volume checks, seed, define, start, observe, report).
// In the same run it measures the floor, a bare go-libvirt define and start
// of the same number of domains on a second daemon of the same kind, and
// reports the ratio agent/raw.
func BenchmarkIntentToRunning(b *testing.B) {
	f := newFleet(b, 0, "bench1", "benchraw")
	cfg := f.config("bench1")
	cfg.ResyncInterval = time.Hour // the measurement is of intents, not resyncs
	// Production's interval: each heartbeat reads every guest's definition,
	// which the tests' fast heartbeat would make a large share of the load.
	cfg.HeartbeatInterval = 2 * time.Second
	f.start(b, cfg)
	raw, err := f.hosts["benchraw"].Dial()
	require.NoError(b, err)
	b.Cleanup(func() { _ = raw.Disconnect() })

	var agentTime, rawTime time.Duration
	vms := 0
	for b.Loop() {
		agentTime += f.intentsToRunning(b, "bench1", vms)
		rawTime += defineAndStart(b, raw, vms)
		vms += batch
	}
	agentRate := float64(vms) / agentTime.Seconds()
	rawRate := float64(vms) / rawTime.Seconds()
	b.ReportMetric(agentRate, "agent-VMs/s")
	b.ReportMetric(rawRate, "raw-VMs/s")
	b.ReportMetric(agentRate/rawRate, "agent/raw")
}

// intentsToRunning writes a batch of intents and returns how long it took
// until all their reports said Running, read from a watch as the hub does.
func (f *fleet) intentsToRunning(b *testing.B, node string, offset int) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := f.reports.Watch(ctx, node+".>", jetstream.UpdatesOnly())
	require.NoError(b, err)
	defer w.Stop() //nolint:errcheck // benchmark cleanup

	pending := map[string]bool{}
	start := time.Now()
	for i := range batch {
		in := vm(fmt.Sprintf("bench-%d", offset+i))
		pending[in.UID] = true
		f.put(b, node, in)
	}
	for len(pending) > 0 {
		select {
		case e := <-w.Updates():
			if e == nil || len(e.Value()) == 0 {
				continue
			}
			r, err := wire.DecodeReport(e.Value())
			require.NoError(b, err)
			if r.Phase == wire.PhaseRunning {
				delete(pending, r.UID)
			}
		case <-ctx.Done():
			b.Fatalf("%d of %d guests not Running within a minute", len(pending), batch)
		}
	}
	return time.Since(start)
}

// defineAndStart defines and starts a batch of domains shaped like the
// agent's guests (2 vCPUs, 512 MiB), with nothing else.
func defineAndStart(b *testing.B, l *golibvirt.Libvirt, offset int) time.Duration {
	b.Helper()
	start := time.Now()
	for i := range batch {
		x, err := (&libvirtxml.Domain{
			Type:   "test",
			Name:   fmt.Sprintf("raw-%d", offset+i),
			VCPU:   &libvirtxml.DomainVCPU{Value: 2},
			Memory: &libvirtxml.DomainMemory{Value: 512, Unit: "MiB"},
			OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
		}).Marshal()
		require.NoError(b, err)
		dom, err := l.DomainDefineXMLFlags(x, 0)
		require.NoError(b, err)
		require.NoError(b, l.DomainCreate(dom))
	}
	return time.Since(start)
}
