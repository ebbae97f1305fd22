// Command chaos kills, in turn, an agent, the hub, the NATS server, a
// libvirtd, then a whole node (agent and libvirtd) and cuts a node off NATS
// while VMs, some of them HA, churn, and checks that nothing was lost,
// duplicated or orphaned, that no VM ran on two nodes at once, that a lost
// node's HA VMs ran elsewhere in time and that everything converged in
// time; `make chaos` runs it. The run lives in chaos/internal/chaos.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/virtfleet/virtfleet/bench/benchmark"
	"github.com/virtfleet/virtfleet/chaos/internal/chaos"
	"github.com/virtfleet/virtfleet/internal/flagenv"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}

func run() error {
	o := chaos.Defaults()
	flag.IntVar(&o.VMs, "vms", o.VMs, "VMs churned (created, stopped, started, deleted).")
	flag.IntVar(&o.Nodes, "nodes", o.Nodes, "Simulated nodes, each with its agent and libvirtd.")
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "How many times each fault is injected.")
	flag.IntVar(&o.HAVMs, "ha-vms", o.HAVMs, "How many of the VMs are HA (availability Restart, Volumes in a shared pool); 0 means a fifth of them, -1 none and no node or partition fault.")
	flag.DurationVar(&o.FenceAfter, "fence-after", o.FenceAfter, "The agents' lease (agent --fence-after).")
	flag.DurationVar(&o.FencingMargin, "fencing-margin", o.FencingMargin, "What the hub waits beyond a lost node's lease before it restarts its HA VMs elsewhere (hub --fencing-margin).")
	flag.DurationVar(&o.RestartWithin, "restart-within", o.RestartWithin, "Limit, at the 95th percentile, from a node's kill or partition to each of its HA VMs Running elsewhere.")
	flag.Float64Var(&o.OpsPerSecond, "rate", o.OpsPerSecond, "Churn requests per second over all VMs.")
	flag.DurationVar(&o.Down, "down", o.Down, "How long the hub, NATS and a libvirtd stay dead.")
	flag.DurationVar(&o.ChurnBetween, "between", o.ChurnBetween, "Churn alone before each kill.")
	flag.DurationVar(&o.ConvergeWithin, "converge-within", o.ConvergeWithin, "Limit from a restart to every VM in its wanted state.")
	flag.DurationVar(&o.NodeLossWithin, "node-loss-within", o.NodeLossWithin, "Limit from an agent's kill to its node's loss in the API.")
	flag.DurationVar(&o.NodeTTL, "node-ttl", o.NodeTTL, "Heartbeat TTL; 0 is the production default.")
	flag.IntVar(&o.NATSServers, "nats-servers", 3, "NATS servers, as one cluster with buckets replicated on each; the NATS fault kills the JetStream meta leader. 1 runs one server, and the NATS fault kills it.")
	flag.StringVar(&o.Dir, "dir", "", "Where the stack keeps its state and logs; empty means the system's temporary directory.")
	flag.BoolVar(&o.Keep, "keep", false, "Keep the stack's directory and logs after a passing run.")
	flag.BoolVar(&o.Debug, "debug", false, "Run the hub and agents at debug level.")
	out := flag.String("out", filepath.Join(controlplane.RepoRoot(), "chaos", "results"), "Directory the run's summary is written to, as <date>.md; empty writes none.")
	if err := flagenv.ParseCommandLine(); err != nil {
		return err
	}
	o.Progress = os.Stderr
	ctrl.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now().UTC()
	r, err := chaos.Run(ctx, o)
	if r != nil {
		fmt.Print(chaos.Summary(r))
	}
	if err != nil {
		return err
	}
	if *out != "" {
		path, err := writeSummary(*out, started, r)
		if err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "results:", path)
	}
	if len(r.Failures) > 0 {
		return fmt.Errorf("%d failures", len(r.Failures))
	}
	return nil
}

// writeSummary stores the run's summary with the commit and the machine it
// ran on as <dir>/<start>.md, so runs on one machine can be compared.
func writeSummary(dir string, started time.Time, r *chaos.Result) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cannot create the results directory: %w", err)
	}
	commit, dirty := benchmark.Commit()
	m := benchmark.ThisMachine()
	var b strings.Builder
	fmt.Fprintf(&b, "# make chaos, %s\n\n", started.Format(time.RFC3339))
	fmt.Fprintf(&b, "Commit `%s` (uncommitted changes: %t). Machine: %d CPUs, %.1f GiB memory, Linux %s, %s; load average after the run: %s.\n\n",
		commit, dirty, m.CPUs, float64(m.MemoryBytes)/(1<<30), m.Kernel, m.GoVersion, m.LoadAvgBefore)
	b.WriteString("```\n" + chaos.Summary(r) + "```\n")
	path := filepath.Join(dir, started.Format("2006-01-02T15-04-05Z")+".md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("cannot write the results: %w", err)
	}
	return path, nil
}
