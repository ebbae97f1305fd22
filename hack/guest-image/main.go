// Command guest-image prints the path of the real-guest test image, building
// it once per machine and recipe when needed (see internal/harness/guestimage).
// Progress goes to stderr, the path to stdout, as hack/envtest-assets does.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	path, err := guestimage.Ensure(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "guest-image:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}
