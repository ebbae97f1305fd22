// Command simnodes serves many simulated hypervisor nodes from one process,
// as KWOK does for kubelets: each node is a whole agent (its own NATS
// connection with its own nkey, the real wire, reconciler, heartbeat and
// lease) over an in-memory driver (agent/driver/fake) instead of a
// hypervisor. A fleet of a hundred nodes is then limited by the hub and the
// control plane, not by a hundred agents and libvirtds on a small machine.
// It exists for scale tests (make bench) and is never shipped: the agent
// command is the one production node.
//
// Every flag can also be set by its environment variable, VIRTFLEET_ and the
// flag's name, as for every virtfleet command (internal/flagenv).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/virtfleet/virtfleet/agent/internal/app"
	"github.com/virtfleet/virtfleet/internal/flagenv"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "simnodes:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("simnodes", flag.ExitOnError)
	var (
		nodes       = fs.String("nodes", "", "Names of the simulated nodes, comma-separated.")
		credentials = fs.String("credentials-dir", "", "Directory holding each node's nkey seed as <node>.nk, as hack/mint-agent-credentials writes it.")
		natsURL     = fs.String("nats-url", "nats://127.0.0.1:4222", "NATS server URLs, comma-separated.")
		labels      = fs.String("labels", "", "Labels of every node, k=v,k2=v2, besides kubernetes.io/hostname=<node>.")
		vcpus       = fs.Int64("host-vcpus", 16, "Host CPUs of each simulated node.")
		hostMemory  = resource.QuantityValue{Quantity: resource.MustParse("64Gi")}
		cpuRatio    = fs.Float64("cpu-allocation-ratio", app.DefaultCPUAllocationRatio, "vCPUs offered to placement per host CPU.")
		memoryRatio = fs.Float64("memory-allocation-ratio", app.DefaultMemoryAllocationRatio, "Guest memory offered to placement per byte of host memory.")
		heartbeat   = fs.Duration("heartbeat-interval", 2*time.Second, "Interval between each node's heartbeats.")
		resync      = fs.Duration("resync-interval", 60*time.Second, "Interval between each node's full resyncs.")
		workers     = fs.Int("workers", 8, "Guests each node reconciles in parallel.")
		metricsAddr = fs.String("metrics-bind-address", "", "Address the Prometheus metrics endpoint (/metrics) of the one node listens on, as the agent's; only with a single node, whose counts it then are; empty serves none.")
		pprofAddr   = fs.String("pprof-bind-address", "", "Address of Go's /debug/pprof profiles of the whole process, for finding where memory and CPU go; empty disables it.")
		debug       = fs.Bool("debug", false, "Log at debug level.")
	)
	fs.Var(&hostMemory, "host-memory", "Host memory of each simulated node, e.g. 64Gi.")
	if err := flagenv.Parse(fs, os.Args[1:], os.LookupEnv, nil); err != nil {
		return err
	}
	common, err := app.ParseLabels(*labels)
	if err != nil {
		return fmt.Errorf("--labels: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, fleet{
		Nodes:          app.ParseList(*nodes),
		CredentialsDir: *credentials,
		NATSURLs:       strings.Split(*natsURL, ","),
		Labels:         common,
		HostVCPUs:      *vcpus,
		HostMemory:     hostMemory.Value(),
		MetricsAddress: *metricsAddr,
		PprofAddress:   *pprofAddr,
		Node: app.Config{
			HeartbeatInterval:     *heartbeat,
			ResyncInterval:        *resync,
			Workers:               *workers,
			CPUAllocationRatio:    *cpuRatio,
			MemoryAllocationRatio: *memoryRatio,
		},
		Log: logging.NewLogrLogger(zap.New(zap.UseDevMode(*debug)).WithName("simnodes")),
	})
}
