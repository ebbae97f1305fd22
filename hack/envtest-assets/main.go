// Command envtest-assets prints a directory holding kube-apiserver, etcd and
// kubectl, building them once per machine when needed (see
// internal/harness/envtestassets). Progress goes to stderr, the directory to stdout, so
// a Makefile can write KUBEBUILDER_ASSETS="$(go run ./hack/envtest-assets)".
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dir, err := envtestassets.Ensure(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest-assets:", err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
