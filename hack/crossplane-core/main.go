// Command crossplane-core prints the path of Crossplane's core binary,
// building it once per machine from the Go module proxy when needed (see
// internal/harness/crossplanecore), together with Kubernetes' garbage
// collector, which the Crossplane harness runs (Crossplane deletes composed
// resources only through Kubernetes garbage collection; see
// internal/harness/envtestassets). Progress
// goes to stderr, the path to stdout.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/virtfleet/virtfleet/internal/harness/crossplanecore"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	c, err := crossplanecore.Ensure(ctx, os.Stderr)
	if err == nil {
		_, err = envtestassets.EnsureGarbageCollector(ctx, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crossplane-core:", err)
		os.Exit(1)
	}
	fmt.Println(c.Binary)
}
