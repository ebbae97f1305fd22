// Command envtest-assets prints a directory holding kube-apiserver, etcd and
// kubectl, or with -node the node binaries (envtestassets.NodeBinaries),
// building them once per machine when needed (see
// internal/harness/envtestassets). Progress goes to stderr, the directory to
// stdout, so a Makefile can write
// KUBEBUILDER_ASSETS="$(go run ./hack/envtest-assets)".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
)

func main() {
	node := flag.Bool("node", false, "Print the directory of the node binaries (kubelet, kube-proxy, kube-scheduler, kube-controller-manager) instead.")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ensure := envtestassets.Ensure
	if *node {
		ensure = envtestassets.EnsureNode
	}
	dir, err := ensure(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest-assets:", err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
