// Command bench measures virtfleet on the real stack and writes
// bench/results/<date>.md and .json; `make bench` runs it with the issue's
// sizes. The measurements live in bench/benchmark.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/virtfleet/virtfleet/bench/benchmark"
	"github.com/virtfleet/virtfleet/internal/flagenv"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	d := benchmark.Defaults()
	var (
		quick        = flag.Bool("quick", false, "Small sizes that test the harness in about a minute; other size flags are ignored.")
		density      = flag.Int("density", d.Density, "VMs created one by one in the density scenario; 0 skips it.")
		densityNodes = flag.Int("density-nodes", d.DensityNodes, "Nodes of the density scenario.")
		interval     = flag.Duration("interval", d.DensityInterval, "Time between creates in the density scenario.")
		burst        = flag.Int("burst", 1000, "VMs created at once in the burst scenario; added to -sizes.")
		sizes        = flag.String("sizes", "10,100,1000,5000", "Burst sizes, comma-separated, each on a fresh stack, so the cost's growth is visible.")
		scale        = flag.String("scale", "1000,10000", "Burst sizes over simulated nodes (one simnodes process serving every node over an in-memory driver), comma-separated, each on a fresh stack; empty runs none.")
		nodes        = flag.Int("nodes", d.Nodes, "Nodes of the burst scenarios, at least.")
		perNode      = flag.Int("vms-per-node", d.VMsPerNode, "Most VMs a burst puts on one node; a larger burst gets more nodes than -nodes.")
		limits       = flag.Bool("limits", true, "Measure raw libvirt and the control plane's limit after each burst.")
		out          = flag.String("out", filepath.Join(controlplane.RepoRoot(), "bench", "results"), "Directory of the result files.")
		dir          = flag.String("dir", "", "Where the stacks keep their state and logs; empty means the system's temporary directory.")
		keep         = flag.Bool("keep", false, "Keep every stack's directory and logs, not only those of failed scenarios.")
		guests       = flag.Bool("guests", d.Guests, "Boot one real QEMU guest (TCG without KVM) through the whole stack and time create→Running, →address, →ssh, snapshot it (-snapshots), back it up and restore it (-backups), and migrate another live between two hosts (-migration); needs root and make deps.")
		snapshots    = flag.Bool("snapshots", d.Snapshots, "With -guests, snapshot the real guest disk-only and with its memory while a prober pings it every 10 ms, and restore the one with memory.")
		backups      = flag.Bool("backups", d.Backups, "With -guests, back the real guest up whole and then incrementally to a SeaweedFS started with its stack, upload as many random bytes to the same store for comparison, and time a restore of it to ssh.")
		migration    = flag.Bool("migration", d.Migration, "With -guests, migrate another real guest live between two hosts.")
		idle         = flag.Bool("idle", d.Idle, "Run the idle-node scenario: one node of 200 guests, its agent's full observe timed, then 100 of them idle for 5 minutes while the agent's CPU is counted.")
		dense        = flag.Bool("dense", d.DenseSimulated, "Run the dense-node scenarios: one simulated node of 1,000 guests (dense-simulated), its agent's full observe timed and then its CPU counted idle for 5 minutes, and one node of 500 domains on the test driver (dense-libvirt), its resyncs and idle CPU the same way for 3 minutes.")
		debug        = flag.Bool("debug", false, "Run the hub and agents at debug level (slower; for finding where time goes).")
		pprof        = flag.Bool("pprof", false, "Have the hub and agents serve Go's profiles, each on a port of its own, named in the progress.")
		only         = flag.String("only", "", "Run only these scenarios, comma-separated, as the other flags size them: "+strings.Join(benchmark.Scenarios, ", ")+" (guest is the real guest with its snapshots and backups); empty runs them all.")
	)
	if err := flagenv.ParseCommandLine(); err != nil {
		return err
	}

	o := benchmark.Options{Density: *density, DensityNodes: *densityNodes, DensityInterval: *interval, Nodes: *nodes, VMsPerNode: *perNode, Limits: *limits}
	if *quick {
		o = benchmark.Quick()
	} else {
		s, err := parseSizes(*sizes)
		if err != nil {
			return fmt.Errorf("-sizes: %w", err)
		}
		if *burst > 0 {
			s = append(s, *burst)
		}
		o.Sizes = s
		if o.Scale, err = parseSizes(*scale); err != nil {
			return fmt.Errorf("-scale: %w", err)
		}
	}
	o.Dir, o.Progress, o.Keep, o.Debug, o.Guests, o.Pprof = *dir, os.Stderr, *keep, *debug, *guests && !*quick, *pprof
	o.Idle = *idle && !*quick
	o.DenseSimulated, o.DenseLibvirt = *dense && !*quick, *dense && !*quick
	o.Snapshots, o.Backups, o.Migration = *snapshots, *backups, *migration && *guests && !*quick
	if *only != "" {
		if err := o.Only(strings.Split(*only, ",")); err != nil {
			return fmt.Errorf("-only: %w", err)
		}
	}
	// The benchmark's own Kubernetes clients have nothing to say.
	ctrl.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, runErr := benchmark.Run(ctx, o)
	if r == nil {
		return runErr
	}
	// A run that stopped part way still writes what it measured.
	md, js, err := benchmark.Write(r, *out)
	if err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Println(benchmark.Markdown(r))
	fmt.Fprintf(os.Stderr, "results: %s, %s\n", md, js)
	return runErr
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
