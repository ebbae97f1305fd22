// Command local is `make run`: the whole virtfleet system on this machine
// until Ctrl-C. See cluster/local/internal/localrun.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/virtfleet/virtfleet/cluster/local/internal/localrun"
	"github.com/virtfleet/virtfleet/internal/flagenv"
)

func main() {
	var o localrun.Options
	flag.StringVar(&o.Dir, "dir", ".run", "run directory for kubeconfig, logs and state")
	flag.StringVar(&o.Examples, "examples", "examples", "manifests applied once the CRDs are installed")
	flag.BoolVar(&o.Keep, "keep", false, "keep etcd's data and the NATS store from the last run in -dir (default: start fresh)")
	flag.BoolVar(&o.Crossplane, "crossplane", false, "install virtfleet into Crossplane core as its packages (make run CROSSPLANE=1)")
	flag.IntVar(&o.NATSPort, "nats-port", 4222, "port of the embedded NATS server (the example ClusterProviderConfig names 4222)")
	flag.StringVar(&o.Binaries, "binaries", "", "directory of hub and agent binaries built from this tree with this one (make run's bin); empty builds them at start")
	flag.StringVar(&o.Guests, "guests", "", "qemu: one more node on a real hypervisor (QEMU, in a network namespace of its own) with a Debian guest to ssh into")
	if err := flagenv.ParseCommandLine(); err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		os.Exit(2)
	}
	o.Out = os.Stdout
	var err error
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		os.Exit(1)
	}
	if o.Binaries != "" {
		if o.Binaries, err = filepath.Abs(o.Binaries); err != nil {
			fmt.Fprintln(os.Stderr, "run:", err)
			os.Exit(1)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	r, err := localrun.Start(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		os.Exit(1)
	}
	r.PrintSummary(os.Stdout, o)
	<-ctx.Done()
	fmt.Println("\nstopping…")
	r.Stop()
	fmt.Println("stopped")
}
