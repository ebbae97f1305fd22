// Command chaos kills, in turn, an agent, the hub, the NATS server and a
// libvirtd while VMs churn, and checks that nothing was lost, duplicated or
// orphaned and that everything converged in time; `make chaos` runs it. The
// run lives in internal/chaos.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/virtfleet/virtfleet/internal/chaos"
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
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "How many times each of the four components is killed.")
	flag.Float64Var(&o.OpsPerSecond, "rate", o.OpsPerSecond, "Churn requests per second over all VMs.")
	flag.DurationVar(&o.Down, "down", o.Down, "How long the hub, NATS and a libvirtd stay dead.")
	flag.DurationVar(&o.ChurnBetween, "between", o.ChurnBetween, "Churn alone before each kill.")
	flag.DurationVar(&o.ConvergeWithin, "converge-within", o.ConvergeWithin, "Limit from a restart to every VM in its wanted state.")
	flag.DurationVar(&o.NodeLossWithin, "node-loss-within", o.NodeLossWithin, "Limit from an agent's kill to its node's loss in the API.")
	flag.DurationVar(&o.NodeTTL, "node-ttl", o.NodeTTL, "Heartbeat TTL; 0 is the production default.")
	flag.StringVar(&o.Dir, "dir", "", "Where the stack keeps its state and logs; empty means the system's temporary directory.")
	flag.BoolVar(&o.Keep, "keep", false, "Keep the stack's directory and logs after a passing run.")
	flag.BoolVar(&o.Debug, "debug", false, "Run the hub and agents at debug level.")
	flag.Parse()
	o.Progress = os.Stderr
	ctrl.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := chaos.Run(ctx, o)
	if r != nil {
		fmt.Print(chaos.Summary(r))
	}
	if err != nil {
		return err
	}
	if len(r.Failures) > 0 {
		return fmt.Errorf("%d failures", len(r.Failures))
	}
	return nil
}
