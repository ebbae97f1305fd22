// Command kube-node prints a directory holding the kubelet and kube-proxy,
// building them once per machine when needed (see
// internal/harness/envtestassets). Progress goes to stderr, the directory to
// stdout.
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
	dir, err := envtestassets.EnsureNode(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-node:", err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
